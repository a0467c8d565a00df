"""Which UltraServer nodes each NeuronUltraServerWorkload gets. Pure: no I/O, no state.

The reconciler turns the cached NeuronUltraServers and workloads into plain values
(:func:`.servers.servers_from`, :func:`request_from`), asks ``plan`` (new workloads) or
``plan_replacement`` (ReplaceAffected) for decisions, and records the chosen units as
``NeuronUltraServer.status.allocations`` entries. Keeping the decision a pure function of
those values is what lets two controller replicas (or a restarted one) reach the same plan,
and lets the rules be tested exhaustively without an API server.

At fleet scale the reconciler does not hand over the whole fleet per decision: it keeps a
``UnitIndex`` (:mod:`.unitindex`) current through :class:`.cache.ServerCache` as objects
change, and asks ``plan_on``/``plan_replacement_on`` of it, which decide exactly as ``plan`` and
``plan_replacement`` do over the same states. The units one UltraServer offers and how they
rank are in :mod:`.units`.

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .unitindex import Inventory, UnitIndex
from .units import (
    UNIT_SIZES,
    NodeState,
    UltraServerState,
)

#: How many UltraServer names a human-readable reason lists before eliding the rest.
_NAMES_SHOWN: Final = 5


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
# Choosing units across UltraServers


def _choose(
    index: UnitIndex, instance_type: str, size: int, count: int, ref: str
) -> list[tuple[str, tuple[NodeState, ...]]] | None:
    """Greedily pick and book ``count`` units; None, with nothing booked, if there are not
    enough. Must run inside ``index.tentative()``.

    Greedy is exact here: units are aligned (whole server, fixed pairs, single nodes), so
    taking one unit never costs more than itself of the remaining capacity of its size.
    Re-ranking after each pick is what makes the packing best fit: the UltraServer just used
    now has fewer free nodes and is preferred for the next unit.
    """
    start = index.savepoint()
    chosen: list[tuple[str, tuple[NodeState, ...]]] = []
    for _ in range(count):
        best = index.best(instance_type, size)
        if best is None:
            index.undo_to(start)
            return None
        name, unit = best
        index.book(name, (n.name for n in unit), ref)
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
# Input checks


def _check_refs(requests: Sequence[Request]) -> None:
    refs = Counter(r.workload_ref for r in requests)
    if twice := sorted(ref for ref, n in refs.items() if n > 1):
        # Callers map decisions by workload; two for one would let one silently win.
        raise ValueError(f"more than one request for {', '.join(twice)}")


def _index_of(servers: Sequence[UltraServerState]) -> UnitIndex:
    names = Counter(s.name for s in servers)
    if twice := sorted(name for name, n in names.items() if n > 1):
        raise ValueError(f"UltraServer {twice[0]!r} appears twice")
    return UnitIndex(servers)


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


def _inventory(of_type: Inventory) -> str:
    """``3 UltraServers of that type exist, 2 are busy, 1 has unhealthy nodes``."""
    if not of_type.servers:
        return "no UltraServers of that type exist"
    exist = "exists" if of_type.servers == 1 else "exist"
    parts = [f"{_plural(of_type.servers, 'UltraServer')} of that type {exist}"]
    busy = of_type.busy
    parts.append(f"{busy} {'is' if busy == 1 else 'are'} busy")
    sick = of_type.sick
    if sick:
        parts.append(f"{sick} {'has' if sick == 1 else 'have'} unhealthy or unusable nodes")
    return ", ".join(parts)


def _shortage(index: UnitIndex, request: Request) -> str:
    # Only reached when fewer units are free than requested: ``hosts`` is short.
    hosts = index.hosts(request.instance_type, request.topology_size)
    available = f"{len(hosts)} available" + (f" ({_names(hosts)})" if hosts else "")
    wanted = _what(request.topology_size, request.server_count).replace(" ", " free ", 1)
    return (
        f"needs {wanted} of {request.instance_type}; {available}; "
        f"{_inventory(index.inventory(request.instance_type))}"
    )


def _never_fits(index: UnitIndex, request: Request, capacity: int) -> str:
    return (
        f"needs {_what(request.topology_size, request.server_count)} of "
        f"{request.instance_type}, more than the type can offer ({capacity} healthy in all; "
        f"{_inventory(index.inventory(request.instance_type))}); it waits until capacity is "
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
    _check_refs(requests)
    return plan_on(_index_of(servers), requests)


def plan_on(
    index: UnitIndex, requests: Sequence[Request], *, until: str | None = None
) -> list[Decision]:
    """``plan`` over a ``UnitIndex`` of the cluster that the caller keeps current between
    decisions (the reconciler). The index is left as it was found.

    ``until``: stop after the decision for this workload ref. Requests are served strictly
    in FIFO order, so the requests after it cannot change it (and a reconciler deciding one
    workload of a burst need not plan the rest of the burst).
    """
    _check_refs(requests)
    decisions: list[Decision] = []
    #: instance type -> the request first in line for it, still waiting for releases.
    waiting: dict[str, Request] = {}
    with index.tentative():
        for request in sorted(requests, key=lambda r: r.order):
            decisions.append(_decide(index, request, waiting))
            if request.workload_ref == until:
                break
    return decisions


def _decide(index: UnitIndex, request: Request, waiting: dict[str, Request]) -> Decision:
    """The decision for ``request``, booking what it is granted; ``waiting`` (instance type
    -> the first request of that type still waiting for releases) is updated."""
    ref = request.workload_ref
    error = _request_error(request)
    if error is not None:
        return Decision(ref, None, error)
    size, count = request.topology_size, request.server_count
    capacity = index.capacity(request.instance_type, size)
    if count > capacity:
        # Checked before the queue: "never fits" tells the user what to change, while
        # "queued" would suggest that waiting helps.
        return Decision(ref, None, _never_fits(index, request, capacity))
    head = waiting.get(request.instance_type)
    if head is not None:
        return Decision(
            ref,
            None,
            f"queued behind {head.workload_ref}, which came first and waits for "
            f"{_what(head.topology_size, head.server_count)} of {head.instance_type} "
            "to be released",
        )
    chosen = _choose(index, request.instance_type, size, count, ref)
    if chosen is None:
        waiting[request.instance_type] = request
        return Decision(ref, None, _shortage(index, request))
    units = tuple(_as_units(chosen, range(count)))
    granted = _names(u.ultraserver for u in units)
    return Decision(
        ref, units, f"allocated {_what(size, count)} of {request.instance_type} on {granted}"
    )


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
    _replacement_error(request, keep, failed)
    return plan_replacement_on(_index_of(servers), request, keep, failed)


def _replacement_error(request: Request, keep: Sequence[Unit], failed: Sequence[Unit]) -> None:
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


def plan_replacement_on(
    index: UnitIndex, request: Request, keep: Sequence[Unit], failed: Sequence[Unit]
) -> tuple[Unit, ...] | None:
    """``plan_replacement`` over a ``UnitIndex`` the caller keeps; left as it was found."""
    _replacement_error(request, keep, failed)
    kept = {u.index for u in keep}
    missing = [i for i in range(request.server_count) if i not in kept]
    with index.tentative():
        # Held by the workload whatever the recorded state says: kept units keep running,
        # and failed ones are being swapped out. Found by node name, not by the unit's
        # UltraServer: a record that moved a node between UltraServers must not make its
        # node look free.
        held = {n for unit in (*keep, *failed) for n in unit.nodes}
        for name in sorted({s for n in held for s in index.listing(n)}):
            index.book(name, held, request.workload_ref)
        chosen = _choose(
            index,
            request.instance_type,
            request.topology_size,
            len(missing),
            request.workload_ref,
        )
    if chosen is None:
        return None
    return tuple(sorted((*keep, *_as_units(chosen, missing)), key=lambda u: u.index))


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
