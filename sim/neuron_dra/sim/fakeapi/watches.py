"""WATCH: the initial events or those since a resourceVersion (410 when compacted), then
live events with selector transitions (ADDED/DELETED as objects enter or leave the
selection), bookmarks, timeouts, and one-row Tables for ``kubectl get -w``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp import web

from . import printing
from .core import as_version
from .errors import FORBIDDEN, FieldError, status
from .lists import matcher
from .rejections import bad_request, invalid
from .resource_types import ResourceType
from .responses import entry_raw, parse_bool, wants_table
from .store import JSON, Entry, Event, Expired, Watcher, encode

if TYPE_CHECKING:
    from .server import FakeAPIServer

BytesList = list[bytes]


async def serve_watch(api: FakeAPIServer, request: web.Request, rt: ResourceType,
                      ns: str | None, field_selector: str | None) -> web.StreamResponse:
    """A watch: the initial state or the events since a resourceVersion, then live events
    (with bookmarks) until the timeout, a 410, or the client going away."""
    q = request.query
    match = matcher(rt, q.get("labelSelector"), field_selector)
    send_initial = parse_bool(q.get("sendInitialEvents"))
    bookmarks = parse_bool(q.get("allowWatchBookmarks"))
    rv_param = q.get("resourceVersion", "")
    if send_initial and q.get("resourceVersionMatch") != "NotOlderThan":
        raise invalid(rt, "", [FieldError(
            "resourceVersionMatch", FORBIDDEN,
            "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan")])
    timeout: float | None = None
    if q.get("timeoutSeconds"):
        try:
            timeout = float(q["timeoutSeconds"])
        except ValueError:
            raise bad_request("invalid timeoutSeconds") from None
    start_rv: int | None = None
    if rv_param not in ("", "0") and not send_initial:
        try:
            start_rv = int(rv_param)
        except ValueError:
            raise bad_request(f"invalid resource version: {rv_param}") from None

    # Register and take the starting point in one synchronous step: nothing can be
    # written in between, so the stream has no gap and no duplicate.
    key = rt.store_key
    render = _renderer(api, request, rt)
    watcher = api.store.add_watcher(key, ns)
    lines: BytesList = []
    expired: Expired | None = None
    if start_rv is None:
        lines = [render("ADDED", e) for e in api.store.iter_entries(key, ns)
                 if match is None or match(e.obj)]
        if send_initial:
            lines.append(_bookmark(rt, api.store.rv, initial_end=True))
    else:
        try:
            for ev in api.store.events_since(key, start_rv):
                seen = _translate(ev, ns, match)
                if seen is not None:
                    lines.append(render(*seen))
        except Expired as exc:
            expired = exc
    resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
    try:
        await resp.prepare(request)
        if expired is not None:
            api.store.remove_watcher(watcher)
            err = status(410, "Expired", str(expired))
            await resp.write(encode({"type": "ERROR", "object": err}) + b"\n")
            return resp
        if lines:
            await resp.write(b"".join(lines))
        await _stream(api, resp, rt, watcher, match, timeout, bookmarks, render,
                      start_rv or 0)
    except ConnectionResetError:
        return resp  # the client went away; nothing left to tell it
    finally:
        api.store.remove_watcher(watcher)
    return resp


async def _stream(api: FakeAPIServer, resp: web.StreamResponse, rt: ResourceType,
                  watcher: Watcher, match: Callable[[JSON], bool] | None,
                  timeout_s: float | None, bookmarks: bool,
                  render: Callable[[str, Entry], bytes], min_rv: int = 0) -> None:
    """Send live events. A watch started at a version the store has not reached yet
    (``min_rv``) gets only later events, like the watch cache's per-watcher filter."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    while True:
        wait_for: float | None = None
        if deadline is not None:
            wait_for = deadline - loop.time()
            if wait_for <= 0:
                return
        if bookmarks:
            wait_for = (api.bookmark_interval if wait_for is None
                        else min(wait_for, api.bookmark_interval))
        try:
            async with asyncio.timeout(wait_for):
                await watcher.wait()
        except TimeoutError:
            if deadline is not None and loop.time() >= deadline:
                return
            # Queue empty ⇒ everything up to the store's version has been sent.
            if bookmarks and watcher.pending() == 0 and api.store.rv >= min_rv:
                await resp.write(_bookmark(rt, api.store.rv))
            continue
        events = watcher.drain()
        if events:
            out = [render(*seen) for ev in events
                   if ev.rv > min_rv
                   and (seen := _translate(ev, None, match)) is not None]
            if out:
                await resp.write(b"".join(out))
        if watcher.closed is not None:
            return


def _renderer(api: FakeAPIServer, request: web.Request, rt: ResourceType
              ) -> Callable[[str, Entry], bytes]:
    """How watch events are encoded: raw objects, or one-row Tables for ``kubectl get -w``
    (column definitions only in the first event, as the real server does)."""
    if not wants_table(request):
        return lambda typ, entry: _line(rt, typ, entry)
    include = request.query.get("includeObject")
    first = True

    def table_line(typ: str, entry: Entry) -> bytes:
        nonlocal first
        table = printing.table(rt, [as_version(rt, entry.obj)],
                               entry.obj["metadata"].get("resourceVersion"), include,
                               api.clock())
        if not first:
            table["columnDefinitions"] = []
        first = False
        return encode({"type": typ, "object": table}) + b"\n"

    return table_line


def _line(rt: ResourceType, typ: str, entry: Entry) -> bytes:
    return b'{"type":"' + typ.encode() + b'","object":' + entry_raw(rt, entry) + b"}\n"


def _bookmark(rt: ResourceType, rv: int, initial_end: bool = False) -> bytes:
    meta: JSON = {"resourceVersion": str(rv)}
    if initial_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return encode({"type": "BOOKMARK", "object": {"kind": rt.kind,
                                                  "apiVersion": rt.api_version,
                                                  "metadata": meta}}) + b"\n"


def _translate(ev: Event, ns: str | None, match: Callable[[JSON], bool] | None
               ) -> tuple[str, Entry] | None:
    """One store event as this watcher sees it (selector transitions become ADDED/DELETED)."""
    if ns is not None and ev.namespace != ns:
        return None
    if match is None:
        return ev.type, ev.entry
    new_ok = match(ev.obj)
    if ev.type == "ADDED":
        return ("ADDED", ev.entry) if new_ok else None
    old_ok = ev.old is not None and match(ev.old)
    if ev.type == "DELETED":
        return ("DELETED", ev.entry) if old_ok else None
    if new_ok and old_ok:
        return "MODIFIED", ev.entry
    if new_ok:
        return "ADDED", ev.entry
    if old_ok:
        return "DELETED", ev.entry
    return None
