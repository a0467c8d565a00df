"""The fake's own control API under /fake/ (what ``neuron-dra fake-apiserver`` users and
out-of-process tests drive): state and request counts, injected failures and latency,
dropped watches, compaction."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from .errors import status
from .rejections import bad_request, not_found_path
from .responses import decode_body, json_response
from .store import JSON, ApiError

if TYPE_CHECKING:
    from .server import FakeAPIServer


async def serve_control(api: FakeAPIServer, request: web.Request) -> web.Response:
    """GET /fake/state; POST /fake/fail, latency, drop-watches, compact, clear."""
    action = request.path[len("/fake/"):].strip("/")
    data: JSON = {}
    if request.method == "POST" and request.can_read_body:
        raw = await request.read()
        if raw.strip():
            parsed = decode_body(raw)
            if not isinstance(parsed, dict):
                raise bad_request("expected a JSON object")
            data = parsed
    if action == "state" and request.method == "GET":
        counts = {"/".join(k).lstrip("/"): api.store.count(k) for k in api.store.keys()}  # noqa: SIM118
        return json_response({"resourceVersion": api.store.rv,
                              "oldestResourceVersion": api.store.oldest_rv,
                              "objects": counts,
                              "watchers": sum(1 for _ in api.store.watchers()),
                              "requests": {f"{v} {r}": n
                                           for (v, r), n in api.request_counts.items()}})
    if request.method != "POST":
        raise ApiError(status(405, "MethodNotAllowed", "use POST"))
    if action == "fail":
        api.faults.fail_next(int(data.get("count", 1)), int(data.get("code", 500)),
                             verb=data.get("verb"), resource=data.get("resource"),
                             message=data.get("message"),
                             after_commit=bool(data.get("afterCommit", False)))
        return json_response({"pending": api.faults.pending_rules})
    if action == "latency":
        api.faults.set_latency(float(data.get("seconds", 0)), verb=data.get("verb"))
        return json_response({})
    if action == "drop-watches":
        return json_response({"dropped": api.faults.drop_watches()})
    if action == "compact":
        return json_response({"resourceVersion": api.faults.compact()})
    if action == "clear":
        api.faults.clear()
        return json_response({})
    raise not_found_path()
