"""How requests come in and objects go out over HTTP: body decoding, query booleans, JSON
responses (objects spliced in from the store's cached encodings), warnings, errors."""

from __future__ import annotations

import json
from typing import Any

import yaml
from aiohttp import web

from .core import as_version
from .errors import status
from .resource_types import ResourceType
from .store import JSON, ApiError, Entry, Store, encode


def parse_bool(value: str | None) -> bool:
    """Go's strconv.ParseBool: kubernetes_asyncio sends Python's ``True``."""
    return value is not None and value.strip() in ("1", "t", "T", "true", "TRUE", "True")


def decode_body(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError as exc:
        # YAML is what kubectl never sends but humans with curl do; accept it too.
        try:
            return yaml.safe_load(body)
        except yaml.YAMLError:
            raise ApiError(status(400, "BadRequest",
                                  f"couldn't get version/kind; json parse error: {exc}")) from None


def wants_table(request: web.Request) -> bool:
    return "as=Table" in request.headers.get("Accept", "")


def warning_headers(warnings: list[str]) -> dict[str, str] | None:
    if not warnings:
        return None
    return {"Warning": ", ".join(f'299 - {json.dumps(w)}' for w in warnings)}


def json_response(obj: Any, code: int = 200, headers: dict[str, str] | None = None
                  ) -> web.Response:
    return raw_response(encode(obj), code, headers)


def raw_response(body: bytes, code: int = 200, headers: dict[str, str] | None = None
                 ) -> web.Response:
    return web.Response(body=body, status=code, content_type="application/json",
                        headers=headers)


def error_response(exc: ApiError) -> web.Response:
    return json_response(exc.body, exc.code, exc.headers or None)


def obj_bytes(store: Store, rt: ResourceType, obj: JSON) -> bytes:
    """The encoding of ``obj``, reusing (and filling) the store's cache when it is the
    stored version: every write is then encoded once, for its response and all lists."""
    meta = obj.get("metadata") or {}
    entry = store.entry(rt.store_key, meta.get("namespace", ""), meta.get("name", ""))
    if entry is not None and entry.obj is obj:
        return entry_raw(rt, entry)
    return encode(as_version(rt, obj))


def entry_raw(rt: ResourceType, e: Entry) -> bytes:
    """A stored entry's cached encoding (re-encoded only when read at another version)."""
    if e.obj.get("apiVersion") == rt.api_version:
        return e.raw
    return encode(as_version(rt, e.obj))
