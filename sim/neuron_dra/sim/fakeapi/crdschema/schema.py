"""CRD structural schemas for the fake kube-apiserver: pruning, defaulting and validation.

A ``CRDSchema`` is compiled once per CRD version from ``openAPIV3Schema``
(:mod:`.build`; every CEL rule is compiled up front, so a bad rule fails at server
start, as ``kubectl apply`` of the CRD would). The server calls, in this order, the same steps
kube-apiserver runs on a write::

    schema.prune(obj)           # drop unknown fields (returns their paths, for fieldValidation)
    schema.apply_defaults(obj)  # fill ``default`` values, drop non-nullable nulls
    errors = schema.validate(obj, old)   # [] or FieldErrors for one 422 Status

``apiVersion``, ``kind`` and ``metadata`` at the root are never pruned, defaulted or validated
here; the server validates ObjectMeta itself. What validation copies of the real server is
listed in :mod:`.validate`; the keywords the fake refuses in :mod:`.build`.

``validate_crd_manifest`` checks a CRD's own fields and that its schemas compile here; whether
a schema is structural and its defaults valid is the real API server's to judge (docs/sim.md).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from neuron_dra.sim.fakeapi.crdschema.build import Node, build_node, child, index
from neuron_dra.sim.fakeapi.crdschema.cel import SchemaError
from neuron_dra.sim.fakeapi.crdschema.validate import ROOT_RESERVED, validate_node
from neuron_dra.sim.fakeapi.errors import FieldError

__all__ = ["CRDSchema", "SchemaError", "validate_crd_manifest"]


def _default(node: Node, value: Any, root: bool = False) -> None:
    if isinstance(value, dict):
        for name, child in node.properties.items():
            if root and name in ROOT_RESERVED:
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
        if isinstance(node.additional, Node):
            addl = node.additional
            for key in list(value):
                if key in node.properties or (root and key in ROOT_RESERVED):
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


def _prune(node: Node | None, value: Any, path: str, removed: list[str], root: bool) -> None:
    if node is None:
        return
    if isinstance(value, dict):
        for key in list(value):
            if root and key in ROOT_RESERVED:
                continue
            if key in node.properties:
                _prune(node.properties[key], value[key], child(path, key), removed, False)
            elif isinstance(node.additional, Node):
                _prune(node.additional, value[key], child(path, key), removed, False)
            elif node.additional is True or node.preserve_unknown:
                continue
            else:
                removed.append(child(path, key))
                del value[key]
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _prune(node.items, item, index(path, i), removed, False)


# --------------------------------------------------------------------------------------------
# Public API


class CRDSchema:
    """One compiled ``openAPIV3Schema``."""

    def __init__(self, root: Node) -> None:
        self._root = root

    @classmethod
    def from_openapi(cls, schema: dict[str, Any]) -> CRDSchema:
        return cls(build_node(schema, "openAPIV3Schema", correlatable=True))

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
        validate_node(self._root, obj, old, old is not None, "", False, out, root=True)
        return out


# --------------------------------------------------------------------------------------------
# --------------------------------------------------------------------------------------------
# CRD manifest checks


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
        try:
            CRDSchema.from_openapi(schema)
        except SchemaError as err:
            problems.append(f"{where}.schema.{err}")
    return problems


def validate_crd_manifest(crd: dict[str, Any]) -> list[str]:
    """Problems that would make kube-apiserver (or the fake) reject this CRD.

    Covers the CRD's own fields (group, names, scope, one storage version) and that every
    version's schema compiles here (known keywords, CEL rules, list-map keys). Structural-schema
    rules, default values, printer columns and the scale subresource are the real tier's.
    """
    return _crd_checks(crd)
