"""Compiles a CRD's ``openAPIV3Schema`` into a tree of ``Node``s for the fake API server, once per
CRD version (every CEL rule is compiled up front, so a bad schema fails at load).

The fake implements the keywords our CRDs use (``_KEYWORDS``) and refuses a schema with any
other (``allOf``/``anyOf``/``oneOf``/``not``, ``multipleOf``, exclusive bounds, min/max
properties, int-or-string, embedded resources, formats other than
``date-time``...) with a ``SchemaError`` that names it: it never ignores a rule the real
server would enforce. CRDs that use them are the real tier's to judge (docs/sim.md).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from neuron_dra.sim.fakeapi.crdschema.cel import Rule, SchemaError, compile_rule, parse_field_path

__all__ = ["Node", "build_node", "child", "index", "map_key", "shown"]

_TYPES = ("object", "array", "string", "integer", "number", "boolean")
_FORMATS = ("date-time",)
# Keywords with no effect on validation are accepted and ignored.
_KEYWORDS = frozenset(
    {
        "type", "nullable", "format", "enum", "default", "description", "title", "example",
        "externalDocs", "properties", "required", "additionalProperties", "items",
        "minimum", "maximum", "minLength", "maxLength", "pattern", "minItems", "maxItems",
        "x-kubernetes-preserve-unknown-fields", "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys", "x-kubernetes-map-type", "x-kubernetes-validations",
    }
)  # fmt: skip


def child(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def index(path: str, i: int) -> str:
    return f"{path}[{i}]"


def map_key(path: str, key: str) -> str:
    return f"{path}[{key}]"


def shown(path: str) -> str:
    # The real server's root field.Path is nil and prints as "<nil>".
    return path or "<nil>"


@dataclass
class Node:
    type: str | None = None
    nullable: bool = False
    format: str | None = None
    properties: dict[str, Node] = field(default_factory=dict)
    required: list[str] = field(default_factory=list)
    items: Node | None = None
    # A schema for map values, True (anything goes) or None (not a map).
    additional: Node | bool | None = None
    preserve_unknown: bool = False
    enum: list[Any] | None = None
    has_default: bool = False
    default: Any = None
    minimum: float | None = None
    maximum: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    pattern: re.Pattern[str] | None = None
    pattern_text: str = ""
    min_items: int | None = None
    max_items: int | None = None
    list_type: str | None = None
    list_map_keys: list[str] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)

    @property
    def schema_type(self) -> str:
        """Type name the real server prints for CEL errors."""
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


def build_node(raw: Any, where: str, correlatable: bool) -> Node:
    """``raw`` compiled; ``correlatable`` says whether old values can be found for this node
    (not inside the items of a list that is not a list-map), which transition rules need."""
    if not isinstance(raw, dict):
        raise SchemaError(f"{where}: must be an object")
    for key in raw:
        if key not in _KEYWORDS:
            raise SchemaError(f"{where}.{key}: not supported by the fake API server")
    node = Node()
    typ = raw.get("type")
    if typ is not None and typ not in _TYPES:
        raise SchemaError(f"{where}.type: Unsupported value: {typ!r}")
    node.type = typ
    node.nullable = bool(raw.get("nullable", False))
    node.format = raw.get("format")
    if node.format is not None and node.format not in _FORMATS:
        raise SchemaError(f"{where}.format: {node.format!r} not supported by the fake API server")
    node.preserve_unknown = bool(raw.get("x-kubernetes-preserve-unknown-fields", False))
    if "enum" in raw:
        if not isinstance(raw["enum"], list):
            raise SchemaError(f"{where}.enum: must be a list")
        node.enum = list(raw["enum"])
    if "default" in raw:
        node.has_default = True
        node.default = copy.deepcopy(raw["default"])
    node.minimum = _num(raw, "minimum", where)
    node.maximum = _num(raw, "maximum", where)
    node.min_length = _int(raw, "minLength", where)
    node.max_length = _int(raw, "maxLength", where)
    node.min_items = _int(raw, "minItems", where)
    node.max_items = _int(raw, "maxItems", where)
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
    _build_children(node, raw, where, correlatable)
    rules = raw.get("x-kubernetes-validations", [])
    if not isinstance(rules, list):
        raise SchemaError(f"{where}.x-kubernetes-validations: must be a list")
    for i, rule_raw in enumerate(rules):
        rule_where = f"{where}.x-kubernetes-validations[{i}]"
        rule = compile_rule(rule_raw, rule_where, correlatable)
        if rule.field_path:
            _check_field_path(node, rule.field_path, f"{rule_where}.fieldPath")
        node.rules.append(rule)
    return node


def _build_children(node: Node, raw: dict[str, Any], where: str, correlatable: bool) -> None:
    props = raw.get("properties", {})
    if not isinstance(props, dict):
        raise SchemaError(f"{where}.properties: must be an object")
    for name, sub in props.items():
        node.properties[name] = build_node(sub, f"{where}.properties[{name}]", correlatable)
    addl = raw.get("additionalProperties")
    if isinstance(addl, dict):
        node.additional = build_node(addl, f"{where}.additionalProperties", correlatable)
    elif addl is True:
        node.additional = True
    elif addl is not None and addl is not False:
        raise SchemaError(f"{where}.additionalProperties: must be a schema or a boolean")

    node.list_type = raw.get("x-kubernetes-list-type")
    if node.list_type not in (None, "atomic", "set", "map"):
        raise SchemaError(
            f"{where}.x-kubernetes-list-type: {node.list_type!r} not supported by the fake API "
            "server"
        )
    node.list_map_keys = list(raw.get("x-kubernetes-list-map-keys", []) or [])
    if node.list_type == "map" and not node.list_map_keys:
        raise SchemaError(
            f"{where}.x-kubernetes-list-map-keys: Required value: must not be empty if "
            "x-kubernetes-list-type is map"
        )
    if "items" in raw:
        # Old values correlate only through list-map keys; elsewhere oldSelf is meaningless.
        node.items = build_node(
            raw["items"], f"{where}.items", correlatable and node.list_type == "map"
        )


def _check_field_path(node: Node, text: str, where: str) -> None:
    try:
        names = parse_field_path(text)
    except ValueError as err:
        raise SchemaError(f"{where}: Invalid value: {text!r}: {err}") from None
    current: Node | None = node
    for name in names:
        if current is None:
            break
        if name in current.properties:
            current = current.properties[name]
        elif isinstance(current.additional, Node):
            current = current.additional
        elif current.additional is True or current.preserve_unknown:
            current = None
        else:
            raise SchemaError(f"{where}: Invalid value: {text!r}: does not refer to a valid field")
