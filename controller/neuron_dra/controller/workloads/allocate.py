"""The allocation step: a workload that holds nothing gets all its units or none.

Validate the spec against the discovered hardware, decide (first come first served across
every waiting workload), record the units in their NeuronUltraServers while the workload
still says it is not running, then ``finish``: template, entry bookkeeping and the one status
write that moves it to ``Allocated``. ``finish`` is also how a repair or a completed
allocation ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from neuron_dra.common.constants import FINALIZER_WORKLOAD
from neuron_dra.common.events import EventType
from neuron_dra.common.k8s.client import object_key
from neuron_dra.common.k8s.writes import has_finalizer
from neuron_dra.controller.allocation.planner import Decision, Unit, plan_on, request_from
from neuron_dra.controller.allocation.unitindex import UnitIndex

from .generated import ensure_template
from .health import carries_tag
from .model import (
    ALLOCATED,
    ALLOCATING,
    COND_ALLOCATED,
    COND_DEGRADED,
    COND_READY,
    FAILED,
    PENDING,
    RUNNING_STATES,
    Cond,
    JsonDict,
    ReconcileResult,
    Workload,
    is_deleting,
    state_of,
)
from .status import StatusUpdate, allocated_message, not_allocated, reason_code
from .tools import Tools
from .validation import Validator

log = logging.getLogger(__name__)


def decide(
    obj: JsonDict,
    workloads: Iterable[Mapping[str, Any]],
    held: Collection[str],
    units: UnitIndex,
    validate: Validator,
) -> Decision:
    """The allocator's decision for ``obj``. Every other workload that holds nothing yet
    (its key not in ``held``) takes part, so the FIFO order holds across workloads; one whose
    spec cannot fit the hardware must not queue others."""
    key = object_key(obj)
    requests = [
        request_from(w)
        for w in workloads
        if (ref := object_key(w)) != key
        and ref not in held
        and not is_deleting(w)
        and validate(w).state != FAILED
    ]
    requests.append(request_from(obj))
    for decision in plan_on(units, requests, until=key):
        if decision.workload_ref == key:
            return decision
    raise AssertionError(f"plan returned no decision for {key}")


async def allocate(t: Tools, obj: JsonDict, wl: Workload) -> ReconcileResult:
    started = time.perf_counter()
    units = t.fleet.sync()
    validate = Validator(t.fleet.ultraservers, t.fleet.slices_of, types=t.fleet.type_counts)
    verdict = validate(obj)
    decision = (
        decide(obj, t.fleet.workloads(), t.fleet.held_refs, units, validate) if verdict.ok else None
    )
    t.metrics.decision_seconds.observe(time.perf_counter() - started)
    if verdict.ok:
        # The template before anything else: it selects by workloadId, not by units, so it
        # can exist before the allocation. Pods applied together with the workload (the
        # seed's Deployment in the same file) then find it when the resourceclaim controller
        # makes their claims, instead of failing and waiting out its growing back-off. A
        # conflict is reported by ``finish``, which ensures it again.
        await ensure_template(t.fleet, obj, wl)
    if not has_finalizer(obj, FINALIZER_WORKLOAD):
        # Before any entry is written: deleting the workload must release what it holds.
        obj = await t.write.ensure_finalizer(wl)
    if not verdict.ok:
        await t.write.set_status(
            wl,
            obj,
            not_allocated(verdict.state, wl.wid, verdict.reason, verdict.message),
            event=(EventType.WARNING, verdict.reason, verdict.message),
        )
        return ReconcileResult(t.timing.pending_requeue if verdict.state == PENDING else None)
    assert decision is not None
    if decision.units is None:
        reason = reason_code(decision.reason)
        await t.write.set_status(
            wl,
            obj,
            not_allocated(PENDING, wl.wid, reason, decision.reason),
            event=(EventType.NORMAL, reason, decision.reason),
        )
        return ReconcileResult(t.timing.pending_requeue)
    if state_of(obj) in RUNNING_STATES:
        # The record must say "not running" before any entry is written: a restart that
        # finds entries under a running state takes them for a running workload that lost
        # units (failure strategy), not for an allocation to finish or give back. A workload
        # that is not running (new, Pending, Failed) already says so, and goes to Allocated
        # in the one final write. Only one still marked as running while it holds nothing
        # (entries lost, or RestartAll interrupted between its release and its Pending
        # write) pays this extra write; ``Allocating`` is what it is then doing.
        obj = await t.write.set_status(
            wl,
            obj,
            StatusUpdate(
                ALLOCATING,
                wl.wid,
                (
                    Cond(COND_ALLOCATED, False, "Allocating", decision.reason),
                    Cond(COND_READY, False, "Allocating", "reserving nodes"),
                ),
            ),
        )
    await t.write.write_entries(wl, decision.units, decision.units[0])
    return await finish(t, obj, wl, list(decision.units), decision.reason)


def readiness(
    wid: str, nodes: Sequence[str], untagged: Sequence[str], conflict: str | None
) -> tuple[str, Cond]:
    """(state, Ready condition) of a workload whose units are all on record and healthy:
    Failed on a template conflict, else Allocated, Ready once every node publishes ``wid``."""
    if conflict is not None:
        return FAILED, Cond(COND_READY, False, "TemplateConflict", conflict)
    if untagged:
        waiting = f"waiting for the node plugins to publish workloadId {wid} on "
        return ALLOCATED, Cond(
            COND_READY, False, "WaitingForNodeTags", waiting + ", ".join(untagged)
        )
    return ALLOCATED, Cond(COND_READY, True, "NodesTagged", f"all {len(nodes)} nodes publish {wid}")


async def finish(
    t: Tools, obj: JsonDict, wl: Workload, units: list[Unit], granted: str | None
) -> ReconcileResult:
    """Every unit is on record and healthy: template, entry bookkeeping, status."""
    conflict = await ensure_template(t.fleet, obj, wl)
    units = sorted(units, key=lambda u: u.index)
    await t.write.tidy_entries(wl, units)
    nodes = [n for u in units for n in u.nodes]
    untagged = [n for n in nodes if not carries_tag(t.fleet.slices_of(n), wl.wid)]
    state, ready = readiness(wl.wid, nodes, untagged, conflict)
    message = allocated_message(units)
    ultraservers = tuple(sorted({u.ultraserver for u in units}))
    await t.write.set_status(
        wl,
        obj,
        StatusUpdate(
            state,
            wl.wid,
            (
                Cond(COND_ALLOCATED, True, "Allocated", message),
                Cond(COND_DEGRADED, False, "Healthy", "all allocated nodes are healthy"),
                ready,
            ),
            ultraservers=ultraservers,
            total_nodes=len(nodes),
            allocated=True if conflict is None else None,
        ),
        event=(
            (EventType.WARNING, "TemplateConflict", conflict)
            if conflict is not None
            else (
                EventType.NORMAL,
                "Allocated",
                f"allocated UltraServers {', '.join(ultraservers)}; {message}",
            )
        ),
    )
    if granted:
        log.info("allocated %s: %s", wl.key, granted)
    return ReconcileResult(None)
