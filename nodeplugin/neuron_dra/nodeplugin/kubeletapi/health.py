"""The ``DRAResourceHealth`` stream (KEP-4680), one servicer per version served (v1 and
v1alpha1, the same messages); the board it reads is ``state.HealthBoard``.

The kubelet keeps one ``NodeWatchResources`` stream per plugin and treats every message
as the complete device list. It marks a device Unknown when it has not been reported for
its timeout (30 s by default) and clears everything when the stream ends, so we send the
full list on connect, on every change, and again every ``resend_interval`` seconds, and give
each device a timeout of a few resend intervals (1.35+ kubelets read it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import AsyncIterator
from typing import Any

from ._proto import HealthCodec, Message
from .model import DEFAULT_RESEND_INTERVAL, DeviceHealthReport, HealthSource

#: A device's timeout in resend intervals: two resends may be lost before it turns Unknown.
TIMEOUT_RESENDS = 3

log = logging.getLogger(__name__)


class HealthServicer:
    def __init__(
        self,
        codec: HealthCodec,
        source: HealthSource,
        stopping: asyncio.Event,
        *,
        resend_interval: float = DEFAULT_RESEND_INTERVAL,
    ) -> None:
        if resend_interval <= 0:
            raise ValueError(f"resend_interval must be positive, got {resend_interval!r}")
        self._codec = codec
        self._source = source
        self._stopping = stopping
        self._resend_interval = resend_interval
        self.active_streams = 0

    # Method name fixed by the generated handler table.

    async def NodeWatchResources(self, request: Message, context: Any) -> AsyncIterator[Message]:
        """Ends (OK) when the server stops; a client cancel cancels this generator."""
        self.active_streams += 1
        log.info(
            "health stream opened (%s)",
            self._codec.registration_name,
            extra={"peer": str(context.peer())},
        )
        try:
            while not self._stopping.is_set():
                # Read the number and the list together: nothing can change in between
                # (no await), so waiting for "newer than generation" cannot miss a change.
                generation = self._source.generation
                yield self._codec.watch_response(self._with_timeout(self._source.snapshot()))
                await self._next_change(generation)
        finally:
            self.active_streams -= 1
            log.info("health stream closed")

    def _with_timeout(self, reports: list[DeviceHealthReport]) -> list[DeviceHealthReport]:
        timeout = math.ceil(TIMEOUT_RESENDS * self._resend_interval)
        return [r if r.timeout_seconds else dataclasses.replace(r, timeout_seconds=timeout)
                for r in reports]  # fmt: skip

    async def _next_change(self, generation: int) -> None:
        """Returns on a change, the resend interval, or server stop, whichever is first."""
        changed = asyncio.ensure_future(self._source.changed(generation))
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait(
                {changed, stopping},
                timeout=self._resend_interval,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            # Not awaited: awaiting a cancelled helper could swallow a cancellation of
            # this stream itself (client gone), which must propagate.
            changed.cancel()
            stopping.cancel()
        if changed.done() and not changed.cancelled():
            changed.result()  # a failing source ends the stream visibly instead of spinning
