"""The free units of a whole fleet, kept current one UltraServer at a time. Pure: no I/O.

What a plan asks of the fleet, per (instance type, unit size): the best free unit anywhere,
how many units the type could offer with every reservation released, and a few counts for
its messages. Recomputing those from every UltraServer on each decision costs O(fleet); this
index keeps them current as UltraServers change (``set``/``remove``), so a decision costs
O(units booked · log fleet), and an UltraServer is re-ranked only when its state changes.

Input hygiene (what ``plan`` used to do over the whole fleet per decision) is kept
incrementally too: a node listed twice (by two UltraServers, or twice by one) is unusable,
since booking it through one listing could double-book it; and a reservation recorded under
any listing holds the node everywhere. Only the UltraServers sharing a node with the one that
changed are re-examined, which in a consistent cluster is just that one.

Tentative bookings: a plan books the units it grants into the index, so later requests of the
same plan see them taken, and takes them all back when it ends (``tentative``), leaving the
index as it found it for the next decision.
"""

from __future__ import annotations

import bisect
import contextlib
from collections import Counter
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import TypeVar

from .units import (
    UNIT_SIZES,
    NodeState,
    UltraServerState,
    UnitKey,
    capacity,
    keyed_candidates,
)

_K = TypeVar("_K", bound=Hashable)


def _bump(counter: Counter[_K], key: _K, delta: int) -> None:
    """Add ``delta``, dropping the key at zero (so equal contents compare equal)."""
    value = counter[key] + delta
    if value:
        counter[key] = value
    else:
        del counter[key]


@dataclass(frozen=True)
class Inventory:
    """What exists of one instance type, for the person reading why a workload waits."""

    servers: int
    #: UltraServers with at least one reserved node, or one whose devices other claims use.
    busy: int
    #: UltraServers with at least one unhealthy or unusable node.
    sick: int


@dataclass(frozen=True)
class IndexSnapshot:
    """Everything a ``UnitIndex`` holds, as plain values (two indexes over the same
    UltraServers have equal snapshots however they got there)."""

    raw: dict[str, UltraServerState]
    states: dict[str, UltraServerState]
    listed: dict[str, int]
    where: dict[str, frozenset[str]]
    held: dict[str, dict[str, int]]
    heads: dict[tuple[str, int], list[UnitKey]]
    capacity: dict[tuple[str, int], int]
    inventory: dict[str, Inventory]


class UnitIndex:
    """Per (instance type, unit size): each UltraServer's best free unit, ordered fleet-wide
    (``best``), the capacity with every reservation released, and inventory counts."""

    def __init__(self, servers: Iterable[UltraServerState] = ()) -> None:
        #: name -> the state as given.
        self._raw: dict[str, UltraServerState] = {}
        #: name -> the state planned with (hygiene applied; the raw object when it changes
        #: nothing, so what was derived from it is kept).
        self._states: dict[str, UltraServerState] = {}
        #: node name -> times listed, over all UltraServers.
        self._listed: Counter[str] = Counter()
        #: node name -> UltraServers listing it.
        self._where: dict[str, set[str]] = {}
        #: node name -> workloadRefs recorded as holding it (one count per listing).
        self._held: dict[str, Counter[str]] = {}
        #: (type, size) -> the best unit key of every UltraServer offering one, ascending.
        self._heads: dict[tuple[str, int], list[UnitKey]] = {}
        self._capacity: Counter[tuple[str, int]] = Counter()
        self._servers: Counter[str] = Counter()
        self._busy: Counter[str] = Counter()
        self._sick: Counter[str] = Counter()
        #: While ``tentative``: (name, raw state before) of every change, oldest first.
        self._journal: list[tuple[str, UltraServerState | None]] | None = None
        for server in servers:
            self.set(server)

    # --- changes -----------------------------------------------------------------------------

    def set(self, server: UltraServerState) -> None:
        """Add ``server`` or replace the UltraServer of its name."""
        old = self._raw.get(server.name)
        if old is server:
            return
        self._record(server.name, old)
        self._raw[server.name] = server
        self._relist(server.name, old, server)

    def remove(self, name: str) -> None:
        old = self._raw.pop(name, None)
        if old is None:
            return
        self._record(name, old)
        self._relist(name, old, None)

    def book(self, name: str, nodes: Iterable[str], ref: str) -> None:
        """Mark ``nodes`` of UltraServer ``name`` reserved by ``ref``."""
        taken = set(nodes)
        server = self._raw[name]
        self.set(
            replace(
                server,
                nodes=tuple(
                    replace(n, reserved_by=ref) if n.name in taken else n for n in server.nodes
                ),
            )
        )

    @contextlib.contextmanager
    def tentative(self) -> Iterator[None]:
        """Every change made inside (bookings included) is undone on leaving. Nestable."""
        outer = self._journal is not None
        if not outer:
            self._journal = []
        start = self.savepoint()
        try:
            yield
        finally:
            self.undo_to(start)
            if not outer:
                self._journal = None

    def savepoint(self) -> int:
        """A point inside ``tentative`` that ``undo_to`` can return to."""
        if self._journal is None:
            raise RuntimeError("savepoint() outside tentative()")
        return len(self._journal)

    def undo_to(self, point: int) -> None:
        journal = self._journal
        if journal is None:
            raise RuntimeError("undo_to() outside tentative()")
        while len(journal) > point:
            name, before = journal.pop()
            current = self._raw.get(name)
            if before is None:
                self._raw.pop(name, None)
            else:
                self._raw[name] = before
            self._relist(name, current, before)
        # Undoing recorded nothing new: _record appends only through set/remove.

    def _record(self, name: str, before: UltraServerState | None) -> None:
        if self._journal is not None:
            self._journal.append((name, before))

    # --- queries -------------------------------------------------------------------------

    def best(self, instance_type: str, size: int) -> tuple[str, tuple[NodeState, ...]] | None:
        """The most preferred free unit of ``size`` among UltraServers of ``instance_type``
        (UltraServer name, nodes), or None when there is none."""
        heads = self._heads.get((instance_type, size))
        if not heads:
            return None
        name = heads[0][2]
        return name, keyed_candidates(self._states[name], size)[0][1]

    def hosts(self, instance_type: str, size: int) -> list[str]:
        """The UltraServer of every free unit of ``size`` (a name per unit)."""
        return [
            key[2]
            for key in self._heads.get((instance_type, size), ())
            for _ in keyed_candidates(self._states[key[2]], size)
        ]

    def capacity(self, instance_type: str, size: int) -> int:
        """Units of ``size`` the type could offer with every reservation released."""
        return self._capacity[(instance_type, size)]

    def inventory(self, instance_type: str) -> Inventory:
        return Inventory(
            self._servers[instance_type], self._busy[instance_type], self._sick[instance_type]
        )

    def instance_types(self) -> list[str]:
        return sorted(self._servers)

    def listing(self, node: str) -> frozenset[str]:
        """The UltraServers that list ``node``."""
        return frozenset(self._where.get(node, ()))

    def state(self, name: str) -> UltraServerState | None:
        """The state as planned with (see the module docstring)."""
        return self._states.get(name)

    def __len__(self) -> int:
        return len(self._raw)

    def snapshot(self) -> IndexSnapshot:
        return IndexSnapshot(
            raw=dict(sorted(self._raw.items())),
            states=dict(sorted(self._states.items())),
            listed=dict(sorted(self._listed.items())),
            where={n: frozenset(s) for n, s in sorted(self._where.items())},
            held={n: dict(sorted(c.items())) for n, c in sorted(self._held.items())},
            heads={k: list(v) for k, v in sorted(self._heads.items()) if v},
            capacity=dict(sorted(self._capacity.items())),
            inventory={t: self.inventory(t) for t in self.instance_types()},
        )

    # --- upkeep --------------------------------------------------------------------------

    def _relist(
        self, name: str, old: UltraServerState | None, new: UltraServerState | None
    ) -> None:
        """Account for ``name``'s raw state going from ``old`` to ``new``, then re-derive every
        UltraServer whose planned state may depend on the nodes involved."""
        touched: set[str] = set()
        if old is not None:
            for n in old.nodes:
                touched.add(n.name)
                _bump(self._listed, n.name, -1)
                if n.reserved_by is not None:
                    held = self._held[n.name]
                    _bump(held, n.reserved_by, -1)
                    if not held:
                        del self._held[n.name]
            for n in old.nodes:
                where = self._where.get(n.name)
                if where is not None:
                    where.discard(name)
                    if not where:
                        del self._where[n.name]
        if new is not None:
            for n in new.nodes:
                touched.add(n.name)
                _bump(self._listed, n.name, 1)
                self._where.setdefault(n.name, set()).add(name)
                if n.reserved_by is not None:
                    _bump(self._held.setdefault(n.name, Counter()), n.reserved_by, 1)
        affected = {name}
        for node in touched:
            affected.update(self._where.get(node, ()))
        for server in affected:
            self._rederive(server)

    def _planned(self, raw: UltraServerState) -> UltraServerState:
        """``raw`` with the fleet's hygiene applied (the raw object if that changes nothing)."""
        nodes: list[NodeState] = []
        changed = False
        for n in raw.nodes:
            holders = self._held.get(n.name)
            # min(): the same answer whatever order the inputs came in.
            reserved_by = min(holders) if holders else None
            healthy = n.healthy and self._listed[n.name] == 1
            if reserved_by != n.reserved_by or healthy != n.healthy:
                n = replace(n, reserved_by=reserved_by, healthy=healthy)
                changed = True
            nodes.append(n)
        return replace(raw, nodes=tuple(nodes)) if changed else raw

    def _rederive(self, name: str) -> None:
        raw = self._raw.get(name)
        old = self._states.get(name)
        new = None if raw is None else self._planned(raw)
        if new is old or (new is not None and old is not None and new == old):
            return  # same value: keep the object (and what was derived from it)
        if old is not None:
            self._account(old, -1)
            del self._states[name]
        if new is not None:
            self._states[name] = new
            self._account(new, +1)

    def _account(self, state: UltraServerState, sign: int) -> None:
        itype = state.instance_type
        _bump(self._servers, itype, sign)
        if any(n.reserved_by is not None or n.in_use for n in state.nodes):
            _bump(self._busy, itype, sign)
        if any(not n.healthy for n in state.nodes):
            _bump(self._sick, itype, sign)
        for size in UNIT_SIZES:
            _bump(self._capacity, (itype, size), sign * capacity(state, size))
            ranked = keyed_candidates(state, size)
            if not ranked:
                continue
            heads = self._heads.setdefault((itype, size), [])
            key = ranked[0][0]
            if sign > 0:
                bisect.insort(heads, key)
            else:
                at = bisect.bisect_left(heads, key)
                assert heads[at] == key, f"index out of step for {state.name}"
                del heads[at]


__all__ = ["IndexSnapshot", "Inventory", "UnitIndex"]
