"""Which UltraServer nodes each NeuronUltraServerWorkload gets (DESIGN §3.7). Pure: no I/O.

The reconciler turns the cached NeuronUltraServers and workloads into the plain values below
(``servers_from``, ``request_from``), asks ``plan`` (new workloads) or ``plan_replacement``
(ReplaceAffected) for decisions, and records the chosen units as
``NeuronUltraServer.status.allocations`` entries. Keeping the decision a pure function of
those values is what lets two controller replicas (or a restarted one) reach the same plan,
and lets the rules be tested exhaustively without an API server.

Rules:

* A unit is ``topologySize`` nodes of one UltraServer that the hardware can run as one
  NeuronLink domain: size 4 is the whole UltraServer (node ids 0..3), size 2 one of the two
  X2V pairs {0, 1} / {2, 3}, size 1 any node. Nothing else is offered, so a request can never
  be granted a shape the node plugins would refuse to prepare.
* Only healthy, unreserved nodes of the requested instance type are used; a workload gets all
  its units or none (a partial gang holds nodes while doing no work), and no node is booked
  twice, including by two requests of the same plan.
* Requests are served first-come, first-served per instance type. A request that waits for
  nodes to be released holds back the later requests of its type; otherwise a stream of
  small workloads could keep taking the nodes it waits for and a large gang would never
  start. A request larger than everything the type has (healthy) cannot be helped by waiting,
  so it does not hold anybody back.
* Best fit: small units go where nodes are already taken, so that whole UltraServers (and
  whole pairs) stay free for the requests that need them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, TypeVar

_T = TypeVar("_T")

#: Nodes of one UltraServer carry node ids 0..3.
ULTRASERVER_NODES: Final = 4
#: Unit sizes the hardware supports (the values of ``topologySize``).
UNIT_SIZES: Final[tuple[int, ...]] = (1, 2, 4)
#: The node pairs a size-2 unit may use (the driver's X2V pairs).
_PAIRS: Final[tuple[tuple[int, int], ...]] = ((0, 1), (2, 3))
#: How many UltraServer names a human-readable reason lists before eliding the rest.
_NAMES_SHOWN: Final = 5


@dataclass(frozen=True)
class NodeState:
    name: str
    #: 0..3 inside its UltraServer.
    node_id: int
    #: Ready, slice present, devices healthy, links up.
    healthy: bool
    #: workloadRef ("ns/name") holding the node, else None.
    reserved_by: str | None

    @property
    def free(self) -> bool:
        return self.healthy and self.reserved_by is None


@dataclass(frozen=True)
class UltraServerState:
    #: NeuronUltraServer name (= UltraServer id).
    name: str
    instance_type: str
    nodes: tuple[NodeState, ...]
    #: Values derived from this (immutable) state, computed on first use: candidate units,
    #: capacity. A reconciler that reuses unchanged states across plans (``ServerCache``)
    #: then ranks only the UltraServers that changed. Not part of the value.
    _derived: dict[Any, Any] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )


def _derive(server: UltraServerState, key: Any, compute: Callable[[], _T]) -> _T:
    try:
        value: _T = server._derived[key]
    except KeyError:
        value = server._derived[key] = compute()
    return value


@dataclass(frozen=True)
class Request:
    #: "ns/name" of the workload.
    workload_ref: str
    instance_type: str
    #: Nodes per unit: 1, 2 or 4.
    topology_size: int
    #: Units wanted.
    server_count: int
    #: FIFO key: (creationTimestamp RFC 3339, workload_ref).
    order: tuple[str, str]


@dataclass(frozen=True)
class Unit:
    ultraserver: str
    #: Node names, ascending node id (the allocatedNodes order ranks are derived from).
    nodes: tuple[str, ...]
    #: ultraserverIndex within the workload (0..server_count-1).
    index: int


@dataclass(frozen=True)
class Decision:
    workload_ref: str
    #: The granted units in index order; None: cannot be satisfied now (all-or-nothing).
    units: tuple[Unit, ...] | None
    #: For a human: what is missing (units None) or what was granted.
    reason: str


# --------------------------------------------------------------------------------------------
# Units of one UltraServer


def _usable_by_id(server: UltraServerState) -> dict[int, NodeState]:
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


def _free_count(server: UltraServerState) -> int:
    return _derive(
        server, "free", lambda: sum(1 for n in _usable_by_id(server).values() if n.free)
    )


def _ranked_candidates(
    server: UltraServerState, size: int
) -> list[tuple[int, tuple[NodeState, ...]]]:
    """Free units of ``size`` on ``server`` with a class: 0 when taking the unit breaks no
    larger free unit (its sibling is already taken), 1 when it does; best first."""
    if size not in UNIT_SIZES:
        raise ValueError(f"unit size must be one of {UNIT_SIZES}, got {size}")
    return _derive(server, ("ranked", size), lambda: _rank(server, size))


def _rank(server: UltraServerState, size: int) -> list[tuple[int, tuple[NodeState, ...]]]:
    by_id = _usable_by_id(server)

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


def _keyed(server: UltraServerState, size: int) -> _Ranked:
    # Units that break no larger free unit first, then the UltraServer with the fewest free
    # nodes (finish partly used ones), then name and node id so every replica agrees. Class
    # before free count: a single node taken from a broken pair of a 3-free server keeps a
    # pair that the 2-free server's intact pair would lose; a whole free server is broken
    # only when nothing else is left.
    free_nodes = _free_count(server)
    return [
        ((klass, free_nodes, server.name, unit[0].node_id), unit)
        for klass, unit in _ranked_candidates(server, size)
    ]


def unit_candidates(server: UltraServerState, size: int) -> list[tuple[NodeState, ...]]:
    """The free units of ``size`` nodes on ``server``, preferred first.

    Only healthy, unreserved nodes count. Size 4 needs all four node ids, size 2 a whole X2V
    pair, size 1 any node. Units whose sibling (the other pair, the pair partner) is already
    taken come first, so taking them leaves larger units intact; ties go by node id. The
    instance type is the caller's business.
    """
    return [unit for _, unit in _ranked_candidates(server, size)]


def _capacity(server: UltraServerState, size: int) -> int:
    """Units of ``size`` the server could offer if every reservation were released (the
    count of ``unit_candidates`` with every node unreserved, without building them)."""
    if size not in UNIT_SIZES:
        raise ValueError(f"unit size must be one of {UNIT_SIZES}, got {size}")
    by_id = _usable_by_id(server)

    def healthy(*ids: int) -> bool:
        return all(i in by_id and by_id[i].healthy for i in ids)

    def compute() -> int:
        if size == ULTRASERVER_NODES:
            return 1 if healthy(*range(ULTRASERVER_NODES)) else 0
        if size == 2:
            return sum(1 for pair in _PAIRS if healthy(*pair))
        return sum(1 for node in by_id.values() if node.healthy)

    return _derive(server, ("capacity", size), compute)


# --------------------------------------------------------------------------------------------
# Choosing units across UltraServers

#: Preference of a candidate unit, smallest first: (class, free nodes, UltraServer, node id).
_Key = tuple[int, int, str, int]
_Ranked = list[tuple[_Key, tuple[NodeState, ...]]]


class _Pool:
    """The working copy of the cluster one ``plan`` (or replacement) books into.

    Rankings are cached per (UltraServer, size) and dropped only for an UltraServer that is
    booked, so a plan over many requests on a large cluster re-ranks just what changed.
    """

    def __init__(self, servers: dict[str, UltraServerState]) -> None:
        self.servers = servers
        self._of_type: dict[str, list[str]] = {}
        for name in sorted(servers):
            self._of_type.setdefault(servers[name].instance_type, []).append(name)
        self._ranked: dict[tuple[str, int], _Ranked] = {}
        self._capacity: dict[tuple[str, int], int] = {}

    def of_type(self, instance_type: str) -> list[UltraServerState]:
        return [self.servers[n] for n in self._of_type.get(instance_type, [])]

    def capacity(self, instance_type: str, size: int) -> int:
        """Units of ``size`` the type could offer with every reservation released."""
        # Independent of reservations, so bookings never invalidate it.
        key = (instance_type, size)
        if key not in self._capacity:
            self._capacity[key] = sum(_capacity(s, size) for s in self.of_type(instance_type))
        return self._capacity[key]

    def ranked(self, name: str, size: int) -> _Ranked:
        cached = self._ranked.get((name, size))
        if cached is None:
            server = self.servers[name]
            cached = self._ranked[(name, size)] = _derive(
                server, ("keyed", size), lambda: _keyed(server, size)
            )
        return cached

    def book(self, name: str, nodes: Iterable[str], ref: str) -> None:
        """Mark ``nodes`` of UltraServer ``name`` reserved by ``ref``."""
        taken = set(nodes)
        server = self.servers[name]
        self.set(
            replace(
                server,
                nodes=tuple(
                    replace(n, reserved_by=ref) if n.name in taken else n for n in server.nodes
                ),
            )
        )

    def set(self, server: UltraServerState) -> None:
        self.servers[server.name] = server
        for size in UNIT_SIZES:
            self._ranked.pop((server.name, size), None)

    def choose(
        self, instance_type: str, size: int, count: int, ref: str
    ) -> list[tuple[str, tuple[NodeState, ...]]] | None:
        """Greedily pick and book ``count`` units; None, with nothing booked, if there are
        not enough.

        Greedy is exact here: units are aligned (whole server, fixed pairs, single nodes), so
        taking one unit never costs more than itself of the remaining capacity of its size.
        Re-ranking after each pick is what makes the packing best fit: the UltraServer just
        used now has fewer free nodes and is preferred for the next unit.
        """
        names = self._of_type.get(instance_type, [])
        before: dict[str, UltraServerState] = {}
        chosen: list[tuple[str, tuple[NodeState, ...]]] = []
        for _ in range(count):
            heads = []
            for n in names:
                ranks = self._ranked.get((n, size))
                if ranks is None:
                    ranks = self.ranked(n, size)
                if ranks:
                    heads.append(ranks[0])
            if not heads:
                for server in before.values():
                    self.set(server)
                return None
            key, unit = min(heads, key=lambda head: head[0])
            name = key[2]
            before.setdefault(name, self.servers[name])
            self.book(name, (n.name for n in unit), ref)
            chosen.append((name, unit))
        return chosen


def _as_units(
    chosen: Iterable[tuple[str, tuple[NodeState, ...]]], indexes: Sequence[int]
) -> list[Unit]:
    """Give the chosen units ``indexes`` in (UltraServer name, node id) order, so the ranks
    derived from them do not depend on the order the units were picked in."""
    ordered = sorted(chosen, key=lambda c: (c[0], c[1][0].node_id))
    return [
        Unit(ultraserver=name, nodes=tuple(n.name for n in unit), index=index)
        for (name, unit), index in zip(ordered, indexes, strict=True)
    ]


# --------------------------------------------------------------------------------------------
# Input hygiene


def _normalize(servers: Sequence[UltraServerState]) -> dict[str, UltraServerState]:
    """The working copy ``plan`` books into, with cross-server inconsistencies made safe.

    A node listed by two UltraServers (a transient state of discovery) is unusable: booking it
    through one of them could double-book it. A reservation recorded under any UltraServer
    holds the node everywhere.
    """
    by_name: dict[str, UltraServerState] = {}
    for server in servers:
        if server.name in by_name:
            raise ValueError(f"UltraServer {server.name!r} appears twice")
        by_name[server.name] = server
    names = [n.name for s in servers for n in s.nodes]
    if len(set(names)) == len(names):
        # No node listed twice: every reservation is already the node's only one and no node
        # is made unusable, so nothing below would change (the usual case, made cheap).
        return by_name
    listed = Counter(names)
    holder: dict[str, str] = {}
    for node in (n for s in servers for n in s.nodes):
        if node.reserved_by is not None:
            # min(): the same answer whatever order the inputs come in.
            held = holder.get(node.name, node.reserved_by)
            holder[node.name] = min(held, node.reserved_by)

    def fixed(node: NodeState) -> NodeState:
        reserved_by = holder.get(node.name)
        healthy = node.healthy and listed[node.name] == 1
        if (reserved_by, healthy) == (node.reserved_by, node.healthy):
            return node
        return replace(node, reserved_by=reserved_by, healthy=healthy)

    out: dict[str, UltraServerState] = {}
    for name, server in by_name.items():
        nodes = tuple(fixed(n) for n in server.nodes)
        same = all(a is b for a, b in zip(nodes, server.nodes, strict=True))
        out[name] = server if same else replace(server, nodes=nodes)
    return out


def _request_error(request: Request) -> str | None:
    if request.topology_size not in UNIT_SIZES:
        return f"invalid request: topologySize must be 1, 2 or 4, got {request.topology_size}"
    if request.server_count < 1:
        return f"invalid request: serverCount must be at least 1, got {request.server_count}"
    return None


# --------------------------------------------------------------------------------------------
# Reasons (for status conditions and events; written for the person who created the workload)


def _plural(count: int, singular: str, plural: str | None = None) -> str:
    return f"{count} {singular if count == 1 else (plural or singular + 's')}"


def _what(size: int, count: int) -> str:
    """``3 nodes`` / ``2 4-node units``."""
    return _plural(count, "node") if size == 1 else _plural(count, f"{size}-node unit")


def _names(names: Iterable[str]) -> str:
    unique = sorted(set(names))
    shown = ", ".join(unique[:_NAMES_SHOWN])
    return shown + (f", … ({len(unique)} in all)" if len(unique) > _NAMES_SHOWN else "")


def _inventory(servers: Iterable[UltraServerState]) -> str:
    """``3 UltraServers of that type exist, 2 are busy, 1 has unhealthy nodes``."""
    of_type = list(servers)
    if not of_type:
        return "no UltraServers of that type exist"
    exist = "exists" if len(of_type) == 1 else "exist"
    parts = [f"{_plural(len(of_type), 'UltraServer')} of that type {exist}"]
    busy = sum(1 for s in of_type if any(n.reserved_by is not None for n in s.nodes))
    parts.append(f"{busy} {'is' if busy == 1 else 'are'} busy")
    sick = sum(1 for s in of_type if any(not n.healthy for n in s.nodes))
    if sick:
        parts.append(f"{sick} {'has' if sick == 1 else 'have'} unhealthy or unusable nodes")
    return ", ".join(parts)


def _shortage(pool: _Pool, request: Request) -> str:
    of_type = pool.of_type(request.instance_type)
    size = request.topology_size
    hosts = [s.name for s in of_type for _ in pool.ranked(s.name, size)]
    available = f"{len(hosts)} available" + (f" ({_names(hosts)})" if hosts else "")
    wanted = _what(size, request.server_count).replace(" ", " free ", 1)
    return f"needs {wanted} of {request.instance_type}; {available}; {_inventory(of_type)}"


def _never_fits(pool: _Pool, request: Request, capacity: int) -> str:
    return (
        f"needs {_what(request.topology_size, request.server_count)} of "
        f"{request.instance_type}, more than the type can offer ({capacity} healthy in all; "
        f"{_inventory(pool.of_type(request.instance_type))}); it waits until capacity is "
        "added or repaired and does not hold up other workloads"
    )


# --------------------------------------------------------------------------------------------
# Public entry points


def plan(servers: Sequence[UltraServerState], requests: Sequence[Request]) -> list[Decision]:
    """One decision per request, in FIFO (``Request.order``) order.

    ``servers`` is the whole cluster as recorded (reservations included); ``requests`` are
    the workloads that hold no units yet. Granted units are booked for the rest of the plan,
    so the decisions can be written together without conflicting. The result depends only on
    the content of the inputs, not on their order. Raises ValueError if a workload has more
    than one request or an UltraServer name appears twice.
    """
    refs = Counter(r.workload_ref for r in requests)
    if twice := sorted(ref for ref, n in refs.items() if n > 1):
        # Callers map decisions by workload; two for one would let one silently win.
        raise ValueError(f"more than one request for {', '.join(twice)}")
    pool = _Pool(_normalize(servers))
    decisions: list[Decision] = []
    #: instance type -> the request first in line for it, still waiting for releases.
    waiting: dict[str, Request] = {}
    for request in sorted(requests, key=lambda r: r.order):
        ref = request.workload_ref
        error = _request_error(request)
        if error is not None:
            decisions.append(Decision(ref, None, error))
            continue
        size, count = request.topology_size, request.server_count
        capacity = pool.capacity(request.instance_type, size)
        if count > capacity:
            # Checked before the queue: "never fits" tells the user what to change, while
            # "queued" would suggest that waiting helps.
            decisions.append(Decision(ref, None, _never_fits(pool, request, capacity)))
            continue
        head = waiting.get(request.instance_type)
        if head is not None:
            decisions.append(
                Decision(
                    ref,
                    None,
                    f"queued behind {head.workload_ref}, which came first and waits for "
                    f"{_what(head.topology_size, head.server_count)} of {head.instance_type} "
                    "to be released",
                )
            )
            continue
        chosen = pool.choose(request.instance_type, size, count, ref)
        if chosen is not None:
            units = tuple(_as_units(chosen, range(count)))
            granted = _names(u.ultraserver for u in units)
            decisions.append(
                Decision(
                    ref,
                    units,
                    f"allocated {_what(size, count)} of {request.instance_type} on {granted}",
                )
            )
            continue
        decisions.append(Decision(ref, None, _shortage(pool, request)))
        waiting[request.instance_type] = request
    return decisions


def plan_replacement(
    servers: Sequence[UltraServerState],
    request: Request,
    keep: Sequence[Unit],
    failed: Sequence[Unit],
) -> tuple[Unit, ...] | None:
    """ReplaceAffected: the workload's full unit list with new units for the failed ones.

    ``keep`` stay as they are (same nodes, same indexes, so the ranks of running pods do not
    move); every other index in 0..server_count-1 (those of ``failed``, and any lost before)
    gets a new unit of the same size with that index. The nodes of ``failed`` are never
    chosen again, even if they look healthy now: the point is to swap them out. All or
    nothing: None if not every missing index can be filled. Result in index order.
    """
    error = _request_error(request)
    if error is not None:
        raise ValueError(error)
    span = range(request.server_count)
    shown = f"0..{request.server_count - 1}"
    kept = [u.index for u in keep]
    if len(set(kept)) != len(kept) or not all(i in span for i in kept):
        raise ValueError(f"kept unit indexes {sorted(kept)} are not distinct indexes in {shown}")
    if any(u.index not in span or u.index in kept for u in failed):
        raise ValueError(
            f"failed unit indexes {sorted(u.index for u in failed)} overlap the "
            f"kept ones or fall outside {shown}"
        )
    missing = [i for i in span if i not in kept]
    pool = _Pool(_normalize(servers))
    # Held by the workload whatever the recorded state says: kept units keep running, and
    # failed ones are being swapped out.
    # Found by node name, not by the unit's UltraServer: a record that moved a node between
    # UltraServers must not make its node look free.
    home = {n.name: s.name for s in pool.servers.values() for n in s.nodes}
    held = {n for unit in (*keep, *failed) for n in unit.nodes}
    for name in sorted({home[n] for n in held if n in home}):
        pool.book(name, held, request.workload_ref)
    chosen = pool.choose(
        request.instance_type, request.topology_size, len(missing), request.workload_ref
    )
    if chosen is None:
        return None
    return tuple(sorted((*keep, *_as_units(chosen, missing)), key=lambda u: u.index))


# --------------------------------------------------------------------------------------------
# From API objects (plain dicts, as the caches hold them)


def _link_down(entry: Mapping[str, Any]) -> bool:
    # "Unknown" is the default before anything is known and on platforms that do not report
    # links; treating it as down would make such clusters unallocatable.
    return "Down" in (entry.get("linkStatusHorizontal"), entry.get("linkStatusVertical"))


def _holders(objects: Iterable[Mapping[str, Any]]) -> dict[str, set[str]]:
    holders: dict[str, set[str]] = {}
    for nus in objects:
        for entry in (nus.get("status") or {}).get("allocations") or []:
            for node in entry.get("allocatedNodes") or []:
                holders.setdefault(str(node), set()).add(str(entry.get("workloadRef", "")))
    return holders


def _server_state(
    nus: Mapping[str, Any], holders: Mapping[str, set[str]], node_health: Mapping[str, bool]
) -> UltraServerState:
    spec = nus.get("spec") or {}
    nodes = []
    for entry in spec.get("topology") or []:
        name = str(entry.get("nodeName", ""))
        held = holders.get(name)
        nodes.append(
            NodeState(
                name=name,
                node_id=int(entry.get("nodeId", -1)),
                healthy=bool(node_health.get(name, False)) and not _link_down(entry),
                # Two holders would be a double booking already on record; either way the
                # node is not free, and min() keeps the answer independent of list order.
                reserved_by=min(held) if held else None,
            )
        )
    return UltraServerState(
        name=str((nus.get("metadata") or {}).get("name", "")),
        instance_type=str(spec.get("instanceType", "")),
        nodes=tuple(sorted(nodes, key=lambda n: (n.node_id, n.name))),
    )


def servers_from(
    nus_objects: Iterable[Mapping[str, Any]], *, node_health: Mapping[str, bool]
) -> list[UltraServerState]:
    """UltraServer states from NeuronUltraServer objects, sorted by name.

    Members come from ``spec.topology``; a node is healthy when ``node_health`` says so (a
    node missing from it is not: nothing vouches for it) and none of its NeuronLinks is
    reported ``Down``. ``reserved_by`` comes from ``status.allocations`` of *all* objects, so
    an entry in any phase (Reserved, Active, Releasing) holds its nodes until it is removed.
    """
    objects = list(nus_objects)
    holders = _holders(objects)
    out = [_server_state(nus, holders, node_health) for nus in objects]
    return sorted(out, key=lambda s: s.name)


_CacheEntry = tuple[
    Mapping[str, Any], tuple[str, ...], Any, tuple[str | None, ...], UltraServerState
]


class ServerCache:
    """``servers_from`` for a caller that asks again and again about a slowly changing
    cluster (the reconciler, once per decision): a NeuronUltraServer whose inputs did not
    change keeps its previous ``UltraServerState`` object, and with it the units and
    capacity already derived from it, so a plan re-ranks only what changed.

    Inputs of one state: the NUS object itself (cached API objects are never mutated, so
    identity stands for content), the health of its members (the caller passes a
    ``health_version`` that changes whenever any node's health may have), and who holds each
    member (recomputed from all objects every time, as ``servers_from`` does).
    """

    def __init__(self) -> None:
        #: id(nus) -> (nus, its member names, health version, member holders, state)
        self._entries: dict[int, _CacheEntry] = {}

    def servers(
        self,
        nus_objects: Iterable[Mapping[str, Any]],
        *,
        node_health: Mapping[str, bool],
        health_version: Any,
    ) -> list[UltraServerState]:
        objects = list(nus_objects)
        holders = _holders(objects)
        # What a state depends on: min() of the holders, as in _server_state.
        reserved = {node: min(refs) for node, refs in holders.items()}
        entries: dict[int, _CacheEntry] = {}
        out = []
        for nus in objects:
            cached = self._entries.get(id(nus))
            if cached is not None and cached[0] is nus:
                names = cached[1]
            else:
                cached = None
                members = (nus.get("spec") or {}).get("topology") or []
                names = tuple(str(t.get("nodeName", "")) for t in members)
            held = tuple(map(reserved.get, names))
            if cached is not None and cached[2] == health_version and cached[3] == held:
                state = cached[4]
            else:
                state = _server_state(nus, holders, node_health)
            entries[id(nus)] = (nus, names, health_version, held, state)
            out.append(state)
        self._entries = entries
        return sorted(out, key=lambda s: s.name)


def request_from(workload_obj: Mapping[str, Any]) -> Request:
    """The allocation request of a NeuronUltraServerWorkload object.

    The FIFO key uses ``creationTimestamp`` as the API server writes it (UTC, second
    precision, ``Z``), so comparing the strings compares the times; the workload ref breaks
    ties between workloads created in the same second.
    """
    meta = workload_obj.get("metadata") or {}
    spec = workload_obj.get("spec") or {}
    ref = f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"
    return Request(
        workload_ref=ref,
        instance_type=str(spec.get("instanceType", "")),
        topology_size=int(spec.get("topologySize", 0)),
        server_count=int(spec.get("serverCount", 0)),
        order=(str(meta.get("creationTimestamp") or ""), ref),
    )


__all__ = [
    "ULTRASERVER_NODES",
    "UNIT_SIZES",
    "Decision",
    "NodeState",
    "Request",
    "ServerCache",
    "UltraServerState",
    "Unit",
    "plan",
    "plan_replacement",
    "request_from",
    "servers_from",
    "unit_candidates",
]
