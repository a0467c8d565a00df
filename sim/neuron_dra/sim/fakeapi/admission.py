"""What a write passes through before it is stored: the body's type check, the decoding
prune of unknown fields (fieldValidation), CRD schema defaults, the namespace check, and
validation (object metadata, then the CRD schema or the built-in kind's rules)."""

from __future__ import annotations

from typing import Any

from .builtin_pruning import prune_builtin
from .crds import crd_errors
from .crdschema.schema import CRDSchema
from .errors import status
from .registry import Registry
from .rejections import bad_request, invalid
from .resource_types import CRD_KEY, NS_KEY, ResourceType
from .store import JSON, ApiError, Store
from .validation.builtin import validate_builtin, validate_object_meta

# Names the real server validates differently from the DNS-subdomain default.
_NAME_RULES = {"namespaces": "dns-label", "events": "path-segment"}


def check_type(registry: Registry, rt: ResourceType, body: Any) -> JSON:
    """The body as an object of ``rt``: apiVersion (any served version of it) and kind
    must match the URL; both are then set, and metadata made an object."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    av, kind = body.get("apiVersion"), body.get("kind")
    if av and av != rt.api_version and not any(
            v.api_version == av for v in registry.versions_of(*rt.store_key)):
        raise bad_request(
            f"the API version in the data ({av}) does not match the expected API version "
            f"({rt.api_version})"
        )
    if kind and kind != rt.kind:
        raise bad_request(
            f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})"
        )
    body["apiVersion"] = rt.api_version
    body["kind"] = rt.kind
    meta = body.get("metadata")
    if meta is None:
        body["metadata"] = {}
    elif not isinstance(meta, dict):
        raise bad_request("metadata must be an object")
    return body


def namespace_usable(store: Store, rt: ResourceType, ns: str, name: str) -> None:
    """A namespaced create needs its namespace to exist and not be terminating."""
    if not rt.namespaced:
        return
    nso = store.get(NS_KEY, "", ns)
    if nso is None:
        raise ApiError(status(404, "NotFound", f'namespaces "{ns}" not found',
                              name=ns, kind="namespaces"))
    if nso["metadata"].get("deletionTimestamp"):
        raise ApiError(status(
            403, "Forbidden",
            f'{rt.plural} "{name}" is forbidden: unable to create new content '
            f"in namespace {ns} because it is being terminated",
            name=name, kind=rt.plural,
        ))


def prepare_custom(rt: ResourceType, obj: JSON, strict: str) -> list[str]:
    """Prune unknown fields and apply defaults (CRD structural schema semantics).

    Returns warnings; unknown fields are an error under fieldValidation=Strict.
    """
    schema: CRDSchema | None = rt.schema
    if schema is None:
        return prepare_builtin(rt, obj, strict)
    unknown = schema.prune(obj)
    schema.apply_defaults(obj)
    return _unknown_fields(rt, unknown, strict)


def prepare_builtin(rt: ResourceType, obj: JSON, strict: str) -> list[str]:
    """Drop fields a built-in kind does not have, like decoding into its Go type.

    Stored objects never hold unknown fields, so pruning in place cannot touch values a
    request body shares with the stored object."""
    if not rt.model:
        return []
    return _unknown_fields(rt, prune_builtin(rt.model, obj), strict)


def _unknown_fields(rt: ResourceType, unknown: list[str], strict: str) -> list[str]:
    """fieldValidation: Strict rejects unknown fields (400); Warn, the default since
    1.27, drops them with a warning per field; Ignore drops them silently."""
    msgs = [f'unknown field "{p}"' for p in unknown]
    if msgs and strict == "Strict":
        raise bad_request(
            f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
            f"strict decoding error: {', '.join(msgs)}"
        )
    return msgs if strict in ("", "Warn") else []


def validate(rt: ResourceType, obj: JSON, old: JSON | None) -> None:
    """422 Invalid with every field error of ``obj`` (``old``: the stored version, for
    update rules), or nothing."""
    name = obj["metadata"].get("name", "")
    errs = validate_object_meta(obj, namespaced=rt.namespaced,
                                name_validator=_NAME_RULES.get(rt.plural, "dns-subdomain"))
    if rt.schema is not None:
        errs += rt.schema.validate(obj, old)
    elif rt.crd is None:
        errs += validate_builtin(rt.group, rt.plural, obj, old)
    if rt.store_key == CRD_KEY:
        errs += crd_errors(obj)
    if errs:
        raise invalid(rt, name, errs)
