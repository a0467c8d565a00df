"""The units one UltraServer can offer, and how they rank. Pure: no I/O.

A unit is ``topologySize`` nodes of one UltraServer that the hardware can run as one
NeuronLink domain: size 4 is the whole UltraServer (node ids 0..3), size 2 one of the two X2V
pairs {0, 1} / {2, 3}, size 1 any node. Nothing else is offered, so a request can never be
granted a shape the node plugins would refuse to prepare.

Everything here is a function of one (immutable) ``UltraServerState`` and is computed once
per state object: the fleet-wide ``UnitIndex`` and the planner in ``planner`` ask about
the same states again and again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

_T = TypeVar("_T")

#: Nodes of one UltraServer carry node ids 0..3.
ULTRASERVER_NODES: Final = 4
#: Unit sizes the hardware supports (the values of ``topologySize``).
UNIT_SIZES: Final[tuple[int, ...]] = (1, 2, 4)
#: The node pairs a size-2 unit may use (the driver's X2V pairs).
_PAIRS: Final[tuple[tuple[int, int], ...]] = ((0, 1), (2, 3))


@dataclass(frozen=True)
class NodeState:
    name: str
    #: 0..3 inside its UltraServer.
    node_id: int
    #: Ready, slice present, devices healthy, links up.
    healthy: bool
    #: workloadRef ("ns/name") holding the node, else None.
    reserved_by: str | None
    #: Some of its Neuron devices are allocated to claims of no workload (a plain claim's
    #: pod runs there): a unit reserved on it would wait until they go, since a workload's
    #: claims take whole nodes. Like a reservation, it passes (capacity still counts it).
    in_use: bool = False

    @property
    def free(self) -> bool:
        return self.healthy and self.reserved_by is None and not self.in_use


@dataclass(frozen=True)
class UltraServerState:
    #: NeuronUltraServer name (= UltraServer id).
    name: str
    instance_type: str
    nodes: tuple[NodeState, ...]
    #: Values derived from this (immutable) state, computed on first use: candidate units,
    #: capacity. Whoever keeps an unchanged state object across plans (``UnitIndex``,
    #: ``ServerCache``) thereby ranks only the UltraServers that changed. Not part of the value.
    _derived: dict[Any, Any] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )


#: Preference of a candidate unit, smallest first: (class, free nodes, UltraServer, node id).
UnitKey = tuple[int, int, str, int]
Ranked = list[tuple[UnitKey, tuple[NodeState, ...]]]


def _derive(server: UltraServerState, key: Any, compute: Callable[[], _T]) -> _T:
    try:
        value: _T = server._derived[key]
    except KeyError:
        value = server._derived[key] = compute()
    return value


def _check_size(size: int) -> None:
    if size not in UNIT_SIZES:
        raise ValueError(f"unit size must be one of {UNIT_SIZES}, got {size}")


def usable_by_id(server: UltraServerState) -> dict[int, NodeState]:
    """Nodes addressable by node id. An id outside 0..3, or one claimed by two nodes, says the
    record is inconsistent; such nodes are left out rather than guessed at."""

    def compute() -> dict[int, NodeState]:
        counts = Counter(n.node_id for n in server.nodes)
        return {
            n.node_id: n
            for n in server.nodes
            if 0 <= n.node_id < ULTRASERVER_NODES and counts[n.node_id] == 1
        }

    return _derive(server, "by_id", compute)


def free_count(server: UltraServerState) -> int:
    return _derive(server, "free", lambda: sum(1 for n in usable_by_id(server).values() if n.free))


def _ranked_candidates(
    server: UltraServerState, size: int
) -> list[tuple[int, tuple[NodeState, ...]]]:
    """Free units of ``size`` on ``server`` with a class: 0 when taking the unit breaks no
    larger free unit (its sibling is already taken), 1 when it does; best first."""
    _check_size(size)
    return _derive(server, ("ranked", size), lambda: _rank(server, size))


def _rank(server: UltraServerState, size: int) -> list[tuple[int, tuple[NodeState, ...]]]:
    by_id = usable_by_id(server)

    def free(*ids: int) -> bool:
        return all(i in by_id and by_id[i].free for i in ids)

    ranked: list[tuple[int, tuple[NodeState, ...]]] = []
    if size == ULTRASERVER_NODES:
        if free(*range(ULTRASERVER_NODES)):
            ranked.append((0, tuple(by_id[i] for i in range(ULTRASERVER_NODES))))
    elif size == 2:
        for pair in _PAIRS:
            if free(*pair):
                sibling = next(p for p in _PAIRS if p != pair)
                ranked.append((1 if free(*sibling) else 0, tuple(by_id[i] for i in pair)))
    else:
        for node_id in sorted(by_id):
            if free(node_id):
                ranked.append((1 if free(node_id ^ 1) else 0, (by_id[node_id],)))
    # Stable sort: within a class, ascending node id (the order they were built in).
    ranked.sort(key=lambda item: item[0])
    return ranked


def keyed_candidates(server: UltraServerState, size: int) -> Ranked:
    """The free units of ``size`` on ``server`` with their fleet-wide preference key, best
    first (the first one is the server's best offer for that size)."""

    def compute() -> Ranked:
        # Units that break no larger free unit first, then the UltraServer with the fewest
        # free nodes (finish partly used ones), then name and node id so every replica
        # agrees. Class before free count: a single node taken from a broken pair of a
        # 3-free server keeps a pair that the 2-free server's intact pair would lose; a whole
        # free server is broken only when nothing else is left.
        free_nodes = free_count(server)
        return [
            ((klass, free_nodes, server.name, unit[0].node_id), unit)
            for klass, unit in _ranked_candidates(server, size)
        ]

    return _derive(server, ("keyed", size), compute)


def unit_candidates(server: UltraServerState, size: int) -> list[tuple[NodeState, ...]]:
    """The free units of ``size`` nodes on ``server``, preferred first.

    Only healthy, unreserved nodes count. Size 4 needs all four node ids, size 2 a whole X2V
    pair, size 1 any node. Units whose sibling (the other pair, the pair partner) is already
    taken come first, so taking them leaves larger units intact; ties go by node id. The
    instance type is the caller's business.
    """
    return [unit for _, unit in _ranked_candidates(server, size)]


def capacity(server: UltraServerState, size: int) -> int:
    """Units of ``size`` the server could offer if every reservation were released (the
    count of ``unit_candidates`` with every node unreserved, without building them)."""
    _check_size(size)
    by_id = usable_by_id(server)

    def healthy(*ids: int) -> bool:
        return all(i in by_id and by_id[i].healthy for i in ids)

    def compute() -> int:
        if size == ULTRASERVER_NODES:
            return 1 if healthy(*range(ULTRASERVER_NODES)) else 0
        if size == 2:
            return sum(1 for pair in _PAIRS if healthy(*pair))
        return sum(1 for node in by_id.values() if node.healthy)

    return _derive(server, ("capacity", size), compute)


__all__ = [
    "ULTRASERVER_NODES",
    "UNIT_SIZES",
    "NodeState",
    "Ranked",
    "UltraServerState",
    "UnitKey",
    "capacity",
    "free_count",
    "keyed_candidates",
    "unit_candidates",
    "usable_by_id",
]
