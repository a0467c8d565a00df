"""Unknown-field pruning of built-in kinds: what decoding a request into the Go type does on
a real server, with kubernetes_asyncio's model tables standing in for the Go structs."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client as k8s_models

# Fields kubernetes_asyncio's models (Kubernetes 1.36 OpenAPI) have that a 1.34 server does
# not know, and so drops: per model, by JSON name.
_NEWER_THAN_SERVED: dict[str, frozenset[str]] = {
    "V1DeviceAttribute": frozenset({"bools", "ints", "strings", "versions"}),
    "V1Device": frozenset({"nodeAllocatableResourceMappings"}),
}
_LEAF_TYPES = frozenset({"str", "int", "bool", "float", "datetime", "date", "object"})


class _Shape:
    """A compiled openapi type of kubernetes_asyncio: ``model`` (fields by JSON name),
    ``list``/``dict`` of an inner shape, or a leaf (None, nothing to prune)."""

    __slots__ = ("fields", "inner", "kind", "leafy")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.inner: _Shape | None = None
        self.fields: dict[str, _Shape | None] = {}
        self.leafy = False  # a model whose fields are all leaves: only its keys to check


_SHAPES: dict[str, _Shape | None] = {}


def _shape(typ: str) -> _Shape | None:
    if typ in _SHAPES:
        return _SHAPES[typ]
    if typ in _LEAF_TYPES:
        _SHAPES[typ] = None
        return None
    if typ.startswith("list[") or typ.startswith("dict("):
        inner_typ = typ[5:-1] if typ.startswith("list[") else typ[typ.index(",") + 1:-1]
        inner = _shape(inner_typ.strip())
        shape = None if inner is None else _Shape("list" if typ[0] == "l" else "dict")
        if shape is not None:
            shape.inner = inner
        _SHAPES[typ] = shape
        return shape
    cls = getattr(k8s_models, typ, None)
    if cls is None or not hasattr(cls, "openapi_types"):
        _SHAPES[typ] = None
        return None
    shape = _Shape("model")
    _SHAPES[typ] = shape  # before recursing: models may refer to themselves
    newer = _NEWER_THAN_SERVED.get(typ, frozenset())
    for attr, ftyp in cls.openapi_types.items():
        name = cls.attribute_map[attr]
        if name not in newer:
            shape.fields[name] = _shape(ftyp)
    shape.leafy = all(f is None for f in shape.fields.values())
    return shape


def _prune_shape(shape: _Shape, value: Any, stack: list[str], removed: list[str]) -> None:
    """Prune ``value`` in place; ``stack`` holds the path segments (joined only for a
    removal, since this runs on every write of every built-in object)."""
    kind = shape.kind
    if kind == "model":
        if not isinstance(value, dict):
            return
        fields = shape.fields
        if not value.keys() <= fields.keys():
            for key in [k for k in value if k not in fields]:
                removed.append(_join([*stack, key]))
                del value[key]
        if shape.leafy:
            return
        for key, sub in value.items():
            fshape = fields[key]
            if fshape is not None:
                stack.append(key)
                _prune_shape(fshape, sub, stack, removed)
                stack.pop()
    elif kind == "list":
        if isinstance(value, list):
            inner = shape.inner
            assert inner is not None
            for i, item in enumerate(value):
                stack.append(f"[{i}]")
                _prune_shape(inner, item, stack, removed)
                stack.pop()
    elif isinstance(value, dict):
        inner = shape.inner
        assert inner is not None
        if inner.leafy:
            # Maps of small leaf-only structs (device attributes): one key check each.
            known = inner.fields.keys()
            if all(not isinstance(v, dict) or v.keys() <= known for v in value.values()):
                return
        for k, v in value.items():
            stack.append(k)
            _prune_shape(inner, v, stack, removed)
            stack.pop()


def _join(segments: list[str]) -> str:
    out = ""
    for seg in segments:
        out += seg if seg.startswith("[") or not out else "." + seg
    return out


def prune_builtin(model: str, obj: dict[str, Any]) -> list[str]:
    """Drop (in place) the fields of ``obj`` its kind does not have; return their paths
    (``spec.devices[0].attributez``), as decoding into the Go type does on a real server."""
    removed: list[str] = []
    shape = _shape(model) if model else None
    if shape is not None:
        _prune_shape(shape, obj, [], removed)
    return removed
