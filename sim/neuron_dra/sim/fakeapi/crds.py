"""CustomResourceDefinitions as the fake serves them: the checks a CRD write must pass,
the status the server gives it (names accepted, established), and the resource types its
served versions become in the registry once it is stored."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .crdschema.schema import CRDSchema, SchemaError, validate_crd_manifest
from .errors import INVALID, FieldError
from .registry import Registry
from .resource_types import PrinterColumn, ResourceType
from .store import JSON


def crd_errors(crd: JSON) -> list[FieldError]:
    """What makes a CRD invalid beyond object metadata: its name, its manifest, and
    openAPIV3Schemas the fake cannot compile."""
    errs: list[FieldError] = []
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    want = f"{names.get('plural')}.{spec.get('group')}"
    name = crd["metadata"].get("name")
    if name != want:
        errs.append(FieldError("metadata.name", INVALID,
                               'must be spec.names.plural+"."+spec.group', name, True))
    for msg in validate_crd_manifest(crd):
        errs.append(FieldError("spec", INVALID, msg))
    for i, ver in enumerate(spec.get("versions") or []):
        try:
            CRDSchema.from_openapi(((ver.get("schema") or {}).get("openAPIV3Schema")) or {})
        except SchemaError as exc:
            errs.append(FieldError(f"spec.versions[{i}].schema.openAPIV3Schema", INVALID,
                                   str(exc)))
    return errs


def set_crd_status(crd: JSON, now: str) -> None:
    """The status the real apiextensions controllers converge to at once here: names
    accepted and established (no conflicts to find among our few CRDs)."""
    spec = crd.get("spec") or {}
    crd["status"] = {
        "acceptedNames": spec.get("names") or {},
        "storedVersions": [v["name"] for v in spec.get("versions") or []
                           if v.get("storage")],
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
             "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
             "message": "the initial names have been accepted", "lastTransitionTime": now},
        ],
    }


def register_crd(registry: Registry, crd: JSON) -> None:
    """Serve (or re-serve, after an update) every served version of a stored CRD."""
    schemas: dict[str, Any] = {}
    for ver in crd["spec"].get("versions") or []:
        raw = (ver.get("schema") or {}).get("openAPIV3Schema")
        if raw is not None:
            schemas[ver["name"]] = CRDSchema.from_openapi(raw)
    registry.remove_crd(crd["metadata"]["name"])
    for rt in crd_resource_types(crd, schemas):
        registry.add(rt)


def crd_resource_types(crd: JSON, schemas: dict[str, Any]) -> Iterable[ResourceType]:
    """One ResourceType per served version of ``crd``; ``schemas`` maps version →
    CRDSchema. The storage version comes first so it becomes the group's preferred one."""
    spec = crd.get("spec", {})
    names = spec.get("names", {})
    group = spec["group"]
    namespaced = spec.get("scope", "Namespaced") == "Namespaced"
    crd_name = crd["metadata"]["name"]
    versions = sorted(
        (v for v in spec.get("versions", []) if v.get("served", True)),
        key=lambda v: not v.get("storage", False),
    )
    for ver in versions:
        cols = tuple(
            PrinterColumn(
                name=c["name"],
                type=c.get("type", "string"),
                json_path=c.get("jsonPath"),
                description=c.get("description", ""),
                priority=int(c.get("priority", 0)),
                format=c.get("format", ""),
            )
            for c in ver.get("additionalPrinterColumns", []) or []
        )
        subs = ver.get("subresources", {}) or {}
        selectable = frozenset(
            s["jsonPath"].lstrip(".") for s in ver.get("selectableFields", []) or []
        )
        yield ResourceType(
            group=group,
            version=ver["name"],
            plural=names["plural"],
            kind=names["kind"],
            namespaced=namespaced,
            singular=names.get("singular") or names["kind"].lower(),
            short_names=tuple(names.get("shortNames", []) or []),
            categories=tuple(names.get("categories", []) or []),
            subresources=frozenset(k for k in subs if k == "status"),
            field_selectors=selectable,
            printer_columns=cols,
            schema=schemas.get(ver["name"]),
            raw_schema=(ver.get("schema") or {}).get("openAPIV3Schema"),
            crd=crd_name,
            status_on_create="drop" if "status" in subs else "keep",
            unconditional_update=False,
        )
