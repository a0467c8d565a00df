"""LIST: selectors, ListOptions validation, lists at a resourceVersion (with the watch
cache's bounded wait for one not reached yet), paging, Tables, and the list body spliced
together from the store's cached per-object encodings."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from . import printing
from .core import as_version
from .errors import FORBIDDEN, FieldError, invalid_status, status
from .rejections import bad_request
from .resource_types import ResourceType
from .responses import entry_raw, json_response, raw_response, wants_table
from .selectors import SelectorError, combine, field_matcher, label_matcher
from .store import JSON, ApiError, Expired, encode

if TYPE_CHECKING:
    from .server import FakeAPIServer


def matcher(rt: ResourceType, labels: str | None, fields: str | None
            ) -> Callable[[JSON], bool] | None:
    """The label and field selectors of a list, watch or deletecollection (400 if bad)."""
    try:
        return combine(label_matcher(labels), field_matcher(fields, rt.allowed_fields()))
    except SelectorError as exc:
        raise bad_request(str(exc)) from None


async def serve_list(api: FakeAPIServer, request: web.Request, rt: ResourceType,
                     ns: str | None) -> web.Response:
    """GET of a collection: paged, filtered, at a resourceVersion, or as a Table."""
    q = request.query
    match = matcher(rt, q.get("labelSelector"), q.get("fieldSelector"))
    limit_s = q.get("limit")
    try:
        limit = int(limit_s) if limit_s else None
    except ValueError:
        raise bad_request(f"invalid limit: {limit_s}") from None
    token = q.get("continue") or None
    at_rv = await _list_rv(api, q)
    try:
        snap = api.store.page(rt.store_key, ns, match, limit if limit and limit > 0 else None,
                              token, at_rv=at_rv)
    except Expired:
        if at_rv is not None:
            raise ApiError(status(410, "Expired", "The resourceVersion for the provided "
                                  "list is too old.")) from None
        raise ApiError(status(
            410, "Expired",
            "The provided continue parameter is too old to display a consistent list "
            "result. You can start a new list without the continue parameter.")) from None
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    if wants_table(request):
        objs = [as_version(rt, e.obj) for e in snap.items]
        table = printing.table(rt, objs, str(snap.rv), q.get("includeObject"), api.clock())
        if snap.continue_token:
            table["metadata"]["continue"] = snap.continue_token
        return json_response(table)
    meta: JSON = {"resourceVersion": str(snap.rv)}
    if snap.continue_token:
        meta["continue"] = snap.continue_token
        if snap.remaining is not None:
            meta["remainingItemCount"] = snap.remaining
    head = encode({"kind": rt.list_kind, "apiVersion": rt.api_version, "metadata": meta})
    # Splice the cached per-object encodings in: one list of 10k objects costs a join.
    parts = [entry_raw(rt, e) for e in snap.items]
    return raw_response(head[:-1] + b',"items":[' + b",".join(parts) + b"]}")


async def _list_rv(api: FakeAPIServer, q: Any) -> int | None:
    """The resourceVersion a list must be served at (None: the current state), after
    ListOptions validation and, for a version the store has not reached yet, the
    watch cache's bounded wait ("Too large resource version")."""
    rv_s = q.get("resourceVersion", "")
    rv_match = q.get("resourceVersionMatch", "")
    errs: list[FieldError] = []
    if rv_match:
        if not rv_s:
            errs.append(FieldError("resourceVersionMatch", FORBIDDEN,
                                   "resourceVersionMatch is forbidden unless "
                                   "resourceVersion is provided"))
        if q.get("continue"):
            errs.append(FieldError("resourceVersionMatch", FORBIDDEN,
                                   "resourceVersionMatch is forbidden when continue is "
                                   "provided"))
        if rv_match not in ("Exact", "NotOlderThan"):
            errs.append(FieldError("resourceVersionMatch", "FieldValueNotSupported",
                                   'supported values: "Exact", "NotOlderThan", ""',
                                   rv_match, True))
        if rv_match == "Exact" and rv_s == "0":
            errs.append(FieldError("resourceVersionMatch", FORBIDDEN,
                                   'resourceVersionMatch "exact" is forbidden for '
                                   'resourceVersion "0"'))
    if "sendInitialEvents" in q:
        errs.append(FieldError("sendInitialEvents", FORBIDDEN,
                               "sendInitialEvents is forbidden for list"))
    if errs:
        raise ApiError(invalid_status("ListOptions", "meta.k8s.io", "", errs))
    if q.get("continue"):
        if rv_s not in ("", "0"):
            raise bad_request("specifying resource version is not allowed when "
                              "using continue")
        return None
    if rv_s in ("", "0"):
        return None
    try:
        rv = int(rv_s)
    except ValueError:
        raise bad_request(f"invalid resource version: {rv_s}") from None
    await _wait_for_rv(api, rv)
    return rv if rv_match == "Exact" else None


async def _wait_for_rv(api: FakeAPIServer, rv: int) -> None:
    """Block (like the watch cache, for at most ``too_large_rv_wait`` seconds) until the
    store reaches ``rv``; then 504 with the ResourceVersionTooLarge cause client-go
    reflectors look for."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + api.too_large_rv_wait
    while api.store.rv < rv:
        if loop.time() >= deadline:
            body = status(504, "Timeout",
                          f"Timeout: Too large resource version: {rv}, current: "
                          f"{api.store.rv}",
                          causes=[{"reason": "ResourceVersionTooLarge",
                                   "message": "Too large resource version"}],
                          retry_after_seconds=1)
            raise ApiError(body)
        await asyncio.sleep(0.01)
