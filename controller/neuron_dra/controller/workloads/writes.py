"""Every write the workload reconciler makes to NeuronUltraServers and workloads, each an
RV-guarded update that re-reads and re-applies its change on a conflict, and each result
remembered in the fleet's overlay so the next read sees it before the cache does."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping, Sequence
from typing import Any

from neuron_dra.common.constants import CRD_API_VERSION, FINALIZER_WORKLOAD, KIND_WORKLOAD
from neuron_dra.common.events import EventType, ObjectRef
from neuron_dra.common.k8s.client import NEURON_ULTRASERVER_WORKLOADS, NEURON_ULTRASERVERS
from neuron_dra.common.k8s.errors import ConflictError, NotFoundError
from neuron_dra.common.k8s.writes import ensure_finalizer, remove_finalizer, update_with_retry
from neuron_dra.controller.allocation.planner import Unit
from neuron_dra.controller.context import ControllerContext

from . import entries
from .fleet import Fleet
from .health import carries_tag
from .model import AllocationRaceError, Held, JsonDict, Workload, meta_of, status_of
from .status import StatusUpdate, desired_workload_status, rfc3339

#: An Event to record with a status write: (type, reason, note).
EventSpec = tuple[EventType, str, str]


class Writer:
    """The reconciler's writes; reads go through ``fleet``, which sees their results."""

    def __init__(self, ctx: ControllerContext, fleet: Fleet) -> None:
        self.ctx = ctx
        self.fleet = fleet

    # --- NeuronUltraServer allocation entries ----------------------------------------------

    async def write_entries(self, wl: Workload, units: Sequence[Unit], leader: Unit) -> None:
        """Record ``units`` in their NeuronUltraServers, one status write per UltraServer;
        raises AllocationRaceError if a unit's nodes are no longer free on the object the
        write is guarded by. Idempotent.

        The writes go out together, not one after the other: each node plugin tags its
        slice as soon as its NeuronUltraServer records the reservation, and pods applied
        with the workload are tried by the scheduler from then on (one tried before its
        node is tagged is unschedulable and waits out a back-off). Every write is awaited
        before the first failure is raised, so the caller re-plans from a settled record;
        a partial record is what a failure midway left before too (``maintain`` completes
        or releases it)."""
        now = rfc3339(self.ctx.clock.wall())
        groups: dict[str, list[Unit]] = {}
        for unit in units:
            groups.setdefault(unit.ultraserver, []).append(unit)
        results = await asyncio.gather(
            *(
                self._write_nus(
                    name,
                    entries.add_entries(
                        wl.key,
                        wl.wid,
                        group,
                        leader=leader.nodes[0],
                        node_count=wl.topology_size,
                        now=now,
                    ),
                )
                for name, group in groups.items()
            ),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def remove_entries(self, held: Sequence[Held]) -> None:
        """Drop ``held`` from their NeuronUltraServers (matched by ref, index and id)."""
        for name, group in sorted(entries.by_ultraserver(held).items()):
            identities = {h.identity for h in group}
            await self._write_nus(name, entries.remove_entries(identities), missing_ok=True)

    async def mark_releasing(self, held: Sequence[Held]) -> None:
        identities = {h.identity for h in held}
        for name in sorted({h.ultraserver for h in held}):
            await self._write_nus(name, entries.mark_releasing(identities), missing_ok=True)

    async def tidy_entries(self, wl: Workload, units: Sequence[Unit]) -> None:
        """Keep every entry's ``leaderNodeName`` on the rank-0 node and mark entries whose
        nodes all publish the tag ``Active``. Written only where an entry differs, so a
        steady workload costs no NeuronUltraServer writes."""
        if not units:
            return
        mutate = entries.tidy_entries(
            wl.key,
            wl.wid,
            leader=units[0].nodes[0],
            publishes=lambda n: carries_tag(self.fleet.slices_of(n), wl.wid),
        )
        for name in sorted({u.ultraserver for u in units}):
            nus = self.fleet.nus_named(name)
            if nus is not None and mutate(copy.deepcopy(nus)) is not None:
                await self._write_nus(name, mutate, missing_ok=True)

    async def _write_nus(
        self, name: str, mutate: entries.Mutation, *, missing_ok: bool = False
    ) -> None:
        """RV-guarded ``/status`` write of one NeuronUltraServer; ``mutate`` sees the fresh
        object on every attempt. A NeuronUltraServer that is gone took its entries with it:
        fine for a release (``missing_ok``), a lost race for a reservation."""
        try:
            result = await update_with_retry(
                self.ctx.kube.resource(NEURON_ULTRASERVERS),
                name,
                self.ctx.namespace,
                mutate,
                status=True,
                clock=self.ctx.clock,
                # As we last wrote or cached it: one round trip instead of a GET and a PUT.
                current=self.fleet.nus_named(name),
            )
        except ConflictError as exc:
            raise AllocationRaceError(f"{name} kept changing: {exc}") from exc
        except NotFoundError as exc:
            if missing_ok:
                return
            raise AllocationRaceError(f"{name} is gone") from exc
        self.fleet.remember_nus(result)

    # --- the workload ----------------------------------------------------------------------

    async def set_status(
        self,
        wl: Workload,
        obj: JsonDict,
        update: StatusUpdate,
        *,
        event: EventSpec | None = None,
    ) -> JsonDict:
        """Write the status if ``update`` changes it; ``event`` is recorded when the state
        changes (not on every reconcile, so a long Pending does not fill the event log)."""
        now = self.ctx.clock.wall()

        def build(current: Mapping[str, Any]) -> JsonDict:
            generation = meta_of(current).get("generation")
            return desired_workload_status(
                status_of(current), update, now, int(generation) if generation else None
            )

        if build(obj) == status_of(obj):
            return obj
        previous_state = status_of(obj).get("state")

        def mutate(fresh: JsonDict) -> JsonDict | None:
            status = build(fresh)
            if status == status_of(fresh):
                return None
            fresh["status"] = status
            return fresh

        result = await update_with_retry(
            self.ctx.kube.resource(NEURON_ULTRASERVER_WORKLOADS),
            wl.name,
            wl.namespace,
            mutate,
            status=True,
            clock=self.ctx.clock,
        )
        self.fleet.remember_workload(result)
        if event is not None and previous_state != update.state:
            await self.event(wl, *event)
        return result

    async def ensure_finalizer(self, wl: Workload) -> JsonDict:
        obj = await ensure_finalizer(
            self.ctx.kube.resource(NEURON_ULTRASERVER_WORKLOADS),
            wl.name,
            wl.namespace,
            FINALIZER_WORKLOAD,
            clock=self.ctx.clock,
            current=self.fleet.workload(wl.key),
        )
        self.fleet.remember_workload(obj)
        return obj

    async def remove_finalizer(self, wl: Workload) -> None:
        await remove_finalizer(
            self.ctx.kube.resource(NEURON_ULTRASERVER_WORKLOADS),
            wl.name,
            wl.namespace,
            FINALIZER_WORKLOAD,
            clock=self.ctx.clock,
        )

    async def event(self, wl: Workload, type_: EventType, reason: str, note: str) -> None:
        await self.ctx.events.record(
            ObjectRef(CRD_API_VERSION, KIND_WORKLOAD, wl.name, wl.namespace, wl.uid or None),
            type_=type_,
            reason=reason,
            note=note,
            action="Allocate",
        )
