"""The reservation record: a workload's allocation entries in ``NeuronUltraServer.status``.

The one writer of ``status.allocations`` (its one reader is ``common/ultraserver.py``'s
``read_allocations``, which every change here reads the fresh object with).
Reading it (``holdings``, ``split_holdings``) and the four changes the reconciler makes to
it, each a pure function from the fresh NeuronUltraServer to the object to write back (None:
nothing to change), run by ``update_with_retry`` on every attempt of one RV-guarded write:
record units (``add_entries``), mark them releasing, tidy them, remove them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from neuron_dra.common.ultraserver import (
    PHASE_BOUND,
    PHASE_PENDING,
    PHASE_RELEASING,
    AllocationEntry,
    read_allocations,
)
from neuron_dra.controller.allocation.planner import Unit

from .model import (
    AllocationRaceError,
    Held,
    JsonDict,
    meta_of,
    nus_members,
    status_of,
)

#: A change to one NeuronUltraServer: the object to write, or None when it needs none.
Mutation = Callable[[JsonDict], JsonDict | None]


def holdings(nus_objects: Iterable[Mapping[str, Any]], ref: str) -> list[Held]:
    """Every allocation entry naming ``ref``, ordered by (index, UltraServer)."""
    out = [
        Held(str(meta_of(nus).get("name", "")), entry)
        for nus in nus_objects
        for entry in read_allocations(nus)
        if entry.workload_ref == ref
    ]
    return sorted(out, key=lambda h: (h.index, h.ultraserver))


def split_holdings(held: Sequence[Held], wid: str, count: int) -> tuple[list[Held], list[Held]]:
    """(usable, surplus): entries of this incarnation with distinct indexes in range, and
    everything else (a previous incarnation's entries, duplicates, indexes out of range),
    which must be released. Duplicates cannot come from this reconciler (it reads its own
    writes), but a record is only trusted as far as it is consistent."""
    usable: list[Held] = []
    surplus: list[Held] = []
    seen: set[int] = set()
    for h in held:
        if h.workload_id != wid or not 0 <= h.index < count or h.index in seen or not h.nodes:
            surplus.append(h)
        else:
            seen.add(h.index)
            usable.append(h)
    return usable, surplus


def nus_status_with(nus: Mapping[str, Any], allocations: list[JsonDict]) -> JsonDict:
    """``nus.status`` with ``allocations`` replaced and the fields derived from them
    (``allocatedNodeCount``, ``state``) recomputed the way discovery computes them, so
    neither writer flips the other's value back."""
    status: JsonDict = copy.deepcopy(dict(status_of(nus)))
    status["allocations"] = allocations
    allocated = {str(n) for e in allocations for n in e.get("allocatedNodes") or []}
    status["allocatedNodeCount"] = len(allocated)
    if not allocations:
        status["state"] = "Available"
    elif set(nus_members(nus)) - allocated:
        status["state"] = "PartiallyAllocated"
    else:
        status["state"] = "FullyAllocated"
    return status


def by_ultraserver(entries: Iterable[Held]) -> dict[str, list[Held]]:
    out: dict[str, list[Held]] = {}
    for h in entries:
        out.setdefault(h.ultraserver, []).append(h)
    return out


def add_entries(
    ref: str, wid: str, units: Sequence[Unit], *, leader: str, node_count: int, now: str
) -> Mutation:
    """Record ``units`` (all on one NeuronUltraServer) as ``Pending`` entries of ``ref``.

    Checks on the fresh object that each unit's nodes are still members and free; raises
    AllocationRaceError otherwise. A unit already recorded the same way (a retry after a lost
    response) is not recorded twice."""

    def entry(unit: Unit) -> JsonDict:
        return {
            "workloadRef": ref,
            "workloadId": wid,
            "allocatedNodes": list(unit.nodes),
            "leaderNodeName": leader,
            "nodeCount": node_count or len(unit.nodes),
            "ultraserverIndex": unit.index,
            "phase": PHASE_PENDING,
            "allocatedAt": now,
        }

    def mutate(nus: JsonDict) -> JsonDict | None:
        current = read_allocations(nus)
        allocations = [dict(e.raw) for e in current]
        members = nus_members(nus)
        added = False
        for unit in units:
            taken: dict[str, str] = {}
            recorded = False
            for e in current:
                if e.workload_ref == ref and e.unit_index == unit.index:
                    if e.workload_id == wid and e.nodes == tuple(unit.nodes):
                        recorded = True  # already recorded (a retry after a lost response)
                        break
                    raise AllocationRaceError(
                        f"unit {unit.index} of {ref} is already recorded on "
                        f"{unit.ultraserver} with other nodes"
                    )
                for n in e.nodes:
                    taken[n] = e.workload_ref
            if recorded:
                continue
            gone = [n for n in unit.nodes if n not in members]
            if gone:
                raise AllocationRaceError(f"{', '.join(gone)} left {unit.ultraserver}")
            clash = sorted(n for n in unit.nodes if n in taken)
            if clash:
                raise AllocationRaceError(
                    f"{', '.join(clash)} on {unit.ultraserver} already held by "
                    f"{', '.join(sorted({taken[n] for n in clash}))}"
                )
            allocations.append(entry(unit))
            added = True
        if not added:
            return None
        nus["status"] = nus_status_with(nus, allocations)
        return nus

    return mutate


def remove_entries(identities: set[tuple[str, int, str]]) -> Mutation:
    """Drop the entries with these (workloadRef, index, workloadId)."""

    def mutate(nus: JsonDict) -> JsonDict | None:
        current = read_allocations(nus)
        kept = [dict(e.raw) for e in current if e.identity not in identities]
        if len(kept) == len(current):
            return None
        nus["status"] = nus_status_with(nus, kept)
        return nus

    return mutate


def mark_releasing(identities: set[tuple[str, int, str]]) -> Mutation:
    """Move the entries with these identities to ``Releasing`` (the node plugins untag their
    slices for releasing entries)."""

    def mutate(nus: JsonDict) -> JsonDict | None:
        allocations = []
        changed = False
        for existing in read_allocations(nus):
            e = dict(existing.raw)
            if existing.identity in identities and e.get("phase") != PHASE_RELEASING:
                e["phase"] = PHASE_RELEASING
                changed = True
            allocations.append(e)
        if not changed:
            return None
        nus["status"] = nus_status_with(nus, allocations)
        return nus

    return mutate


def tidy_entries(ref: str, wid: str, *, leader: str, publishes: Callable[[str], bool]) -> Mutation:
    """Put every entry of this incarnation's ``leaderNodeName`` on ``leader`` (a replaced
    unit 0 moves it), mark ``Bound`` the ``Pending`` entries all of whose nodes
    ``publishes`` the workload's tag, and respell the phases of earlier versions
    (``Reserved``, ``Active``) in today's words."""

    def fix(e: AllocationEntry) -> JsonDict | None:
        if e.workload_ref != ref or e.workload_id != wid:
            return None
        want = dict(e.raw)
        want["leaderNodeName"] = leader
        phase = e.phase
        if phase == PHASE_PENDING and all(publishes(n) for n in e.nodes):
            phase = PHASE_BOUND
        if phase != e.raw.get("phase"):
            want["phase"] = phase
        return want if want != dict(e.raw) else None

    def mutate(nus: JsonDict) -> JsonDict | None:
        allocations = []
        changed = False
        for e in read_allocations(nus):
            new = fix(e)
            changed |= new is not None
            allocations.append(new if new is not None else dict(e.raw))
        if not changed:
            return None
        nus["status"] = nus_status_with(nus, allocations)
        return nus

    return mutate
