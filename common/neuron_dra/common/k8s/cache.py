"""An indexed, in-memory store of raw API objects, fed by a reflector.

Objects are the decoded JSON dicts straight from the API server and are shared, not copied:
every reader and every event handler sees the same dict. **Nobody may mutate them**; to change
an object, deep-copy it and write the copy to the API server (the cache then updates from the
watch). Copying on every read would make a cache of thousands of ResourceSlices expensive.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .client import object_key, resource_version

JsonDict = dict[str, Any]
IndexFunc = Callable[[JsonDict], Iterable[str]]
KeyFunc = Callable[[Mapping[str, Any]], str]

DeltaType = Literal["add", "update", "delete"]


@dataclass(frozen=True)
class Delta:
    """One change the store applied: ``old`` is None for adds, ``new`` is None for deletes."""

    type: DeltaType
    key: str
    old: JsonDict | None
    new: JsonDict | None

    @property
    def object(self) -> JsonDict:
        """The object a handler should look at (the last known state for a delete)."""
        obj = self.new if self.new is not None else self.old
        assert obj is not None
        return obj


def namespace_index(obj: JsonDict) -> list[str]:
    ns = (obj.get("metadata") or {}).get("namespace")
    return [ns] if ns else []


def label_index(label: str) -> IndexFunc:
    """Index by the value of one label (objects without it are not indexed)."""

    def fn(obj: JsonDict) -> list[str]:
        value = ((obj.get("metadata") or {}).get("labels") or {}).get(label)
        return [value] if value is not None else []

    return fn


class Store:
    """``key -> object`` plus named secondary indexes ``index -> value -> {keys}``."""

    def __init__(self, key_func: KeyFunc = object_key) -> None:
        self._key_func = key_func
        self._items: dict[str, JsonDict] = {}
        self._index_funcs: dict[str, IndexFunc] = {}
        # index name -> indexed value -> keys; and the reverse per key to update cheaply.
        self._indices: dict[str, dict[str, set[str]]] = {}
        self._values_of: dict[str, dict[str, tuple[str, ...]]] = {}
        self._resource_version = ""
        self._synced = asyncio.Event()
        #: Bumped on every object stored or removed (not on bookmarks): a reader that derived
        #: something from the content can tell cheaply whether it is still current.
        self.mutations = 0

    # --- reads ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def get(self, key: str) -> JsonDict | None:
        return self._items.get(key)

    def get_by_name(self, name: str, namespace: str | None = None) -> JsonDict | None:
        return self._items.get(f"{namespace}/{name}" if namespace else name)

    def keys(self) -> builtins.list[str]:
        return list(self._items)

    def list(self) -> builtins.list[JsonDict]:
        return list(self._items.values())

    def index_names(self) -> builtins.list[str]:
        return list(self._index_funcs)

    def index_keys(self, index: str, value: str) -> builtins.list[str]:
        try:
            idx = self._indices[index]
        except KeyError:
            raise KeyError(f"no index named {index!r}") from None
        return sorted(idx.get(value, ()))

    def by_index(self, index: str, value: str) -> builtins.list[JsonDict]:
        """Objects whose index function returned ``value``, in key order."""
        return [self._items[k] for k in self.index_keys(index, value)]

    def index_values(self, index: str) -> builtins.list[str]:
        """Every value currently present in ``index``."""
        return sorted(self._indices[index])

    @property
    def resource_version(self) -> str:
        """The list/watch resourceVersion the store content corresponds to."""
        return self._resource_version

    @resource_version.setter
    def resource_version(self, rv: str) -> None:
        self._resource_version = rv

    # --- sync ----------------------------------------------------------------------------

    def has_synced(self) -> bool:
        return self._synced.is_set()

    def mark_synced(self) -> None:
        self._synced.set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    # --- indexes -------------------------------------------------------------------------

    def add_index(self, name: str, fn: IndexFunc) -> None:
        """Register an index; existing objects are indexed immediately."""
        if name in self._index_funcs:
            raise ValueError(f"index {name!r} already exists")
        self._index_funcs[name] = fn
        self._indices[name] = {}
        self._values_of[name] = {}
        for key, obj in self._items.items():
            self._index_one(name, key, obj)

    def _index_one(self, name: str, key: str, obj: JsonDict) -> None:
        values = tuple(dict.fromkeys(self._index_funcs[name](obj)))
        if not values:
            return
        self._values_of[name][key] = values
        idx = self._indices[name]
        for v in values:
            idx.setdefault(v, set()).add(key)

    def _unindex_one(self, name: str, key: str) -> None:
        values = self._values_of[name].pop(key, ())
        idx = self._indices[name]
        for v in values:
            keys = idx.get(v)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del idx[v]

    def _put(self, key: str, obj: JsonDict) -> None:
        self.mutations += 1
        if key in self._items:
            for name in self._index_funcs:
                self._unindex_one(name, key)
        self._items[key] = obj
        for name in self._index_funcs:
            self._index_one(name, key, obj)

    def _remove(self, key: str) -> JsonDict | None:
        old = self._items.pop(key, None)
        if old is not None:
            self.mutations += 1
            for name in self._index_funcs:
                self._unindex_one(name, key)
        return old

    # --- writes (by the reflector) -------------------------------------------------------

    def apply_event(self, event_type: str, obj: JsonDict) -> Delta | None:
        """Apply one watch event (``ADDED``/``MODIFIED``/``DELETED``).

        Returns the resulting change, or None when nothing changed (a delete of an unknown
        object, or an event carrying the resourceVersion we already have).
        ``BOOKMARK`` only moves the store's resourceVersion.
        """
        rv = resource_version(obj)
        if event_type == "BOOKMARK":
            if rv:
                self._resource_version = rv
            return None
        key = self._key_func(obj)
        old = self._items.get(key)
        delta: Delta | None
        if event_type in ("ADDED", "MODIFIED"):
            if old is not None and rv and resource_version(old) == rv:
                delta = None
            else:
                self._put(key, obj)
                delta = Delta("add" if old is None else "update", key, old, obj)
        elif event_type == "DELETED":
            removed = self._remove(key)
            # The watch's copy is the final state (it can be newer than ours): hand that on.
            final = obj if rv else removed
            delta = Delta("delete", key, final, None) if removed is not None else None
        else:
            raise ValueError(f"unknown watch event type {event_type!r}")
        if rv:
            self._resource_version = rv
        return delta

    def replace(self, objs: Iterable[JsonDict], rv: str) -> builtins.list[Delta]:
        """Make the store equal to a fresh list, returning what changed.

        Deletions are reported for objects that vanished while we were not watching: without
        this diff, a relist after 410 would silently forget them. Objects whose
        resourceVersion did not change produce no delta.
        """
        fresh: dict[str, JsonDict] = {}
        for obj in objs:
            fresh[self._key_func(obj)] = obj
        deltas: builtins.list[Delta] = []
        for key in [k for k in self._items if k not in fresh]:
            old = self._remove(key)
            assert old is not None
            deltas.append(Delta("delete", key, old, None))
        for key, obj in fresh.items():
            old = self._items.get(key)
            if old is None:
                self._put(key, obj)
                deltas.append(Delta("add", key, None, obj))
            elif old is not obj and (
                not resource_version(obj) or resource_version(old) != resource_version(obj)
            ):
                self._put(key, obj)
                deltas.append(Delta("update", key, old, obj))
        self._resource_version = rv
        return deltas
