"""Kubernetes name and label formats (k8s.io/apimachinery/pkg/util/validation), in one place.

The fake API server's validation, the slice builder, the controller and the models all need
the same patterns; a second hand-written copy drifts silently.
"""

from __future__ import annotations

import re
from typing import Final

DNS1123_LABEL_FMT: Final = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN_FMT: Final = DNS1123_LABEL_FMT + r"(\." + DNS1123_LABEL_FMT + ")*"
QUALIFIED_NAME_FMT: Final = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
LABEL_VALUE_FMT: Final = "(" + QUALIFIED_NAME_FMT + ")?"
C_IDENTIFIER_FMT: Final = "[A-Za-z_][A-Za-z0-9_]*"

DNS1123_LABEL_RE: Final = re.compile(DNS1123_LABEL_FMT)
DNS1123_SUBDOMAIN_RE: Final = re.compile(DNS1123_SUBDOMAIN_FMT)
QUALIFIED_NAME_RE: Final = re.compile(QUALIFIED_NAME_FMT)
LABEL_VALUE_RE: Final = re.compile(LABEL_VALUE_FMT)
C_IDENTIFIER_RE: Final = re.compile(C_IDENTIFIER_FMT)

DNS1123_SUBDOMAIN_MAX: Final = 253
LABEL_VALUE_MAX: Final = 63


def is_dns_subdomain(value: str) -> bool:
    return len(value) <= DNS1123_SUBDOMAIN_MAX and bool(DNS1123_SUBDOMAIN_RE.fullmatch(value))


def is_label_value(value: str) -> bool:
    return len(value) <= LABEL_VALUE_MAX and bool(LABEL_VALUE_RE.fullmatch(value))
