"""List-then-watch into a :class:`~.cache.Store`, with the recovery rules a cache depends on.

The loop:

1. LIST (paged) → ``Store.replace`` diffs it against what we had, so deletions that happened
   while we were not watching are delivered to handlers too. The store is now synced.
2. WATCH from the list's resourceVersion with bookmarks and a randomised server timeout.
   Events update the store and call handlers in order; BOOKMARKs only advance the RV.
3. The stream ends (server timeout, dropped connection) → watch again from the last RV.
   410 Gone (HTTP status or in-stream ERROR event) → back to 1. Other errors → back off
   (injected clock) and watch again. If the watch goes quiet for longer than ``stale_after``
   (no event and no bookmark), the watchdog drops it and we watch again: the watch may be
   stuck (kubernetes_asyncio issue #360 shows this happens); if the RV is too old by then the
   re-watch gets a 410 and we relist. kube-apiserver sends a bookmark about once a minute on
   an idle watch, so the default ``stale_after`` of 180 s means three missed bookmarks.

We stream and parse the watch ourselves (``client.WatchStream``) rather than using
``kubernetes_asyncio.watch.Watch``, which re-connects once with a stale RV on 410 and builds
generated models for every event.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from .cache import Delta, Store
from .client import ResourceClient, WatchStream, resource_version
from .clock import Clock, SystemClock
from .errors import GoneError, KubeError, classify

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]
Handler = Callable[..., Awaitable[None] | None]


class StaleWatchError(Exception):
    """The watchdog saw no event or bookmark within ``stale_after``."""


class _ShortWatchError(Exception):
    """A watch ended at once without any event or bookmark."""


class ReflectorMetrics:
    """Prometheus counters for reflectors; create once per registry and share (label ``name``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.lists = Counter(
            "neuron_dra_reflector_lists",
            "Full LISTs (initial and relists).",
            ["name"],
            registry=self.registry,
        )
        self.relists = Counter(
            "neuron_dra_reflector_relists",
            "LISTs after the first, by reason (gone, error).",
            ["name", "reason"],
            registry=self.registry,
        )
        self.watches = Counter(
            "neuron_dra_reflector_watches",
            "WATCH requests opened.",
            ["name"],
            registry=self.registry,
        )
        self.watch_restarts = Counter(
            "neuron_dra_reflector_watch_restarts",
            "Watches ended and re-opened, by reason (end, gone, stale, error).",
            ["name", "reason"],
            registry=self.registry,
        )
        self.events = Counter(
            "neuron_dra_reflector_events",
            "Watch events received, by type.",
            ["name", "type"],
            registry=self.registry,
        )
        self.handler_errors = Counter(
            "neuron_dra_reflector_handler_errors",
            "Exceptions raised by event handlers.",
            ["name"],
            registry=self.registry,
        )


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter for list/watch failures."""

    initial: float = 0.8
    cap: float = 30.0
    factor: float = 2.0
    jitter: float = 0.5

    def delay(self, attempt: int, rng: random.Random) -> float:
        base = min(self.cap, self.initial * self.factor ** min(attempt, 32))
        return base * (1.0 + self.jitter * rng.random())


@dataclass
class _Handlers:
    on_add: Handler | None
    on_update: Handler | None
    on_delete: Handler | None


class Reflector:
    """Keeps ``store`` in sync with the API server for one resource (optionally filtered).

    Handlers are plain or async callables: ``on_add(obj)``, ``on_update(old, new)``,
    ``on_delete(obj)``. They run one at a time, in event order, after the store was updated,
    and must not mutate the objects. A handler exception is logged and counted, never fatal.
    """

    def __init__(
        self,
        api: ResourceClient,
        store: Store | None = None,
        *,
        name: str | None = None,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        watch_timeout_range: tuple[int, int] = (300, 600),
        stale_after: float | None = 180.0,
        backoff: Backoff = Backoff(),
        clock: Clock | None = None,
        rng: random.Random | None = None,
        metrics: ReflectorMetrics | None = None,
        min_watch_duration: float = 1.0,
    ) -> None:
        lo, hi = watch_timeout_range
        if not 0 < lo <= hi:
            raise ValueError("watch_timeout_range must be 0 < min <= max")
        if stale_after is not None and stale_after <= 0:
            raise ValueError("stale_after must be positive")
        self.api = api
        self.store = store if store is not None else Store()
        self.name = name or str(api.resource)
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.page_size = page_size
        self.watch_timeout_range = watch_timeout_range
        self.stale_after = stale_after
        self.backoff = backoff
        self.min_watch_duration = min_watch_duration
        self._clock: Clock = clock or SystemClock()
        self._rng = rng or random.Random()
        m = metrics or ReflectorMetrics()
        self._m_lists = m.lists.labels(self.name)
        self._m_relists = m.relists
        self._m_watches = m.watches.labels(self.name)
        self._m_restarts = m.watch_restarts
        self._m_events = m.events
        self._m_handler_errors = m.handler_errors.labels(self.name)
        self._handlers: list[_Handlers] = []
        self._task: asyncio.Task[None] | None = None
        self._stream: WatchStream | None = None
        self._stopping = False
        self._last_activity = 0.0
        # Progress counters, and a wake-up for wait_until() after every list, watch start and
        # watch event (an Event that is set and replaced, so waiting costs nothing when idle).
        self.lists_done = 0
        self.watches_started = 0
        self._tick = asyncio.Event()

    # --- public API ----------------------------------------------------------------------

    def add_handler(
        self,
        *,
        on_add: Handler | None = None,
        on_update: Handler | None = None,
        on_delete: Handler | None = None,
    ) -> None:
        """Register handlers. Add them before ``start`` to see the initial list as adds."""
        self._handlers.append(_Handlers(on_add, on_update, on_delete))

    def has_synced(self) -> bool:
        return self.store.has_synced()

    async def wait_synced(self) -> None:
        await self.store.wait_synced()

    def start(self) -> asyncio.Task[None]:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self.run(), name=f"reflector-{self.name}"
            )
        return self._task

    async def stop(self) -> None:
        """Stop and wait for the loop to finish; the store keeps its last content."""
        self._stopping = True
        if self._stream is not None:
            self._stream.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds; re-checked after every list, watch and event."""
        while not predicate():
            await self._tick.wait()

    async def wait_for(self, *, lists: int = 0, watches: int = 0) -> None:
        """Wait until at least ``lists`` LISTs completed and ``watches`` WATCHes were opened."""
        await self.wait_until(lambda: self.lists_done >= lists and self.watches_started >= watches)

    # --- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        need_list = True
        relist_reason = ""
        failures = 0
        while not self._stopping:
            try:
                if need_list:
                    await self._list(relist_reason)
                    need_list, relist_reason, failures = False, "", 0
                started = self._clock.now()
                active = await self._watch()
                self._m_restarts.labels(self.name, "end").inc()
                if active:
                    failures = 0
                elif self._clock.now() - started < self.min_watch_duration:
                    # A watch that ends at once with nothing in it, again and again, would
                    # spin: treat it like an error and back off.
                    raise _ShortWatchError(self.name)
            except asyncio.CancelledError:
                raise
            except GoneError:
                log.info("%s: resourceVersion expired (410); relisting", self.name)
                self._m_restarts.labels(self.name, "gone").inc()
                need_list, relist_reason = True, "gone"
            except StaleWatchError:
                log.warning(
                    "%s: no watch event or bookmark for %ss; re-watching",
                    self.name,
                    self.stale_after,
                )
                self._m_restarts.labels(self.name, "stale").inc()
            except Exception as exc:
                if isinstance(exc, _ShortWatchError):
                    log.info("%s: watch ended immediately; backing off", self.name)
                elif classify(exc) is None:
                    log.exception("%s: unexpected error in list/watch", self.name)
                else:
                    log.warning("%s: list/watch failed: %s", self.name, exc)
                if need_list:
                    relist_reason = relist_reason or "error"
                else:
                    self._m_restarts.labels(self.name, "error").inc()
                delay = self.backoff.delay(failures, self._rng)
                if isinstance(exc, KubeError) and exc.retry_after:
                    delay = max(delay, exc.retry_after)
                failures += 1
                await self._clock.sleep(delay)

    def _notify_progress(self) -> None:
        tick, self._tick = self._tick, asyncio.Event()
        tick.set()

    async def _list(self, reason: str) -> None:
        result = await self.api.list_all(
            self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            page_size=self.page_size,
        )
        self._m_lists.inc()
        if self.lists_done:
            self._m_relists.labels(self.name, reason or "error").inc()
        deltas = self.store.replace(result.items, result.resource_version)
        for delta in deltas:
            await self._dispatch(delta)
        # Synced only once handlers have seen the initial list (as client-go's informers), so
        # whoever waits for sync can rely on their side effects (e.g. keys queued).
        self.store.mark_synced()
        self.lists_done += 1
        self._notify_progress()

    async def _watch(self) -> bool:
        """One watch request; returns whether it delivered anything. Raises on errors."""
        timeout = self._rng.randint(*self.watch_timeout_range)
        stream = await self.api.watch(
            self.namespace,
            resource_version=self.store.resource_version or None,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            timeout_seconds=timeout,
            allow_bookmarks=True,
        )
        self._stream = stream
        self._m_watches.inc()
        self.watches_started += 1
        self._last_activity = self._clock.now()
        self._notify_progress()
        got_events = False
        reader = asyncio.ensure_future(self._consume(stream))
        watchdog = asyncio.ensure_future(self._watchdog(stream)) if self.stale_after else None
        try:
            if watchdog is None:
                got_events = await reader
            else:
                done, _ = await asyncio.wait(
                    {reader, watchdog}, return_when=asyncio.FIRST_COMPLETED
                )
                if watchdog in done:
                    # The watchdog closed the stream; reap the reader before reporting.
                    reader.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await reader
                    watchdog.result()  # raises StaleWatchError
                got_events = reader.result()
        finally:
            for t in (reader, watchdog):
                if t is not None and not t.done():
                    t.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await t
            stream.close()
            self._stream = None
        return got_events

    async def _watchdog(self, stream: WatchStream) -> None:
        assert self.stale_after is not None
        while True:
            idle = self._clock.now() - self._last_activity
            if idle >= self.stale_after:
                stream.close()
                raise StaleWatchError(self.name)
            await self._clock.sleep(self.stale_after - idle)

    async def _consume(self, stream: WatchStream) -> bool:
        active = False
        async for event in stream:
            self._last_activity = self._clock.now()
            active = True
            self._m_events.labels(self.name, event.type).inc()
            if event.type == "BOOKMARK":
                rv = resource_version(event.object)
                if rv:
                    self.store.resource_version = rv
            elif event.type in ("ADDED", "MODIFIED", "DELETED"):
                delta = self.store.apply_event(event.type, event.object)
                if delta is not None:
                    await self._dispatch(delta)
            else:
                log.warning("%s: ignoring watch event type %r", self.name, event.type)
            self._notify_progress()
        return active

    async def _dispatch(self, delta: Delta) -> None:
        args: tuple[JsonDict | None, ...]
        for h in self._handlers:
            if delta.type == "add":
                fn, args = h.on_add, (delta.new,)
            elif delta.type == "update":
                fn, args = h.on_update, (delta.old, delta.new)
            else:
                fn, args = h.on_delete, (delta.old,)
            if fn is None:
                continue
            try:
                result = fn(*args)
                if inspect.isawaitable(result):
                    await result
            except asyncio.CancelledError:
                raise
            except Exception:
                self._m_handler_errors.inc()
                log.exception("%s: %s handler failed for %s", self.name, delta.type, delta.key)
