"""The PATCH verb: decode a patch of one of the four content types (merge, JSON patch,
strategic merge, server-side apply), apply it to the current object with :mod:`.patch`,
and write the result through the same update (or, for apply, create) as PUT and POST."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import yaml

from . import patch as patchlib
from .admission import check_type
from .core import as_version
from .errors import status
from .rejections import bad_request, conflict, not_found
from .resource_types import ResourceType
from .store import JSON, ApiError

if TYPE_CHECKING:
    from .core import ApiCore

MERGE = "application/merge-patch+json"
JSONPATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"


def patch(
    core: ApiCore,
    rt: ResourceType,
    ns: str,
    name: str,
    content_type: str,
    raw: bytes,
    *,
    subresource: str = "",
    field_manager: str | None = None,
    force: bool = False,
    dry_run: bool = False,
    field_validation: str = "",
) -> tuple[JSON, bool, list[str]]:
    """Returns (object, created, warnings); only apply can create."""
    ctype = content_type.split(";")[0].strip().lower()
    current = core.store.get(rt.store_key, ns, name)
    if ctype == APPLY:
        return _apply(core, rt, ns, name, raw, current, subresource=subresource,
                      field_manager=field_manager, force=force, dry_run=dry_run,
                      field_validation=field_validation)
    if ctype not in (MERGE, JSONPATCH, STRATEGIC):
        raise ApiError(status(415, "UnsupportedMediaType",
                              f"the body of the request was in an unknown format - accepted "
                              f"media types include: {JSONPATCH}, {MERGE}, {APPLY}"
                              + ("" if rt.crd else f", {STRATEGIC}")))
    if ctype == STRATEGIC and rt.crd is not None:
        raise ApiError(status(415, "UnsupportedMediaType",
                              f"the body of the request was in an unknown format - accepted "
                              f"media types include: {JSONPATCH}, {MERGE}, {APPLY}"))
    if current is None:
        raise not_found(rt, name)
    try:
        body = json.loads(raw or b"null")
    except ValueError as exc:
        raise bad_request(f"error decoding patch: {exc}") from None
    current = as_version(rt, current)
    try:
        if ctype == MERGE:
            if not isinstance(body, dict):
                raise bad_request("merge patch must be a JSON object")
            new = patchlib.merge_patch(current, body)
        elif ctype == JSONPATCH:
            new = patchlib.json_patch(current, body)
        else:
            if not isinstance(body, dict):
                raise bad_request("strategic merge patch must be a JSON object")
            new = patchlib.strategic_merge_patch(current, body)
    except patchlib.PatchError as exc:
        code = exc.code
        raise ApiError(status(code, "BadRequest" if code == 400 else "Invalid"
                              if code == 422 else "Conflict", str(exc))) from None
    if not isinstance(new, dict):
        raise bad_request("patch produced a non-object document")
    # A resourceVersion left in the patched object is a precondition: it must be current.
    pmeta = new.get("metadata")
    meta: JSON = pmeta if isinstance(pmeta, dict) else {}
    if str(meta.get("resourceVersion", "")) != current["metadata"]["resourceVersion"]:
        raise conflict(rt, name)
    obj, warnings = core.update(rt, ns, name, new, subresource=subresource, dry_run=dry_run,
                                field_validation=field_validation)
    return obj, False, warnings


def _apply(
    core: ApiCore,
    rt: ResourceType,
    ns: str,
    name: str,
    raw: bytes,
    current: JSON | None,
    *,
    subresource: str,
    field_manager: str | None,
    force: bool,
    dry_run: bool,
    field_validation: str,
) -> tuple[JSON, bool, list[str]]:
    if not field_manager:
        raise bad_request("PATCH requests with apply content type require fieldManager "
                          "to be set")
    try:
        applied = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise bad_request(f"error decoding YAML: {exc}") from None
    if not isinstance(applied, dict):
        raise bad_request("apply configuration must be an object")
    if not applied.get("apiVersion") or not applied.get("kind"):
        raise bad_request("apiVersion and kind must be set in an apply configuration")
    check_type(core.registry, rt, applied)
    ameta = applied.setdefault("metadata", {})
    if ameta.get("name") not in (None, name):
        raise bad_request(f"the name of the object ({ameta['name']}) does not match the "
                          f"name on the URL ({name})")
    ameta["name"] = name
    if rt.namespaced:
        ameta["namespace"] = ns
    want_rv = ameta.pop("resourceVersion", None)
    try:
        merged = patchlib.server_side_apply(
            current, applied, manager=field_manager, force=force, now=core.now(),
            api_version=rt.api_version)
    except patchlib.ApplyConflict as exc:
        # errors.NewApplyConflict: the details carry only the causes (no name/kind).
        raise ApiError(status(409, "Conflict", str(exc), causes=exc.causes())) from None
    if current is None:
        if subresource:
            raise not_found(rt, name)
        merged["metadata"].pop("resourceVersion", None)
        obj, warnings = core.create(rt, ns if rt.namespaced else None, merged,
                                    dry_run=dry_run, field_validation=field_validation)
        return obj, True, warnings
    if want_rv and str(want_rv) != current["metadata"]["resourceVersion"]:
        raise conflict(rt, name)
    merged["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    obj, warnings = core.update(rt, ns, name, merged, subresource=subresource,
                                dry_run=dry_run, field_validation=field_validation)
    return obj, False, warnings
