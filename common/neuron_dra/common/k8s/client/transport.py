"""One request to the API server: timeouts, the raw JSON call, and the streaming GET of a
watch, through a ``kubernetes_asyncio`` ``ApiClient`` (:class:`KubeClient`).

Every call uses ``call_api(..., _preload_content=False)`` and returns plain JSON: caches hold
thousands of ResourceSlices, and deserializing them into the generated models is several
times slower than ``json.loads`` (1.25 s against 0.22 s for 1,000 slices).
``kubernetes_asyncio`` has no default timeout; every request here gets one from
:class:`Timeouts` unless the caller passes its own. Errors come out as the typed errors of
:mod:`neuron_dra.common.k8s.errors`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import aiohttp
from kubernetes_asyncio import client as k8s_client

from ..errors import NetworkError, classify, from_response
from .resource_client import ResourceClient
from .resources import ApiResource
from .watch import MAX_LINE_BYTES, WatchStream


@dataclass(frozen=True)
class Timeouts:
    """Client-side timeouts. aiohttp's default is *no* timeout at all, so we always set one.

    ``request`` bounds a whole unary call including reading the body. Watches have no total
    bound (they are long-lived by design); instead the socket read timeout is the server-side
    ``timeoutSeconds`` plus ``watch_margin``, so a server that never closes the stream as
    promised is still noticed.
    """

    connect: float = 5.0
    request: float = 30.0
    watch_margin: float = 30.0

    def __post_init__(self) -> None:
        if min(self.connect, self.request, self.watch_margin) <= 0:
            raise ValueError("timeouts must be positive")

    def unary(self, override: float | None = None) -> aiohttp.ClientTimeout:
        total = self.request if override is None else override
        return aiohttp.ClientTimeout(
            total=total, connect=self.connect, sock_connect=self.connect, sock_read=total
        )

    def watch(self, server_timeout_seconds: float) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(
            total=None,
            connect=self.connect,
            sock_connect=self.connect,
            sock_read=server_timeout_seconds + self.watch_margin,
        )


DEFAULT_TIMEOUTS = Timeouts()

QueryParams = Sequence[tuple[str, str]]


@dataclass
class KubeClient:
    """Raw JSON requests through a ``kubernetes_asyncio`` ``ApiClient``.

    ``owned=True`` means closing this closes the ``ApiClient`` (and its aiohttp session).
    """

    api_client: k8s_client.ApiClient
    timeouts: Timeouts = DEFAULT_TIMEOUTS
    owned: bool = False
    max_line_bytes: int = MAX_LINE_BYTES
    _resources: dict[ApiResource, ResourceClient] = field(default_factory=dict, repr=False)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self.owned:
            await self.api_client.close()

    def resource(self, res: ApiResource) -> ResourceClient:
        """The raw-dict client for one kind (cached, cheap to call repeatedly)."""
        rc = self._resources.get(res)
        if rc is None:
            rc = self._resources[res] = ResourceClient(self, res)
        return rc

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: QueryParams | None,
        body: Any,
        content_type: str | None,
        client_timeout: aiohttp.ClientTimeout,
    ) -> aiohttp.ClientResponse:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        try:
            resp: aiohttp.ClientResponse = await self.api_client.call_api(
                path,
                method,
                query_params=list(query or []),
                header_params=headers,
                body=body,
                # Adds the bearer token (and runs the in-cluster token refresh hook) when set.
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=client_timeout,
            )
        except Exception as exc:
            err = classify(exc)
            if err is None:
                raise
            raise err from exc
        if resp.status >= 300:
            try:
                raw = await resp.read()
            except (aiohttp.ClientError, TimeoutError):
                raw = b""
            finally:
                resp.release()
            raise from_response(resp.status, raw, resp.headers, default_reason=resp.reason or "")
        return resp

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: QueryParams | None = None,
        body: Any = None,
        content_type: str | None = None,
        request_timeout: float | None = None,
    ) -> Any:
        """One unary call; returns the decoded JSON body (None for an empty body)."""
        resp = await self._send(
            method,
            path,
            query=query,
            body=body,
            content_type=content_type,
            client_timeout=self.timeouts.unary(request_timeout),
        )
        try:
            raw = await resp.read()
        except Exception as exc:
            err = classify(exc)
            if err is None:
                raise
            raise err from exc
        finally:
            resp.release()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise NetworkError(f"{method} {path}: response is not JSON: {raw[:200]!r}") from exc

    async def stream(
        self, path: str, *, query: QueryParams, server_timeout_seconds: float
    ) -> WatchStream:
        """Open a streaming GET (a watch). The caller closes the returned stream."""
        resp = await self._send(
            "GET",
            path,
            query=query,
            body=None,
            content_type=None,
            client_timeout=self.timeouts.watch(server_timeout_seconds),
        )
        return WatchStream(resp, self.max_line_bytes)
