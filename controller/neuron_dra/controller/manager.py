"""The controller process: caches, queues, workers, leader election, HTTP endpoints.

Every replica keeps its caches warm (reflectors run whether or not it leads), so a new
leader starts reconciling at once; only the leader runs the workers that write. Watch
events only *enqueue keys*: reconcilers are level-triggered and read the caches, so a burst
of events for one object costs one reconcile (the queue de-duplicates keys).

Event → keys:
- ResourceSlice / Node → the UltraServers they belong to (discovery), and the workloads
  holding a reservation on that node (failure handling);
- NeuronUltraServer → the workloads named in its allocations, plus every workload waiting
  for capacity (a change may have freed or added nodes);
- NeuronUltraServerWorkload → itself; ResourceClaimTemplate → its owning workload.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from neuron_dra.common.constants import (
    DRIVER_NAME,
    KIND_WORKLOAD,
    LABEL_WORKLOAD_ID,
)
from neuron_dra.common.events import EventRecorder
from neuron_dra.common.httpserver import HttpServer
from neuron_dra.common.k8s.client import (
    LEASES,
    NEURON_ULTRASERVER_WORKLOADS,
    NEURON_ULTRASERVERS,
    NODES,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    KubeClient,
)
from neuron_dra.common.k8s.leaderelection import LeaderElectionConfig, LeaderElector
from neuron_dra.common.k8s.reflector import Reflector, ReflectorMetrics
from neuron_dra.common.k8s.workqueue import QueueMetrics, QueueShutDown, WorkQueue
from neuron_dra.common.ultraserver import node_reservations, read_allocations, workload_id
from neuron_dra.controller.caches import (
    DeviceClaimStore,
    NodeStore,
    SliceStore,
    SlimListClient,
    UltraServerStore,
    claim_nodes_in_use,
    slim_claim,
    slim_node,
    slim_slice,
)
from neuron_dra.controller.context import REPORTING_CONTROLLER, ControllerContext
from neuron_dra.controller.discovery import (
    UltraServerDiscovery,
    keys_for_node,
    keys_for_slice,
    keys_for_ultraserver,
)
from neuron_dra.controller.protoslim import NODE_CODEC, SLICE_CODEC
from neuron_dra.controller.templates import MANAGED_BY_LABEL, MANAGED_BY_VALUE
from neuron_dra.controller.workloads import WorkloadReconciler, orphan_claims_key

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]
LEASE_NAME = "neuron-dra-controller"
#: Seconds of cache events gathered before the allocator's fleet index catches up with them
#: in the background (``WorkloadReconciler.sync_fleet``).
FLEET_SYNC_DELAY: Final = 0.5


@dataclass(frozen=True)
class ManagerConfig:
    namespace: str
    leader_elect: bool = False
    identity: str = ""
    workers: int = 4
    http_host: str = "0.0.0.0"
    http_port: int = 8080


def default_identity() -> str:
    return f"{socket.gethostname()}_{os.getpid()}"


def _owner_workload_key(template: Mapping[str, Any]) -> str | None:
    meta = template.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == KIND_WORKLOAD:
            return f"{meta.get('namespace', '')}/{ref.get('name', '')}"
    return None


#: Index on ``ctx.workloads``: status.workloadId → the workload.
WORKLOAD_BY_ID: Final = "manager/workload-id"


def _workload_id(obj: JsonDict) -> list[str]:
    wid = (obj.get("status") or {}).get("workloadId")
    return [str(wid)] if wid else []


#: Index on ``ctx.ultraservers``: node name → NeuronUltraServers whose allocations name it.
NUS_BY_HELD_NODE: Final = "manager/held-nodes"


def _held_nodes(nus: JsonDict) -> list[str]:
    return [n for entry in read_allocations(nus) for n in entry.nodes]


def _node_of_slice(obj: Mapping[str, Any]) -> str | None:
    name = (obj.get("spec") or {}).get("nodeName")
    return str(name) if name else None


class ControllerManager:
    """Wires reflectors → queues → reconcilers for one controller replica."""

    def __init__(self, kube: KubeClient, config: ManagerConfig) -> None:
        self.kube = kube
        self.config = config
        self.ctx = ControllerContext(
            kube=kube,
            events=EventRecorder(
                kube,
                reporting_instance=config.identity or default_identity(),
                reporting_controller=REPORTING_CONTROLLER,
            ),
            namespace=config.namespace,
            slices=SliceStore(),
            nodes=NodeStore(),
            ultraservers=UltraServerStore(),
            device_claims=DeviceClaimStore(),
        )
        self.ctx.ultraservers.add_index(NUS_BY_HELD_NODE, _held_nodes)
        self.ctx.workloads.add_index(WORKLOAD_BY_ID, _workload_id)
        registry = self.ctx.registry
        reflector_metrics = ReflectorMetrics(registry)
        queue_metrics = QueueMetrics(registry)
        self.discovery = UltraServerDiscovery(self.ctx)
        self.workloads = WorkloadReconciler(self.ctx)
        self.discovery_queue: WorkQueue[str] = WorkQueue("ultraservers", metrics=queue_metrics)
        self.workload_queue: WorkQueue[str] = WorkQueue("workloads", metrics=queue_metrics)
        ctx = self.ctx
        self.reflectors = [
            Reflector(
                SlimListClient(kube, RESOURCE_SLICES, slim_slice, SLICE_CODEC),
                ctx.slices,
                name="resourceslices",
                field_selector=f"spec.driver={DRIVER_NAME}",
                metrics=reflector_metrics,
            ),
            Reflector(
                SlimListClient(kube, NODES, slim_node, NODE_CODEC),
                ctx.nodes,
                name="nodes",
                metrics=reflector_metrics,
            ),
            Reflector(
                kube.resource(NEURON_ULTRASERVERS),
                ctx.ultraservers,
                name="neuronultraservers",
                namespace=config.namespace,
                metrics=reflector_metrics,
            ),
            Reflector(
                kube.resource(NEURON_ULTRASERVER_WORKLOADS),
                ctx.workloads,
                name="neuronultraserverworkloads",
                metrics=reflector_metrics,
            ),
            Reflector(
                kube.resource(RESOURCE_CLAIM_TEMPLATES),
                ctx.templates,
                name="resourceclaimtemplates",
                label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}",
                metrics=reflector_metrics,
            ),
            Reflector(
                kube.resource(RESOURCE_CLAIMS),
                ctx.claims,
                name="resourceclaims",
                label_selector=LABEL_WORKLOAD_ID,
                metrics=reflector_metrics,
            ),
            # Every claim, slim: which nodes' devices claims of no workload use.
            Reflector(
                SlimListClient(kube, RESOURCE_CLAIMS, slim_claim),
                ctx.device_claims,
                name="resourceclaims-in-use",
                metrics=reflector_metrics,
            ),
        ]
        slices, nodes, nus, nusw, rcts, claims, device_claims = self.reflectors
        slices.add_handler(
            on_add=self._on_slice, on_update=self._on_slice_update, on_delete=self._on_slice
        )
        nodes.add_handler(
            on_add=self._on_node, on_update=lambda _o, n: self._on_node(n), on_delete=self._on_node
        )
        nus.add_handler(on_add=self._on_nus, on_update=self._on_nus_update, on_delete=self._on_nus)
        nusw.add_handler(
            on_add=self._on_workload,
            on_update=lambda _o, n: self._on_workload(n),
            on_delete=self._on_workload_deleted,
        )
        rcts.add_handler(
            on_add=self._on_template,
            on_update=lambda _o, n: self._on_template(n),
            on_delete=self._on_template,
        )
        claims.add_handler(
            on_add=self._on_claim, on_update=lambda _o, n: self._on_claim(n), on_delete=None
        )
        device_claims.add_handler(
            on_add=self._on_device_claim,
            on_update=self._on_device_claim_update,
            on_delete=self._on_device_claim,
        )
        self.http = HttpServer(registry=registry)
        self.http.add_liveness("reflectors", self._reflectors_alive)
        self.http.add_readiness("caches", self._caches_synced)
        self.elector: LeaderElector | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._workers: list[asyncio.Task[None]] = []
        self.leading = asyncio.Event()
        self._fleet_sync: asyncio.TimerHandle | None = None

    # -- event → keys -----------------------------------------------------------------------

    def _workloads_on_nodes(self, nodes: Iterable[str]) -> set[str]:
        # Only the NeuronUltraServers recording the node can name it (index, not a scan: a
        # relist delivers every slice and Node).
        store = self.ctx.ultraservers
        return {
            r.workload_ref
            for n in nodes
            for r in node_reservations(store.by_index(NUS_BY_HELD_NODE, n), n)
        }

    def _fleet_changed(self) -> None:
        """Something the allocator's fleet index derives from changed: bring the index up
        to date soon, in the background, a batch of events at a time. Decisions would catch
        up by themselves, but then the first one after start-up (or after a relist) would
        index the whole fleet: a second at 10,000 nodes."""
        if self._fleet_sync is None:
            loop = asyncio.get_running_loop()
            self._fleet_sync = loop.call_later(FLEET_SYNC_DELAY, self._sync_fleet)

    def _sync_fleet(self) -> None:
        self._fleet_sync = None
        try:
            self.workloads.sync_fleet()
        except Exception:
            # The next decision syncs again (and reports the error in its reconcile).
            log.exception("background sync of the fleet index failed")

    def _on_slice(self, obj: JsonDict) -> None:
        self._fleet_changed()
        for key in keys_for_slice(obj):
            self.discovery_queue.add(key)
        node = _node_of_slice(obj)
        if node:
            for key in self._workloads_on_nodes([node]):
                self.workload_queue.add(key)

    def _on_slice_update(self, old: JsonDict, new: JsonDict) -> None:
        self._on_slice(old)  # an UltraServer id may have changed: requeue both sides
        self._on_slice(new)

    def _on_node(self, obj: JsonDict) -> None:
        self._fleet_changed()
        for key in keys_for_node(obj, self.ctx):
            self.discovery_queue.add(key)
        name = (obj.get("metadata") or {}).get("name")
        if name:
            for key in self._workloads_on_nodes([str(name)]):
                self.workload_queue.add(key)

    def _on_nus(self, obj: JsonDict) -> None:
        self._requeue_for_nus(obj)

    def _on_nus_update(self, old: JsonDict, new: JsonDict) -> None:
        self._requeue_for_nus(old, new)

    def _requeue_for_nus(self, *versions: JsonDict) -> None:
        self._fleet_changed()
        # The waiting workloads once per event, not once per version: the list is O(workloads).
        keys = set(self.workloads.pending_keys())
        for obj in versions:
            keys |= self.workloads.keys_for_ultraserver(obj)
        for key in keys:
            self.workload_queue.add(key)
        # Deleted or edited by someone else: discovery decides whether it should exist.
        for obj in versions:
            for key in keys_for_ultraserver(obj):
                self.discovery_queue.add(key)

    def _on_workload(self, obj: JsonDict) -> None:
        meta = obj.get("metadata") or {}
        self.workload_queue.add(f"{meta.get('namespace', '')}/{meta.get('name', '')}")

    def _on_workload_deleted(self, obj: JsonDict) -> None:
        """The workload is gone for good (its finalizer removed). A claim made from its
        template while it was being deleted was still its workload's then, so ``_on_claim``
        queued no orphan check for it, and an allocated claim sees no further event: look
        for such claims now."""
        self._on_workload(obj)
        meta = obj.get("metadata") or {}
        wid = workload_id(str(meta.get("name", "")), str(meta.get("uid") or ""))
        self.workload_queue.add(orphan_claims_key(str(meta.get("namespace", "")), wid))

    def _on_claim(self, claim: JsonDict) -> None:
        """A workload's claim was allocated (or changed): its workload checks that it landed on
        one of its nodes (a stale tag can mislead the scheduler after a move). A claim whose
        workload is gone is queued for deletion (see ``workloads.orphans.delete_orphan_claims``)."""
        meta = claim.get("metadata") or {}
        wid = (meta.get("labels") or {}).get(LABEL_WORKLOAD_ID)
        if not wid or meta.get("deletionTimestamp"):
            return
        keys = self.ctx.workloads.index_keys(WORKLOAD_BY_ID, str(wid))
        if not keys:
            self.workload_queue.add(orphan_claims_key(str(meta.get("namespace", "")), str(wid)))
            return
        if not ((claim.get("status") or {}).get("allocation")):
            return
        for key in keys:
            self.workload_queue.add(key)

    def _on_device_claim(self, claim: JsonDict) -> None:
        if claim_nodes_in_use(claim):
            self._nodes_in_use_changed()

    def _on_device_claim_update(self, old: JsonDict, new: JsonDict) -> None:
        if claim_nodes_in_use(old) != claim_nodes_in_use(new):
            self._nodes_in_use_changed()

    def _nodes_in_use_changed(self) -> None:
        """Claims of no workload took or gave back a node's devices: the free units change,
        and a workload waiting for capacity may fit now."""
        self._fleet_changed()
        for key in self.workloads.pending_keys():
            self.workload_queue.add(key)

    def _on_template(self, obj: JsonDict) -> None:
        key = _owner_workload_key(obj)
        if key:
            self.workload_queue.add(key)

    # -- health ---------------------------------------------------------------------------

    def _reflectors_alive(self) -> tuple[bool, str]:
        dead = [t.get_name() for t in self._tasks if t.done()]
        return (not dead, "ok" if not dead else f"stopped: {', '.join(dead)}")

    def _caches_synced(self) -> tuple[bool, str]:
        waiting = [r.name for r in self.reflectors if not r.has_synced()]
        if waiting:
            return False, f"caches not synced: {', '.join(str(w) for w in waiting)}"
        if self.config.leader_elect and not self.leading.is_set():
            return True, "standby (not leading)"
        return True, "ok"

    # -- workers --------------------------------------------------------------------------

    async def _worker(
        self, queue: WorkQueue[str], reconcile: Callable[[str], Awaitable[float | None]]
    ) -> None:
        while True:
            try:
                key = await queue.get()
            except QueueShutDown:
                return
            try:
                requeue_after = await reconcile(key)
            except asyncio.CancelledError:
                queue.done(key)
                raise
            except Exception:
                log.exception("reconcile %s %s failed; retrying with backoff", queue.name, key)
                queue.done(key)
                queue.add_rate_limited(key)
                continue
            queue.forget(key)
            queue.done(key)
            if requeue_after is not None:
                queue.add_after(key, requeue_after)

    async def _reconcile_ultraserver(self, key: str) -> float | None:
        await self.discovery.reconcile(key)
        return None

    async def _reconcile_workload(self, key: str) -> float | None:
        result = await self.workloads.reconcile(key)
        return result.requeue_after

    def _start_workers(self) -> None:
        for i in range(self.config.workers):
            self._workers.append(
                asyncio.create_task(
                    self._worker(self.discovery_queue, self._reconcile_ultraserver),
                    name=f"ultraserver-worker-{i}",
                )
            )
        # Allocation decisions are global (FIFO across workloads): one worker keeps them
        # serialized inside this replica; the RV-guarded writes keep replicas safe.
        self._workers.append(
            asyncio.create_task(
                self._worker(self.workload_queue, self._reconcile_workload),
                name="workload-worker",
            )
        )

    async def _lead(self) -> None:
        self.leading.set()
        log.info("leading: starting workers")
        self._start_workers()
        # Everything already cached needs a look now that we may write.
        for obj in self.ctx.workloads.list():
            self._on_workload(obj)
        for obj in self.ctx.slices.list():
            for key in keys_for_slice(obj):
                self.discovery_queue.add(key)
        for obj in self.ctx.ultraservers.list():
            for key in keys_for_ultraserver(obj):
                self.discovery_queue.add(key)
        await asyncio.Event().wait()  # until cancelled when leadership ends

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        for r in self.reflectors:
            self._tasks.append(r.start())
        await self.http.start(self.config.http_host, self.config.http_port)
        await asyncio.gather(*(r.wait_synced() for r in self.reflectors))
        if self.config.leader_elect:
            self.elector = LeaderElector(
                self.kube.resource(LEASES),
                LeaderElectionConfig(
                    lease_name=LEASE_NAME,
                    namespace=self.config.namespace,
                    identity=self.config.identity or default_identity(),
                ),
                on_started_leading=self._lead,
            )
            self._tasks.append(asyncio.create_task(self.elector.run(), name="leader-election"))
        else:
            self._tasks.append(asyncio.create_task(self._lead(), name="leader"))

    async def wait_lost(self) -> None:
        """Returns when this replica stopped leading (the process should then exit)."""
        if self.elector is None:
            await asyncio.Event().wait()
            return
        await self.elector.lost_leadership.wait()

    async def stop(self) -> None:
        if self._fleet_sync is not None:
            self._fleet_sync.cancel()
            self._fleet_sync = None
        if self.elector is not None:
            self.elector.stop()
        self.discovery_queue.shutdown()
        self.workload_queue.shutdown()
        for task in self._workers + self._tasks:
            task.cancel()
        for task in self._workers + self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for r in self.reflectors:
            await r.stop()
        await self.http.stop()
