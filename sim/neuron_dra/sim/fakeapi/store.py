"""Object storage of the fake API server: versions, history and watch fan-out.

Like etcd behind kube-apiserver there is one global, monotonically increasing
resourceVersion; every write gets the next one. A bounded ring buffer of events
lets watches resume from an older version until it has been overwritten (or
``compact()`` dropped it), after which the server answers 410 Expired.

Stored objects are immutable by convention: writers build a new dict and hand it
to ``put``; readers may share the stored dict without copying. That keeps lists
of tens of thousands of objects cheap, and lets the JSON encoding of each object
be computed once and reused by every list and watch that sends it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import bisect
import json
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]
StoreKey = tuple[str, str]  # (group, plural): all versions of a resource share storage
ObjKey = tuple[str, str]  # (namespace or "", name)


class ApiError(Exception):
    """A request failure carrying the ``v1.Status`` body the server sends."""

    def __init__(self, body: JSON, headers: dict[str, str] | None = None) -> None:
        super().__init__(body.get("message", ""))
        self.body = body
        self.code = int(body.get("code", 500))
        self.headers = headers or {}


class Expired(Exception):
    """The requested resourceVersion is older than the retained history."""

    def __init__(self, requested: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {requested} ({oldest})")
        self.requested = requested
        self.oldest = oldest


def encode(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


class Entry:
    """A stored object plus its lazily computed JSON encoding."""

    __slots__ = ("_raw", "obj")

    def __init__(self, obj: JSON) -> None:
        self.obj = obj
        self._raw: bytes | None = None

    @property
    def raw(self) -> bytes:
        if self._raw is None:
            self._raw = encode(self.obj)
        return self._raw


@dataclass(slots=True)
class Event:
    type: str  # ADDED | MODIFIED | DELETED
    rv: int
    key: StoreKey
    namespace: str
    name: str
    entry: Entry  # the object after the change (for DELETED: last state, new RV)
    old: JSON | None  # the object before the change (None for ADDED)

    @property
    def obj(self) -> JSON:
        return self.entry.obj


class Watcher:
    """One watch connection's bounded queue.

    Fan-out happens synchronously inside the write, so a watcher registered
    atomically with its starting snapshot never misses or duplicates an event.
    A watcher that falls ``maxsize`` events behind is closed (the real server drops
    slow watchers too) and its client resumes from the last version it saw.
    """

    def __init__(self, key: StoreKey, namespace: str | None, maxsize: int) -> None:
        self.key = key
        self.namespace = namespace
        self.maxsize = maxsize
        self._items: deque[Event] = deque()
        self._ready = asyncio.Event()
        self.closed: str | None = None  # reason, once closed

    def offer(self, ev: Event) -> None:
        if self.closed is not None:
            return
        if len(self._items) >= self.maxsize:
            self.close("overflow")
            return
        self._items.append(ev)
        self._ready.set()

    def close(self, reason: str) -> None:
        if self.closed is None:
            self.closed = reason
            self._ready.set()

    def pending(self) -> int:
        return len(self._items)

    def drain(self) -> list[Event]:
        items = list(self._items)
        self._items.clear()
        return items

    async def wait(self) -> None:
        """Return once events are queued or the watcher is closed."""
        while not self._items and self.closed is None:
            self._ready.clear()
            await self._ready.wait()


@dataclass
class Snapshot:
    rv: int
    items: list[Entry] = field(default_factory=list)
    continue_token: str | None = None
    remaining: int | None = None


class Store:
    """All objects of all resources, with history and watchers."""

    def __init__(self, history_size: int = 50_000, watch_queue_size: int = 20_000) -> None:
        self.rv = 0
        self._objects: dict[StoreKey, dict[ObjKey, Entry]] = {}
        self._sorted: dict[StoreKey, list[ObjKey]] = {}  # cache, dropped on add/remove
        self._history: deque[Event] = deque(maxlen=history_size)
        # Every event with rv > oldest_rv is still in the history.
        self.oldest_rv = 0
        self._watchers: dict[StoreKey, set[Watcher]] = {}
        self.watch_queue_size = watch_queue_size
        self.by_uid: dict[str, tuple[StoreKey, str, str]] = {}
        self.dependents: dict[str, set[tuple[StoreKey, str, str]]] = {}
        # Called after every committed event (used for GC / namespace cleanup).
        self.listeners: list[Callable[[Event], None]] = []

    # ------------------------------------------------------------------ reads
    def get(self, key: StoreKey, namespace: str, name: str) -> JSON | None:
        e = self._objects.get(key, {}).get((namespace, name))
        return e.obj if e else None

    def entry(self, key: StoreKey, namespace: str, name: str) -> Entry | None:
        return self._objects.get(key, {}).get((namespace, name))

    def count(self, key: StoreKey) -> int:
        return len(self._objects.get(key, {}))

    def keys(self) -> list[StoreKey]:
        return list(self._objects)

    def _sorted_keys(self, key: StoreKey) -> list[ObjKey]:
        ks = self._sorted.get(key)
        if ks is None:
            ks = sorted(self._objects.get(key, {}))
            self._sorted[key] = ks
        return ks

    def iter_entries(self, key: StoreKey, namespace: str | None = None) -> Iterator[Entry]:
        """Objects in (namespace, name) order, like the real server's key order."""
        objs = self._objects.get(key, {})
        for k in self._sorted_keys(key):
            if namespace is None or k[0] == namespace:
                yield objs[k]

    def page(
        self,
        key: StoreKey,
        namespace: str | None,
        match: Callable[[JSON], bool] | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        *,
        at_rv: int | None = None,
    ) -> Snapshot:
        """A consistent page of objects.

        A continuation lists the state *at the first page's resourceVersion*, rebuilt
        by undoing later history, so paging through a changing collection is
        consistent like etcd's snapshot reads; once that history is gone → Expired.
        ``at_rv`` asks for the state at that version (resourceVersionMatch=Exact).
        """
        start_after: ObjKey | None = None
        if continue_token:
            rv, start_after = decode_continue(continue_token)
            objs = self._state_at(key, rv)
            keys = sorted(objs)
        elif at_rv is not None and at_rv < self.rv:
            rv = at_rv
            objs = self._state_at(key, rv)
            keys = sorted(objs)
        else:
            rv = self.rv
            objs = self._objects.get(key, {})
            keys = self._sorted_keys(key)
        snap = Snapshot(rv=rv)
        idx = bisect.bisect_right(keys, start_after) if start_after is not None else 0
        n = len(keys)
        while idx < n:
            k = keys[idx]
            idx += 1
            if namespace is not None and k[0] != namespace:
                continue
            e = objs[k]
            if match is not None and not match(e.obj):
                continue
            snap.items.append(e)
            if limit and len(snap.items) >= limit:
                # Only hand out a token when something may follow, like the real server.
                if idx < n:
                    snap.continue_token = encode_continue(rv, k)
                    rest = keys[idx:]
                    if match is None:
                        snap.remaining = sum(
                            1 for r in rest if namespace is None or r[0] == namespace
                        )
                break
        return snap

    def _state_at(self, key: StoreKey, rv: int) -> dict[ObjKey, Entry]:
        if rv < self.oldest_rv:
            raise Expired(rv, self.oldest_rv)
        objs = dict(self._objects.get(key, {}))
        for ev in reversed(self._history):
            if ev.rv <= rv:
                break
            if ev.key != key:
                continue
            k = (ev.namespace, ev.name)
            if ev.type == "ADDED":
                objs.pop(k, None)
            elif ev.old is not None:
                objs[k] = Entry(ev.old)
        return objs

    def events_since(self, key: StoreKey, rv: int) -> list[Event]:
        """History events for ``key`` newer than ``rv`` (Expired when they are gone)."""
        if rv < self.oldest_rv:
            raise Expired(rv, self.oldest_rv)
        out: list[Event] = []
        for ev in reversed(self._history):
            if ev.rv <= rv:
                break
            if ev.key == key:
                out.append(ev)
        out.reverse()
        return out

    # ------------------------------------------------------------------ writes
    def put(self, key: StoreKey, obj: JSON, old: JSON | None = None) -> Event:
        """Store a new version of ``obj`` (a fresh dict the store now owns)."""
        meta = obj["metadata"]
        ns, name = meta.get("namespace", ""), meta["name"]
        bucket = self._objects.setdefault(key, {})
        prev = bucket.get((ns, name))
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        entry = Entry(obj)
        if prev is None:
            self._sorted.pop(key, None)
        else:
            self._unindex(key, ns, name, prev.obj)
        bucket[(ns, name)] = entry
        self._index(key, ns, name, obj)
        ev = Event("ADDED" if prev is None else "MODIFIED", self.rv, key, ns, name, entry,
                   prev.obj if prev else None)
        self._emit(ev)
        return ev

    def remove(self, key: StoreKey, namespace: str, name: str) -> Event | None:
        bucket = self._objects.get(key, {})
        prev = bucket.pop((namespace, name), None)
        if prev is None:
            return None
        self._sorted.pop(key, None)
        self._unindex(key, namespace, name, prev.obj)
        self.rv += 1
        # The DELETED event carries the object's last state at the deletion's version.
        final = dict(prev.obj)
        final["metadata"] = {**prev.obj["metadata"], "resourceVersion": str(self.rv)}
        ev = Event("DELETED", self.rv, key, namespace, name, Entry(final), prev.obj)
        self._emit(ev)
        return ev

    def drop_resource(self, key: StoreKey) -> list[Event]:
        """Remove every object of a resource (its CRD went away)."""
        events = [
            ev
            for ns, name in list(self._objects.get(key, {}))
            if (ev := self.remove(key, ns, name)) is not None
        ]
        for w in self._watchers.pop(key, set()):
            w.close("resource removed")
        return events

    def _index(self, key: StoreKey, ns: str, name: str, obj: JSON) -> None:
        meta = obj["metadata"]
        uid = meta.get("uid")
        if uid:
            self.by_uid[uid] = (key, ns, name)
        for ref in meta.get("ownerReferences") or []:
            if ref.get("uid"):
                self.dependents.setdefault(ref["uid"], set()).add((key, ns, name))

    def _unindex(self, key: StoreKey, ns: str, name: str, obj: JSON) -> None:
        meta = obj["metadata"]
        uid = meta.get("uid")
        if uid and self.by_uid.get(uid) == (key, ns, name):
            del self.by_uid[uid]
        for ref in meta.get("ownerReferences") or []:
            deps = self.dependents.get(ref.get("uid", ""))
            if deps is not None:
                deps.discard((key, ns, name))
                if not deps:
                    del self.dependents[ref["uid"]]

    def _emit(self, ev: Event) -> None:
        hist = self._history
        if hist.maxlen is not None and len(hist) == hist.maxlen:
            self.oldest_rv = hist[0].rv
        hist.append(ev)
        for w in self._watchers.get(ev.key, ()):
            if w.namespace is None or w.namespace == ev.namespace:
                w.offer(ev)
        for listener in self.listeners:
            listener(ev)

    # ------------------------------------------------------------------ watchers
    def add_watcher(self, key: StoreKey, namespace: str | None) -> Watcher:
        w = Watcher(key, namespace, self.watch_queue_size)
        self._watchers.setdefault(key, set()).add(w)
        return w

    def remove_watcher(self, w: Watcher) -> None:
        ws = self._watchers.get(w.key)
        if ws is not None:
            ws.discard(w)

    def watchers(self) -> Iterable[Watcher]:
        for ws in self._watchers.values():
            yield from ws

    def close_watchers(self, reason: str = "dropped") -> int:
        n = 0
        for ws in self._watchers.values():
            for w in list(ws):
                w.close(reason)
                n += 1
        return n

    def compact(self) -> int:
        """Forget all history: any watch or continue from an older version gets 410."""
        self._history.clear()
        self.oldest_rv = self.rv
        return self.rv


def encode_continue(rv: int, after: ObjKey) -> str:
    raw = json.dumps({"v": "fake/1", "rv": rv, "start": list(after)}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, ObjKey]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        ns, name = data["start"]
        return int(data["rv"]), (str(ns), str(name))
    except (binascii.Error, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"invalid continue token: {exc}") from None
