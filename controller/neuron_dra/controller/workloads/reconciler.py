"""``WorkloadReconciler``: one reconcile of one workload key, as a sequence of steps.

Sync reads where the workload stands (caches plus our own writes) and calls the one step
that applies: orphan claims → :mod:`.orphans`; workload gone → :mod:`.orphans`; being
deleted → :mod:`.release`; holding nothing → :mod:`.allocate`; holding entries →
:mod:`.repair`. Surplus entries are dropped and the finalizer added first. A lost race
(AllocationRaceError) is not an error: the key is retried soon from fresh caches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from neuron_dra.common.constants import FINALIZER_WORKLOAD
from neuron_dra.common.k8s.client import object_key
from neuron_dra.common.k8s.writes import has_finalizer
from neuron_dra.common.ultraserver import read_allocations
from neuron_dra.controller.context import ControllerContext

from .allocate import allocate
from .entries import holdings, split_holdings
from .fleet import Fleet
from .model import (
    FAILED,
    ORPHAN_CLAIMS_MARK,
    AllocationRaceError,
    Held,
    ReconcileResult,
    Workload,
    fifo_key,
    is_deleting,
    state_of,
)
from .orphans import delete_orphan_claims, release_orphans
from .release import deallocate
from .repair import maintain
from .tools import Timing, Tools, WorkloadMetrics
from .writes import Writer

log = logging.getLogger(__name__)


class WorkloadReconciler:
    """Reconciles NeuronUltraServerWorkloads; see the package docstring."""

    def __init__(
        self,
        ctx: ControllerContext,
        *,
        pending_requeue: float = 60.0,
        retry_requeue: float = 1.0,
        tag_poll: float = 2.0,
        tag_clear_timeout: float = 300.0,
    ) -> None:
        self.ctx = ctx
        self.metrics = WorkloadMetrics(ctx.registry)
        self.timing = Timing(pending_requeue, retry_requeue, tag_poll, tag_clear_timeout)
        self.fleet = Fleet(ctx)
        self._tools = Tools(ctx, self.fleet, Writer(ctx, self.fleet), self.metrics, self.timing)

    @property
    def pending_requeue(self) -> float:
        return self.timing.pending_requeue

    @property
    def retry_requeue(self) -> float:
        return self.timing.retry_requeue

    @property
    def tag_poll(self) -> float:
        return self.timing.tag_poll

    @property
    def tag_clear_timeout(self) -> float:
        return self.timing.tag_clear_timeout

    # --- sync ------------------------------------------------------------------------------

    async def reconcile(self, key: str) -> ReconcileResult:
        started = time.perf_counter()
        try:
            return await self._reconcile(key)
        finally:
            self.metrics.reconcile_seconds.observe(time.perf_counter() - started)

    async def _reconcile(self, key: str) -> ReconcileResult:
        t = self._tools
        if not t.fleet.caches_synced():
            # Empty caches look like "every node is gone": acting on them would fire the
            # failure strategies on every workload.
            return ReconcileResult(t.timing.retry_requeue)
        namespace, _, name = key.partition("/")
        if name.startswith(ORPHAN_CLAIMS_MARK):
            await delete_orphan_claims(t, namespace, name.removeprefix(ORPHAN_CLAIMS_MARK))
            return ReconcileResult(None)
        obj = t.fleet.workload(key)
        if obj is None:
            await release_orphans(t, namespace, name)
            return ReconcileResult(None)
        wl = Workload.of(obj)
        held, surplus = self._holdings(wl)
        try:
            if is_deleting(obj):
                return await deallocate(t, obj, wl, [*held, *surplus])
            t.releasing_since.pop(key, None)
            if surplus:
                # A previous incarnation's entries or a damaged record: ours to drop at once.
                await t.write.remove_entries(surplus)
                held, _ = self._holdings(wl)
            if not held:
                return await allocate(t, obj, wl)
            if not has_finalizer(obj, FINALIZER_WORKLOAD):
                obj = await t.write.ensure_finalizer(wl)
            return await maintain(t, obj, wl, held)
        except AllocationRaceError as exc:
            log.info("allocation of %s lost a race, re-planning: %s", key, exc)
            return ReconcileResult(t.timing.retry_requeue)

    def _holdings(self, wl: Workload) -> tuple[list[Held], list[Held]]:
        """(usable, surplus) entries of ``wl`` on record (``split_holdings``)."""
        return split_holdings(
            holdings(self.fleet.nus_holding(wl.key), wl.key), wl.wid, wl.server_count
        )

    # --- for the manager -------------------------------------------------------------------

    def sync_fleet(self) -> None:
        """Catch up with the caches now rather than at the next decision (the manager calls
        this in the background after cache events)."""
        if self.fleet.caches_synced():
            self.fleet.sync()

    def indexed_ultraservers(self) -> int:
        """How many UltraServers the fleet index holds (as of its last sync)."""
        return len(self.fleet.units)

    def keys_for_ultraserver(self, nus: Mapping[str, Any]) -> set[str]:
        """Workloads named in ``nus``'s allocations (they react to its changes)."""
        return {e.workload_ref for e in read_allocations(nus) if e.workload_ref}

    def pending_keys(self) -> list[str]:
        """Workloads waiting for capacity, first come first: requeue them when capacity may
        have appeared (a NeuronUltraServer, slice or node changed)."""
        self.fleet.sync_nus()
        held = self.fleet.held_refs
        waiting = [
            w
            for w in self.fleet.workloads()
            if not is_deleting(w) and state_of(w) != FAILED and object_key(w) not in held
        ]
        return [object_key(w) for w in sorted(waiting, key=fifo_key)]
