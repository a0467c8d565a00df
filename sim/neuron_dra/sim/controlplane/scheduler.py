"""A DRA scheduler for pending pods: structured allocation, reservation, binding, release.

For a Pending pod without ``spec.nodeName`` whose ResourceClaims all exist:

0. The nodes it may run on are filtered first (:mod:`.placement`: Ready, not cordoned, taints,
   node selector and affinity, required pod affinity/anti-affinity).
1. Claims already allocated (shared claims, or an earlier attempt of this pod) pin the node.
2. The others are allocated with the shared structured allocator
   (:func:`neuron_dra.sim.allocation.allocate`) over the cached ResourceSlices and
   DeviceClasses, never handing out a device another claim holds. All of a pod's claims land
   on one node: the first claim picks a node (nodes in name order), the rest must fit there;
   otherwise the remaining nodes are tried in order.
3. A claim it allocates first gets the ``resource.kubernetes.io/delete-protection``
   finalizer (an update of the claim), then each claim's ``status.allocation`` and
   ``status.reservedFor`` are written through ``/status`` with its resourceVersion; a conflict
   retries the whole pod.
4. The pod is bound (``pods/<name>/binding``).

If nothing fits the pod stays Pending with a ``FailedScheduling`` Warning Event carrying the
allocator's message and a ``PodScheduled=False`` condition, and is retried whenever
ResourceSlices, ResourceClaims, DeviceClasses or Nodes change.

Releasing claims (``reservedFor``, deallocation, the finalizer) is the resourceclaim
controller's part, as in Kubernetes: see :mod:`.claims`.

Pods being deleted but still bound count as placed (pod affinity and anti-affinity) until they
are gone, like the scheduler's cache of assigned pods; terminal pods do not.

Not modelled: scoring (nodes are tried in name order), resources other than DRA devices,
preemption, scheduling gates.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from neuron_dra.common.events import EventRecorder, EventType, ObjectRef
from neuron_dra.common.k8s.client import (
    DEVICE_CLASSES,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    KubeClient,
    object_key,
    resource_version,
)
from neuron_dra.common.k8s.errors import ConflictError, NotFoundError
from neuron_dra.sim.allocation import (
    DEFAULT_MAX_STEPS,
    AllocationFailure,
    AllocationResult,
    DeviceKey,
    allocate,
)

from .base import (
    DELETE_PROTECTION_FINALIZER,
    JsonDict,
    Loop,
    allocation_node,
    controller_owner_uid,
    is_reserved_for,
    is_terminal,
    meta,
    now_rfc3339,
    pod_claims,
    pod_ref,
    reserved_for,
    uid_index,
    uid_of,
)
from .placement import PlacedPod, feasible_nodes

log = logging.getLogger(__name__)

SCHEDULER_NAME: Final = "default-scheduler"
#: ``status.reservedFor`` holds at most this many consumers.
MAX_RESERVED_FOR: Final = 256


class _Unschedulable(Exception):
    pass


@dataclass(frozen=True)
class _Assumed:
    """Devices we allocated to a claim before our cache shows the write: while the cache
    holds one of the ``stale`` versions (from before the allocation was written)."""

    stale: frozenset[str]
    devices: frozenset[DeviceKey]


def allocated_devices(claim: Mapping[str, Any]) -> set[DeviceKey]:
    """The devices ``claim`` puts in use (an admin-access result does not)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return {
        (str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
        for r in (allocation.get("devices") or {}).get("results") or []
        if not r.get("adminAccess")
    }


class Scheduler(Loop[str]):
    """Schedules pending pods; keys are pod ``namespace/name``."""

    def __init__(self, kube: KubeClient, *, max_steps: int = DEFAULT_MAX_STEPS) -> None:
        super().__init__("sim-scheduler")
        self.kube = kube
        self.max_steps = max_steps
        self.pods = self.reflector(kube.resource(PODS))
        self.pods.store.add_index("uid", uid_index)
        self.claims = self.reflector(kube.resource(RESOURCE_CLAIMS))
        self.slices = self.reflector(kube.resource(RESOURCE_SLICES))
        self.classes = self.reflector(kube.resource(DEVICE_CLASSES))
        self.nodes = self.reflector(kube.resource(NODES))
        self.events = EventRecorder(
            kube, reporting_instance="sim-scheduler", reporting_controller=SCHEDULER_NAME
        )
        self._assumed: dict[str, _Assumed] = {}  # claim uid -> devices
        self._bound: dict[str, str] = {}  # pod uid -> node, until the cache shows it
        self.pods.add_handler(
            on_add=self._on_pod,
            on_update=lambda _old, new: self._on_pod(new),
            on_delete=self._on_pod_gone,
        )
        for r in (self.claims, self.slices, self.classes, self.nodes):
            r.add_handler(
                on_add=lambda _obj: self._requeue_pending(),
                on_update=lambda _old, _new: self._requeue_pending(),
                on_delete=lambda _obj: self._requeue_pending(),
            )

    # --- event handlers --------------------------------------------------------------------

    def _unscheduled(self, pod: Mapping[str, Any]) -> bool:
        spec = pod.get("spec") or {}
        return (
            not spec.get("nodeName")
            and spec.get("schedulerName", SCHEDULER_NAME) == SCHEDULER_NAME
            and not meta(pod).get("deletionTimestamp")
            and (pod.get("status") or {}).get("phase", "Pending") == "Pending"
            and uid_of(pod) not in self._bound
        )

    def _on_pod(self, pod: JsonDict) -> None:
        if (pod.get("spec") or {}).get("nodeName") and self._bound.pop(uid_of(pod), None):
            # Our own binding is now in the cache: pods waiting to be near it (pod affinity)
            # may fit now. (A pod bound while we were not looking is requeued by its claims.)
            self._requeue_pending()
        if self._unscheduled(pod):
            self.queue.add(object_key(pod))
        elif is_terminal(pod):
            self._requeue_pending()  # the affinity it imposed is gone

    def _on_pod_gone(self, pod: JsonDict) -> None:
        self._bound.pop(uid_of(pod), None)
        self._requeue_pending()  # the affinity it imposed is gone

    def _requeue_pending(self) -> None:
        for pod in self.pods.store.list():
            if self._unscheduled(pod):
                self.queue.add(object_key(pod))

    # --- sync ------------------------------------------------------------------------------

    async def sync(self, key: str) -> None:
        pod = self.pods.store.get(key)
        if pod is None or not self._unscheduled(pod):
            return
        try:
            claims = self._claims_of(pod)
            if claims is None:
                return  # a claim does not exist yet; its creation requeues the pod
            allowed = self._feasible(pod)
            if not claims:
                node = allowed[0]
                results: dict[str, AllocationResult] = {}
            else:
                node, results = self._plan(claims, allowed)
        except _Unschedulable as exc:
            await self._unschedulable(pod, str(exc))
            return
        for claim in claims:
            await self._reserve(claim, pod, results.get(uid_of(claim)))
        await self._bind(pod, node)

    def _claims_of(self, pod: JsonDict) -> list[JsonDict] | None:
        ns = meta(pod).get("namespace")
        claims: list[JsonDict] = []
        for pc in pod_claims(pod):
            if pc.claim_name is None:
                return None
            claim = self.claims.store.get(f"{ns}/{pc.claim_name}")
            if claim is None:
                return None
            if pc.generated and controller_owner_uid(claim) != uid_of(pod):
                raise _Unschedulable(
                    f"ResourceClaim {pc.claim_name} was not created for pod {meta(pod)['name']}"
                )
            if meta(claim).get("deletionTimestamp"):
                raise _Unschedulable(f"ResourceClaim {pc.claim_name} is being deleted")
            reserved = reserved_for(claim)
            if len(reserved) >= MAX_RESERVED_FOR and not is_reserved_for(claim, uid_of(pod)):
                raise _Unschedulable(f"ResourceClaim {pc.claim_name} has too many consumers")
            claims.append(claim)
        return claims

    def _placed(self) -> list[PlacedPod]:
        """Pods holding a node (bound, or bound by us and not yet in the cache)."""
        out: list[PlacedPod] = []
        for p in self.pods.store.list():
            m = meta(p)
            node = (p.get("spec") or {}).get("nodeName") or self._bound.get(uid_of(p))
            if not node or is_terminal(p):
                continue
            out.append(PlacedPod(str(m.get("namespace") or ""), m.get("labels") or {}, node))
        return out

    def _feasible(self, pod: JsonDict) -> list[str]:
        nodes = self.nodes.store.list()
        if not nodes:
            raise _Unschedulable("no nodes available to schedule pods")
        got = feasible_nodes(pod, nodes, self._placed())
        if not got.nodes:
            raise _Unschedulable(got.message())
        return got.nodes

    def _in_use(self) -> set[DeviceKey]:
        used: set[DeviceKey] = set()
        current: dict[str, JsonDict] = {}
        for claim in self.claims.store.list():
            used |= allocated_devices(claim)
            current[uid_of(claim)] = claim
        for uid, assumed in list(self._assumed.items()):
            cached = current.get(uid)
            if cached is None or resource_version(cached) not in assumed.stale:
                del self._assumed[uid]  # the cache has caught up (or the claim is gone)
            else:
                used |= assumed.devices
        return used

    def _plan(
        self, claims: Sequence[JsonDict], allowed: Sequence[str]
    ) -> tuple[str, dict[str, AllocationResult]]:
        """(node, allocation per claim uid) for the claims not allocated yet, on one of the
        ``allowed`` nodes (name order)."""
        pinned = {
            node
            for c in claims
            if (node := allocation_node((c.get("status") or {}).get("allocation") or {}))
        }
        if len(pinned) > 1:
            raise _Unschedulable(
                f"the pod's ResourceClaims are allocated on different nodes: {sorted(pinned)}"
            )
        pin = next(iter(pinned), None)
        if pin is not None and pin not in allowed:
            raise _Unschedulable(
                f"the pod's ResourceClaims are allocated on node {pin}, which cannot take the "
                "pod (not ready, cordoned, tainted or excluded by its affinity)"
            )
        todo = [c for c in claims if not (c.get("status") or {}).get("allocation")]
        if not todo:
            return pin or allowed[0], {}
        classes = {str(meta(c).get("name")): c for c in self.classes.store.list()}
        slices = self.slices.store.list()
        used = self._in_use()

        def alloc(claim: JsonDict, node: str | None, taken: set[DeviceKey]) -> AllocationResult:
            got = allocate(
                claim.get("spec") or {},
                classes=classes,
                slices=slices,
                allocated=taken,
                node_name=node,
                max_steps=self.max_steps,
            )
            if isinstance(got, AllocationFailure):
                raise _Unschedulable(got.message)
            return got

        # The first claim searched over every node gives the allocator's own message when it
        # fits nowhere, and usually the node to use.
        first = alloc(todo[0], pin, used)
        ok = set(allowed)
        candidates = [first.node_name] if first.node_name in ok else []
        if pin is None:
            nodes = sorted({str((s.get("spec") or {}).get("nodeName") or "") for s in slices})
            candidates += [n for n in nodes if n in ok and n != first.node_name]
        if not candidates:
            raise _Unschedulable(
                f"the devices fit only on nodes that cannot take the pod ({first.node_name}: "
                "not ready, cordoned, tainted or excluded by its affinity)"
            )
        last = ""
        for node in candidates:
            taken = set(used)
            results: dict[str, AllocationResult] = {}
            try:
                for claim in todo:
                    got = first if claim is todo[0] and node == first.node_name else None
                    got = got or alloc(claim, node, taken)
                    results[uid_of(claim)] = got
                    taken |= got.device_keys
            except _Unschedulable as exc:
                last = str(exc)
                continue
            return node, results
        raise _Unschedulable(f"no node can allocate all {len(todo)} ResourceClaims: {last}")

    async def _reserve(
        self, claim: JsonDict, pod: JsonDict, result: AllocationResult | None
    ) -> None:
        status = copy.deepcopy(claim.get("status") or {})
        changed = False
        stale = {resource_version(claim)}  # versions the cache may show before our write
        api = self.kube.resource(RESOURCE_CLAIMS)
        try:
            if result is not None:
                if DELETE_PROTECTION_FINALIZER not in (meta(claim).get("finalizers") or []):
                    # Protect the claim before it holds devices: deleting it while it is in
                    # use must leave it until the resourceclaim controller releases it.
                    protected = copy.deepcopy(claim)
                    protected["metadata"]["finalizers"] = [
                        *(meta(claim).get("finalizers") or []),
                        DELETE_PROTECTION_FINALIZER,
                    ]
                    claim = await api.replace(protected)
                    stale.add(resource_version(claim))
                status["allocation"] = copy.deepcopy(result.allocation)
                changed = True
            if not is_reserved_for(claim, uid_of(pod)):
                status["reservedFor"] = [*status.get("reservedFor", []), pod_ref(pod)]
                changed = True
            if not changed:
                return
            await api.replace({**claim, "status": status}, subresource="status")
        except ConflictError:
            log.info("claim %s changed meanwhile; retrying its pod", object_key(claim))
            raise
        if result is not None:
            self._assumed[uid_of(claim)] = _Assumed(frozenset(stale), frozenset(result.device_keys))

    async def _bind(self, pod: JsonDict, node: str) -> None:
        m = meta(pod)
        name, ns = str(m.get("name")), str(m.get("namespace"))
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": ns, "uid": uid_of(pod)},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            await self.kube.request(
                "POST",
                PODS.path(ns, name, "binding"),
                body=body,
                content_type="application/json",
            )
        except NotFoundError:
            return  # deleted meanwhile; its release follows from the delete event
        self._bound[uid_of(pod)] = node
        log.info("bound pod %s/%s to %s", ns, name, node)

    async def _unschedulable(self, pod: JsonDict, message: str) -> None:
        m = meta(pod)
        ref = ObjectRef("v1", "Pod", str(m.get("name")), str(m.get("namespace")), uid_of(pod))
        await self.events.record(
            ref,
            type_=EventType.WARNING,
            reason="FailedScheduling",
            note=message,
            action="Scheduling",
        )
        conditions = list((pod.get("status") or {}).get("conditions") or [])
        old = next((c for c in conditions if c.get("type") == "PodScheduled"), None)
        if (
            old is not None
            and old.get("status") == "False"
            and old.get("reason") == "Unschedulable"
            and old.get("message") == message
        ):
            return
        conditions = [c for c in conditions if c.get("type") != "PodScheduled"]
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastTransitionTime": now_rfc3339(),
            }
        )
        try:
            await self.kube.resource(PODS).merge_patch(
                str(m.get("name")),
                {"status": {"conditions": conditions}},
                str(m.get("namespace")),
                subresource="status",
            )
        except NotFoundError:
            return
