"""Field paths, FieldError constructors and the checks shared by the built-in validators.

Paths print as kube-apiserver's ``field.Path`` does (``spec.devices[3].name``, map keys in
brackets) and errors carry the real server's wording, because callers match on both.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from neuron_dra.sim.fakeapi.errors import (
    DUPLICATE,
    INVALID,
    NOT_SUPPORTED,
    REQUIRED,
    TOO_LONG,
    TOO_MANY,
    TYPE_INVALID,
    FieldError,
)
from neuron_dra.sim.fakeapi.validation.names import (
    is_c_identifier,
    is_dns1123_label,
    is_dns1123_subdomain,
    is_qualified_name,
    is_valid_label_value,
)

# resource.k8s.io/v1 name limits (Kubernetes 1.34 values, from the API's types and validation).
DEVICE_MAX_DOMAIN_LENGTH = 63
DEVICE_MAX_ID_LENGTH = 32
DRIVER_NAME_MAX_LENGTH = 63
POOL_NAME_MAX_LENGTH = 253


def child(path: str, *names: str) -> str:
    for name in names:
        path = f"{path}.{name}" if path else name
    return path


def idx(path: str, i: int) -> str:
    return f"{path}[{i}]"


def map_key(path: str, key: str) -> str:
    return f"{path}[{_truncate(key)}]"


def _truncate(key: str, limit: int = DEVICE_MAX_DOMAIN_LENGTH + 1 + DEVICE_MAX_ID_LENGTH) -> str:
    # Very long map keys are shortened in the middle so one bad key cannot flood the message.
    if len(key) <= limit:
        return key
    keep = limit - 3
    return key[: (keep + 1) // 2] + "..." + key[len(key) - keep // 2 :]


def invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError(path, INVALID, detail, value=value, has_value=True)


def required(path: str, detail: str = "") -> FieldError:
    return FieldError(path, REQUIRED, detail)


def too_long(path: str, limit: int) -> FieldError:
    return FieldError(path, TOO_LONG, f"may not be more than {limit} bytes")


def too_many(path: str, actual: int, limit: int) -> FieldError:
    return FieldError(path, TOO_MANY, f"must have at most {limit} items", actual, True)


def not_supported(path: str, value: Any, supported: Iterable[str]) -> FieldError:
    detail = "supported values: " + ", ".join(json.dumps(s) for s in supported)
    return FieldError(path, NOT_SUPPORTED, detail, value=value, has_value=True)


def duplicate(path: str, value: Any) -> FieldError:
    # field.Duplicate has no detail; the rendered value ends the message.
    return FieldError(path, DUPLICATE, json.dumps(value) if isinstance(value, str) else str(value))


def immutable(path: str, value: Any) -> FieldError:
    return invalid(path, value, "field is immutable")


def messages(path: str, value: str, msgs: list[str]) -> list[FieldError]:
    return [invalid(path, value, m) for m in msgs]


def get_list(obj: Any, key: str) -> list[Any]:
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, list) else []


def get_dict(obj: Any, key: str) -> dict[str, Any]:
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, dict) else {}


def get_str(obj: Any, key: str) -> str:
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, str) else ""


Validator = Callable[[Any, str], list[FieldError]]


def validate_slice(items: list[Any], limit: int, each: Validator, path: str) -> list[FieldError]:
    # Like the real server, an oversized list gets only the size error (DoS protection).
    if limit >= 0 and len(items) > limit:
        return [too_many(path, len(items), limit)]
    errs: list[FieldError] = []
    for i, item in enumerate(items):
        errs.extend(each(item, idx(path, i)))
    return errs


def validate_set(
    items: list[Any],
    limit: int,
    each: Validator,
    key: Callable[[Any], Any],
    path: str,
    key_field: str = "",
) -> list[FieldError]:
    # Duplicates are reported at the key field of the repeated item (``devices[1].name``).
    if limit >= 0 and len(items) > limit:
        return [too_many(path, len(items), limit)]
    errs: list[FieldError] = []
    for i, item in enumerate(items):
        errs.extend(each(item, idx(path, i)))
    seen: set[Any] = set()
    for i, item in enumerate(items):
        k = key(item)
        if k in seen:
            dup_path = child(idx(path, i), key_field) if key_field else idx(path, i)
            errs.append(duplicate(dup_path, k))
        else:
            seen.add(k)
    return errs


# --------------------------------------------------------------------------------------------
# Names and values shared by several kinds


def validate_dns_label(value: str, path: str) -> list[FieldError]:
    return messages(path, value, is_dns1123_label(value))


def validate_dns_subdomain(value: str, path: str) -> list[FieldError]:
    return messages(path, value, is_dns1123_subdomain(value))


def validate_driver_name(value: str, path: str) -> list[FieldError]:
    """CSI driver name rules: required, <= 63, DNS subdomain after lowercasing."""
    errs: list[FieldError] = []
    if not value:
        errs.append(required(path))
    if len(value) > DRIVER_NAME_MAX_LENGTH:
        errs.append(too_long(path, DRIVER_NAME_MAX_LENGTH))
    errs.extend(messages(path, value, is_dns1123_subdomain(value.lower())))
    return errs


def validate_pool_name(value: str, path: str) -> list[FieldError]:
    if not value:
        return [required(path)]
    errs: list[FieldError] = []
    if len(value) > POOL_NAME_MAX_LENGTH:
        errs.append(too_long(path, POOL_NAME_MAX_LENGTH))
    for part in value.split("/"):
        errs.extend(messages(path, part, is_dns1123_subdomain(part)))
    return errs


def validate_c_identifier(value: str, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    if len(value) > DEVICE_MAX_ID_LENGTH:
        errs.append(too_long(path, DEVICE_MAX_ID_LENGTH))
    errs.extend(FieldError(path, TYPE_INVALID, m, value, True) for m in is_c_identifier(value))
    return errs


def validate_qualified_name(value: str, path: str) -> list[FieldError]:
    """Attribute/capacity names: ``<C identifier>`` or ``<domain>/<C identifier>``."""
    if not value:
        return [required(path, "name required")]
    parts = value.split("/")
    if len(parts) == 1:
        return validate_c_identifier(value, path)
    if len(parts) > 2:
        return [invalid(path, value, "must include at most one slash")]
    domain, ident = parts
    errs: list[FieldError] = []
    if not domain:
        errs.append(invalid(path, "", "the domain must not be empty"))
    else:
        errs.extend(validate_driver_name(domain, path))
    if not ident:
        errs.append(invalid(path, "", "the name must not be empty"))
    else:
        errs.extend(validate_c_identifier(ident, path))
    return errs


def validate_fully_qualified_name(value: str, path: str) -> list[FieldError]:
    errs = validate_qualified_name(value, path)
    if value and "/" not in value:
        errs.append(
            invalid(
                path,
                value,
                "a fully qualified name must be a domain and a name separated by a slash",
            )
        )
    return errs


def validate_label_name(value: str, path: str) -> list[FieldError]:
    return messages(path, value, is_qualified_name(value))


def validate_label_value(value: str, path: str) -> list[FieldError]:
    return messages(path, value, is_valid_label_value(value))


# The total size of all annotations of one object (apimachinery TotalAnnotationSizeLimitB).
TOTAL_ANNOTATION_SIZE_LIMIT = 256 * 1024


def validate_labels(labels: dict[str, Any], path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    for name, value in labels.items():
        errs.extend(validate_label_name(name, path))
        text = value if isinstance(value, str) else ""
        errs.extend(validate_label_value(text, path))
    return errs


def validate_annotations(annotations: dict[str, Any], path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    total = 0
    for name, value in annotations.items():
        # Annotation keys are checked case-insensitively (upper case is allowed).
        errs.extend(messages(path, name, is_qualified_name(name.lower())))
        total += len(name) + len(value if isinstance(value, str) else "")
    if total > TOTAL_ANNOTATION_SIZE_LIMIT:
        errs.append(too_long(path, TOTAL_ANNOTATION_SIZE_LIMIT))
    return errs
