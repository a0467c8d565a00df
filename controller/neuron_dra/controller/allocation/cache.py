"""The UltraServer states of the whole fleet, kept current one NeuronUltraServer at a time: the
state the allocation planner reads (it holds no I/O either; :mod:`.servers` computes each
state)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from .servers import allocation_records, members, server_state
from .units import UltraServerState


class ServerCache:
    """``servers_from``, kept current one NeuronUltraServer at a time (the reconciler sees
    the objects change one by one and must not rebuild 2,500 states per decision).

    ``put`` each object that was added or changed (None once it is gone) and call
    ``node_changed`` for each node whose health may have changed; ``changes`` then rebuilds
    just the states those can affect and says which differ. An object's state depends on the
    object itself (cached API objects are never mutated, so identity stands for content), the
    health of its members, and who holds each member according to *any* object.
    """

    def __init__(
        self,
        node_health: Callable[[str], bool],
        node_in_use: Callable[[str], bool] = lambda _name: False,
    ) -> None:
        self._health = node_health
        self._in_use = node_in_use
        #: key -> the object as last put.
        self._objects: dict[str, Mapping[str, Any]] = {}
        #: node name -> keys of the objects whose topology lists it.
        self._listed_by: dict[str, set[str]] = {}
        #: key -> (node, workloadRef) the object's allocations record.
        self._recorded: dict[str, list[tuple[str, str]]] = {}
        #: node name -> workloadRefs holding it (one count per record).
        self._holders: dict[str, Counter[str]] = {}
        #: key -> its state as of the last ``changes``.
        self._states: dict[str, UltraServerState] = {}
        #: keys whose state may differ from ``_states``.
        self._dirty: set[str] = set()

    def put(self, key: str, nus: Mapping[str, Any] | None) -> None:
        old = self._objects.get(key)
        if old is nus:
            return
        touched: set[str] = set()
        if old is not None:
            for node in members(old):
                listed = self._listed_by.get(node)
                if listed is not None:
                    listed.discard(key)
                    if not listed:
                        del self._listed_by[node]
            for node, ref in self._recorded.pop(key, []):
                touched.add(node)
                holders = self._holders[node]
                holders[ref] -= 1
                if holders[ref] <= 0:
                    del holders[ref]
                if not holders:
                    del self._holders[node]
        if nus is None:
            self._objects.pop(key, None)
        else:
            self._objects[key] = nus
            for node in members(nus):
                self._listed_by.setdefault(node, set()).add(key)
            records = allocation_records(nus)
            if records:
                self._recorded[key] = records
            for node, ref in records:
                touched.add(node)
                self._holders.setdefault(node, Counter())[ref] += 1
        self._dirty.add(key)
        for node in touched:
            self._dirty.update(self._listed_by.get(node, ()))

    def node_changed(self, node: str) -> None:
        """``node``'s health, or whether its devices are in use, may have changed."""
        self._dirty.update(self._listed_by.get(node, ()))

    def changes(self) -> list[tuple[str, UltraServerState | None]]:
        """(UltraServer name, new state or None if gone) for every state that changed since
        the previous call, in key order."""
        dirty, self._dirty = self._dirty, set()
        out: list[tuple[str, UltraServerState | None]] = []
        for key in sorted(dirty):
            old = self._states.get(key)
            nus = self._objects.get(key)
            if nus is None:
                if old is not None:
                    del self._states[key]
                    out.append((old.name, None))
                continue
            state = server_state(nus, self._holder, self._health, self._in_use)
            if old is not None and state == old:
                continue  # keep the old object: what was derived from it still holds
            self._states[key] = state
            if old is not None and old.name != state.name:
                out.append((old.name, None))
            out.append((state.name, state))
        return out

    def servers(self) -> list[UltraServerState]:
        """Every state as of the last ``changes``, sorted by name."""
        return sorted(self._states.values(), key=lambda s: s.name)

    def _holder(self, node: str) -> str | None:
        # min(), as servers_from: independent of the order things were recorded in.
        holders = self._holders.get(node)
        return min(holders) if holders else None
