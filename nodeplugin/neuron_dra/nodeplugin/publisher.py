"""Keeps this node's ResourceSlices and UltraServer Node labels equal to what discovery says.

Both are level-triggered: every trigger (start, an inventory or workload-id change, a watch
event on our slices or our Node) only *requests* a sync, and a single worker per object kind
computes the desired state from scratch and converges, so bursts of triggers collapse into one
sync and two syncs never race each other's writes (DESIGN.md §5).

ResourceSlice rules we follow (reference/kubelet-dra.md §4.5, §5):

- Only slices with ``spec.driver == <driver>`` and ``spec.nodeName == <node>`` are ours; the
  watch uses that field selector and every write re-checks it, so other drivers' and other
  nodes' slices are never touched.
- Every content change moves the whole pool to a new ``pool.generation`` (consumers trust only
  the highest generation of a pool, so a partially written pool must not look complete).
- Slices the kubelet deletes (it removes all of a node's slices when it starts) or someone edits
  are noticed through the watch and republished.

Cache freshness: a write's response is newer than our watch cache until the watch delivers the
corresponding event. Planning from the stale cache would re-create what we just created or PUT
with an old resourceVersion. So the result of each write overrides the cache for that slice
name until the next watch event for that name arrives (that event is our write's, because a
successful RV-guarded write means nothing else happened in between). This needs no comparison
of resourceVersions, which are opaque. With two writes to one slice in flight, the first one's
event ends the override early; the next write then meets a 409, re-reads that slice and carries
on, so the cost is one extra request, never a wrong result.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import types
from collections import Counter as CounterDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Self

from neuron_dra.common.constants import (
    DRIVER_NAME,
    LABEL_CAPACITY_BLOCK_ID,
    LABEL_INSTANCE_TYPE,
    NETWORK_NODE_LAYER_ATTRIBUTES,
    ULTRASERVER_NODE_LABELS,
)
from neuron_dra.common.k8s.cache import Store
from neuron_dra.common.k8s.client import (
    NODES,
    RESOURCE_SLICES,
    KubeClient,
    ResourceClient,
    resource_version,
)
from neuron_dra.common.k8s.clock import Clock, SystemClock
from neuron_dra.common.k8s.errors import (
    AlreadyExistsError,
    ConflictError,
    KubeError,
    NotFoundError,
    PermanentError,
    RetryableError,
    classify,
)
from neuron_dra.common.k8s.reflector import Reflector, ReflectorMetrics
from neuron_dra.common.k8s.workqueue import (
    ExponentialBackoff,
    QueueMetrics,
    QueueShutDown,
    RateLimiter,
    WorkQueue,
)
from neuron_dra.nodeplugin.discovery.model import NodeInventory
from neuron_dra.nodeplugin.slices import (
    InventoryError,
    SliceBuildError,
    build_resource_slices,
    next_generation,
    slice_content_changed,
    ultraserver_node_labels,
)
from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]
InventoryProvider = Callable[[], NodeInventory | None]
WorkloadIdProvider = Callable[[], Mapping[int | str, str]]

#: Node labels the slices depend on (attributes; the instance type is discovery's fallback):
#: a change to one of these means a sync.
SLICE_NODE_LABELS: Final[frozenset[str]] = frozenset(
    {
        LABEL_CAPACITY_BLOCK_ID,
        LABEL_INSTANCE_TYPE,
        *(label for label, _ in NETWORK_NODE_LAYER_ATTRIBUTES),
    }
)

#: Write attempts within one sync when a write meets a concurrent change (409, AlreadyExists,
#: vanished object). Each attempt re-reads the one object involved and re-plans; after that the
#: worker's backoff takes over.
CONFLICT_ATTEMPTS: Final = 5

_KEY: Final = "sync"


def _no_workload_ids() -> Mapping[int | str, str]:
    return {}


def _default_backoff() -> ExponentialBackoff[str]:
    # Publishing is one node's own pool: start retrying quickly, but never hammer the API
    # server with a failure that will not go away (a bad inventory, missing RBAC).
    return ExponentialBackoff(0.25, 60.0)


# --- metrics -----------------------------------------------------------------------------------


class PublisherMetrics:
    """Prometheus metrics of the slice publisher and node labeller; one per registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.slice_writes = Counter(
            "neuron_dra_resourceslice_writes",
            "Successful ResourceSlice writes, by verb (create, update, delete).",
            ["verb"],
            registry=self.registry,
        )
        self.syncs = Counter(
            "neuron_dra_resourceslice_syncs",
            "Completed ResourceSlice syncs (with or without writes).",
            registry=self.registry,
        )
        self.sync_errors = Counter(
            "neuron_dra_resourceslice_sync_errors",
            "Failed ResourceSlice syncs, by error type.",
            ["error"],
            registry=self.registry,
        )
        self.published_devices = Gauge(
            "neuron_dra_published_devices",
            "Devices in this node's published ResourceSlices.",
            registry=self.registry,
        )
        self.pool_generation = Gauge(
            "neuron_dra_resourceslice_pool_generation",
            "pool.generation of this node's published ResourceSlices.",
            registry=self.registry,
        )
        self.first_publish_seconds = Gauge(
            "neuron_dra_resourceslice_first_publish_seconds",
            "Seconds from publisher start to the first complete publish.",
            registry=self.registry,
        )
        self.label_patches = Counter(
            "neuron_dra_node_label_patches",
            "Merge patches of this node's UltraServer labels.",
            registry=self.registry,
        )
        self.label_errors = Counter(
            "neuron_dra_node_label_errors",
            "Failed node label syncs, by error type.",
            ["error"],
            registry=self.registry,
        )


# --- pure planning -------------------------------------------------------------------------------


def slice_name_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def is_own_slice(obj: Mapping[str, Any], node_name: str, driver_name: str) -> bool:
    spec = obj.get("spec") or {}
    return spec.get("driver") == driver_name and spec.get("nodeName") == node_name


def pool_generation(obj: Mapping[str, Any]) -> int:
    value = ((obj.get("spec") or {}).get("pool") or {}).get("generation", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _owner_uids(obj: Mapping[str, Any]) -> list[str]:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return sorted(str(r.get("uid")) for r in refs if isinstance(r, Mapping))


def slice_up_to_date(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether ``current`` already is ``desired``: same content, generation and owner.

    The owner matters too: a Node deleted and re-created under the same name has a new uid, and
    slices owned by the old one would be garbage-collected.
    """
    return (
        not slice_content_changed(current, desired)
        and pool_generation(current) == pool_generation(desired)
        and _owner_uids(current) == _owner_uids(desired)
    )


def _with_generation(obj: Mapping[str, Any], generation: int) -> JsonDict:
    out = copy.deepcopy(dict(obj))
    out["spec"]["pool"]["generation"] = generation
    return out


#: Metadata others may have put on our slices that a PUT of ours should keep.
_PRESERVED_METADATA: Final = ("labels", "annotations", "finalizers")


@dataclass(frozen=True)
class SlicePlan:
    """The writes that turn the existing slices into the desired ones."""

    generation: int
    #: The desired slices, all at ``generation``.
    desired: tuple[JsonDict, ...]
    create: tuple[JsonDict, ...] = ()
    #: Full objects to PUT, guarded by the existing ``metadata.resourceVersion``.
    update: tuple[JsonDict, ...] = ()
    #: (name, resourceVersion) of slices to delete, RV-guarded.
    delete: tuple[tuple[str, str], ...] = ()

    @property
    def writes(self) -> int:
        return len(self.create) + len(self.update) + len(self.delete)


def plan_slices(
    existing: Sequence[Mapping[str, Any]],
    desired: Sequence[Mapping[str, Any]],
    *,
    previous_generation: int | None = None,
) -> SlicePlan:
    """Plan the writes from ``existing`` (our slices as the API has them) to ``desired``.

    ``desired`` may carry any generation: the plan picks it (slices.next_generation: unchanged
    content keeps the generation, any change moves the whole pool past the highest one).
    ``previous_generation`` is the highest generation this process published; when slices are
    missing (the kubelet deleted them) the recreated pool goes above it, so a consumer that
    still holds the deleted slices sees ours as newer rather than as an older pool.

    Creates and updates come before deletes in the order the caller should apply them: when a
    pool shrinks, the surviving slices announce the new slice count at the new generation
    first, and the extra slice is by then an older generation that consumers ignore.
    """
    by_name = {slice_name_of(s): s for s in existing}
    generation = next_generation(existing, desired)
    missing = any(slice_name_of(s) not in by_name for s in desired)
    if missing and previous_generation is not None:
        generation = max(generation, previous_generation + 1)
    final = tuple(_with_generation(s, generation) for s in desired)
    create: list[JsonDict] = []
    update: list[JsonDict] = []
    for want in final:
        have = by_name.get(slice_name_of(want))
        if have is None:
            create.append(want)
        elif not slice_up_to_date(have, want):
            obj = copy.deepcopy(want)
            meta = obj["metadata"]
            have_meta = have.get("metadata") or {}
            for key in _PRESERVED_METADATA:
                if have_meta.get(key):
                    meta[key] = copy.deepcopy(have_meta[key])
            meta["resourceVersion"] = resource_version(have)
            update.append(obj)
    wanted = {slice_name_of(s) for s in final}
    delete = tuple(
        (name, resource_version(s)) for name, s in sorted(by_name.items()) if name not in wanted
    )
    return SlicePlan(generation, final, tuple(create), tuple(update), delete)


def node_slice_facts(node: Mapping[str, Any]) -> tuple[str, tuple[tuple[str, str], ...]]:
    """What of a Node goes into its slices: the uid (owner) and the labels attributes come from."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    return str(meta.get("uid") or ""), tuple(
        sorted((k, str(v)) for k, v in labels.items() if k in SLICE_NODE_LABELS)
    )


def node_label_patch(
    current: Mapping[str, str],
    desired: Mapping[str, str],
    owned: Iterable[str] = ULTRASERVER_NODE_LABELS,
) -> dict[str, str | None]:
    """The ``metadata.labels`` merge patch making our labels on the Node equal ``desired``.

    Only ``owned`` labels are ever set or removed (``None`` = remove); anything else on the
    Node belongs to someone else and is left alone, even if ``desired`` named it.
    """
    owned = frozenset(owned)
    patch: dict[str, str | None] = {
        k: v for k, v in desired.items() if k in owned and current.get(k) != v
    }
    for k in sorted(owned):
        if k in current and k not in desired:
            patch[k] = None
    return patch


# --- the single-key worker -----------------------------------------------------------------------


class _SyncWorker:
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
            rate_limiter=rate_limiter or _default_backoff(),
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


def _log_failure(what: str, exc: Exception, attempt: int) -> None:
    err = classify(exc)
    if isinstance(exc, RetryableError | _NotReadyError) or (err is not None and err.retryable):
        log.warning("%s failed (attempt %d, will retry): %s", what, attempt, exc)
    elif isinstance(exc, SliceBuildError | InventoryError | PermanentError) or err is not None:
        # Not fixed by retrying the same request, but the inputs may change (new inventory,
        # RBAC granted): keep retrying at the capped backoff, and say so loudly.
        log.error("%s failed (attempt %d): %s", what, attempt, exc)
    else:
        log.error("%s failed (attempt %d): unexpected error", what, attempt, exc_info=exc)


class _NotReadyError(Exception):
    """An input of the desired state is not there yet (the Node, the inventory)."""


class SliceNameTakenError(PermanentError):
    """A slice with one of our deterministic names exists but is not ours to write."""


# --- ResourceSlice publisher ---------------------------------------------------------------------


@dataclass
class SyncResult:
    """What one successful sync did."""

    generation: int
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    devices: int = 0

    @property
    def writes(self) -> int:
        return len(self.created) + len(self.updated) + len(self.deleted)


class _StaleError(Exception):
    """A write met a concurrent change to ``name``; re-read it and plan again."""

    def __init__(self, name: str, cause: KubeError) -> None:
        super().__init__(f"{name}: {cause}")
        self.name = name
        self.cause = cause


class SlicePublisher:
    """Publishes this node's ResourceSlices and keeps them published.

    ``inventory`` returns the current discovery result (None until discovery has run);
    ``workload_ids`` the device reservations (DESIGN §3.7). Call :meth:`request_sync` when
    either changes. Readiness: :attr:`published` is set after the first sync that left the API
    matching the desired state.
    """

    def __init__(
        self,
        kube: KubeClient,
        *,
        node_name: str,
        dra_driver_version: str,
        inventory: InventoryProvider,
        workload_ids: WorkloadIdProvider = _no_workload_ids,
        driver_name: str = DRIVER_NAME,
        clock: Clock | None = None,
        rate_limiter: RateLimiter[str] | None = None,
        metrics: PublisherMetrics | None = None,
        reflector_metrics: ReflectorMetrics | None = None,
        queue_metrics: QueueMetrics | None = None,
        conflict_attempts: int = CONFLICT_ATTEMPTS,
    ) -> None:
        if driver_name != DRIVER_NAME:
            # slices.py builds slices for DRIVER_NAME only; publishing under another name would
            # make every sync fight its own watch filter.
            raise ValueError(f"driver_name must be {DRIVER_NAME!r} (slices.py builds only that)")
        if conflict_attempts < 1:
            raise ValueError("conflict_attempts must be >= 1")
        self.node_name = node_name
        self.driver_name = driver_name
        self.dra_driver_version = dra_driver_version
        self._inventory = inventory
        self._workload_ids = workload_ids
        self._clock: Clock = clock or SystemClock()
        self._metrics = metrics or PublisherMetrics()
        self._conflict_attempts = conflict_attempts
        self._api: ResourceClient = kube.resource(RESOURCE_SLICES)
        self.slice_store = Store()
        self.node_store = Store()
        self.slice_reflector = Reflector(
            self._api,
            self.slice_store,
            name=f"resourceslices/{node_name}",
            field_selector=f"spec.nodeName={node_name},spec.driver={driver_name}",
            metrics=reflector_metrics,
        )
        self.node_reflector = Reflector(
            kube.resource(NODES),
            self.node_store,
            name=f"node/{node_name}",
            field_selector=f"metadata.name={node_name}",
            metrics=reflector_metrics,
        )
        self.slice_reflector.add_handler(
            on_add=self._on_slice_event,
            on_update=lambda _old, new: self._on_slice_event(new),
            on_delete=self._on_slice_event,
        )
        self.node_reflector.add_handler(
            on_add=self._on_node_event,
            on_update=lambda _old, new: self._on_node_event(new),
            on_delete=self._on_node_event,
        )
        self._worker = _SyncWorker(
            f"slice-publisher-{node_name}",
            self._sync_once,
            self._on_sync_error,
            clock=self._clock,
            rate_limiter=rate_limiter,
            queue_metrics=queue_metrics,
        )
        # name -> our write's result (None: we deleted it), until the watch catches up.
        self._overrides: dict[str, JsonDict | None] = {}
        # (names and resourceVersions of the slices it was built from, the view)
        self._published_view: (
            tuple[tuple[tuple[str, str], ...], Mapping[str, Mapping[str, Any]]] | None
        ) = None
        self._last_desired: dict[str, JsonDict] | None = None
        self._last_node_facts: tuple[str, tuple[tuple[str, str], ...]] | None = None
        self._generation: int | None = None
        self._started_at: float | None = None
        self.published = asyncio.Event()
        self.first_publish_seconds: float | None = None
        self.last_result: SyncResult | None = None
        self.last_error: Exception | None = None
        #: Successful writes by verb, for tests and diagnostics (Prometheus has the same).
        self.writes: CounterDict[str] = CounterDict()

    # --- lifecycle -----------------------------------------------------------------------

    def start_watching(self) -> None:
        """Start only the Node and ResourceSlice watches (in the running loop), so that their
        initial lists are done by the time :meth:`start` publishes. Idempotent."""
        self.node_reflector.start()
        self.slice_reflector.start()

    def start(self) -> None:
        """Start watching and publishing (in the running loop); returns at once."""
        if self._started_at is not None:
            return
        self._started_at = self._clock.now()
        self.start_watching()
        self._worker.start()
        self._worker.request()

    async def stop(self) -> None:
        """Stop; the published slices stay (the kubelet or the Node's deletion removes them)."""
        await self._worker.stop()
        await self.slice_reflector.stop()
        await self.node_reflector.stop()

    async def __aenter__(self) -> Self:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- triggers ------------------------------------------------------------------------

    def request_sync(self) -> None:
        """Ask for a sync (inventory or workload ids changed). Cheap; bursts collapse."""
        self._worker.request()

    def _on_slice_event(self, obj: JsonDict) -> None:
        name = slice_name_of(obj)
        # Whatever this event says is at least as new as our write's response.
        self._overrides.pop(name, None)
        if not self._is_ours(obj):
            return
        if self._last_desired is None:
            self.request_sync()
            return
        current = self.slice_store.get_by_name(name)
        want = self._last_desired.get(name)
        if current is None:
            if want is not None:
                log.info(
                    "ResourceSlice %s was deleted; republishing",
                    name,
                    extra={"node": self.node_name},
                )
                self.request_sync()
        elif want is None or not slice_up_to_date(current, want):
            log.info(
                "ResourceSlice %s differs from what we publish; republishing",
                name,
                extra={"node": self.node_name},
            )
            self.request_sync()

    def _on_node_event(self, obj: JsonDict) -> None:
        if (obj.get("metadata") or {}).get("name") != self.node_name:
            return
        current = self.node_store.get_by_name(self.node_name)
        facts = None if current is None else node_slice_facts(current)
        if facts != self._last_node_facts:
            self.request_sync()

    # --- readiness and reads -------------------------------------------------------------

    def is_published(self) -> bool:
        return self.published.is_set()

    def readiness_check(self) -> tuple[bool, str]:
        """For ``/readyz``: ready once the slices were published (and stays so; a republish
        after the kubelet deleted them is routine and must not take the plugin out of service).
        """
        if self.is_published():
            return True, "ok"
        reason = f": {self.last_error}" if self.last_error is not None else ""
        return False, f"ResourceSlices for node {self.node_name} not published yet{reason}"

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds, re-checked after every sync attempt."""
        await self._worker.wait_until(predicate)

    @property
    def sync_attempts(self) -> int:
        return self._worker.runs

    @property
    def sync_failures(self) -> int:
        return self._worker.failures

    def published_devices(self) -> Mapping[str, Mapping[str, Any]]:
        """Device name -> attributes, as currently published (the highest pool generation).

        This is what schedulers allocate from, so the prepare path checks ``workloadId``
        against it rather than against what we would like to publish. It is on the hot path of
        every NodePrepareResources call, so the view is built once per set of published slice
        versions and shared, read-only, until a slice changes.
        """
        slices = self._existing()
        versions = tuple(
            (slice_name_of(s), str((s.get("metadata") or {}).get("resourceVersion", "")))
            for s in slices
        )
        if self._published_view is not None and self._published_view[0] == versions:
            return self._published_view[1]
        out: dict[str, Mapping[str, Any]] = {}
        if slices:
            top = max(pool_generation(s) for s in slices)
            for s in slices:
                if pool_generation(s) != top:
                    continue
                for dev in (s.get("spec") or {}).get("devices") or []:
                    attrs = copy.deepcopy(dev.get("attributes") or {})
                    out[str(dev.get("name"))] = types.MappingProxyType(attrs)
        view = types.MappingProxyType(out)
        self._published_view = (versions, view)
        return view

    # --- the sync ------------------------------------------------------------------------

    def _is_ours(self, obj: Mapping[str, Any]) -> bool:
        return is_own_slice(obj, self.node_name, self.driver_name)

    def _existing(self) -> list[JsonDict]:
        """Our slices as we best know them: the watch cache, overridden by our own writes."""
        view = {slice_name_of(s): s for s in self.slice_store.list() if self._is_ours(s)}
        for name, obj in self._overrides.items():
            if obj is None:
                view.pop(name, None)
            else:
                view[name] = obj
        return [view[n] for n in sorted(view)]

    def _desired(self) -> list[JsonDict]:
        node = self.node_store.get_by_name(self.node_name)
        if node is None:
            raise _NotReadyError(f"Node {self.node_name} not found")
        inventory = self._inventory()
        if inventory is None:
            raise _NotReadyError("device discovery has not completed")
        facts = node_slice_facts(node)
        meta = node.get("metadata") or {}
        desired = build_resource_slices(
            inventory,
            node_name=self.node_name,
            node_uid=facts[0],
            node_labels=meta.get("labels") or {},
            dra_driver_version=self.dra_driver_version,
            workload_ids=dict(self._workload_ids()),
            generation=0,
        )
        self._last_node_facts = facts
        return desired

    async def sync(self) -> SyncResult:
        """One sync now, in the caller's task. For one-shot use without :meth:`start`: running
        it beside the worker would let two syncs interleave their writes."""
        return await self._sync_once()

    async def _sync_once(self) -> SyncResult:
        await self.node_reflector.wait_synced()
        await self.slice_reflector.wait_synced()
        result: SyncResult | None = None
        stale: _StaleError | None = None
        for _ in range(self._conflict_attempts):
            desired = self._desired()
            plan = plan_slices(self._existing(), desired, previous_generation=self._generation)
            # Recorded before writing: events for our own writes then compare against it and
            # cause no extra sync.
            self._last_desired = {slice_name_of(s): s for s in plan.desired}
            if result is None:
                result = SyncResult(plan.generation)
            result.generation = plan.generation
            try:
                await self._apply(plan, result)
            except _StaleError as exc:
                stale = exc
                log.debug("ResourceSlice %s changed concurrently (%s); re-planning", exc.name, exc)
                await self._refresh(exc.name)
                continue
            break
        else:
            assert stale is not None
            raise stale.cause
        assert result is not None
        self._succeeded(plan, result)
        return result

    async def _apply(self, plan: SlicePlan, result: SyncResult) -> None:
        for obj in plan.create:
            name = slice_name_of(obj)
            try:
                created = await self._api.create(obj)
            except (AlreadyExistsError, ConflictError) as exc:
                raise _StaleError(name, exc) from exc
            self._wrote("create", name, created)
            result.created.append(name)
        for obj in plan.update:
            name = slice_name_of(obj)
            try:
                updated = await self._api.replace(obj)
            except (ConflictError, NotFoundError) as exc:
                raise _StaleError(name, exc) from exc
            self._wrote("update", name, updated)
            result.updated.append(name)
        for name, rv in plan.delete:
            try:
                await self._api.delete(name, resource_version=rv or None)
            except NotFoundError:
                pass  # someone beat us to it: the outcome we wanted
            except ConflictError as exc:
                raise _StaleError(name, exc) from exc
            self._wrote("delete", name, None)
            result.deleted.append(name)

    def _wrote(self, verb: str, name: str, obj: JsonDict | None) -> None:
        self._overrides[name] = obj
        self.writes[verb] += 1
        self._metrics.slice_writes.labels(verb).inc()
        log.debug("ResourceSlice %s: %s", name, verb, extra={"node": self.node_name})

    async def _refresh(self, name: str) -> None:
        """Read one slice from the API after a conflict, newer than our cache may be."""
        try:
            obj = await self._api.get(name)
        except NotFoundError:
            self._overrides[name] = None
            return
        if not self._is_ours(obj):
            spec = obj.get("spec") or {}
            raise SliceNameTakenError(
                f"ResourceSlice {name} exists but belongs to driver {spec.get('driver')!r} on "
                f"node {spec.get('nodeName')!r}; delete it so this node can publish"
            )
        self._overrides[name] = obj

    def _succeeded(self, plan: SlicePlan, result: SyncResult) -> None:
        self._generation = plan.generation
        result.devices = sum(len(s["spec"]["devices"]) for s in plan.desired)
        self.last_result = result
        self.last_error = None
        self._metrics.syncs.inc()
        self._metrics.published_devices.set(result.devices)
        self._metrics.pool_generation.set(plan.generation)
        if result.writes:
            log.info(
                "published %d devices in %d ResourceSlice(s) at generation %d "
                "(created %s, updated %s, deleted %s)",
                result.devices,
                len(plan.desired),
                plan.generation,
                result.created,
                result.updated,
                result.deleted,
                extra={"node": self.node_name},
            )
        if not self.published.is_set():
            started = self._started_at if self._started_at is not None else self._clock.now()
            self.first_publish_seconds = self._clock.now() - started
            self._metrics.first_publish_seconds.set(self.first_publish_seconds)
            log.info(
                "ResourceSlices published %.3fs after start",
                self.first_publish_seconds,
                extra={"node": self.node_name},
            )
            self.published.set()

    def _on_sync_error(self, exc: Exception) -> None:
        self.last_error = exc
        self._metrics.sync_errors.labels(type(exc).__name__).inc()
        _log_failure(f"ResourceSlice sync for node {self.node_name}", exc, self._worker.failures)


# --- Node labeller -------------------------------------------------------------------------------


class NodeLabeller:
    """Keeps the UltraServer labels (DESIGN §3.6) on this node equal to the inventory's.

    A merge patch of ``metadata.labels`` touches only the keys it names, so no resourceVersion
    guard is needed: other writers' labels cannot be lost, and the labels we name are ours.
    Until discovery has run (inventory None) nothing is changed, so a restart does not strip
    labels that schedulers rely on and then put them back.
    """

    def __init__(
        self,
        kube: KubeClient,
        *,
        node_name: str,
        inventory: InventoryProvider,
        clock: Clock | None = None,
        rate_limiter: RateLimiter[str] | None = None,
        metrics: PublisherMetrics | None = None,
        queue_metrics: QueueMetrics | None = None,
    ) -> None:
        self.node_name = node_name
        self._inventory = inventory
        self._api = kube.resource(NODES)
        self._metrics = metrics or PublisherMetrics()
        self._worker = _SyncWorker(
            f"node-labeller-{node_name}",
            self.sync,
            self._on_error,
            clock=clock or SystemClock(),
            rate_limiter=rate_limiter,
            queue_metrics=queue_metrics,
        )
        self.patches = 0
        self.last_error: Exception | None = None

    def start(self) -> None:
        self._worker.start()
        self._worker.request()

    async def stop(self) -> None:
        await self._worker.stop()

    def request_sync(self) -> None:
        self._worker.request()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        await self._worker.wait_until(predicate)

    def watch_node(self, reflector: Reflector) -> None:
        """Re-check whenever the Node changes (someone removed or edited our labels).

        Register before the reflector starts, e.g. with the publisher's ``node_reflector``.
        """
        reflector.add_handler(on_add=self._on_node, on_update=lambda _o, new: self._on_node(new))

    def _on_node(self, node: JsonDict) -> None:
        if (node.get("metadata") or {}).get("name") != self.node_name:
            return
        inventory = self._inventory()
        if inventory is None:
            return
        labels = (node.get("metadata") or {}).get("labels") or {}
        if node_label_patch(labels, ultraserver_node_labels(inventory)):
            self.request_sync()

    async def sync(self) -> dict[str, str | None]:
        """Patch the Node's labels if needed; returns the patch applied ({} if none)."""
        inventory = self._inventory()
        if inventory is None:
            return {}
        node = await self._api.get(self.node_name)
        labels = (node.get("metadata") or {}).get("labels") or {}
        patch = node_label_patch(labels, ultraserver_node_labels(inventory))
        if not patch:
            return {}
        await self._api.merge_patch(self.node_name, {"metadata": {"labels": patch}})
        self.patches += 1
        self.last_error = None
        self._metrics.label_patches.inc()
        log.info("Node labels updated: %s", patch, extra={"node": self.node_name})
        return patch

    def _on_error(self, exc: Exception) -> None:
        self.last_error = exc
        self._metrics.label_errors.labels(type(exc).__name__).inc()
        _log_failure(f"labelling node {self.node_name}", exc, self._worker.failures)
