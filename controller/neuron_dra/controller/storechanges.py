"""Which objects of a cache changed since we last looked, without scanning the cache.

The workload reconciler keeps state derived from the caches between decisions (node health,
the fleet's free units). Re-deriving it from 10,000 Nodes and slices per decision is what
made decisions O(fleet); knowing *which* objects changed makes them O(changes).

``Store`` offers no change feed, but it calls every index function on each object it stores
(adds, updates, relists, and the objects present when the index is added), so an index
function that returns nothing can note what it is shown. Removals call no index function;
they are found by size: every key the store holds was shown to us, so the store holds fewer
keys than we have seen exactly when some were removed, and only then is the key set compared.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

from neuron_dra.common.k8s.cache import Store
from neuron_dra.common.k8s.client import object_key

Project = Callable[[Mapping[str, Any]], str | None]

_names = itertools.count()


class StoreChanges:
    """Collects, per object stored or removed, ``project(object)`` (default: the object's
    key; e.g. the node name for ResourceSlices). ``drain`` returns and forgets them.

    Assumes the store keys objects by ``object_key`` (the ``Store`` default).
    """

    def __init__(self, store: Store, project: Project = object_key) -> None:
        self._store = store
        self._project = project
        #: key -> what the object stored under it projected to.
        self._seen: dict[str, str | None] = {}
        self._pending: set[str] = set()
        store.add_index(f"controller/changes-{next(_names)}", self._observe)

    def _observe(self, obj: dict[str, Any]) -> list[str]:
        key = object_key(obj)
        value = self._project(obj)
        before = self._seen.get(key)
        if before is not None:
            self._pending.add(before)  # what it was is affected too (e.g. a slice that moved)
        if value is not None:
            self._pending.add(value)
        self._seen[key] = value
        return []  # indexes nothing: this index only watches

    def drain(self) -> set[str]:
        """What changed (projected) since the previous call; O(changes) unless objects were
        removed, when it compares key sets once."""
        if len(self._seen) != len(self._store):
            for key in self._seen.keys() - set(self._store.keys()):
                value = self._seen.pop(key)
                if value is not None:
                    self._pending.add(value)
        changed, self._pending = self._pending, set()
        return changed


__all__ = ["StoreChanges"]
