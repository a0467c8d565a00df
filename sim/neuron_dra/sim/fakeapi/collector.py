"""The follow-ups of writes that the real server leaves to background controllers: the
garbage collector (owner checks, orphaning, collecting dependents), namespace deletion
(purge, then finish), and a deleted CRD taking its custom resources with it. They run
right after the request that caused them, as functions of the ``ApiCore``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .resource_types import CRD_KEY, NS_KEY, ResourceType
from .store import JSON, ApiError, Event

if TYPE_CHECKING:
    from .core import ApiCore


def later(fn: Callable[[], None]) -> None:
    """Run ``fn`` right after the current request, like the real background controllers."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        fn()
        return
    loop.call_soon(fn)


def after_removal(core: ApiCore, ev: Event, policy: str | None) -> None:
    """Follow-ups of an object really leaving storage: GC, namespace/CRD cleanup."""
    uid = ev.obj["metadata"].get("uid", "")
    if policy == "Orphan":
        orphan(core, uid)
    elif uid in core.store.dependents:
        later(lambda: _collect(core, uid))
    if ev.key == CRD_KEY:
        _unregister_crd(core, ev.obj)
    if ev.key == NS_KEY:
        return
    if ev.namespace:
        nso = core.store.get(NS_KEY, "", ev.namespace)
        if nso is not None and nso["metadata"].get("deletionTimestamp"):
            later(lambda: finish_namespace(core, ev.namespace))


def _unregister_crd(core: ApiCore, crd: JSON) -> None:
    gone = core.registry.remove_crd(crd["metadata"]["name"])
    for key in {rt.store_key for rt in gone}:
        for ev in core.store.drop_resource(key):
            after_removal(core, ev, None)


def orphan(core: ApiCore, owner_uid: str) -> None:
    """Remove ``owner_uid`` from its dependents' ownerReferences (propagationPolicy Orphan)."""
    store = core.store
    for key, ns, name in list(store.dependents.get(owner_uid, ())):
        obj = store.get(key, ns, name)
        if obj is None:
            continue
        refs = [r for r in obj["metadata"].get("ownerReferences") or []
                if r.get("uid") != owner_uid]
        new = dict(obj)
        new["metadata"] = {**obj["metadata"], "ownerReferences": refs}
        if not refs:
            del new["metadata"]["ownerReferences"]
        store.put(key, new)


def _collect(core: ApiCore, owner_uid: str) -> None:
    """Garbage-collect dependents all of whose owners are gone."""
    for key, ns, name in list(core.store.dependents.get(owner_uid, ())):
        _collect_if_orphaned(core, key, ns, name)


def _owner_present(core: ApiCore, rt: ResourceType, ns: str, ref: Any) -> bool:
    """Whether the garbage collector would find ``ref``'s owner (or cannot tell).

    Like the real GC, an owner is looked up by kind and name in the *dependent's*
    namespace (owner references carry none) and must have the referenced uid; a missing
    one, or one with another uid, is absent. A kind the server does not serve, or a
    namespaced owner of a cluster-scoped dependent, cannot be resolved: the GC then
    reports it and leaves the dependent alone.
    """
    if not isinstance(ref, dict):
        return True
    owner_rt = core.registry.by_kind(str(ref.get("apiVersion", "")), str(ref.get("kind", "")))
    if owner_rt is None or (owner_rt.namespaced and not rt.namespaced):
        return True
    owner = core.store.get(owner_rt.store_key, ns if owner_rt.namespaced else "",
                           str(ref.get("name", "")))
    return owner is not None and owner["metadata"].get("uid") == ref.get("uid")


def _collect_if_orphaned(core: ApiCore, key: tuple[str, str], ns: str, name: str) -> None:
    obj = core.store.get(key, ns, name)
    rt = core.rt_for_key(key)
    if obj is None or rt is None:
        return
    refs = obj["metadata"].get("ownerReferences") or []
    if not refs or any(_owner_present(core, rt, ns, r) for r in refs):
        return
    try:
        core.delete(rt, ns, name, {"propagationPolicy": "Background"})
    except ApiError:
        return


def check_owners_later(core: ApiCore, rt: ResourceType, obj: JSON) -> None:
    """The GC's check of a new dependent: one whose owners are all absent (never existed,
    another uid, another namespace) is deleted shortly after it was written."""
    meta = obj["metadata"]
    target = (rt.store_key, meta.get("namespace", ""), meta["name"])
    core.pending_owner_checks.append(target)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return  # in-process setup before start(): checked once the server runs
    loop.call_soon(run_owner_checks, core)


def run_owner_checks(core: ApiCore) -> None:
    pending, core.pending_owner_checks = core.pending_owner_checks, []
    for key, ns, name in pending:
        _collect_if_orphaned(core, key, ns, name)


def purge_namespace(core: ApiCore, ns: str) -> None:
    """Delete everything in a terminating namespace, then remove it once empty."""
    for key in core.store.keys():  # noqa: SIM118 (a method, not a dict)
        rt = core.rt_for_key(key)
        if rt is None or not rt.namespaced:
            continue
        for entry in list(core.store.iter_entries(key, ns)):
            try:
                core.delete(rt, ns, entry.obj["metadata"]["name"], {})
            except ApiError:
                continue
    finish_namespace(core, ns)


def finish_namespace(core: ApiCore, ns: str) -> None:
    nso = core.store.get(NS_KEY, "", ns)
    if nso is None or not nso["metadata"].get("deletionTimestamp"):
        return
    for key in core.store.keys():  # noqa: SIM118 (a method, not a dict)
        if key != NS_KEY and next(core.store.iter_entries(key, ns), None) is not None:
            return
    ev = core.store.remove(NS_KEY, "", ns)
    if ev is not None:
        after_removal(core, ev, None)
