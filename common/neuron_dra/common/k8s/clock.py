"""Injectable time for everything in this package that waits or timestamps.

Work-queue backoff, reflector backoff and watchdog, and leader-election lease expiry all depend
on time. Tests drive them with :class:`FakeClock` so they are deterministic and never sleep for
real; production code uses :class:`SystemClock`.

``now()`` is monotonic (for durations and expiry); ``wall()`` is UTC wall time (only for
timestamps that are written into API objects, such as a Lease's ``renewTime``).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds; only differences are meaningful."""
        ...

    def wall(self) -> datetime:
        """Timezone-aware UTC wall time."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that only moves when a test calls :meth:`advance`.

    Sleepers are woken in deadline order. :meth:`wait_for_sleepers` lets a test wait until the
    code under test has actually reached its sleep, so the test never races the code it drives.
    """

    def __init__(self, start: float = 1000.0, wall_start: datetime | None = None) -> None:
        self._now = start
        self._start = start
        self._wall_start = wall_start or datetime(2026, 1, 1, tzinfo=UTC)
        self._heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._changed: asyncio.Event | None = None

    def now(self) -> float:
        return self._now

    def wall(self) -> datetime:
        return self._wall_start + timedelta(seconds=self._now - self._start)

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            # Still a scheduling point, like asyncio.sleep(0).
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (self._now + seconds, next(self._seq), fut))
        self._notify()
        await fut

    @property
    def sleepers(self) -> int:
        """Number of coroutines currently sleeping on this clock."""
        return sum(1 for _, _, f in self._heap if not f.done())

    def next_deadline(self) -> float | None:
        live = [d for d, _, f in self._heap if not f.done()]
        return min(live) if live else None

    async def wait_for_sleepers(self, n: int = 1) -> None:
        """Return once at least ``n`` coroutines are blocked in :meth:`sleep`."""
        while self.sleepers < n:
            if self._changed is None:
                self._changed = asyncio.Event()
            self._changed.clear()
            await self._changed.wait()

    async def advance(self, seconds: float) -> None:
        """Move time forward, waking (in order) every sleeper whose deadline has passed.

        Yields to the loop after each wake-up so woken coroutines run before the next one is
        woken, like real time passing.
        """
        target = self._now + seconds
        while self._heap and self._heap[0][0] <= target:
            deadline, _, fut = heapq.heappop(self._heap)
            if fut.done():  # cancelled sleeper
                continue
            self._now = max(self._now, deadline)
            fut.set_result(None)
            for _ in range(5):
                await asyncio.sleep(0)
        self._now = target
        await asyncio.sleep(0)


class InstantClock:
    """A clock whose sleeps return at once (after one scheduling point) but advance time and
    are recorded: for asserting retry and backoff schedules without waiting them out."""

    def __init__(self, start: float = 0.0, wall_start: datetime | None = None) -> None:
        self.t = start
        self._start = start
        self._wall_start = wall_start or datetime(2026, 1, 1, tzinfo=UTC)
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    def wall(self) -> datetime:
        return self._wall_start + timedelta(seconds=self.t - self._start)

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += max(0.0, seconds)
        await asyncio.sleep(0)
