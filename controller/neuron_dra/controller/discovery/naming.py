"""NeuronUltraServer object names and the label/annotation that carry the raw UltraServer id.

The object name is the id itself when the id is a valid name, else a sanitized form plus a
hash; the annotation is the authoritative copy of the id, the label (a valid label value
derived from it) lets clients select a NUS by id.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any, Final

from neuron_dra.common.names import DNS1123_SUBDOMAIN_RE, LABEL_VALUE_RE

ANNOTATION_ULTRASERVER_ID: Final = "neuron.aws.com/ultraserver-id"
LABEL_ULTRASERVER_ID: Final = "neuron.aws.com/ultraserver-id"

_HASH_CHARS: Final = 8
_DNS_SUBDOMAIN = DNS1123_SUBDOMAIN_RE
_LABEL_VALUE = LABEL_VALUE_RE
_MAX_NAME: Final = 253
_MAX_LABEL: Final = 63


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:_HASH_CHARS]


def nus_name(ultraserver_id: str) -> str:
    """The NUS object name for an UltraServer id.

    The id itself when it is a valid DNS subdomain (the usual case: 16 hex chars from the
    driver's election, or a capacity block id). Otherwise a sanitized form plus a hash of the
    raw id, so two ids that sanitize alike ("A_1" and "a-1") still get different objects.
    """
    if len(ultraserver_id) <= _MAX_NAME and _DNS_SUBDOMAIN.fullmatch(ultraserver_id):
        return ultraserver_id
    base = re.sub(r"[^a-z0-9.-]", "-", ultraserver_id.lower())
    # Dots only separate labels: collapse runs and drop those next to a dash.
    base = re.sub(r"\.{2,}", ".", base)
    base = re.sub(r"-*\.-*", ".", base).strip(".-")
    suffix = _short_hash(ultraserver_id)
    base = base[: _MAX_NAME - len(suffix) - 1].rstrip(".-")
    return f"{base}-{suffix}" if base else f"us-{suffix}"


def ultraserver_label_value(ultraserver_id: str) -> str:
    """A label value standing for the id: the id itself when it is one, else a hashed form."""
    if len(ultraserver_id) <= _MAX_LABEL and _LABEL_VALUE.fullmatch(ultraserver_id):
        return ultraserver_id
    suffix = _short_hash(ultraserver_id)
    base = re.sub(r"[^A-Za-z0-9_.-]", "-", ultraserver_id)
    base = base[: _MAX_LABEL - len(suffix) - 1].strip("-_.")
    return f"{base}-{suffix}" if base else f"us-{suffix}"


def ultraserver_id_of(nus: Mapping[str, Any]) -> str | None:
    """The raw UltraServer id of a NUS object (annotation, else its name for old objects)."""
    meta = nus.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    annotations = meta.get("annotations")
    if isinstance(annotations, Mapping):
        raw = annotations.get(ANNOTATION_ULTRASERVER_ID)
        if isinstance(raw, str) and raw:
            return raw
    name = meta.get("name")
    return name if isinstance(name, str) and name else None
