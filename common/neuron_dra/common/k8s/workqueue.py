"""A de-duplicating, rate-limited work queue with client-go's semantics, for asyncio.

The guarantees controllers rely on:

- A key waiting in the queue is there once, however often it is added (``dirty`` set).
- A key is never handed to two workers at once: adding a key that is being processed only
  marks it dirty, and ``done`` re-queues it, so the change is processed after the current run.
- ``add_rate_limited`` delays a key by its own exponential backoff (and optionally a global
  token bucket); ``forget`` resets the key's backoff after a success.

Time comes from an injected :class:`~.clock.Clock`, so tests drive delays deterministically.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Hashable
from typing import Generic, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge

from .clock import Clock, SystemClock

K = TypeVar("K", bound=Hashable)


class QueueShutDown(Exception):
    """``get`` on a queue that is shut down and empty."""


# --- rate limiters --------------------------------------------------------------------------


class RateLimiter(Protocol[K]):  # type: ignore[misc]
    def when(self, key: K) -> float:
        """Delay (seconds) before ``key`` may be retried; records one more failure."""
        ...

    def forget(self, key: K) -> None: ...

    def num_requeues(self, key: K) -> int: ...


class ExponentialBackoff(Generic[K]):
    """Per-key ``base * 2**failures``, capped."""

    def __init__(self, base: float = 0.005, cap: float = 1000.0) -> None:
        if base <= 0 or cap < base:
            raise ValueError("need 0 < base <= cap")
        self.base = base
        self.cap = cap
        self._failures: dict[K, int] = {}

    def when(self, key: K) -> float:
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        # Avoid computing huge powers once the cap is reached.
        if n >= 64:
            return self.cap
        return min(self.cap, self.base * float(2**n))

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def num_requeues(self, key: K) -> int:
        return self._failures.get(key, 0)


class TokenBucket(Generic[K]):
    """Overall rate limit shared by all keys: ``qps`` sustained, ``burst`` at once.

    Each ``when`` reserves a token and returns how long until that token exists, so a burst of
    failures is spread out instead of hammering the API server together.
    """

    def __init__(self, qps: float, burst: int, clock: Clock) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError("need qps > 0 and burst >= 1")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock.now()

    def when(self, key: K) -> float:
        now = self._clock.now()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
        self._last = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def forget(self, key: K) -> None:
        pass

    def num_requeues(self, key: K) -> int:
        return 0


class MaxOf(Generic[K]):
    """The largest delay of several limiters (client-go's default controller limiter)."""

    def __init__(self, *limiters: RateLimiter[K]) -> None:
        self._limiters = limiters

    def when(self, key: K) -> float:
        return max(lim.when(key) for lim in self._limiters)

    def forget(self, key: K) -> None:
        for lim in self._limiters:
            lim.forget(key)

    def num_requeues(self, key: K) -> int:
        return max(lim.num_requeues(key) for lim in self._limiters)


def default_rate_limiter(clock: Clock) -> MaxOf[Hashable]:
    """5 ms → 1000 s per key, and 10 qps / burst 100 overall."""
    return MaxOf(ExponentialBackoff(0.005, 1000.0), TokenBucket(10.0, 100, clock))


# --- metrics --------------------------------------------------------------------------------


class QueueMetrics:
    """Prometheus metrics for work queues; create once per registry and share (label ``name``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.depth = Gauge(
            "neuron_dra_workqueue_depth",
            "Keys waiting in the queue.",
            ["name"],
            registry=self.registry,
        )
        self.adds = Counter(
            "neuron_dra_workqueue_adds", "Keys added.", ["name"], registry=self.registry
        )
        self.retries = Counter(
            "neuron_dra_workqueue_retries",
            "Rate-limited re-adds.",
            ["name"],
            registry=self.registry,
        )


# --- the queue ------------------------------------------------------------------------------


class WorkQueue(Generic[K]):
    def __init__(
        self,
        name: str = "default",
        *,
        clock: Clock | None = None,
        rate_limiter: RateLimiter[K] | None = None,
        metrics: QueueMetrics | None = None,
    ) -> None:
        self.name = name
        self._clock: Clock = clock or SystemClock()
        self._limiter: RateLimiter[K] = rate_limiter or ExponentialBackoff()
        self._queue: collections.deque[K] = collections.deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._getters: collections.deque[asyncio.Future[None]] = collections.deque()
        # Delayed adds: key -> (ready time, timer task). Only the earliest is kept per key.
        self._waiting: dict[K, tuple[float, asyncio.Task[None]]] = {}
        self._shutting_down = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._metrics = metrics
        if metrics is not None:
            self._depth = metrics.depth.labels(name)
            self._adds = metrics.adds.labels(name)
            self._retries = metrics.retries.labels(name)

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def _update_idle(self) -> None:
        if self._queue or self._processing or self._waiting:
            self._idle.clear()
        else:
            self._idle.set()

    def _wake_one(self) -> None:
        while self._getters:
            fut = self._getters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def add(self, key: K) -> None:
        """Queue ``key`` (no-op if already waiting; deferred if being processed)."""
        if self._shutting_down:
            return
        if key in self._dirty:
            return
        self._dirty.add(key)
        if self._metrics is not None:
            self._adds.inc()
        if key in self._processing:
            return
        self._queue.append(key)
        self._after_change()
        self._wake_one()

    def _after_change(self) -> None:
        if self._metrics is not None:
            self._depth.set(len(self._queue))
        self._update_idle()

    def add_after(self, key: K, delay: float) -> None:
        """Queue ``key`` once ``delay`` seconds have passed (earliest request wins)."""
        if self._shutting_down:
            return
        if delay <= 0:
            self.add(key)
            return
        ready = self._clock.now() + delay
        existing = self._waiting.get(key)
        if existing is not None:
            if existing[0] <= ready:
                return
            existing[1].cancel()
        task = asyncio.get_running_loop().create_task(
            self._fire(key, delay), name=f"workqueue-{self.name}-delay"
        )
        self._waiting[key] = (ready, task)
        self._update_idle()

    async def _fire(self, key: K, delay: float) -> None:
        await self._clock.sleep(delay)
        entry = self._waiting.get(key)
        if entry is not None and entry[1] is asyncio.current_task():
            del self._waiting[key]
        self.add(key)
        self._update_idle()

    def add_rate_limited(self, key: K) -> None:
        """Re-queue after the key's backoff (call after a failed attempt)."""
        if self._metrics is not None:
            self._retries.inc()
        self.add_after(key, self._limiter.when(key))

    def forget(self, key: K) -> None:
        """Reset ``key``'s backoff (call after a successful attempt)."""
        self._limiter.forget(key)

    def num_requeues(self, key: K) -> int:
        return self._limiter.num_requeues(key)

    async def get(self) -> K:
        """Next key to process; the caller must call :meth:`done` with it afterwards.

        Raises :class:`QueueShutDown` once the queue is shut down and drained.
        """
        while not self._queue:
            if self._shutting_down:
                raise QueueShutDown(self.name)
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._getters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                # If we were woken and cancelled at once, pass the wake-up on.
                if fut.done() and not fut.cancelled() and self._queue:
                    self._wake_one()
                raise
        key = self._queue.popleft()
        self._processing.add(key)
        self._dirty.discard(key)
        self._after_change()
        return key

    def done(self, key: K) -> None:
        """Mark ``key`` finished; if it was re-added meanwhile, queue it again now."""
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.append(key)
            self._wake_one()
        self._after_change()

    def shutdown(self) -> None:
        """Stop accepting keys. Waiting keys are still handed out; then ``get`` raises."""
        self._shutting_down = True
        for _, task in self._waiting.values():
            task.cancel()
        self._waiting.clear()
        while self._getters:
            fut = self._getters.popleft()
            if not fut.done():
                fut.set_result(None)
        self._update_idle()

    async def wait_idle(self) -> None:
        """Wait until nothing is queued, delayed or being processed."""
        await self._idle.wait()
