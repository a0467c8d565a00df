"""check-claim's input: the claim files read (YAML/JSON, documents, lists), each
ResourceClaim(Template) in v1 shape, and what API validation would say of it."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

RESOURCE_GROUP: Final = "resource.k8s.io"
CLAIM_KINDS: Final = ("ResourceClaimTemplate", "ResourceClaim")
#: Fields of a v1beta1 request that v1 moved under ``exactly``.
_EXACT_FIELDS: Final = (
    "deviceClassName",
    "selectors",
    "allocationMode",
    "count",
    "adminAccess",
    "tolerations",
    "capacity",
)
_KIND_OF_VALUE: Final[dict[type, str]] = {
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
}


class InputError(Exception):
    """Bad input (exit code 2): the message says what to fix."""


def read_objects(path: str, what: str) -> list[dict[str, Any]]:
    """Every object in a YAML/JSON file: several documents, a list, or a ``…List``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{what} {path}: file not found") from None
    except IsADirectoryError:
        raise InputError(f"{what} {path}: is a directory, not a file") from None
    except UnicodeDecodeError:
        raise InputError(f"{what} {path}: not a text file") from None
    except OSError as exc:
        raise InputError(f"{what} {path}: cannot read: {exc.strerror or exc}") from None
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
            mark = exc.problem_mark
            detail = f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
        raise InputError(f"{what} {path}: not valid YAML: {detail}") from None
    objects: list[dict[str, Any]] = []
    for number, doc in enumerate(docs, start=1):
        if doc is None:
            continue
        if isinstance(doc, list):
            items: list[Any] = doc
        elif isinstance(doc, dict) and isinstance(doc.get("items"), list):
            items = doc["items"]  # a List (kubectl get -o yaml)
        else:
            items = [doc]
        for item in items:
            if not isinstance(item, dict):
                raise InputError(
                    f"{what} {path}: document {number} is not a Kubernetes object "
                    f"({_KIND_OF_VALUE.get(type(item), type(item).__name__)})"
                )
            objects.append(item)
    return objects


def api_group(obj: Mapping[str, Any]) -> str:
    return str(obj.get("apiVersion") or "").rpartition("/")[0]


def is_kind(obj: Mapping[str, Any], kind: str) -> bool:
    return obj.get("kind") == kind and api_group(obj) == RESOURCE_GROUP


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def classes_of(objects: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        str(as_dict(o.get("metadata")).get("name")): dict(o)
        for o in objects
        if is_kind(o, "DeviceClass") and as_dict(o.get("metadata")).get("name")
    }


def to_v1_claim_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A ResourceClaim spec in v1 shape: v1beta1's flat requests moved under ``exactly``."""
    out = copy.deepcopy(dict(spec))
    for request in as_list(as_dict(out.get("devices")).get("requests")):
        if not isinstance(request, dict) or "exactly" in request or "firstAvailable" in request:
            continue
        exactly = {k: request.pop(k) for k in _EXACT_FIELDS if k in request}
        request["exactly"] = exactly
    return out


@dataclass(frozen=True)
class ClaimDoc:
    """One ResourceClaimTemplate or ResourceClaim of the input, in v1 shape."""

    kind: str
    api_version: str
    namespace: str
    name: str
    #: ``ResourceClaim.spec`` (v1 shape), what gets allocated.
    spec: dict[str, Any]
    #: The whole object converted to ``resource.k8s.io/v1``, for API validation.
    v1_object: dict[str, Any]
    #: Labels of the claim (a template's claim labels): Prepare matches a workload's claims
    #: to the devices reserved for it by one of them.
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"


def claim_docs(objects: Iterable[Mapping[str, Any]], path: str) -> list[ClaimDoc]:
    found: list[ClaimDoc] = []
    kinds: list[str] = []
    for obj in objects:
        kind = str(obj.get("kind") or "")
        kinds.append(kind or "(no kind)")
        if kind not in CLAIM_KINDS:
            continue
        if api_group(obj) != RESOURCE_GROUP:
            raise InputError(
                f"{path}: {kind} has apiVersion {obj.get('apiVersion')!r}; expected "
                f"{RESOURCE_GROUP}/v1 (or v1beta1, v1beta2)"
            )
        meta = as_dict(obj.get("metadata"))
        name = str(meta.get("name") or meta.get("generateName") or "(unnamed)")
        outer = as_dict(obj.get("spec"))
        raw_spec = as_dict(outer.get("spec")) if kind == "ResourceClaimTemplate" else outer
        claim_meta = as_dict(outer.get("metadata")) if kind == "ResourceClaimTemplate" else meta
        labels = {str(k): str(v) for k, v in as_dict(claim_meta.get("labels")).items()}
        spec = to_v1_claim_spec(raw_spec)
        v1 = copy.deepcopy(dict(obj))
        v1["apiVersion"] = f"{RESOURCE_GROUP}/v1"
        if kind == "ResourceClaimTemplate":
            v1.setdefault("spec", {})
            if isinstance(v1["spec"], dict):
                v1["spec"]["spec"] = copy.deepcopy(spec)
        else:
            v1["spec"] = copy.deepcopy(spec)
        found.append(
            ClaimDoc(
                kind=kind,
                api_version=str(obj.get("apiVersion")),
                namespace=str(meta.get("namespace") or ""),
                name=name,
                spec=spec,
                v1_object=v1,
                labels=labels,
            )
        )
    if not found:
        seen = ", ".join(sorted(set(kinds))) or "nothing"
        raise InputError(f"{path}: no ResourceClaimTemplate or ResourceClaim in it (found: {seen})")
    return found


def api_errors(doc: ClaimDoc) -> list[str]:
    """What the API server's validation would say about the (v1 form of the) object."""
    from neuron_dra.sim.fakeapi.validation.builtin import (
        apply_builtin_defaults,
        validate_builtin,
    )

    plural = "resourceclaimtemplates" if doc.kind == "ResourceClaimTemplate" else "resourceclaims"
    obj = copy.deepcopy(doc.v1_object)
    apply_builtin_defaults(RESOURCE_GROUP, plural, obj)
    return [e.full() for e in validate_builtin(RESOURCE_GROUP, plural, obj, None)]
