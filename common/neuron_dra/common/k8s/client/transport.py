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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Self

import aiohttp
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio.client import rest as k8s_rest

from ..errors import NetworkError, classify, from_response
from .resource_client import ResourceClient
from .resources import ApiResource
from .watch import MAX_LINE_BYTES, FrameDecoder, FramedWatchStream, WatchStream

JSON = "application/json"

#: The API server's protobuf encoding (built-in kinds only; CRDs are JSON).
PROTOBUF = "application/vnd.kubernetes.protobuf"


def go_json(obj: Any) -> str:
    """``obj`` as JSON the way Go's ``encoding/json`` writes it: compact, map keys sorted,
    UTF-8, ``<``, ``>``, ``&``, U+2028 and U+2029 escaped (only strings can hold them).

    Why it matters: the API server keeps an opaque config's ``parameters`` (a
    ``RawExtension``) as the exact bytes it was sent. A server-side apply to a claim's status
    runs the live object through its structured form and back, which re-encodes them as Go
    does, and then checks that ``status.allocation`` is unchanged byte for byte: with
    Python's default spaces it was not, and every ``status.devices`` report on a claim from
    our generated templates was refused ("field is immutable"). A float with a whole value
    would still differ (Python's ``1.0`` against Go's ``1``), as would large exponents; the
    configs we write carry no floats.
    """
    text = json.dumps(obj, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    for char, escaped in _GO_ESCAPES:
        if char in text:
            text = text.replace(char, escaped)
    return text


_GO_ESCAPES = (
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("&", "\\u0026"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)


class _GoJsonBodies:
    """What ``kubernetes_asyncio``'s REST layer finds as its ``json`` module: it serializes
    every JSON request body with ``json.dumps(body)`` and offers no other hook."""

    dumps = staticmethod(go_json)
    loads = staticmethod(json.loads)


k8s_rest.json = _GoJsonBodies  # type: ignore[attr-defined]

#: Turns a protobuf ``Status`` body into the dict the typed errors read.
StatusDecoder = Callable[[bytes], dict[str, Any]]


class RawResponse(NamedTuple):
    """A response body as it came, with its media type (``application/json``, or
    ``application/vnd.kubernetes.protobuf`` when that was accepted and the kind has it)."""

    content_type: str
    body: bytes


def media_type(content_type: str | None) -> str:
    """``application/vnd.kubernetes.protobuf;stream=watch`` -> its media type, lower case."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def decode_json(body: bytes, what: str, *, reason: str = "") -> Any:
    """``body`` as JSON; a :class:`NetworkError` saying ``what`` is not JSON otherwise."""
    try:
        return json.loads(body)
    except ValueError as exc:
        raise NetworkError(f"{what} is not JSON: {body[:200]!r}", reason=reason) from exc


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
        accept: str = JSON,
        status_decoder: StatusDecoder | None = None,
    ) -> aiohttp.ClientResponse:
        headers = {"Accept": accept}
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
            error_body: Any = raw
            if status_decoder is not None and media_type(resp.content_type) == PROTOBUF:
                try:
                    error_body = status_decoder(raw)
                except ValueError:
                    error_body = None  # typed by the HTTP status alone
            raise from_response(
                resp.status, error_body, resp.headers, default_reason=resp.reason or ""
            )
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
        raw = (
            await self._unary(
                method,
                path,
                query=query,
                body=body,
                content_type=content_type,
                request_timeout=request_timeout,
            )
        ).body
        if not raw:
            return None
        return decode_json(raw, f"{method} {path}: response")

    async def request_raw(
        self,
        path: str,
        *,
        query: QueryParams | None = None,
        accept: str = JSON,
        status_decoder: StatusDecoder | None = None,
        request_timeout: float | None = None,
    ) -> RawResponse:
        """One GET whose body is returned undecoded, with its media type: the caller decodes
        by what the server answered (it may answer JSON to an ``Accept`` naming protobuf
        first). ``status_decoder`` reads a protobuf error body."""
        return await self._unary(
            "GET",
            path,
            query=query,
            request_timeout=request_timeout,
            accept=accept,
            status_decoder=status_decoder,
        )

    async def _unary(
        self,
        method: str,
        path: str,
        *,
        query: QueryParams | None,
        body: Any = None,
        content_type: str | None = None,
        request_timeout: float | None,
        accept: str = JSON,
        status_decoder: StatusDecoder | None = None,
    ) -> RawResponse:
        """Send one unary call and read its whole body (read failures typed as the send's)."""
        resp = await self._send(
            method,
            path,
            query=query,
            body=body,
            content_type=content_type,
            client_timeout=self.timeouts.unary(request_timeout),
            accept=accept,
            status_decoder=status_decoder,
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
        return RawResponse(media_type(resp.content_type), raw)

    async def stream(
        self,
        path: str,
        *,
        query: QueryParams,
        server_timeout_seconds: float,
        accept: str = JSON,
        frame_decoder: FrameDecoder | None = None,
        status_decoder: StatusDecoder | None = None,
    ) -> WatchStream:
        """Open a streaming GET (a watch). The caller closes the returned stream.

        With ``accept`` naming protobuf, a protobuf answer is read as length-prefixed frames,
        each turned into an event by ``frame_decoder``; a JSON answer as JSON lines.
        """
        resp = await self._send(
            "GET",
            path,
            query=query,
            body=None,
            content_type=None,
            client_timeout=self.timeouts.watch(server_timeout_seconds),
            accept=accept,
            status_decoder=status_decoder,
        )
        if media_type(resp.content_type) == PROTOBUF:
            if frame_decoder is None:
                resp.close()
                raise NetworkError(f"GET {path}: protobuf watch without a frame decoder")
            return FramedWatchStream(resp, self.max_line_bytes, frame_decoder)
        return WatchStream(resp, self.max_line_bytes)
