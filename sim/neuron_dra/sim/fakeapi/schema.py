"""CRD structural schemas for the fake kube-apiserver: defaulting, pruning, validation, CEL.

A ``CRDSchema`` is compiled once per CRD version from ``openAPIV3Schema`` (every CEL rule is
compiled up front, so a bad rule fails at server start, as ``kubectl apply`` of the CRD would).
The server calls, in this order, the same steps kube-apiserver runs on a write::

    schema.prune(obj)           # drop unknown fields (returns their paths, for fieldValidation)
    schema.apply_defaults(obj)  # fill ``default`` values, drop non-nullable nulls
    errors = schema.validate(obj, old)   # [] or FieldErrors for one 422 Status

Fidelity notes (what the real server does that we copy):

* Error paths and messages follow kube-apiserver: ``spec.topology[2].nodeId``, map values as
  ``spec.map[key]``, root-level CEL errors at ``<nil>``; ``Required value``, ``Unsupported value:
  "x": supported values: "a", "b"``, ``Too many: 5: must have at most 4 items``, type errors as
  ``Invalid value: "string": spec.x in body must be of type integer: "string"``.
* CEL errors show the schema type instead of the value (``Invalid value: "object": msg``).
* Transition rules (rules that use ``oldSelf``) run only on update and only where the old object
  has a correlated value (same property / map key / list-map key); ``optionalOldSelf`` rules run
  always and see ``oldSelf`` as an optional.
* Validation ratcheting (GA in 1.33): on update, a value equal to its correlated old value is not
  re-validated, except by transition rules.
* ``apiVersion``, ``kind`` and ``metadata`` at the root are never pruned, defaulted or validated
  here; the server validates ObjectMeta itself.

Not supported (documented so nobody relies on it): CEL cost limits; typed CEL (``self`` is DYN,
so ``self.noSuchField`` compiles and fails at runtime instead of at CRD creation); the Kubernetes
CEL libraries (``quantity()``, ``semver()``, ``isSorted()``, ``url()``, ``ip()``, ``format``…,
only the cel-go ``strings``, ``optional`` and ``cel.bind`` extensions are present); ``date-time``
values are strings in CEL, not timestamps; formats other than date-time, date, int32, int64,
uuid and byte are not checked; metadata inside embedded resources is not validated.
"""

from __future__ import annotations

import base64
import binascii
import copy
import functools
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings
from neuron_dra.sim.fakeapi.errors import (
    DUPLICATE,
    FORBIDDEN,
    INVALID,
    NOT_SUPPORTED,
    REQUIRED,
    TOO_LONG,
    TOO_MANY,
    TYPE_INVALID,
    FieldError,
)

__all__ = ["CRDSchema", "SchemaError", "validate_crd_manifest"]

# Fields at the root of every object that belong to the server, not to the schema.
_ROOT_RESERVED = ("apiVersion", "kind", "metadata")
# What CEL may see of ``self.metadata`` at the root (the real server exposes only these).
_CEL_ROOT_METADATA = ("name", "generateName")

_TYPES = ("object", "array", "string", "integer", "number", "boolean")
_RULE_REASONS = {
    "FieldValueInvalid": INVALID,
    "FieldValueForbidden": FORBIDDEN,
    "FieldValueRequired": REQUIRED,
    "FieldValueDuplicate": DUPLICATE,
}
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_UUID = re.compile(
    r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}"
)


class SchemaError(ValueError):
    """The schema (or one of its CEL rules) is unusable; raised when a CRD is loaded."""


# --------------------------------------------------------------------------------------------
# Paths


def _child(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _index(path: str, i: int) -> str:
    return f"{path}[{i}]"


def _key(path: str, key: str) -> str:
    return f"{path}[{key}]"


def _shown(path: str) -> str:
    # The real server's root field.Path is nil and prints as "<nil>".
    return path or "<nil>"


# --------------------------------------------------------------------------------------------
# CEL


def _cel_extensions() -> list[Any]:
    return [ext_strings.ExtStrings(), ext_optional.ExtOptional(), ext_bindings.ExtBindings()]


# Environments differ only in the declared variables. "optold" implements optionalOldSelf:
# cel-expr-python cannot receive optional values from Python, so the rule is wrapped in
# ``cel.bind(oldSelf, <present> ? optional.of(<value>) : optional.none(), <rule>)``.
_OLD_VALUE = "__oldSelfValue"
_OLD_PRESENT = "__oldSelfPresent"


@functools.cache
def _env(kind: str) -> Any:
    dyn = cel.Type.DYN
    variables: dict[str, Any] = {"self": dyn}
    if kind == "old":
        variables["oldSelf"] = dyn
    elif kind == "optold":
        variables[_OLD_VALUE] = dyn
        variables[_OLD_PRESENT] = cel.Type.BOOL
    return cel.NewEnv(variables=variables, extensions=_cel_extensions())


def _wrap_optional_old(expr: str) -> str:
    # Newlines keep a trailing ``// comment`` in the rule from swallowing the closing paren.
    return (
        f"cel.bind(oldSelf, {_OLD_PRESENT} ? optional.of({_OLD_VALUE}) : optional.none(),\n"
        f"{expr}\n)"
    )


@functools.lru_cache(maxsize=4096)
def _compile_cached(expr: str, kind: str) -> Any:
    """Compile once per (expression, environment); CRDs are reloaded by every test server."""
    env = _env(kind)
    if kind == "optold":
        # Syntax errors are reported against the user's text, not the wrapper.
        env.compile(expr, disable_check=True)
        return env.compile(_wrap_optional_old(expr))
    return env.compile(expr)


def cel_error_text(err: BaseException) -> str:
    """cel-cpp status text without the ``INVALID_ARGUMENT:`` wrapper."""
    text = str(err).strip()
    text = re.sub(r"^[A-Z_]+: ", "", text)
    return re.sub(r"\s*\[[A-Z_]+\]$", "", text)


def _eval_error_text(raw: Any) -> str:
    """Runtime error values, phrased like cel-go where the cause is common."""
    text = str(raw)
    missing = re.match(r'NOT_FOUND: Key not found in map : "?(.*?)"?$', text)
    if missing:
        return f"no such key: {missing.group(1)}"
    return re.sub(r"^[A-Z_]+: ", "", text)


def _return_type(program: Any) -> str:
    try:
        return str(program.return_type().name())
    except Exception:  # pragma: no cover - defensive: older bindings
        return "DYN"


@dataclass(frozen=True)
class _Rule:
    rule: str
    message: str
    message_program: Any | None
    program: Any
    kind: str  # "self" | "old" | "optold"
    reason: str
    field_path: str

    @property
    def transition(self) -> bool:
        return self.kind != "self"

    def default_message(self) -> str:
        return self.message or f"failed rule: {self.rule.strip()}"

    def error_string(self) -> str:
        return self.message or self.rule.strip()


def _compile_rule(raw: Any, where: str, correlatable: bool) -> _Rule:
    if not isinstance(raw, dict):
        raise SchemaError(f"{where}: must be an object")
    rule = raw.get("rule")
    if not isinstance(rule, str) or not rule.strip():
        raise SchemaError(f"{where}.rule: Required value")
    optional_old = bool(raw.get("optionalOldSelf", False))
    kind = "self"
    try:
        program = _compile_cached(rule, "self")
    except RuntimeError as err:
        if not _USES_OLD_SELF.search(str(err)):
            raise SchemaError(
                f"{where}.rule: Invalid value: {rule!r}: compilation failed: {cel_error_text(err)}"
            ) from None
        kind = "optold" if optional_old else "old"
        try:
            program = _compile_cached(rule, kind)
        except RuntimeError as err2:
            raise SchemaError(
                f"{where}.rule: Invalid value: {rule!r}: compilation failed: {cel_error_text(err2)}"
            ) from None
    if optional_old and kind == "self":
        raise SchemaError(
            f"{where}.optionalOldSelf: Forbidden: may not be set if oldSelf is not used in rule"
        )
    if kind != "self" and not correlatable:
        raise SchemaError(
            f"{where}.rule: Forbidden: oldSelf cannot be used on the uncorrelatable portion of "
            "the schema (inside items of a list that is not x-kubernetes-list-type=map)"
        )
    if _return_type(program) not in ("BOOL", "DYN"):
        raise SchemaError(f"{where}.rule: Invalid value: {rule!r}: must evaluate to a bool")

    message = raw.get("message") or ""
    if not isinstance(message, str):
        raise SchemaError(f"{where}.message: must be a string")
    message = message.strip()
    if "\n" in message:
        raise SchemaError(f"{where}.message: Invalid value: message must not contain line breaks")

    message_program = None
    message_expression = raw.get("messageExpression")
    if message_expression:
        if not isinstance(message_expression, str):
            raise SchemaError(f"{where}.messageExpression: must be a string")
        try:
            message_program = _compile_cached(message_expression, kind)
        except RuntimeError as err:
            raise SchemaError(
                f"{where}.messageExpression: Invalid value: {message_expression!r}: "
                f"messageExpression compilation failed: {cel_error_text(err)}"
            ) from None
        if _return_type(message_program) not in ("STRING", "DYN"):
            raise SchemaError(
                f"{where}.messageExpression: Invalid value: {message_expression!r}: "
                "must evaluate to a string"
            )

    reason_raw = raw.get("reason", "FieldValueInvalid")
    if reason_raw not in _RULE_REASONS:
        raise SchemaError(
            f"{where}.reason: Unsupported value: {reason_raw!r}: supported values: "
            + ", ".join(f'"{r}"' for r in _RULE_REASONS)
        )
    return _Rule(
        rule=rule,
        message=message,
        message_program=message_program,
        program=program,
        kind=kind,
        reason=_RULE_REASONS[reason_raw],
        field_path=str(raw.get("fieldPath") or ""),
    )


# The checker names the whole dotted reference it could not resolve: 'oldSelf' or 'oldSelf.x'.
_USES_OLD_SELF = re.compile(r"undeclared reference to 'oldSelf[.']")

_FIELD_PATH_TOKEN = re.compile(r"\.([A-Za-z_$][A-Za-z0-9_$-]*)|\['((?:[^'\\]|\\.)*)'\]")


def _parse_field_path(text: str) -> list[str]:
    """``.spec.a['b.c']`` -> ["spec", "a", "b.c"]; raises ValueError on anything else."""
    names: list[str] = []
    pos = 0
    while pos < len(text):
        m = _FIELD_PATH_TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"invalid field path at {text[pos:]!r}")
        names.append(m.group(1) if m.group(1) is not None else m.group(2).replace("\\'", "'"))
        pos = m.end()
    if not names:
        raise ValueError("field path must not be empty")
    return names


# --------------------------------------------------------------------------------------------
# Compiled schema nodes


@dataclass
class _Node:
    type: str | None = None
    nullable: bool = False
    format: str | None = None
    properties: dict[str, _Node] = field(default_factory=dict)
    required: list[str] = field(default_factory=list)
    items: _Node | None = None
    # A schema for map values, True (anything goes) or None (not a map).
    additional: _Node | bool | None = None
    preserve_unknown: bool = False
    int_or_string: bool = False
    embedded: bool = False
    enum: list[Any] | None = None
    has_default: bool = False
    default: Any = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    exclusive_maximum: bool = False
    multiple_of: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    pattern: re.Pattern[str] | None = None
    pattern_text: str = ""
    min_items: int | None = None
    max_items: int | None = None
    min_properties: int | None = None
    max_properties: int | None = None
    list_type: str | None = None
    list_map_keys: list[str] = field(default_factory=list)
    all_of: list[_Node] = field(default_factory=list)
    any_of: list[_Node] = field(default_factory=list)
    one_of: list[_Node] = field(default_factory=list)
    not_: _Node | None = None
    rules: list[_Rule] = field(default_factory=list)

    @property
    def schema_type(self) -> str:
        """Type name the real server prints for CEL errors (``""`` for int-or-string)."""
        return self.type or ""


def _num(raw: dict[str, Any], key: str, where: str) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SchemaError(f"{where}.{key}: must be a number")
    return value


def _int(raw: dict[str, Any], key: str, where: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaError(f"{where}.{key}: must be a non-negative integer")
    return value


def _build(raw: Any, where: str, correlatable: bool, value_only: bool = False) -> _Node:
    if not isinstance(raw, dict):
        raise SchemaError(f"{where}: must be an object")
    node = _Node()
    typ = raw.get("type")
    if typ is not None and typ not in _TYPES:
        raise SchemaError(f"{where}.type: Unsupported value: {typ!r}")
    node.type = typ
    node.nullable = bool(raw.get("nullable", False))
    node.format = raw.get("format")
    node.preserve_unknown = bool(raw.get("x-kubernetes-preserve-unknown-fields", False))
    node.int_or_string = bool(raw.get("x-kubernetes-int-or-string", False))
    node.embedded = bool(raw.get("x-kubernetes-embedded-resource", False))
    if "enum" in raw:
        if not isinstance(raw["enum"], list):
            raise SchemaError(f"{where}.enum: must be a list")
        node.enum = list(raw["enum"])
    if "default" in raw:
        node.has_default = True
        node.default = copy.deepcopy(raw["default"])
    node.minimum = _num(raw, "minimum", where)
    node.maximum = _num(raw, "maximum", where)
    node.exclusive_minimum = bool(raw.get("exclusiveMinimum", False))
    node.exclusive_maximum = bool(raw.get("exclusiveMaximum", False))
    node.multiple_of = _num(raw, "multipleOf", where)
    node.min_length = _int(raw, "minLength", where)
    node.max_length = _int(raw, "maxLength", where)
    node.min_items = _int(raw, "minItems", where)
    node.max_items = _int(raw, "maxItems", where)
    node.min_properties = _int(raw, "minProperties", where)
    node.max_properties = _int(raw, "maxProperties", where)
    if "pattern" in raw:
        node.pattern_text = str(raw["pattern"])
        try:
            node.pattern = re.compile(node.pattern_text)
        except re.error as err:
            raise SchemaError(
                f"{where}.pattern: Invalid value: {node.pattern_text!r}: {err}"
            ) from None
    required = raw.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise SchemaError(f"{where}.required: must be a list of strings")
    node.required = list(required)

    props = raw.get("properties", {})
    if not isinstance(props, dict):
        raise SchemaError(f"{where}.properties: must be an object")
    for name, sub in props.items():
        node.properties[name] = _build(sub, f"{where}.properties[{name}]", correlatable, value_only)
    addl = raw.get("additionalProperties")
    if isinstance(addl, dict):
        node.additional = _build(addl, f"{where}.additionalProperties", correlatable, value_only)
    elif addl is True:
        node.additional = True
    elif addl is not None and addl is not False:
        raise SchemaError(f"{where}.additionalProperties: must be a schema or a boolean")

    node.list_type = raw.get("x-kubernetes-list-type")
    if node.list_type not in (None, "atomic", "set", "map"):
        raise SchemaError(f"{where}.x-kubernetes-list-type: Unsupported value: {node.list_type!r}")
    node.list_map_keys = list(raw.get("x-kubernetes-list-map-keys", []) or [])
    if node.list_type == "map" and not node.list_map_keys:
        raise SchemaError(
            f"{where}.x-kubernetes-list-map-keys: Required value: must not be empty if "
            "x-kubernetes-list-type is map"
        )
    if "items" in raw:
        # Old values correlate only through list-map keys; elsewhere oldSelf is meaningless.
        node.items = _build(
            raw["items"], f"{where}.items", correlatable and node.list_type == "map", value_only
        )

    for key, target in (("allOf", node.all_of), ("anyOf", node.any_of), ("oneOf", node.one_of)):
        subs = raw.get(key, [])
        if not isinstance(subs, list):
            raise SchemaError(f"{where}.{key}: must be a list")
        for i, sub in enumerate(subs):
            target.append(_build(sub, f"{where}.{key}[{i}]", correlatable, value_only=True))
    if "not" in raw:
        node.not_ = _build(raw["not"], f"{where}.not", correlatable, value_only=True)

    rules = raw.get("x-kubernetes-validations", [])
    if rules:
        if value_only:
            raise SchemaError(
                f"{where}.x-kubernetes-validations: Forbidden: must be empty inside allOf, anyOf, "
                "oneOf or not"
            )
        if not isinstance(rules, list):
            raise SchemaError(f"{where}.x-kubernetes-validations: must be a list")
        for i, rule_raw in enumerate(rules):
            rule_where = f"{where}.x-kubernetes-validations[{i}]"
            rule = _compile_rule(rule_raw, rule_where, correlatable)
            if rule.field_path:
                _check_field_path(node, rule.field_path, f"{rule_where}.fieldPath")
            node.rules.append(rule)
    return node


def _check_field_path(node: _Node, text: str, where: str) -> None:
    try:
        names = _parse_field_path(text)
    except ValueError as err:
        raise SchemaError(f"{where}: Invalid value: {text!r}: {err}") from None
    current: _Node | None = node
    for name in names:
        if current is None:
            break
        if name in current.properties:
            current = current.properties[name]
        elif isinstance(current.additional, _Node):
            current = current.additional
        elif current.additional is True or current.preserve_unknown:
            current = None
        else:
            raise SchemaError(f"{where}: Invalid value: {text!r}: does not refer to a valid field")


# --------------------------------------------------------------------------------------------
# JSON helpers


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _json_equal(a: Any, b: Any) -> bool:
    """Deep equality that, unlike ``==``, keeps ``True`` and ``1`` apart."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict):
        return (
            isinstance(b, dict) and a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
        )
    if isinstance(a, list):
        return (
            isinstance(b, list)
            and len(a) == len(b)
            and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
        )
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and bool(a == b)


def _go_number(value: float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    return str(value)


def _render_plain(value: Any) -> str:
    """A value as the real server prints it inside Duplicate/NotSupported messages."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return _go_number(value)
    if isinstance(value, dict):
        inner = ", ".join(f"{json.dumps(k)}:{_render_plain(v)}" for k, v in sorted(value.items()))
        return "map[string]interface {}{" + inner + "}"
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _quote_supported(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    return json.dumps(_render_plain(value))


# --------------------------------------------------------------------------------------------
# Validation


def _type_ok(node: _Node, value: Any) -> bool:
    if node.int_or_string:
        return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))
    t = node.type
    if t is None:
        return True
    if t == "object":
        return isinstance(value, dict)
    if t == "array":
        return isinstance(value, list)
    if t == "string":
        return isinstance(value, str)
    if t == "boolean":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if t == "integer":
        # JSON numbers written as 1.0 decode to floats; the real validator accepts them.
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if t == "number":
        return isinstance(value, (int, float))
    return False


def _check_format(node: _Node, value: Any, path: str, out: list[FieldError]) -> None:
    fmt = node.format
    if not fmt:
        return
    bad = False
    if isinstance(value, str):
        if fmt in ("date-time", "datetime"):
            bad = _DATE_TIME.fullmatch(value) is None
        elif fmt == "date":
            bad = _DATE.fullmatch(value) is None
        elif fmt == "uuid":
            bad = _UUID.fullmatch(value) is None
        elif fmt == "byte":
            try:
                base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                bad = True
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        bounds = {"int32": _INT32, "int64": _INT64}.get(fmt)
        if bounds is not None:
            bad = not bounds[0] <= value <= bounds[1]
    if bad:
        shown = value if isinstance(value, str) else _go_number(value)
        out.append(
            FieldError(
                _shown(path),
                INVALID,
                f'{_shown(path)} in body must be of type {fmt}: "{shown}"',
                value=value,
                has_value=True,
            )
        )


def _value_checks(node: _Node, value: Any, path: str, out: list[FieldError]) -> None:
    """Everything except type, children and CEL: the kube-openapi keyword checks."""
    name = _shown(path)
    if node.enum is not None and not any(_json_equal(value, e) for e in node.enum):
        out.append(
            FieldError(
                name,
                NOT_SUPPORTED,
                "supported values: " + ", ".join(_quote_supported(e) for e in node.enum),
                value=value,
                has_value=True,
            )
        )
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if node.minimum is not None:
            if node.exclusive_minimum and not value > node.minimum:
                out.append(
                    FieldError(
                        name,
                        INVALID,
                        f"{name} in body should be greater than {_go_number(node.minimum)}",
                        value=value,
                        has_value=True,
                    )
                )
            elif not node.exclusive_minimum and not value >= node.minimum:
                out.append(
                    FieldError(
                        name,
                        INVALID,
                        f"{name} in body should be greater than or equal to "
                        f"{_go_number(node.minimum)}",
                        value=value,
                        has_value=True,
                    )
                )
        if node.maximum is not None:
            if node.exclusive_maximum and not value < node.maximum:
                out.append(
                    FieldError(
                        name,
                        INVALID,
                        f"{name} in body should be less than {_go_number(node.maximum)}",
                        value=value,
                        has_value=True,
                    )
                )
            elif not node.exclusive_maximum and not value <= node.maximum:
                out.append(
                    FieldError(
                        name,
                        INVALID,
                        f"{name} in body should be less than or equal to "
                        f"{_go_number(node.maximum)}",
                        value=value,
                        has_value=True,
                    )
                )
        if node.multiple_of:
            quotient = value / node.multiple_of
            if not math.isclose(quotient, round(quotient), rel_tol=0, abs_tol=1e-9):
                out.append(
                    FieldError(
                        name,
                        INVALID,
                        f"{name} in body should be a multiple of {_go_number(node.multiple_of)}",
                        value=value,
                        has_value=True,
                    )
                )
    if isinstance(value, str):
        # Lengths count characters (runes), not bytes.
        length = len(value)
        if node.max_length is not None and length > node.max_length:
            out.append(FieldError(name, TOO_LONG, f"may not be more than {node.max_length} bytes"))
        if node.min_length is not None and length < node.min_length:
            out.append(
                FieldError(
                    name,
                    INVALID,
                    f"{name} in body should be at least {node.min_length} chars long",
                    value=value,
                    has_value=True,
                )
            )
        if node.pattern is not None and node.pattern.search(value) is None:
            out.append(
                FieldError(
                    name,
                    INVALID,
                    f"{name} in body should match '{node.pattern_text}'",
                    value=value,
                    has_value=True,
                )
            )
    if isinstance(value, list):
        if node.max_items is not None and len(value) > node.max_items:
            out.append(
                FieldError(
                    name,
                    TOO_MANY,
                    f"must have at most {node.max_items} items",
                    value=len(value),
                    has_value=True,
                )
            )
        if node.min_items is not None and len(value) < node.min_items:
            out.append(
                FieldError(
                    name,
                    INVALID,
                    f"{name} in body should have at least {node.min_items} items",
                    value=len(value),
                    has_value=True,
                )
            )
    if isinstance(value, dict):
        if node.max_properties is not None and len(value) > node.max_properties:
            out.append(
                FieldError(
                    name,
                    TOO_MANY,
                    f"must have at most {node.max_properties} items",
                    value=len(value),
                    has_value=True,
                )
            )
        if node.min_properties is not None and len(value) < node.min_properties:
            out.append(
                FieldError(
                    name,
                    INVALID,
                    f"{name} in body should have at least {node.min_properties} properties",
                    value=len(value),
                    has_value=True,
                )
            )
    _check_format(node, value, path, out)


def _value_only(node: _Node, value: Any, path: str) -> list[FieldError]:
    """Errors of a value-validation-only subschema (allOf/anyOf/oneOf/not branches)."""
    out: list[FieldError] = []
    if value is None:
        return out
    if not _type_ok(node, value):
        out.append(_type_error(node, value, path))
        return out
    _value_checks(node, value, path, out)
    _junctors(node, value, path, out)
    if isinstance(value, dict):
        for req in node.required:
            if req not in value:
                out.append(FieldError(_child(path, req), REQUIRED, ""))
        for name, child in node.properties.items():
            if name in value:
                out.extend(_value_only(child, value[name], _child(path, name)))
    if isinstance(value, list) and node.items is not None:
        for i, item in enumerate(value):
            out.extend(_value_only(node.items, item, _index(path, i)))
    return out


def _junctors(node: _Node, value: Any, path: str, out: list[FieldError]) -> None:
    name = _shown(path)
    for sub in node.all_of:
        out.extend(_value_only(sub, value, path))
    if node.any_of and all(_value_only(sub, value, path) for sub in node.any_of):
        out.append(
            FieldError(
                name,
                INVALID,
                f"{name} in body must validate at least one schema (anyOf)",
                value=value,
                has_value=True,
            )
        )
    if node.one_of:
        passing = sum(1 for sub in node.one_of if not _value_only(sub, value, path))
        if passing != 1:
            out.append(
                FieldError(
                    name,
                    INVALID,
                    f"{name} in body must validate one and only one schema (oneOf)",
                    value=value,
                    has_value=True,
                )
            )
    if node.not_ is not None and not _value_only(node.not_, value, path):
        out.append(
            FieldError(
                name,
                INVALID,
                f"{name} in body must not validate the schema (not)",
                value=value,
                has_value=True,
            )
        )


def _type_error(node: _Node, value: Any, path: str) -> FieldError:
    actual = _json_type(value)
    expected = "integer-or-string" if node.int_or_string else node.type or "object"
    return FieldError(
        _shown(path),
        TYPE_INVALID,
        f'{_shown(path)} in body must be of type {expected}: "{actual}"',
        value=actual,
        has_value=True,
    )


def _map_key(node: _Node, item: Any) -> tuple[str, ...] | None:
    if not isinstance(item, dict):
        return None
    return tuple(json.dumps(item.get(k), sort_keys=True) for k in node.list_map_keys)


def _list_duplicates(node: _Node, value: list[Any], path: str, out: list[FieldError]) -> None:
    if node.list_type == "set":
        seen: list[Any] = []
        for i, item in enumerate(value):
            if any(_json_equal(item, s) for s in seen):
                out.append(FieldError(_index(path, i), DUPLICATE, _render_plain(item)))
            else:
                seen.append(item)
    elif node.list_type == "map":
        keys: set[tuple[str, ...]] = set()
        for i, item in enumerate(value):
            key = _map_key(node, item)
            if key is None:
                continue
            if key in keys:
                shown = {k: item.get(k) for k in node.list_map_keys if k in item}
                # Duplicate errors carry no detail; the rendered key is the whole message tail.
                out.append(FieldError(_index(path, i), DUPLICATE, _render_plain(shown)))
            else:
                keys.add(key)


def _to_cel(value: Any, node: _Node | None, root: bool = False) -> Any:
    """JSON value -> what cel-expr-python should see, honouring the schema's numeric type."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        if node is not None and node.type == "number":
            return float(value)
        return value
    if isinstance(value, float):
        if node is not None and node.type == "integer" and value.is_integer():
            return int(value)
        return value
    if isinstance(value, list):
        item_node = node.items if node is not None else None
        return [_to_cel(v, item_node) for v in value]
    if isinstance(value, dict):
        result: dict[str, Any] = {}
        for key, sub in value.items():
            if root and key == "metadata" and isinstance(sub, dict):
                result[key] = {k: sub[k] for k in _CEL_ROOT_METADATA if k in sub}
                continue
            child: _Node | None = None
            if node is not None:
                if key in node.properties:
                    child = node.properties[key]
                elif isinstance(node.additional, _Node):
                    child = node.additional
            result[key] = _to_cel(sub, child)
        return result
    return value


def _run_rules(
    node: _Node,
    value: Any,
    old: Any,
    has_old: bool,
    path: str,
    ratcheted: bool,
    root: bool,
    out: list[FieldError],
) -> None:
    cel_self: Any = None
    cel_old: Any = None
    converted = False
    for rule in node.rules:
        if rule.transition:
            if rule.kind == "old" and not has_old:
                continue
        elif ratcheted:
            continue
        if not converted:
            cel_self = _to_cel(value, node, root)
            cel_old = _to_cel(old, node, root) if has_old else None
            converted = True
        data: dict[str, Any] = {"self": cel_self}
        if rule.kind == "old":
            data["oldSelf"] = cel_old
        elif rule.kind == "optold":
            data[_OLD_VALUE] = cel_old
            data[_OLD_PRESENT] = has_old
        err = _eval_rule(rule, data, node, path)
        if err is not None:
            out.append(err)


def _eval_rule(rule: _Rule, data: dict[str, Any], node: _Node, path: str) -> FieldError | None:
    type_name = node.schema_type
    try:
        result = rule.program.eval(data=data)
        kind = result.type().name()
        raw = result.value()
    except Exception as exc:  # the binding raises for values it cannot convert
        kind, raw = "ERROR", str(exc)
    if kind == "ERROR":
        text = _eval_error_text(raw)
        if text.startswith("No matching overloads") or "no matching overload" in text:
            detail = (
                f"'{text}': call arguments did not match a supported operator, function or "
                f"macro signature for rule: {rule.error_string()}"
            )
        else:
            detail = f"{text} evaluating rule: {rule.error_string()}"
        return FieldError(_shown(path), INVALID, detail, value=type_name, has_value=True)
    if raw is True:
        return None
    if kind != "BOOL":
        return FieldError(
            _shown(path),
            INVALID,
            f"rule did not evaluate to a bool: {rule.error_string()}",
            value=type_name,
            has_value=True,
        )
    target = path
    if rule.field_path:
        for name in _parse_field_path(rule.field_path):
            target = _child(target, name)
    message = rule.default_message()
    if rule.message_program is not None:
        message = _eval_message(rule.message_program, data) or message
    if rule.reason == REQUIRED:
        return FieldError(_shown(target), REQUIRED, message)
    if rule.reason == FORBIDDEN:
        return FieldError(_shown(target), FORBIDDEN, message)
    if rule.reason == DUPLICATE:
        # field.Duplicate has no detail: the rendered (type) value ends the message.
        return FieldError(_shown(target), DUPLICATE, json.dumps(type_name))
    return FieldError(_shown(target), INVALID, message, value=type_name, has_value=True)


def _eval_message(program: Any, data: dict[str, Any]) -> str | None:
    """messageExpression result, or None to fall back to ``message`` like the real server."""
    try:
        result = program.eval(data=data)
        if result.type().name() != "STRING":
            return None
        text = result.value()
    except Exception:
        return None
    if not isinstance(text, str) or not text.strip() or "\n" in text:
        return None
    return text.strip()


def _validate(
    node: _Node,
    value: Any,
    old: Any,
    has_old: bool,
    path: str,
    ratcheted: bool,
    out: list[FieldError],
    root: bool = False,
) -> None:
    # Ratcheting: an unchanged, correlated value keeps whatever it was allowed to be.
    if not ratcheted and has_old and _json_equal(value, old):
        ratcheted = True
    if value is None:
        if not node.nullable and not ratcheted and (node.type or node.int_or_string):
            out.append(_type_error(node, value, path))
        return
    if not _type_ok(node, value):
        if not ratcheted:
            out.append(_type_error(node, value, path))
        return
    if not ratcheted:
        _value_checks(node, value, path, out)
        _junctors(node, value, path, out)

    if isinstance(value, dict):
        _validate_object(node, value, old, has_old, path, ratcheted, out, root)
    elif isinstance(value, list):
        if not ratcheted:
            _list_duplicates(node, value, path, out)
        if node.items is not None:
            old_items = _correlate_items(node, old) if has_old else {}
            for i, item in enumerate(value):
                key = _map_key(node, item) if node.list_type == "map" else None
                has = key is not None and key in old_items
                _validate(
                    node.items,
                    item,
                    old_items.get(key) if has and key is not None else None,
                    has,
                    _index(path, i),
                    ratcheted,
                    out,
                )
    _run_rules(node, value, old, has_old, path, ratcheted, root, out)


def _correlate_items(node: _Node, old: Any) -> dict[tuple[str, ...], Any]:
    if node.list_type != "map" or not isinstance(old, list):
        return {}
    result: dict[tuple[str, ...], Any] = {}
    for item in old:
        key = _map_key(node, item)
        if key is not None and key not in result:
            result[key] = item
    return result


def _validate_object(
    node: _Node,
    value: dict[str, Any],
    old: Any,
    has_old: bool,
    path: str,
    ratcheted: bool,
    out: list[FieldError],
    root: bool,
) -> None:
    old_map = old if has_old and isinstance(old, dict) else {}
    if not ratcheted:
        for req in node.required:
            if root and req in _ROOT_RESERVED:
                continue
            child = node.properties.get(req)
            missing = req not in value or (
                value[req] is None and not (child is not None and child.nullable)
            )
            if missing:
                out.append(FieldError(_child(path, req), REQUIRED, ""))
        if node.embedded:
            for key in ("apiVersion", "kind"):
                if not value.get(key):
                    out.append(FieldError(_child(path, key), REQUIRED, "must not be empty"))
    for key, sub in value.items():
        if root and key in _ROOT_RESERVED:
            continue
        if key in node.properties:
            child_node: _Node | None = node.properties[key]
            child_path = _child(path, key)
        elif isinstance(node.additional, _Node):
            child_node = node.additional
            child_path = _key(path, key)
        else:
            continue
        assert child_node is not None
        if sub is None and not child_node.nullable:
            # A non-nullable null is dropped by defaulting before validation on the real
            # server; if the caller skipped that step, treat it as absent, not as a type error.
            continue
        _validate(child_node, sub, old_map.get(key), key in old_map, child_path, ratcheted, out)


# --------------------------------------------------------------------------------------------
# Defaulting and pruning


def _default(node: _Node, value: Any, root: bool = False) -> None:
    if isinstance(value, dict):
        for name, child in node.properties.items():
            if root and name in _ROOT_RESERVED:
                continue
            if name in value and value[name] is None and not child.nullable:
                # Non-nullable nulls are replaced by the default, or dropped.
                if child.has_default:
                    value[name] = copy.deepcopy(child.default)
                else:
                    del value[name]
            elif name not in value and child.has_default:
                value[name] = copy.deepcopy(child.default)
            if name in value:
                _default(child, value[name])
        if isinstance(node.additional, _Node):
            addl = node.additional
            for key in list(value):
                if key in node.properties or (root and key in _ROOT_RESERVED):
                    continue
                if value[key] is None and not addl.nullable:
                    if addl.has_default:
                        value[key] = copy.deepcopy(addl.default)
                    else:
                        del value[key]
                        continue
                _default(addl, value[key])
    elif isinstance(value, list) and node.items is not None:
        items = node.items
        for i, item in enumerate(value):
            if item is None and not items.nullable and items.has_default:
                value[i] = copy.deepcopy(items.default)
            _default(items, value[i])


def _prune(node: _Node | None, value: Any, path: str, removed: list[str], root: bool) -> None:
    if node is None:
        return
    if isinstance(value, dict):
        for key in list(value):
            if root and key in _ROOT_RESERVED:
                continue
            if key in node.properties:
                _prune(node.properties[key], value[key], _child(path, key), removed, False)
            elif isinstance(node.additional, _Node):
                _prune(node.additional, value[key], _child(path, key), removed, False)
            elif (
                node.additional is True
                or node.preserve_unknown
                or (node.embedded and key in _ROOT_RESERVED)
            ):
                continue
            else:
                removed.append(_child(path, key))
                del value[key]
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _prune(node.items, item, _index(path, i), removed, False)


# --------------------------------------------------------------------------------------------
# Public API


class CRDSchema:
    """One compiled ``openAPIV3Schema``."""

    def __init__(self, root: _Node) -> None:
        self._root = root

    @classmethod
    def from_openapi(cls, schema: dict[str, Any]) -> CRDSchema:
        return cls(_build(schema, "openAPIV3Schema", correlatable=True))

    def apply_defaults(self, obj: dict[str, Any]) -> None:
        """Fill absent fields with their ``default`` (recursively, into defaulted values too)."""
        _default(self._root, obj, root=True)

    def prune(self, obj: dict[str, Any]) -> list[str]:
        """Drop fields the schema does not know; return their paths (``spec.foo``).

        The paths let the server implement ``fieldValidation=Strict`` (what kubectl sends),
        which rejects with ``unknown field "spec.foo"`` instead of silently dropping.
        """
        removed: list[str] = []
        _prune(self._root, obj, "", removed, root=True)
        return removed

    def validate(self, obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[FieldError]:
        out: list[FieldError] = []
        _validate(self._root, obj, old, old is not None, "", False, out, root=True)
        return out

    def validate_value(self, value: Any, path: str = "") -> list[FieldError]:
        """Validate a value against the root schema without root-object special cases."""
        out: list[FieldError] = []
        _validate(self._root, value, None, False, path, False, out)
        return out


# --------------------------------------------------------------------------------------------
# CRD manifest checks

_FORBIDDEN_KEYWORDS = (
    "$ref",
    "$schema",
    "definitions",
    "dependencies",
    "patternProperties",
    "additionalItems",
    "id",
)


def _structural_problems(
    raw: Any, where: str, out: list[str], *, root: bool = False, value_only: bool = False
) -> None:
    if not isinstance(raw, dict):
        out.append(f"{where}: must be an object")
        return
    for key in _FORBIDDEN_KEYWORDS:
        if key in raw:
            out.append(f"{where}.{key}: Forbidden: {key} is not supported in structural schemas")
    if raw.get("uniqueItems") is True:
        out.append(
            f"{where}.uniqueItems: Forbidden: uniqueItems cannot be set to true since the "
            "runtime complexity becomes quadratic"
        )
    typ = raw.get("type")
    preserve = raw.get("x-kubernetes-preserve-unknown-fields") is True
    int_or_string = raw.get("x-kubernetes-int-or-string") is True
    if value_only:
        for key in ("type", "default", "nullable", "x-kubernetes-validations"):
            if key in raw:
                out.append(f"{where}.{key}: Forbidden: must be empty inside allOf/anyOf/oneOf/not")
    else:
        if root and typ != "object":
            out.append(f"{where}.type: Invalid value: {typ!r}: must be object at the root")
        if int_or_string and typ:
            out.append(f"{where}.type: Forbidden: must be empty if x-kubernetes-int-or-string")
        if not typ and not preserve and not int_or_string:
            out.append(f"{where}.type: Required value: must not be empty for specified fields")
        if typ == "array" and "items" not in raw:
            out.append(f"{where}.items: Required value: must be specified")
        if raw.get("x-kubernetes-embedded-resource") is True and typ != "object":
            out.append(f"{where}.type: Invalid value: must be object if embedded resource")
    if "properties" in raw and isinstance(raw.get("additionalProperties"), dict):
        out.append(
            f"{where}.additionalProperties: Forbidden: additionalProperties and properties are "
            "mutual exclusive"
        )
    if raw.get("additionalProperties") is False:
        out.append(f"{where}.additionalProperties: Forbidden: must not be false")
    list_type = raw.get("x-kubernetes-list-type")
    map_keys = raw.get("x-kubernetes-list-map-keys")
    if map_keys and list_type != "map":
        out.append(
            f"{where}.x-kubernetes-list-map-keys: Forbidden: requires x-kubernetes-list-type=map"
        )
    if list_type == "map" and isinstance(raw.get("items"), dict):
        items = raw["items"]
        item_props = items.get("properties", {}) or {}
        item_required = items.get("required", []) or []
        for key in map_keys or []:
            if key not in item_props:
                out.append(
                    f"{where}.x-kubernetes-list-map-keys: Invalid value: {key!r}: "
                    "must be a property of the items"
                )
            elif key not in item_required and "default" not in item_props[key]:
                out.append(
                    f"{where}.x-kubernetes-list-map-keys: Invalid value: {key!r}: "
                    "must be required or have a default"
                )
    if (
        list_type == "set"
        and isinstance(raw.get("items"), dict)
        and (
            raw["items"].get("type") == "object"
            and raw["items"].get("x-kubernetes-map-type") != "atomic"
        )
    ):
        out.append(f"{where}.items.type: Invalid value: set items must be scalars or atomic")
    props = raw.get("properties", {})
    if isinstance(props, dict):
        if root and isinstance(props.get("metadata"), dict):
            meta = props["metadata"]
            extra = set(meta.get("properties", {}) or {}) - {"name", "generateName"}
            if extra or set(meta) - {"type", "properties"}:
                out.append(
                    f"{where}.properties[metadata]: Forbidden: must not specify anything other "
                    "than name and generateName, but metadata is implicitly specified"
                )
        for name, sub in props.items():
            if root and name == "metadata":
                continue
            _structural_problems(sub, f"{where}.properties[{name}]", out, value_only=value_only)
    addl = raw.get("additionalProperties")
    if isinstance(addl, dict):
        _structural_problems(addl, f"{where}.additionalProperties", out, value_only=value_only)
    if isinstance(raw.get("items"), dict):
        _structural_problems(raw["items"], f"{where}.items", out, value_only=value_only)
    for key in ("allOf", "anyOf", "oneOf"):
        for i, sub in enumerate(raw.get(key, []) or []):
            _structural_problems(sub, f"{where}.{key}[{i}]", out, value_only=True)
    if isinstance(raw.get("not"), dict):
        _structural_problems(raw["not"], f"{where}.not", out, value_only=True)


def _default_problems(raw: Any, where: str, out: list[str]) -> None:
    """Defaults must be valid and survive pruning, as the real server checks at CRD creation."""
    if not isinstance(raw, dict):
        return
    if "default" in raw:
        try:
            sub = CRDSchema(_build(raw, where, correlatable=False))
        except SchemaError:
            sub = None
        if sub is not None:
            value = copy.deepcopy(raw["default"])
            removed: list[str] = []
            _prune(sub._root, value, "", removed, root=False)
            for path in removed:
                out.append(f"{where}.default: Invalid value: unknown field {path!r}")
            for err in sub.validate_value(raw["default"], f"{where}.default"):
                out.append(err.full())
    for name, child in (raw.get("properties") or {}).items():
        _default_problems(child, f"{where}.properties[{name}]", out)
    if isinstance(raw.get("additionalProperties"), dict):
        _default_problems(raw["additionalProperties"], f"{where}.additionalProperties", out)
    if isinstance(raw.get("items"), dict):
        _default_problems(raw["items"], f"{where}.items", out)


def _crd_checks(crd: Any) -> list[str]:
    problems: list[str] = []
    if not isinstance(crd, dict):
        return ["CRD must be an object"]
    if crd.get("apiVersion") != "apiextensions.k8s.io/v1":
        problems.append(
            f"apiVersion: Unsupported value: {crd.get('apiVersion')!r}: "
            'supported values: "apiextensions.k8s.io/v1"'
        )
    if crd.get("kind") != "CustomResourceDefinition":
        problems.append(
            f"kind: Invalid value: {crd.get('kind')!r}: must be CustomResourceDefinition"
        )
    spec = crd.get("spec")
    if not isinstance(spec, dict):
        return [*problems, "spec: Required value"]
    group = spec.get("group")
    names = spec.get("names") or {}
    if not group:
        problems.append("spec.group: Required value")
    elif "." not in group:
        problems.append(
            f"spec.group: Invalid value: {group!r}: should be a domain with at least one dot"
        )
    plural = names.get("plural")
    for key in ("plural", "kind"):
        if not names.get(key):
            problems.append(f"spec.names.{key}: Required value")
    name = (crd.get("metadata") or {}).get("name")
    if plural and group and name != f"{plural}.{group}":
        problems.append(
            f"metadata.name: Invalid value: {name!r}: must be spec.names.plural+"
            f'"."+spec.group ({plural}.{group})'
        )
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        problems.append(
            f"spec.scope: Unsupported value: {spec.get('scope')!r}: supported values:"
            ' "Cluster", "Namespaced"'
        )
    versions = spec.get("versions")
    if not isinstance(versions, list) or not versions:
        problems.append(
            "spec.versions: Invalid value: must have exactly one version marked as storage version"
        )
        return problems
    storage = [v for v in versions if isinstance(v, dict) and v.get("storage")]
    if len(storage) != 1:
        problems.append(
            "spec.versions: Invalid value: must have exactly one version marked as storage version"
        )
    seen: set[str] = set()
    for i, version in enumerate(versions):
        where = f"spec.versions[{i}]"
        if not isinstance(version, dict):
            problems.append(f"{where}: must be an object")
            continue
        vname = version.get("name")
        if not vname:
            problems.append(f"{where}.name: Required value")
        elif vname in seen:
            problems.append(f"{where}.name: Duplicate value: {json.dumps(vname)}")
        seen.add(str(vname))
        problems.extend(_version_checks(version, where))
    return problems


def _version_checks(version: dict[str, Any], where: str) -> list[str]:
    problems: list[str] = []
    schema = (version.get("schema") or {}).get("openAPIV3Schema")
    swhere = f"{where}.schema.openAPIV3Schema"
    if schema is None:
        problems.append(f"{swhere}: Required value: schemas are required")
    else:
        structural: list[str] = []
        _structural_problems(schema, swhere, structural, root=True)
        problems.extend(structural)
        if not structural:
            try:
                CRDSchema.from_openapi(schema)
            except SchemaError as err:
                problems.append(f"{where}.schema.{err}")
            _default_problems(schema, swhere, problems)
    subresources = version.get("subresources") or {}
    scale = subresources.get("scale")
    if isinstance(scale, dict):
        for key in ("specReplicasPath", "statusReplicasPath"):
            if not scale.get(key):
                problems.append(f"{where}.subresources.scale.{key}: Required value")
    for j, column in enumerate(version.get("additionalPrinterColumns") or []):
        cwhere = f"{where}.additionalPrinterColumns[{j}]"
        if not column.get("name"):
            problems.append(f"{cwhere}.name: Required value")
        if column.get("type") not in ("integer", "number", "string", "boolean", "date"):
            problems.append(f"{cwhere}.type: Unsupported value: {column.get('type')!r}")
        if not column.get("jsonPath"):
            problems.append(f"{cwhere}.jsonPath: Required value")
    return problems


def validate_crd_manifest(crd: dict[str, Any]) -> list[str]:
    """Problems that would make kube-apiserver reject this CRD ([] if it is acceptable).

    Covers the structural-schema rules (typed nodes, no ``$ref``, list-type consistency,
    metadata restrictions), CEL compilation, default values, and the CRD's own fields.
    """
    return _crd_checks(crd)
