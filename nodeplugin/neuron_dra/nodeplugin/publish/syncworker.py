"""One level-triggered sync loop per object kind: requests collapse, runs never overlap.

Every trigger of the publisher and the labeller (start, an inventory or workload-id change, a
watch event) only *requests* a sync; :class:`SyncWorker` runs the sync function, so bursts of
triggers collapse into one run and two runs never race each other's writes.
A failure is retried with exponential backoff, and :func:`log_failure` says whether waiting
helps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from neuron_dra.common.k8s.clock import Clock
from neuron_dra.common.k8s.errors import PermanentError, RetryableError, classify
from neuron_dra.common.k8s.workqueue import (
    ExponentialBackoff,
    QueueMetrics,
    QueueShutDown,
    RateLimiter,
    WorkQueue,
)
from neuron_dra.nodeplugin.discovery.facts import InventoryError
from neuron_dra.nodeplugin.publish.slices import SliceBuildError

log = logging.getLogger(__name__)

_KEY: Final = "sync"


def default_backoff() -> ExponentialBackoff[str]:
    # Publishing is one node's own pool: start retrying quickly, but never hammer the API
    # server with a failure that will not go away (a bad inventory, missing RBAC).
    return ExponentialBackoff(0.25, 60.0)


class SyncWorker:
    """Runs ``fn`` whenever requested, never twice at once, retrying failures with backoff.

    A one-key work queue gives exactly the semantics needed: requests while a run is queued
    collapse into it, a request during a run causes exactly one more run afterwards, and a
    failure re-queues the key after its exponential backoff (reset by the next success).
    """

    def __init__(
        self,
        name: str,
        fn: Callable[[], Awaitable[object]],
        on_error: Callable[[Exception], None],
        *,
        clock: Clock,
        rate_limiter: RateLimiter[str] | None,
        queue_metrics: QueueMetrics | None,
    ) -> None:
        self.name = name
        self._fn = fn
        self._on_error = on_error
        self._queue: WorkQueue[str] = WorkQueue(
            name,
            clock=clock,
            rate_limiter=rate_limiter or default_backoff(),
            metrics=queue_metrics,
        )
        self._task: asyncio.Task[None] | None = None
        self.runs = 0
        self.failures = 0
        self._tick = asyncio.Event()

    def request(self) -> None:
        self._queue.add(_KEY)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        self._queue.shutdown()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds; re-checked after every run (success or failure)."""
        while not predicate():
            await self._tick.wait()

    def _notify(self) -> None:
        tick, self._tick = self._tick, asyncio.Event()
        tick.set()

    async def _run(self) -> None:
        while True:
            try:
                key = await self._queue.get()
            except QueueShutDown:
                return
            try:
                await self._fn()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failures += 1
                self._on_error(exc)
                self._queue.add_rate_limited(key)
            else:
                self._queue.forget(key)
            finally:
                self._queue.done(key)
                self.runs += 1
                self._notify()


class NotReadyError(Exception):
    """An input of the desired state is not there yet (the Node, the inventory)."""


def log_failure(what: str, exc: Exception, attempt: int) -> None:
    err = classify(exc)
    if isinstance(exc, RetryableError | NotReadyError) or (err is not None and err.retryable):
        log.warning("%s failed (attempt %d, will retry): %s", what, attempt, exc)
    elif isinstance(exc, SliceBuildError | InventoryError | PermanentError) or err is not None:
        # Not fixed by retrying the same request, but the inputs may change (new inventory,
        # RBAC granted): keep retrying at the capped backoff, and say so loudly.
        log.error("%s failed (attempt %d): %s", what, attempt, exc)
    else:
        log.error("%s failed (attempt %d): unexpected error", what, attempt, exc_info=exc)
