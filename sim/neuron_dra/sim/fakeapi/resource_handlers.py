"""Requests on resources (/api/v1/..., /apis/GROUP/VERSION/...): the URL parsed into
resource, namespace, name, subresource and verb; request counting and injected faults;
then each verb handed to the ApiCore (or to lists and watches) and its answer encoded."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiohttp import web

from . import printing
from .discovery import discovery_document
from .errors import status
from .faults import RequestInfo, fault_status
from .lists import matcher, serve_list
from .patch_verb import patch
from .rejections import bad_request, method_not_allowed, not_found_path
from .resource_types import ResourceType
from .responses import (
    decode_body,
    json_response,
    obj_bytes,
    parse_bool,
    raw_response,
    wants_table,
    warning_headers,
)
from .store import ApiError
from .watches import serve_watch

if TYPE_CHECKING:
    from .server import FakeAPIServer


async def serve_resource(api: FakeAPIServer, request: web.Request) -> web.StreamResponse:
    """Everything under /api and /apis: discovery, or a verb on a resource (after the
    request is counted and injected faults and latency applied)."""
    segs = [s for s in request.path.split("/") if s]
    if not segs or segs[0] not in ("api", "apis"):
        raise not_found_path()
    if segs[0] == "api":
        if len(segs) <= 2:
            return _discovery(api, segs)
        group, version, rest = "", segs[1], segs[2:]
    else:
        if len(segs) <= 3:
            return _discovery(api, segs)
        group, version, rest = segs[1], segs[2], segs[3:]
    q = request.query
    watch = parse_bool(q.get("watch"))
    if rest[0] == "watch":  # deprecated /watch/ paths
        watch, rest = True, rest[1:]
    ns: str | None = None
    if (rest and rest[0] == "namespaces" and len(rest) >= 3
            and not (len(rest) == 3 and rest[2] in ("status", "finalize"))):
        ns, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        raise not_found_path()
    rt = api.registry.lookup(group, version, rest[0])
    if rt is None or (ns is not None and not rt.namespaced):
        raise not_found_path()
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else ""
    if sub and sub not in rt.subresources:
        raise not_found_path()
    if sub == "finalize":
        sub = ""
    method = request.method
    verb = {
        "GET": "watch" if watch else ("get" if name else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if name else "deletecollection",
    }.get(method, "")
    if not verb:
        raise method_not_allowed()
    body = await request.read() if method in ("POST", "PUT", "PATCH", "DELETE") else b""
    ctype = request.headers.get("Content-Type", "")
    if method in ("POST", "PUT") and body and "protobuf" in ctype:
        # JSON only: typed client-go writes (e.g. `kubectl create configmap`) send
        # protobuf, and an honest 415 beats a confusing decode error.
        raise ApiError(status(415, "UnsupportedMediaType",
                              'the body of the request was in an unknown format - accepted '
                              'media types include: application/json, application/yaml'))
    info = RequestInfo(verb=verb, method=method, path=request.path, group=group,
                       version=version, resource=rt.plural, subresource=sub, namespace=ns,
                       name=name, content_type=request.headers.get("Content-Type", ""),
                       body_bytes=body)
    api.request_counts[(verb, f"{rt.plural}/{sub}" if sub else rt.plural)] += 1
    delay = api.faults.latency_for(info)
    if delay > 0:
        await asyncio.sleep(delay)  # injected latency, on purpose
    rule = api.faults.take(info)
    if rule is not None and not rule.after_commit:
        st, headers = fault_status(rule.code, info, rule.message)
        return json_response(st, rule.code, headers)
    if rt.namespaced and ns is None and verb not in ("list", "watch", "create"):
        raise not_found_path()
    resp = await _handle(api, request, rt, ns, name, sub, verb, body)
    if rule is not None:
        st, headers = fault_status(rule.code, info, rule.message)
        return json_response(st, rule.code, headers)
    return resp


async def _handle(
    api: FakeAPIServer,
    request: web.Request,
    rt: ResourceType,
    ns: str | None,
    name: str | None,
    sub: str,
    verb: str,
    body: bytes,
) -> web.StreamResponse:
    """One verb on one resource (or collection), answered with the object it produced."""
    q = request.query
    core = api.core
    nsv = ns or ""
    dry_run = "All" in q.getall("dryRun", [])
    validation = q.get("fieldValidation", "")
    if verb == "watch":
        if name:  # legacy single-object watch
            fs = f"metadata.name={name}"
            extra = q.get("fieldSelector")
            return await serve_watch(api, request, rt, ns, fs + ("," + extra if extra else ""))
        return await serve_watch(api, request, rt, ns, q.get("fieldSelector"))
    if verb == "list":
        return await serve_list(api, request, rt, ns)
    if verb == "get":
        assert name is not None
        obj = core.get(rt, nsv, name)
        if wants_table(request):
            return json_response(printing.table(rt, [obj], None, q.get("includeObject"),
                                                api.clock()))
        return raw_response(obj_bytes(api.store, rt, obj))
    if verb == "create":
        data = decode_body(body)
        if name:
            if sub != "binding":
                raise method_not_allowed()
            return json_response(core.bind(rt, nsv, name, data), 201)
        made, warnings = core.create(rt, ns, data, dry_run=dry_run,
                                     field_validation=validation)
        return raw_response(obj_bytes(api.store, rt, made), 201, warning_headers(warnings))
    if verb == "update":
        assert name is not None
        updated, warnings = core.update(rt, nsv, name, decode_body(body), subresource=sub,
                                        dry_run=dry_run, field_validation=validation)
        return raw_response(obj_bytes(api.store, rt, updated), 200, warning_headers(warnings))
    if verb == "patch":
        assert name is not None
        force = parse_bool(q.get("force"))
        patched, created, warnings = patch(
            core, rt, nsv, name, request.headers.get("Content-Type", ""), body, subresource=sub,
            field_manager=q.get("fieldManager"), force=force, dry_run=dry_run,
            field_validation=validation)
        return raw_response(obj_bytes(api.store, rt, patched), 201 if created else 200,
                            warning_headers(warnings))
    return _delete(api, request, rt, ns, name, verb, body, dry_run)


def _delete(api: FakeAPIServer, request: web.Request, rt: ResourceType, ns: str | None,
            name: str | None, verb: str, body: bytes, dry_run: bool) -> web.Response:
    """DELETE of one object or of a collection; DeleteOptions come from the body, with
    propagationPolicy and gracePeriodSeconds also accepted as query parameters."""
    q = request.query
    core = api.core
    nsv = ns or ""
    opts = decode_body(body) if body.strip() else {}
    if not isinstance(opts, dict):
        raise bad_request("DeleteOptions must be an object")
    for key in ("propagationPolicy", "gracePeriodSeconds"):
        if key in q and key not in opts:
            opts[key] = q[key]
    if verb == "delete":
        assert name is not None
        obj, deleted = core.delete(rt, nsv, name, opts, dry_run=dry_run)
        # The real server answers 202 when deletion is pending and a policy was given.
        code = 202 if not deleted and opts.get("propagationPolicy") in (
            "Foreground", "Background") else 200
        return json_response(obj, code)
    # deletecollection
    match = matcher(rt, q.get("labelSelector"), q.get("fieldSelector"))
    page = api.store.page(rt.store_key, ns, match)
    victims = [e.obj["metadata"]["name"] for e in page.items]
    for victim in victims:
        try:
            core.delete(rt, nsv if rt.namespaced else "", victim, opts, dry_run=dry_run)
        except ApiError as exc:
            if exc.code != 404:
                raise
    return json_response({"kind": "Status", "apiVersion": "v1", "metadata": {},
                          "status": "Success"})


def _discovery(api: FakeAPIServer, segs: list[str]) -> web.Response:
    doc = discovery_document(api.registry, segs, f"{api.host}:{api.port}")
    if doc is None:
        raise not_found_path()
    return json_response(doc)
