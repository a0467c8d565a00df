"""The events of one watch response: JSON lines (:class:`WatchStream`) or the protobuf
encoding's length-prefixed frames (:class:`FramedWatchStream`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, NamedTuple, Self

import aiohttp

from ..errors import NetworkError, classify, from_status

JsonDict = dict[str, Any]

#: Largest watch-event line we accept. A ResourceSlice with 128 devices is ~60 KB; objects are
#: bounded by etcd's 1.5 MiB request limit, so 16 MiB leaves room without being unbounded.
MAX_LINE_BYTES = 16 * 1024 * 1024


class WatchEvent(NamedTuple):
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    object: JsonDict


class WatchStream:
    """Newline-delimited watch events from one HTTP response.

    Iterating yields :class:`WatchEvent`; an in-stream ``ERROR`` event is raised as its typed
    error (a :class:`~.errors.GoneError` for 410 Expired), and the end of the stream ends the
    iteration. Always close it (``async with``) so the connection is not leaked.
    """

    def __init__(self, response: aiohttp.ClientResponse, max_line_bytes: int) -> None:
        self._response = response
        self._max_line = max_line_bytes
        self._closed = False

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Drop the connection. Safe to call from another task to abort a blocked read."""
        if not self._closed:
            self._closed = True
            # close(), not release(): release() would try to reuse a half-read connection.
            self._response.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self

    async def __anext__(self) -> WatchEvent:
        while True:
            if self._closed:
                raise StopAsyncIteration
            try:
                line = await self._response.content.readuntil(b"\n", max_size=self._max_line)
            except aiohttp.ClientConnectionError as exc:
                if self._closed:
                    raise StopAsyncIteration from None
                raise NetworkError(f"watch stream broken: {exc}", reason="StreamError") from exc
            except (aiohttp.ClientPayloadError, TimeoutError) as exc:
                raise classify(exc) or NetworkError(str(exc)) from exc
            except ValueError as exc:  # LineTooLong
                raise NetworkError(f"watch event too large: {exc}", reason="LineTooLong") from exc
            if not line:
                self.close()
                raise StopAsyncIteration
            line = line.strip()
            if not line:
                continue
            try:
                event = json.loads(line)
                ev_type = str(event["type"])
                obj = event["object"]
            except (ValueError, KeyError, TypeError) as exc:
                raise NetworkError(
                    f"malformed watch event: {line[:200]!r}", reason="MalformedEvent"
                ) from exc
            if not isinstance(obj, dict):
                raise NetworkError(f"malformed watch event object: {line[:200]!r}")
            if ev_type == "ERROR":
                raise from_status(obj)
            return WatchEvent(ev_type, obj)


#: One protobuf watch frame -> (event type, object). Raises ``ValueError`` on a bad frame.
FrameDecoder = Callable[[bytes], tuple[str, JsonDict]]


class FramedWatchStream(WatchStream):
    """A protobuf watch: frames of a 4-byte big-endian length and that many bytes (a
    ``metav1.WatchEvent``), turned into events by ``decode``. Ends, fails and closes as
    :class:`WatchStream` does."""

    def __init__(
        self, response: aiohttp.ClientResponse, max_frame_bytes: int, decode: FrameDecoder
    ) -> None:
        super().__init__(response, max_frame_bytes)
        self._decode = decode

    async def _read(self, n: int) -> bytes | None:
        """``n`` bytes, or None at a clean end of the stream (before any of them)."""
        try:
            return await self._response.content.readexactly(n)
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise NetworkError("watch stream ended mid-frame", reason="StreamError") from exc
            return None
        except aiohttp.ClientConnectionError as exc:
            if self._closed:
                return None
            raise NetworkError(f"watch stream broken: {exc}", reason="StreamError") from exc
        except (aiohttp.ClientPayloadError, TimeoutError) as exc:
            raise classify(exc) or NetworkError(str(exc)) from exc

    async def __anext__(self) -> WatchEvent:
        if self._closed:
            raise StopAsyncIteration
        header = await self._read(4)
        if header is None:
            self.close()
            raise StopAsyncIteration
        size = int.from_bytes(header, "big")
        if size > self._max_line:
            raise NetworkError(f"watch frame too large: {size} bytes", reason="LineTooLong")
        frame = await self._read(size)
        if frame is None:
            raise NetworkError("watch stream ended mid-frame", reason="StreamError")
        try:
            ev_type, obj = self._decode(frame)
        except ValueError as exc:
            raise NetworkError(f"malformed watch frame: {exc}", reason="MalformedEvent") from exc
        if ev_type == "ERROR":
            raise from_status(obj)
        return WatchEvent(ev_type, obj)
