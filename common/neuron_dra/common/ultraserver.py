"""UltraServer reservation facts shared by the controller and the kubelet plugin.

The controller records each allocated *unit* (``topologySize`` nodes of one UltraServer) as
one entry of ``NeuronUltraServer.status.allocations``; that is the only place reservations
are written. Each kubelet plugin reads the entries naming its node to tag its devices with
``workloadId`` and to give containers their ranks. These pure functions are the one reading
of that record both sides agree on: :func:`read_allocations` is the one reader of the entries
(``tests/docs/test_wire_readers.py`` fails on another), the controller's
``workloads/entries.py`` their one writer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from neuron_dra.common.constants import WORKLOAD_ID_MAX_LENGTH
from neuron_dra.common.names import is_label_value

#: Suffix length of a workload id: 8 hex chars of the workload UID keep ids unique when a
#: workload is deleted and recreated under the same name.
_UID_SUFFIX_LEN: Final = 8


# Allocation entry phases (crds.AllocationPhase): the words of AWS's operator, and ours for
# the release it does not have.
PHASE_PENDING: Final = "Pending"
PHASE_BOUND: Final = "Bound"
PHASE_RELEASING: Final = "Releasing"
#: How earlier versions spelt Pending and Bound; read as those (the controller rewrites them).
PHASE_LEGACY: Final = {"Reserved": PHASE_PENDING, "Active": PHASE_BOUND}


def entry_phase(entry: Mapping[str, Any]) -> str:
    """An allocation entry's phase in today's words (absent: Pending, the schema default)."""
    raw = str(entry.get("phase") or PHASE_PENDING)
    return PHASE_LEGACY.get(raw, raw)


def workload_id(name: str, uid: str) -> str:
    """Cluster-unique, stable id of a workload, starting with its name.

    ``<name>-<8 hex of uid>``; long names are cut so the id fits a label value (63), the
    limit that matters because the id is also a label on the generated claims.
    """
    digest = hashlib.sha256(uid.encode()).hexdigest()[:_UID_SUFFIX_LEN]
    room = WORKLOAD_ID_MAX_LENGTH - _UID_SUFFIX_LEN - 1
    head = name[:room].rstrip("-.")
    wid = f"{head}-{digest}"
    assert is_label_value(wid), wid
    return wid


def workload_ref(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def global_topo_id(unit_index: int, topology_size: int, node_index: int) -> int:
    """``NEURON_GLOBAL_TOPOID``: the node's rank across the whole workload."""
    if not 0 <= node_index < topology_size:
        raise ValueError(f"node index {node_index} outside a unit of {topology_size}")
    return unit_index * topology_size + node_index


@dataclass(frozen=True)
class Reservation:
    """One node's part in an allocated unit, as the plugin on that node needs it."""

    ultraserver: str
    workload_ref: str
    workload_id: str
    unit_index: int
    topology_size: int
    node_name: str
    #: Position of the node inside its unit (allocatedNodes order: ascending node id).
    node_index: int
    leader_node_name: str | None
    phase: str
    #: ``allocatedAt`` of the entry (None: absent or unparsable); orders a node's entries.
    allocated_at: datetime | None = None

    @property
    def rank(self) -> int:
        return global_topo_id(self.unit_index, self.topology_size, self.node_index)


@dataclass(frozen=True)
class UltraServerPeers:
    """Where a node sits in an operator workload, as its containers' environment says it
    (from its :class:`Reservation` and the leader's address)."""

    #: Index of this UltraServer unit within the workload (allocation ``ultraserverIndex``).
    ultraserver_index: int
    #: Nodes per unit (the workload's ``topologySize``: 1, 2 or 4).
    topology_size: int
    #: This node's position within its unit, 0..topology_size-1.
    node_index: int
    #: Address of the workload's rank-0 node (global topology id 0).
    leader_host: str

    @property
    def global_topo_id(self) -> int:
        return global_topo_id(self.ultraserver_index, self.topology_size, self.node_index)


class ReservationError(RuntimeError):
    """A node's part in a claim's workload cannot be told (the other answer of the plugin's
    topology provider besides :class:`UltraServerPeers`). ``retryable``: the controller has
    not completed the record yet, and a later Prepare succeeds once it has; otherwise the
    devices' workload tag is stale and the claim must move (the controller moves it)."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class AllocationEntry:
    """One entry of ``NeuronUltraServer.status.allocations``: one unit of a workload.

    Read defensively: a malformed value reads as empty (or 0), never raises, as every reader
    of a watched object must."""

    workload_ref: str
    workload_id: str
    #: ``ultraserverIndex``: the unit's index within the workload.
    unit_index: int
    #: ``allocatedNodes``, in the recorded order (ascending node id: ranks follow it).
    nodes: tuple[str, ...]
    #: ``nodeCount``: nodes per unit (the workload's topologySize); the nodes' count if absent.
    topology_size: int
    leader_node_name: str | None
    #: In today's words (:func:`entry_phase`).
    phase: str
    #: ``allocatedAt``; None when absent or not an RFC 3339 time with a zone.
    allocated_at: datetime | None
    #: The entry as written, for the writer that rewrites the list (unknown fields kept).
    raw: Mapping[str, Any] = field(compare=False, repr=False)

    @property
    def identity(self) -> tuple[str, int, str]:
        """(workloadRef, ultraserverIndex, workloadId): how a release finds the entry again
        ((workloadRef, ultraserverIndex) is the list's map key)."""
        return (self.workload_ref, self.unit_index, self.workload_id)


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    # Naive times cannot be compared with aware ones; the CRD says RFC 3339 (always zoned).
    return parsed if parsed.tzinfo is not None else None


def read_allocations(nus: Mapping[str, Any]) -> tuple[AllocationEntry, ...]:
    """The allocation entries of one NeuronUltraServer object, in recorded order."""
    status = nus.get("status")
    entries = status.get("allocations") if isinstance(status, Mapping) else None
    out = []
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, Mapping):
            continue
        listed = entry.get("allocatedNodes")
        nodes = tuple(n for n in listed if isinstance(n, str)) if isinstance(listed, list) else ()
        leader = entry.get("leaderNodeName")
        out.append(
            AllocationEntry(
                workload_ref=str(entry.get("workloadRef") or ""),
                workload_id=str(entry.get("workloadId") or ""),
                unit_index=_int(entry.get("ultraserverIndex")),
                nodes=nodes,
                topology_size=_int(entry.get("nodeCount")) or len(nodes) or 1,
                leader_node_name=str(leader) if leader else None,
                phase=entry_phase(entry),
                allocated_at=_time(entry.get("allocatedAt")),
                raw=entry,
            )
        )
    return tuple(out)


def reservations(nus: Mapping[str, Any]) -> list[Reservation]:
    """Every (node, unit) reservation recorded in one NeuronUltraServer object."""
    name = str((nus.get("metadata") or {}).get("name", ""))
    return [
        Reservation(
            ultraserver=name,
            workload_ref=entry.workload_ref,
            workload_id=entry.workload_id,
            unit_index=entry.unit_index,
            topology_size=entry.topology_size,
            node_name=node,
            node_index=index,
            leader_node_name=entry.leader_node_name,
            phase=entry.phase,
            allocated_at=entry.allocated_at,
        )
        for entry in read_allocations(nus)
        for index, node in enumerate(entry.nodes)
    ]


def node_reservations(
    nus_objects: Iterable[Mapping[str, Any]], node_name: str
) -> list[Reservation]:
    """The reservations naming ``node_name`` across all NeuronUltraServers.

    More than one means the record is inconsistent (a node booked twice); callers must treat
    that as an error, not pick one.
    """
    return [r for nus in nus_objects for r in reservations(nus) if r.node_name == node_name]
