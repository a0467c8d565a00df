"""Keeps this node's ResourceSlices equal to what discovery says (the converge loop).

Level-triggered: every trigger (start, an inventory or workload-id change, a watch event on
our slices or our Node) only *requests* a sync, and one :class:`~.syncworker.SyncWorker`
computes the desired slices from scratch (:mod:`.slices`), plans the writes (:mod:`.sliceplan`,
pure) and applies them, so bursts of triggers collapse into one sync and two syncs never race
each other's writes. The Node's UltraServer labels are :mod:`.nodelabels`' job.

ResourceSlice rules we follow (those of the Go helper's publisher and the API server):

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
import logging
from collections import Counter as CounterDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Self

from neuron_dra.common.constants import DRIVER_NAME
from neuron_dra.common.k8s.cache import Store
from neuron_dra.common.k8s.client import (
    NODES,
    RESOURCE_SLICES,
    KubeClient,
    ResourceClient,
)
from neuron_dra.common.k8s.clock import Clock, SystemClock
from neuron_dra.common.k8s.errors import (
    AlreadyExistsError,
    ConflictError,
    KubeError,
    NotFoundError,
    PermanentError,
)
from neuron_dra.common.k8s.reflector import Reflector, ReflectorMetrics
from neuron_dra.common.k8s.workqueue import QueueMetrics, RateLimiter
from neuron_dra.nodeplugin.discovery.model import NodeInventory
from neuron_dra.nodeplugin.publish import gated
from neuron_dra.nodeplugin.publish.metrics import PublisherMetrics
from neuron_dra.nodeplugin.publish.sliceplan import (
    JsonDict,
    NodeSliceFacts,
    SlicePlan,
    is_own_slice,
    node_slice_facts,
    plan_slices,
    published_attributes,
    slice_name_of,
    slice_resync_reason,
)
from neuron_dra.nodeplugin.publish.slices import build_resource_slices
from neuron_dra.nodeplugin.publish.syncworker import NotReadyError, SyncWorker, log_failure

log = logging.getLogger(__name__)

InventoryProvider = Callable[[], NodeInventory | None]
WorkloadIdProvider = Callable[[], Mapping[int | str, str]]

#: Write attempts within one sync when a write meets a concurrent change (409, AlreadyExists,
#: vanished object). Each attempt re-reads the one object involved and re-plans; after that the
#: worker's backoff takes over.
CONFLICT_ATTEMPTS: Final = 5


def _no_workload_ids() -> Mapping[int | str, str]:
    return {}


class SliceNameTakenError(PermanentError):
    """A slice with one of our deterministic names exists but is not ours to write."""


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
    ``workload_ids`` the device reservations (:mod:`..reservations`). Call :meth:`request_sync` when
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
        taint_effect: str | None = None,
        core_sharing: bool = False,
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
        self._taint_effect = taint_effect
        self._core_sharing = core_sharing
        #: The features whose fields the API server has shown it drops (:mod:`.gated`, by
        #: name): from then on the slices are built as it keeps them.
        self.dropped: set[str] = set()
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
        self._worker = SyncWorker(
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
        self._last_node_facts: NodeSliceFacts | None = None
        self._generation: int | None = None
        self._started_at: float | None = None
        self.published = asyncio.Event()
        self.first_publish_seconds: float | None = None
        self.last_result: SyncResult | None = None
        self.last_error: Exception | None = None
        #: Successful writes by verb, for tests and diagnostics (Prometheus has the same).
        self.writes: CounterDict[str] = CounterDict()

    @property
    def taint_effect(self) -> str | None:
        """Effect of the taints on unhealthy devices; None when none are published (off, or
        the API server drops them)."""
        return None if gated.DEVICE_TAINTS.name in self.dropped else self._taint_effect

    @property
    def core_sharing(self) -> bool:
        """Whether the devices are published for claims on some of their cores."""
        return self._core_sharing and gated.CORE_SHARING.name not in self.dropped

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
        reason = slice_resync_reason(
            self.slice_store.get_by_name(name), self._last_desired.get(name)
        )
        if reason is not None:
            log.info(
                "ResourceSlice %s %s; republishing", name, reason, extra={"node": self.node_name}
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
        view = published_attributes(slices)
        self._published_view = (versions, view)
        return view

    # --- the converge loop ---------------------------------------------------------------

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
            raise NotReadyError(f"Node {self.node_name} not found")
        inventory = self._inventory()
        if inventory is None:
            raise NotReadyError("device discovery has not completed")
        facts = node_slice_facts(node)
        meta = node.get("metadata") or {}
        desired = build_resource_slices(
            inventory,
            node_name=self.node_name,
            node_uid=facts.uid,
            node_labels=meta.get("labels") or {},
            dra_driver_version=self.dra_driver_version,
            workload_ids=dict(self._workload_ids()),
            generation=0,
            taint_effect=self._taint_effect,
            core_sharing=self._core_sharing,
        )
        self._last_node_facts = facts
        return gated.as_kept(desired, self.dropped) if self.dropped else desired

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
            self._check_kept(obj, created)
            result.created.append(name)
        for obj in plan.update:
            name = slice_name_of(obj)
            try:
                updated = await self._api.replace(obj)
            except (ConflictError, NotFoundError) as exc:
                raise _StaleError(name, exc) from exc
            self._wrote("update", name, updated)
            self._check_kept(obj, updated)
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

    def _check_kept(self, sent: JsonDict, returned: JsonDict) -> None:
        """Stop sending the fields of a feature the API server drops (its gate is off, as
        before Kubernetes 1.36 for device taints and core sharing): republishing them would
        never converge (:mod:`.gated`)."""
        lost = gated.newly_dropped(sent, returned, self.dropped)
        for feature in lost:
            log.warning("%s", feature.message(), extra={"node": self.node_name})
            self.dropped.add(feature.name)
        if lost:
            self.request_sync()

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
        log_failure(f"ResourceSlice sync for node {self.node_name}", exc, self._worker.failures)
