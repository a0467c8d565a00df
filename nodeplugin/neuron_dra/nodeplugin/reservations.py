"""This node's UltraServer reservations, from the NeuronUltraServers' status.

The controller writes allocations only into ``NeuronUltraServer.status.allocations``; it never
touches our slices. :class:`ReservationWatcher` turns that record into the two things the
kubelet plugin needs:

* ``workload_ids()`` for the :class:`~.publisher.SlicePublisher`: while the node is reserved,
  every device and ``neuronnode`` carry the workload's ``workloadId`` (which keeps them out of
  other claims' reach: the generated claims select by it, the default classes exclude it);
* ``topology(plan)`` for the :class:`~.preparer.Preparer`: the rank and the leader's address
  that go into the container as ``NEURON_GLOBAL_TOPOID`` / ``NEURON_GLOBAL_TOPOID0_HOST``.

NeuronUltraServers name their nodes only in ``status``, which can be neither field- nor
label-selected, so we watch all of them in the driver namespace (one per UltraServer: a small
set) and filter in memory. ``on_change`` fires only when the entries naming this node change,
so allocations on other UltraServers never cost this node a republish.

A node named by more than one entry is an inconsistent record (the controller never
double-books). Dropping the tag would be the worst answer: the node would look free and a
third party could get it. So the node stays reserved for one of them, chosen the same way on
every restart (:func:`choose_reservation`), and the inconsistency is logged and exported as a
metric for someone to fix.

Leader address: ``topology()`` is called synchronously while a claim is prepared, so the
leader Node's address is looked up (one GET, retried) as soon as a reservation appears and
cached; until the lookup has finished, or if it fails, the leader's node name is used, which
resolves in cluster DNS on EKS (and is normally the same string as InternalDNS there). The
lookup starts together with the republish that tags the devices, and a workload claim can only
be allocated once the tag is published, so in practice it has finished long before Prepare.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from neuron_dra.common.constants import DRIVER_NAMESPACE
from neuron_dra.common.k8s.cache import Store
from neuron_dra.common.k8s.client import NEURON_ULTRASERVERS, NODES, KubeClient, object_key
from neuron_dra.common.k8s.clock import Clock, SystemClock
from neuron_dra.common.k8s.errors import KubeError, NotFoundError
from neuron_dra.common.k8s.reflector import Reflector, ReflectorMetrics
from neuron_dra.common.ultraserver import (
    PHASE_RELEASING,
    Reservation,
    ReservationError,
    UltraServerPeers,
    node_reservations,
    read_allocations,
)
from neuron_dra.nodeplugin.publish.slices import WHOLE_NODE
from prometheus_client import CollectorRegistry, Gauge

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]


#: Node address types in the order we prefer them for NEURON_GLOBAL_TOPOID0_HOST: a name that
#: stays valid if the interface's address is re-assigned, then the raw address.
ADDRESS_PREFERENCE: Final = ("InternalDNS", "Hostname", "InternalIP")


# --- pure decisions ----------------------------------------------------------------------------


def node_entries(nus: Mapping[str, Any], node_name: str) -> tuple[Reservation, ...]:
    """The allocation entries of one NeuronUltraServer that name ``node_name``."""
    return tuple(node_reservations([nus], node_name))


def _sort_key(r: Reservation) -> tuple[int, float, str, str, int]:
    # Entries without allocatedAt sort after dated ones; the names and the index make the
    # order total, so the choice never depends on watch-event order.
    dated = r.allocated_at is not None
    stamp = r.allocated_at.timestamp() if r.allocated_at is not None else 0.0
    return (0 if dated else 1, stamp, r.ultraserver, r.workload_ref, r.unit_index)


def choose_reservation(entries: Sequence[Reservation]) -> Reservation | None:
    """The reservation in effect on the node: one entry, or the rule for an inconsistent record.

    The earliest allocated entry that is not ``Releasing`` wins: it is the one whose pods may
    already run here, and a releasing entry must not keep the node from the other one (the
    controller waits for the release's tags to clear). If every entry is releasing, the
    earliest of them (the node is then published untagged, see :func:`workload_ids_for`).
    Deterministic, so a restarted plugin picks the same entry.
    """
    if not entries:
        return None
    ordered = sorted(entries, key=_sort_key)
    active = [e for e in ordered if e.phase != PHASE_RELEASING]
    return (active or ordered)[0]


def workload_ids_for(reservation: Reservation | None) -> dict[int | str, str]:
    """What the slice builder needs to tag the node: the whole node (every device and
    ``neuronnode``) under ``WHOLE_NODE``; nothing once the reservation is being released, so
    the controller sees the tags clear and can finish the release."""
    if reservation is None or reservation.phase == PHASE_RELEASING:
        return {}
    return {WHOLE_NODE: reservation.workload_id}


def node_address(node: Mapping[str, Any]) -> str | None:
    """The Node's preferred address (:data:`ADDRESS_PREFERENCE`), None if it lists none."""
    addresses = (node.get("status") or {}).get("addresses") or []
    for kind in ADDRESS_PREFERENCE:
        for a in addresses:
            if isinstance(a, Mapping) and a.get("type") == kind and a.get("address"):
                return str(a["address"])
    return None


def workload_leader(nus_objects: Iterable[Mapping[str, Any]], workload_id: str) -> str | None:
    """Rank 0 of a workload from the record itself: first node of its unit 0.

    Only for an entry without ``leaderNodeName`` (the controller normally writes it).
    """
    for nus in nus_objects:
        for e in read_allocations(nus):
            if e.workload_id == workload_id and e.unit_index == 0 and e.nodes:
                return e.nodes[0]
    return None


# --- the watcher ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LookupPolicy:
    """Leader Node lookups: a few tries; after that the node name is the answer."""

    attempts: int = 4
    backoff_base: float = 0.5
    request_timeout: float = 10.0


class ReservationWatcher:
    """Watches NeuronUltraServers for entries naming ``node_name`` (see the module doc)."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        node_name: str,
        namespace: str = DRIVER_NAMESPACE,
        on_change: Callable[[], None],
        clock: Clock | None = None,
        lookup: LookupPolicy | None = None,
        registry: CollectorRegistry | None = None,
        reflector_metrics: ReflectorMetrics | None = None,
    ) -> None:
        self.node_name = node_name
        self.namespace = namespace
        self._on_change = on_change
        # For the leader lookup's backoff only; the reflector keeps real time for its watchdog.
        self._clock: Clock = clock or SystemClock()
        self._lookup = lookup or LookupPolicy()
        self._nodes = kube.resource(NODES)
        self.store = Store()
        self.reflector = Reflector(
            kube.resource(NEURON_ULTRASERVERS),
            self.store,
            name=f"neuronultraservers/{node_name}",
            namespace=namespace,
            metrics=reflector_metrics,
        )
        self.reflector.add_handler(
            on_add=self._on_event,
            on_update=lambda _old, new: self._on_event(new),
            on_delete=self._on_delete,
        )
        # Per NeuronUltraServer (store key): its entries naming this node. Kept per object so
        # an event costs one object's work, not a scan of every UltraServer.
        self._by_object: dict[str, tuple[Reservation, ...]] = {}
        self._entries: tuple[Reservation, ...] = ()
        self._chosen: Reservation | None = None
        # Leader node name -> its resolved address, for the leaders of the current entries.
        self._leader_hosts: dict[str, str] = {}
        self._lookups: dict[str, asyncio.Task[None]] = {}
        #: How many times on_change was called (diagnostics and tests).
        self.changes = 0
        self._gauge = Gauge(
            "neuron_dra_node_ultraserver_reservations",
            "NeuronUltraServer allocation entries naming this node (more than 1 is an "
            "inconsistent record).",
            registry=registry if registry is not None else CollectorRegistry(),
        )

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Start watching (in the running loop); returns at once."""
        self.reflector.start()

    async def stop(self) -> None:
        await self.reflector.stop()
        tasks = list(self._lookups.values())
        self._lookups.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def wait_synced(self) -> None:
        """Until the first LIST was seen: before that, "no reservation" is not yet known.

        Publish slices only after this, or a restarted plugin would briefly publish a reserved
        node untagged.
        """
        await self.reflector.wait_synced()

    async def wait_lookups(self) -> None:
        """Until the leader lookups started so far have finished (resolved or given up)."""
        while pending := [t for t in self._lookups.values() if not t.done()]:
            await asyncio.wait(pending)

    # --- reads ---------------------------------------------------------------------------

    def entries(self) -> tuple[Reservation, ...]:
        """Every entry naming this node (normally 0 or 1), in :func:`choose_reservation` order."""
        return tuple(sorted(self._entries, key=_sort_key))

    def reservation(self) -> Reservation | None:
        """The reservation in effect on this node (:func:`choose_reservation`), or None."""
        return self._chosen

    def workload_ids(self) -> dict[int | str, str]:
        """For ``SlicePublisher(workload_ids=...)``."""
        return workload_ids_for(self._chosen)

    def leader_host(self, leader_node_name: str) -> str:
        """The leader's address if looked up, else its node name (resolvable on EKS)."""
        return self._leader_hosts.get(leader_node_name, leader_node_name)

    def topology(self, workload_id: str | None) -> UltraServerPeers | None:
        """For ``Preparer(topology=...)``: this node's place in workload ``workload_id`` (the
        one a claim's devices are tagged for; None: a claim of no workload).

        None for a claim whose devices carry no workload tag; :class:`ReservationError` when
        they do but no entry of that workload names this node (a stale tag: permanent) or
        the entry's leader is not known yet (retryable). Every entry is considered,
        not only the one in effect: the facts of an entry are right for its own workload, and
        which claims may use the devices is decided by the published tags (claims.py).
        """
        if workload_id is None:
            return None
        match = next((e for e in self._entries if e.workload_id == workload_id), None)
        if match is None:
            # The devices still carry the workload's tag (this node has not republished yet)
            # but no entry names this node for it any more: released or moved (RestartAll,
            # ReplaceAffected). Starting the container without its rank would hang the job's
            # collectives; refuse, and let the controller move the claim.
            raise ReservationError(
                f"node {self.node_name} holds no reservation for workload "
                f"{workload_id} (released or moved); its devices' workloadId tag is stale",
                retryable=False,
            )
        leader = match.leader_node_name or workload_leader(self.store.list(), match.workload_id)
        if leader is None:
            # The controller writes the entries unit by unit: until unit 0's is there, the
            # rank-0 host is not known. Retryable: the kubelet's next try finds it.
            raise ReservationError(
                f"the leader node of workload {match.workload_id} is unknown "
                f"(NeuronUltraServer {match.ultraserver} has no leaderNodeName and no unit 0 of "
                "the workload is recorded yet)",
                retryable=True,
            )
        return UltraServerPeers(
            ultraserver_index=match.unit_index,
            topology_size=match.topology_size,
            node_index=match.node_index,
            leader_host=self.leader_host(leader),
        )

    # --- events --------------------------------------------------------------------------

    def _on_event(self, obj: JsonDict) -> None:
        entries = node_entries(obj, self.node_name)
        key = object_key(obj)
        if entries:
            self._by_object[key] = entries
        elif self._by_object.pop(key, None) is None:
            return  # neither before nor now about this node: the common case
        self._recompute()

    def _on_delete(self, obj: JsonDict) -> None:
        if self._by_object.pop(object_key(obj), None) is not None:
            self._recompute()

    def _recompute(self) -> None:
        entries = tuple(e for key in sorted(self._by_object) for e in self._by_object[key])
        if frozenset(entries) == frozenset(self._entries):
            return  # e.g. another node's entry in the same object changed
        previous = self._chosen
        self._entries = entries
        self._chosen = choose_reservation(entries)
        self._gauge.set(len(entries))
        if len(entries) > 1:
            log.error(
                "node %s is named by %d NeuronUltraServer allocations (%s); keeping it reserved "
                "for %s until the record is fixed",
                self.node_name,
                len(entries),
                ", ".join(_describe(e) for e in entries),
                _describe(self._chosen) if self._chosen is not None else "none",
                extra={"node": self.node_name},
            )
        elif previous != self._chosen:
            log.info(
                "node %s reservation: %s",
                self.node_name,
                _describe(self._chosen) if self._chosen is not None else "none",
                extra={"node": self.node_name},
            )
        self._refresh_lookups()
        self.changes += 1
        self._on_change()

    # --- leader lookups ------------------------------------------------------------------

    def _refresh_lookups(self) -> None:
        leaders = {e.leader_node_name for e in self._entries if e.leader_node_name is not None}
        # Forget leaders no longer referenced, so a later reservation looks its leader up
        # afresh instead of trusting an address cached for an earlier workload.
        for name in set(self._leader_hosts) - leaders:
            del self._leader_hosts[name]
        for name in set(self._lookups) - leaders:
            self._lookups.pop(name).cancel()
        for name in leaders - set(self._leader_hosts) - set(self._lookups):
            task = asyncio.get_running_loop().create_task(
                self._resolve(name), name=f"leader-lookup-{name}"
            )
            self._lookups[name] = task
            task.add_done_callback(functools.partial(self._lookup_done, name))

    def _lookup_done(self, name: str, task: asyncio.Task[None]) -> None:
        # A cancelled lookup was already replaced or dropped; only forget our own entry.
        if self._lookups.get(name) is task:
            del self._lookups[name]

    async def _resolve(self, name: str) -> None:
        policy = self._lookup
        for attempt in range(policy.attempts):
            try:
                node = await self._nodes.get(name, request_timeout=policy.request_timeout)
            except NotFoundError:
                log.warning(
                    "leader node %s not found; using its name as NEURON_GLOBAL_TOPOID0_HOST",
                    name,
                    extra={"node": self.node_name},
                )
                return
            except KubeError as exc:
                if not exc.retryable or attempt + 1 >= policy.attempts:
                    log.warning(
                        "cannot read leader node %s (%s); using its name as "
                        "NEURON_GLOBAL_TOPOID0_HOST",
                        name,
                        exc,
                        extra={"node": self.node_name},
                    )
                    return
                await self._clock.sleep(policy.backoff_base * 2**attempt)
                continue
            address = node_address(node)
            if address is None:
                log.warning(
                    "leader node %s lists no address; using its name",
                    name,
                    extra={"node": self.node_name},
                )
                return
            self._leader_hosts[name] = address
            log.debug("leader node %s: %s", name, address, extra={"node": self.node_name})
            return


def _describe(r: Reservation) -> str:
    return (
        f"workload {r.workload_id} ({r.workload_ref}) unit {r.unit_index} node {r.node_index}"
        f"/{r.topology_size} on {r.ultraserver} [{r.phase}]"
    )
