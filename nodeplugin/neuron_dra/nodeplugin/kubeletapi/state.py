"""In-memory state the servicers share with the rest of the plugin, free of gRPC.

``RegistrationState`` is what the kubelet last told us (the readiness probe reads it);
``HealthBoard`` is the device health we stream to it. The plugin builds both before the gRPC
stack is imported (it publishes its ResourceSlice first and serves afterwards), so this
module must not import ``grpc``, protobuf or generated code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from .model import DeviceHealthReport


class RegistrationState:
    """What the kubelet last told us; the readiness probe reads it."""

    def __init__(self) -> None:
        #: Set while the kubelet considers us registered.
        self.registered = asyncio.Event()
        #: The kubelet's error from the last failed registration ("" after a success).
        self.last_error = ""
        self.info_requests = 0
        self.notifications = 0

    def record(self, registered: bool, error: str) -> None:
        self.notifications += 1
        if registered:
            self.last_error = ""
            self.registered.set()
        else:
            # Usually a configuration problem on our side (driver name, endpoint path not
            # valid on the host, no DRA version the kubelet supports): say so loudly.
            self.last_error = error or "the kubelet rejected the plugin without a reason"
            self.registered.clear()


class HealthBoard:
    """In-memory ``HealthSource``: a health monitor writes, streams read.

    Not thread-safe: call it from the event loop that serves the streams.
    """

    def __init__(self, reports: Iterable[DeviceHealthReport] = ()) -> None:
        self._reports = {(r.pool_name, r.device_name): r for r in reports}
        self._generation = 0
        # Replaced on every change, so one set() wakes exactly the current waiters.
        self._changed = asyncio.Event()

    @property
    def generation(self) -> int:
        return self._generation

    def snapshot(self) -> list[DeviceHealthReport]:
        return list(self._reports.values())

    async def changed(self, since: int) -> None:
        while self._generation <= since:
            await self._changed.wait()

    def put(self, report: DeviceHealthReport) -> None:
        """Add or replace one device's report."""
        key = (report.pool_name, report.device_name)
        if self._reports.get(key) != report:
            self._reports[key] = report
            self._bump()

    def replace(self, reports: Iterable[DeviceHealthReport]) -> None:
        """Set the complete list (devices not in it are no longer reported)."""
        new = {(r.pool_name, r.device_name): r for r in reports}
        if new != self._reports:
            self._reports = new
            self._bump()

    def _bump(self) -> None:
        self._generation += 1
        event, self._changed = self._changed, asyncio.Event()
        event.set()
