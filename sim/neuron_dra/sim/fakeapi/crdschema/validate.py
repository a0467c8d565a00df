"""Validation of a custom resource against its compiled schema (``build.Node``), as
kube-apiserver does it: types, the keyword checks, list-map keys, required fields and CEL rules,
with the real server's paths and messages.

Fidelity notes (what the real server does that we copy):

* Error paths and messages follow kube-apiserver: ``spec.topology[2].nodeId``, map values as
  ``spec.map[key]``, root-level CEL errors at ``<nil>``; ``Required value``, ``Unsupported value:
  "x": supported values: "a", "b"``, ``Too many: 5: must have at most 4 items``, type errors as
  ``Invalid value: "string": spec.x in body must be of type integer: "string"``.
* CEL errors show the schema type instead of the value (``Invalid value: "object": msg``).
* Transition rules (rules that use ``oldSelf``) run only on update and only where the old object
  has a correlated value (same property / map key / list-map key).
* Validation ratcheting (GA in 1.33): on update, a value equal to its correlated old value is not
  re-validated, except by transition rules.
* ``apiVersion``, ``kind`` and ``metadata`` at the root are not validated here (the server
  validates ObjectMeta itself); CEL sees only ``name`` and ``generateName`` of the root
  ``metadata``. ``date-time`` values are strings in CEL, not timestamps.
"""

from __future__ import annotations

import json
import re
from typing import Any

from neuron_dra.sim.fakeapi.crdschema.build import Node, child, index, map_key, shown
from neuron_dra.sim.fakeapi.crdschema.cel import evaluate_rule, parse_field_path
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

__all__ = ["ROOT_RESERVED", "validate_node"]

# Fields at the root of every object that belong to the server, not to the schema.
ROOT_RESERVED = ("apiVersion", "kind", "metadata")
# What CEL may see of ``self.metadata`` at the root (the real server exposes only these).
_CEL_ROOT_METADATA = ("name", "generateName")
_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")


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


def _type_ok(node: Node, value: Any) -> bool:
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


def _check_format(node: Node, value: Any, path: str, out: list[FieldError]) -> None:
    # build_node refuses every other format.
    if node.format == "date-time" and isinstance(value, str) and not _DATE_TIME.fullmatch(value):
        out.append(
            FieldError(
                shown(path),
                INVALID,
                f'{shown(path)} in body must be of type date-time: "{value}"',
                value=value,
                has_value=True,
            )
        )


def _invalid(name: str, value: Any, detail: str) -> FieldError:
    return FieldError(name, INVALID, f"{name} in body {detail}", value=value, has_value=True)


def _value_checks(node: Node, value: Any, path: str, out: list[FieldError]) -> None:
    """Everything except type, children and CEL: the kube-openapi keyword checks."""
    name = shown(path)
    if node.enum is not None and not any(_json_equal(value, e) for e in node.enum):
        supported = "supported values: " + ", ".join(_quote_supported(e) for e in node.enum)
        out.append(FieldError(name, NOT_SUPPORTED, supported, value=value, has_value=True))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if node.minimum is not None and not value >= node.minimum:
            bound = _go_number(node.minimum)
            out.append(_invalid(name, value, f"should be greater than or equal to {bound}"))
        if node.maximum is not None and not value <= node.maximum:
            bound = _go_number(node.maximum)
            out.append(_invalid(name, value, f"should be less than or equal to {bound}"))
    if isinstance(value, str):
        # Lengths count characters (runes), not bytes.
        if node.max_length is not None and len(value) > node.max_length:
            out.append(FieldError(name, TOO_LONG, f"may not be more than {node.max_length} bytes"))
        if node.min_length is not None and len(value) < node.min_length:
            out.append(_invalid(name, value, f"should be at least {node.min_length} chars long"))
        if node.pattern is not None and node.pattern.search(value) is None:
            out.append(_invalid(name, value, f"should match '{node.pattern_text}'"))
        _check_format(node, value, path, out)
    if isinstance(value, list):
        if node.max_items is not None and len(value) > node.max_items:
            too_many = f"must have at most {node.max_items} items"
            out.append(FieldError(name, TOO_MANY, too_many, value=len(value), has_value=True))
        if node.min_items is not None and len(value) < node.min_items:
            out.append(_invalid(name, len(value), f"should have at least {node.min_items} items"))


def _type_error(node: Node, value: Any, path: str) -> FieldError:
    actual = _json_type(value)
    expected = node.type or "object"
    return FieldError(
        shown(path),
        TYPE_INVALID,
        f'{shown(path)} in body must be of type {expected}: "{actual}"',
        value=actual,
        has_value=True,
    )


def _list_map_key(node: Node, item: Any) -> tuple[str, ...] | None:
    if not isinstance(item, dict):
        return None
    return tuple(json.dumps(item.get(k), sort_keys=True) for k in node.list_map_keys)


def _list_duplicates(node: Node, value: list[Any], path: str, out: list[FieldError]) -> None:
    if node.list_type == "set":
        seen: list[Any] = []
        for i, item in enumerate(value):
            if any(_json_equal(item, s) for s in seen):
                out.append(FieldError(index(path, i), DUPLICATE, _render_plain(item)))
            else:
                seen.append(item)
    if node.list_type != "map":
        return
    keys: set[tuple[str, ...]] = set()
    for i, item in enumerate(value):
        key = _list_map_key(node, item)
        if key is None:
            continue
        if key in keys:
            given = {k: item.get(k) for k in node.list_map_keys if k in item}
            # Duplicate errors carry no detail; the rendered key is the whole message tail.
            out.append(FieldError(index(path, i), DUPLICATE, _render_plain(given)))
        else:
            keys.add(key)


def _to_cel(value: Any, node: Node | None, root: bool = False) -> Any:
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
            sub_node: Node | None = None
            if node is not None:
                if key in node.properties:
                    sub_node = node.properties[key]
                elif isinstance(node.additional, Node):
                    sub_node = node.additional
            result[key] = _to_cel(sub, sub_node)
        return result
    return value


def _run_rules(
    node: Node,
    value: Any,
    old: Any,
    has_old: bool,
    path: str,
    ratcheted: bool,
    root: bool,
    out: list[FieldError],
) -> None:
    data: dict[str, Any] | None = None
    for rule in node.rules:
        # Transition rules run where an old value correlates; the others are ratcheted.
        if (rule.transition and not has_old) or (not rule.transition and ratcheted):
            continue
        if data is None:
            data = {"self": _to_cel(value, node, root)}
            if has_old:
                data["oldSelf"] = _to_cel(old, node, root)
        failed = evaluate_rule(rule, data)
        if failed is None:
            continue
        detail, at_field_path = failed
        target = path
        if at_field_path and rule.field_path:
            for name in parse_field_path(rule.field_path):
                target = child(target, name)
        out.append(
            FieldError(shown(target), INVALID, detail, value=node.schema_type, has_value=True)
        )


def validate_node(
    node: Node,
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
        if not node.nullable and not ratcheted and node.type:
            out.append(_type_error(node, value, path))
        return
    if not _type_ok(node, value):
        if not ratcheted:
            out.append(_type_error(node, value, path))
        return
    if not ratcheted:
        _value_checks(node, value, path, out)

    if isinstance(value, dict):
        _validate_object(node, value, old, has_old, path, ratcheted, out, root)
    elif isinstance(value, list):
        if not ratcheted:
            _list_duplicates(node, value, path, out)
        if node.items is not None:
            old_items = _correlate_items(node, old) if has_old else {}
            for i, item in enumerate(value):
                key = _list_map_key(node, item) if node.list_type == "map" else None
                has = key is not None and key in old_items
                validate_node(
                    node.items,
                    item,
                    old_items.get(key) if has and key is not None else None,
                    has,
                    index(path, i),
                    ratcheted,
                    out,
                )
    _run_rules(node, value, old, has_old, path, ratcheted, root, out)


def _correlate_items(node: Node, old: Any) -> dict[tuple[str, ...], Any]:
    if node.list_type != "map" or not isinstance(old, list):
        return {}
    result: dict[tuple[str, ...], Any] = {}
    for item in old:
        key = _list_map_key(node, item)
        if key is not None and key not in result:
            result[key] = item
    return result


def _validate_object(
    node: Node,
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
            if root and req in ROOT_RESERVED:
                continue
            req_node = node.properties.get(req)
            missing = req not in value or (
                value[req] is None and not (req_node is not None and req_node.nullable)
            )
            if missing:
                out.append(FieldError(child(path, req), REQUIRED, ""))
    for key, sub in value.items():
        if root and key in ROOT_RESERVED:
            continue
        if key in node.properties:
            child_node: Node | None = node.properties[key]
            child_path = child(path, key)
        elif isinstance(node.additional, Node):
            child_node = node.additional
            child_path = map_key(path, key)
        else:
            continue
        assert child_node is not None
        if sub is None and not child_node.nullable:
            # A non-nullable null is dropped by defaulting before validation on the real
            # server; if the caller skipped that step, treat it as absent, not as a type error.
            continue
        validate_node(child_node, sub, old_map.get(key), key in old_map, child_path, ratcheted, out)
