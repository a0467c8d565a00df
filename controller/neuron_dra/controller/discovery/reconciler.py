"""The discovery reconciler: converges one NeuronUltraServer per UltraServer id (the I/O).

It reads only the controller's caches, decides with the pure functions of this package
(:mod:`.grouping`, :mod:`.spec`, :mod:`.status`) and writes guarded by the resourceVersion
of the object the decision was based on: ``status.allocations`` is the workload
reconciler's, so an allocation written meanwhile makes our write fail with 409 and we
recompute from the fresh object instead of overwriting it. NUS objects carry no finalizer,
so deleting one never hangs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from neuron_dra.common.events import EventType, ObjectRef
from neuron_dra.common.k8s.client import NEURON_ULTRASERVERS, ResourceClient
from neuron_dra.common.k8s.errors import (
    AlreadyExistsError,
    ConflictError,
    NotFoundError,
    PermanentError,
)
from neuron_dra.common.k8s.writes import update_with_retry
from neuron_dra.controller.caches import slice_node_name
from neuron_dra.controller.context import ControllerContext

from .fields import as_mapping
from .grouping import DesiredUltraServer, group_ultraservers
from .keys import SLICE_INDEX_NODE, SLICE_INDEX_ULTRASERVER, ensure_slice_indexes
from .naming import nus_name, ultraserver_id_of
from .spec import desired_nus, plan_topology, spec_view
from .status import (
    CONDITION_DEGRADED,
    desired_status,
    get_condition,
    has_allocations,
    health_event,
    join_names,
)

#: The package's logger, as before the split into modules (log queries filter on its name).
log = logging.getLogger("neuron_dra.controller.discovery")

JsonDict = dict[str, Any]


@dataclass
class _StatusAttempt:
    """What the last ``mutate`` of a status write saw: the one whose result was written."""

    degraded_before: Mapping[str, Any] | None = None
    changed: bool = False


class UltraServerDiscovery:
    """Level-triggered reconciler: ``reconcile(ultraserver_id)`` converges one NUS.

    Reads only the context's caches; writes go through ``ctx.kube`` guarded by the
    resourceVersion of the object they are based on. API errors propagate (the work queue
    retries with backoff); malformed input never raises.
    """

    def __init__(self, ctx: ControllerContext) -> None:
        self.ctx = ctx
        self.api: ResourceClient = ctx.kube.resource(NEURON_ULTRASERVERS)
        ensure_slice_indexes(ctx.slices)

    # --- cache reads ---------------------------------------------------------------------

    def _group(self, us_id: str) -> DesiredUltraServer | None:
        """The group for ``us_id`` from the cache.

        All current slices of every node that names ``us_id`` take part, not only the slices
        naming it: a node whose newest generation moved to another UltraServer must drop out
        here even while a stale slice of it still names ``us_id``.
        """
        store = self.ctx.slices
        node_names = {
            n for s in store.by_index(SLICE_INDEX_ULTRASERVER, us_id) if (n := slice_node_name(s))
        }
        slices = [s for n in sorted(node_names) for s in store.by_index(SLICE_INDEX_NODE, n)]
        nodes = {n: self.ctx.nodes.get(n) for n in node_names}
        return group_ultraservers(slices, nodes).get(us_id)

    def _cached(self, us_id: str) -> JsonDict | None:
        """The cached NUS of ``us_id``; an object by that name standing for another id is
        not it (``us_id`` may be the sanitized name of another id: never act on that one)."""
        nus = self.ctx.ultraservers.get_by_name(nus_name(us_id), self.ctx.namespace)
        return nus if nus is not None and ultraserver_id_of(nus) == us_id else None

    async def _wait_synced(self) -> None:
        # Acting on an empty cache would delete every NUS at start-up; the manager starts
        # workers after sync, so this normally returns at once.
        for store in (self.ctx.slices, self.ctx.nodes, self.ctx.ultraservers):
            await store.wait_synced()

    # --- reconcile -----------------------------------------------------------------------

    def _resolve(self, key: str) -> str:
        """The UltraServer id for a queue key: an id, or the name of a NUS object.

        NUS events can only name the object; for a sanitized name the raw id is in its
        annotation. A key that is itself a known id wins.
        """
        if self.ctx.slices.index_keys(SLICE_INDEX_ULTRASERVER, key) or self._cached(key):
            return key
        nus = self.ctx.ultraservers.get_by_name(key, self.ctx.namespace)
        raw = ultraserver_id_of(nus) if nus is not None else None
        return raw or key

    async def reconcile(self, key: str) -> None:
        """Converge the NUS of UltraServer ``key`` (an UltraServer id or a NUS name)."""
        await self._wait_synced()
        if not isinstance(key, str) or not key:
            log.warning("ignoring empty UltraServer key", extra={"ultraserver": repr(key)})
            return
        us_id = self._resolve(key)
        keys = {"ultraserver": us_id, "nus": f"{self.ctx.namespace}/{nus_name(us_id)}"}
        group = self._group(us_id)
        cached = self._cached(us_id)
        if group is None:
            if cached is not None:
                await self._nodes_gone(us_id, cached, keys)
            return
        if cached is None:
            plan = plan_topology(group, None)
            if plan.instance_type is None:
                log.warning(
                    "cannot create NeuronUltraServer: no node reports an instance type", extra=keys
                )
                return
            obj = await self._create(us_id, group, keys)
        else:
            obj = await self._ensure_spec(us_id, group, cached, keys)
        await self._ensure_status(us_id, group, obj, keys)

    async def _create(
        self, us_id: str, group: DesiredUltraServer, keys: Mapping[str, str]
    ) -> JsonDict:
        body = desired_nus(us_id, group, None, namespace=self.ctx.namespace)
        try:
            created = await self.api.create(body, self.ctx.namespace)
        except AlreadyExistsError:
            # Our cache had not seen it yet: continue from the live object.
            log.debug("NeuronUltraServer already exists", extra=keys)
            live = await self.api.get(body["metadata"]["name"], self.ctx.namespace)
            if ultraserver_id_of(live) != us_id:
                # Two ids mapping to one name needs a hash collision; refuse to mix them.
                raise PermanentError(
                    f"NeuronUltraServer {body['metadata']['name']} belongs to UltraServer "
                    f"{ultraserver_id_of(live)!r}, not {us_id!r}"
                ) from None
            return await self._ensure_spec(us_id, group, live, keys)
        plan = plan_topology(group, None)
        log.info("created NeuronUltraServer with %d nodes", len(plan.members), extra=keys)
        await self.ctx.events.record(
            ObjectRef.of(created),
            type_=EventType.NORMAL,
            reason="Discovered",
            note=f"UltraServer {us_id} ({plan.instance_type}) discovered with "
            f"{len(plan.members)} node(s): {join_names(n.name for n in plan.members)}",
            action="Discover",
        )
        return created

    async def _ensure_spec(
        self, us_id: str, group: DesiredUltraServer, current: JsonDict, keys: Mapping[str, str]
    ) -> JsonDict:
        if spec_view(desired_nus(us_id, group, current)) == spec_view(current):
            return current

        def mutate(obj: JsonDict) -> JsonDict | None:
            want = desired_nus(us_id, group, obj)
            return want if spec_view(want) != spec_view(obj) else None

        updated = await self._guarded_write(current, mutate, status=False)
        log.info("updated NeuronUltraServer spec", extra=keys)
        return updated

    async def _ensure_status(
        self,
        us_id: str,
        group: DesiredUltraServer | None,
        current: JsonDict,
        keys: Mapping[str, str],
    ) -> None:
        now = self.ctx.clock.wall()
        last = _StatusAttempt()

        def mutate(obj: JsonDict) -> JsonDict | None:
            # Recomputed from whatever object the write is guarded by, so allocations written
            # by the workload reconciler since our last read are both kept and counted.
            plan = plan_topology(group, obj) if group is not None else None
            status = desired_status(us_id, plan, obj, now=now)
            last.degraded_before = get_condition(obj, CONDITION_DEGRADED)
            last.changed = status != obj.get("status")
            if not last.changed:
                return None
            obj["status"] = status
            return obj

        result = await self._guarded_write(current, mutate, status=True)
        if not last.changed:
            return
        log.info(
            "updated NeuronUltraServer status",
            extra={**keys, "state": as_mapping(result.get("status")).get("state")},
        )
        event = health_event(us_id, last.degraded_before, result)
        if event is not None:
            await self.ctx.events.record(
                ObjectRef.of(result),
                type_=event.type_,
                reason=event.reason,
                note=event.note,
                action="Reconcile",
            )

    async def _nodes_gone(self, us_id: str, cached: JsonDict, keys: Mapping[str, str]) -> None:
        """No node names this UltraServer any more: delete it, unless allocations remain."""
        current = cached
        for _ in range(3):
            if has_allocations(current):
                # Deleting would strand the workload's record of its nodes; keep the object
                # and say why, the workload reconciler applies its failure strategy.
                await self._ensure_status(us_id, None, current, keys)
                return
            try:
                # Preconditioned on what we checked: an allocation added meanwhile makes the
                # delete fail instead of silently discarding it.
                await self.api.delete(
                    current["metadata"]["name"],
                    self.ctx.namespace,
                    uid=current["metadata"].get("uid"),
                    resource_version=current["metadata"].get("resourceVersion"),
                )
            except NotFoundError:
                return
            except ConflictError:
                try:
                    current = await self.api.get(current["metadata"]["name"], self.ctx.namespace)
                except NotFoundError:
                    return
                continue
            log.info("deleted NeuronUltraServer: none of its nodes remains", extra=keys)
            return
        raise ConflictError(f"NeuronUltraServer for {us_id} keeps changing; retrying later")

    async def _guarded_write(
        self, current: JsonDict, mutate: Callable[[JsonDict], JsonDict | None], *, status: bool
    ) -> JsonDict:
        """Write ``mutate(copy of current)`` guarded by ``current``'s resourceVersion.

        The first attempt uses the object we already have (usually the cache's: no extra GET
        per reconcile); a 409 means someone wrote in between, so retries re-read the object
        and re-apply ``mutate`` to it.
        """
        # ``mutate`` replaces whole top-level fields (spec, status) and never edits nested
        # ones in place, so a copy of the top level and the metadata (whose resourceVersion
        # is set below) keeps the cached ``current`` intact. A deep copy of every NUS on each
        # pass was a fifth of a restarted controller's start-up at 5,000 nodes.
        draft = mutate({**current, "metadata": dict(current["metadata"])})
        if draft is None:
            return current
        meta = current["metadata"]
        draft["metadata"]["resourceVersion"] = meta["resourceVersion"]
        try:
            return await self.api.replace(draft, subresource="status" if status else None)
        except ConflictError:
            log.debug("conflict writing NeuronUltraServer %s; re-reading", meta.get("name"))
        return await update_with_retry(
            self.api,
            meta["name"],
            meta.get("namespace"),
            mutate,
            status=status,
            clock=self.ctx.clock,
        )
