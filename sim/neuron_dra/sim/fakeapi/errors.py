"""Field errors and API Status bodies shaped like kube-apiserver's.

Validation code (schemas, CEL rules, built-in resource validation) returns
``FieldError`` lists; the server turns them into one 422 ``Status`` whose
message and ``details.causes`` read like the real server's, because users and
our own code match on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Cause reasons used by the real server (k8s.io/apimachinery field.ErrorType).
REQUIRED = "FieldValueRequired"
INVALID = "FieldValueInvalid"
NOT_SUPPORTED = "FieldValueNotSupported"
DUPLICATE = "FieldValueDuplicate"
FORBIDDEN = "FieldValueForbidden"
TOO_LONG = "FieldValueTooLong"
TOO_MANY = "FieldValueTooMany"
TYPE_INVALID = "FieldValueTypeInvalid"

_PREFIX = {
    REQUIRED: "Required value",
    INVALID: "Invalid value",
    NOT_SUPPORTED: "Unsupported value",
    DUPLICATE: "Duplicate value",
    FORBIDDEN: "Forbidden",
    TOO_LONG: "Too long",
    TOO_MANY: "Too many",
    TYPE_INVALID: "Invalid value",
}


@dataclass(frozen=True)
class FieldError:
    """One invalid field: ``field`` is a dotted/indexed path such as ``spec.devices[3].name``."""

    field: str
    reason: str
    detail: str
    value: Any = None
    has_value: bool = False

    def message(self) -> str:
        """The cause message, e.g. ``Unsupported value: 3: supported values: "1", "2"``."""
        prefix = _PREFIX.get(self.reason, "Invalid value")
        if self.has_value:
            return f"{prefix}: {_render_value(self.value)}: {self.detail}"
        return f"{prefix}: {self.detail}" if self.detail else prefix

    def full(self) -> str:
        return f"{self.field}: {self.message()}"


def _render_value(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (dict, list)):
        return f'"{value!s}"' if not value else "{...}" if isinstance(value, dict) else "[...]"
    return str(value)


def status(
    code: int,
    reason: str,
    message: str,
    *,
    name: str | None = None,
    group: str | None = None,
    kind: str | None = None,
    causes: list[dict[str, Any]] | None = None,
    retry_after_seconds: int | None = None,
) -> dict[str, Any]:
    """A ``v1.Status`` failure body."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    details: dict[str, Any] = {}
    if name is not None:
        details["name"] = name
    if group is not None:
        details["group"] = group
    if kind is not None:
        details["kind"] = kind
    if causes:
        details["causes"] = causes
    if retry_after_seconds is not None:
        details["retryAfterSeconds"] = retry_after_seconds
    if details:
        body["details"] = details
    return body


def invalid_status(kind: str, group: str, name: str, errors: list[FieldError]) -> dict[str, Any]:
    """The 422 body the real server sends for failed validation."""
    qualified = f"{kind}.{group}" if group else kind
    joined = (
        errors[0].full() if len(errors) == 1 else "[" + ", ".join(e.full() for e in errors) + "]"
    )
    return status(
        422,
        "Invalid",
        f'{qualified} "{name}" is invalid: {joined}',
        name=name,
        group=group,
        kind=kind,
        causes=[{"reason": e.reason, "message": e.message(), "field": e.field} for e in errors],
    )
