"""The step for a workload that holds entries: complete an interrupted allocation, or watch
over a running one and apply its failure strategy when a node fails.

An allocation interrupted before its final status write (entries on record, state not
running) was never used by pods: it is finished if every unit can still be had, otherwise
given back (all-or-nothing). A running workload whose nodes are healthy and all on record is
kept as it is (claims that landed outside its nodes are moved); otherwise its
``failureStrategy`` says what happens: ``RestartAll`` releases everything and allocates
again, ``ReplaceAffected`` swaps the failed units for healthy ones, ``NoOp`` (and a
replacement that cannot be found) leaves the workload ``PartiallyAllocated`` and degraded.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from neuron_dra.common.events import EventType
from neuron_dra.controller.allocation.planner import Unit, plan_replacement_on, request_from

from .allocate import allocate, finish
from .generated import delete_claims, ensure_template, stray_nodes
from .health import link_problem
from .model import (
    COND_ALLOCATED,
    COND_DEGRADED,
    COND_READY,
    PARTIALLY_ALLOCATED,
    PENDING,
    REPLACE_AFFECTED,
    RESTART_ALL,
    RUNNING_STATES,
    Cond,
    Held,
    JsonDict,
    ReconcileResult,
    Workload,
    nus_members,
    state_of,
)
from .status import StatusUpdate, allocated_message
from .tools import Tools

log = logging.getLogger(__name__)


async def maintain(t: Tools, obj: JsonDict, wl: Workload, held: list[Held]) -> ReconcileResult:
    """The workload holds entries: complete an interrupted allocation, or watch over a
    running one (failure strategies)."""
    problems = _problems(t, held)
    failed = [h for h in held if any(n in problems for n in h.nodes)]
    missing = sorted(set(range(wl.server_count)) - {h.index for h in held})

    if state_of(obj) not in RUNNING_STATES:
        # An allocation that was interrupted before any pod could use it (its entries were
        # written, the final status write was not): finish it if every unit can still be
        # had, otherwise give everything back (all-or-nothing). Finishing writes no
        # ``Allocating`` either: the state found already says "not running", which is all
        # a further restart needs; only the missing entries and the final status write are
        # made.
        if not failed:
            completed = _complete(t, obj, held)
            if completed is not None:
                missing_units = [u for u in completed if u.index in missing]
                await t.write.write_entries(wl, missing_units, completed[0])
                return await finish(t, obj, wl, list(completed), "allocation completed")
        log.info("releasing the partial allocation of %s", wl.key)
        await t.write.remove_entries(held)
        return await allocate(t, obj, wl)

    if not failed and not missing:
        await _move_strays(t, wl, held)
        return await finish(t, obj, wl, [h.unit for h in held], None)
    what = failure_summary(failed, missing, problems)
    if wl.failure_strategy == RESTART_ALL:
        return await _restart_all(t, obj, wl, held, what)
    if wl.failure_strategy == REPLACE_AFFECTED:
        result = await _replace_affected(t, obj, wl, held, failed, what)
        if result is not None:
            return result
        message = f"{what}; no healthy replacement unit available, keeping the rest"
    else:
        message = f"{what}; failureStrategy NoOp: nothing is moved"
    return await _degraded(t, obj, wl, held, message)


def _problems(t: Tools, held: Sequence[Held]) -> dict[str, str]:
    """Why each node of ``held`` that cannot serve cannot: the node itself (Node, slices,
    devices), or its place in the UltraServer (no longer a member, NeuronLink down)."""
    problems = t.fleet.node_problems({n for h in held for n in h.nodes})
    for h in held:
        members = nus_members(t.fleet.nus_named(h.ultraserver) or {})
        for n in h.nodes:
            if n not in members:
                problems.setdefault(n, f"no longer a member of UltraServer {h.ultraserver}")
            elif (link := link_problem(members[n])) is not None:
                problems.setdefault(n, link)
    return problems


def failure_summary(
    failed: Sequence[Held], missing: Sequence[int], problems: Mapping[str, str]
) -> str:
    """``n1: Node is NotReady; units 2 are no longer on record``."""
    bad_nodes = sorted({n for h in failed for n in h.nodes if n in problems})
    what = "; ".join(f"{n}: {problems[n]}" for n in bad_nodes)
    if missing:
        lost = f"units {', '.join(str(i) for i in missing)} are no longer on record"
        what = f"{what}; {lost}" if what else lost
    return what


def _complete(t: Tools, obj: JsonDict, held: list[Held]) -> tuple[Unit, ...] | None:
    return plan_replacement_on(
        t.fleet.sync(),
        request_from(obj),
        keep=[h.unit for h in held],
        failed=[],
    )


async def _move_strays(t: Tools, wl: Workload, held: list[Held]) -> None:
    stray = stray_nodes(t.ctx, wl, held)
    if not stray:
        return
    moved = await delete_claims(t.ctx, wl.namespace, wl.wid, on_nodes=stray)
    if moved:
        await t.write.event(
            wl,
            EventType.WARNING,
            "ClaimsMoved",
            f"claims {', '.join(moved)} were allocated on {', '.join(sorted(stray))}, which "
            "no longer belong to the workload (stale workloadId tag); deleted them and "
            "their pods so they are scheduled onto the workload's nodes",
        )


async def _restart_all(
    t: Tools, obj: JsonDict, wl: Workload, held: list[Held], what: str
) -> ReconcileResult:
    await t.write.event(
        wl,
        EventType.WARNING,
        "NodeFailure",
        f"{what}; RestartAll: releasing every unit, deleting the workload's claims and "
        "allocating again",
    )
    await delete_claims(t.ctx, wl.namespace, wl.wid, on_nodes=None)
    await t.write.remove_entries(held)
    obj = await t.write.set_status(
        wl,
        obj,
        StatusUpdate(
            PENDING,
            wl.wid,
            (
                Cond(COND_ALLOCATED, False, "Restarting", f"restarting after: {what}"),
                Cond(COND_READY, False, "Restarting", "all units released"),
            ),
            ultraservers=(),
            total_nodes=0,
            allocated=False,
        ),
    )
    return await allocate(t, obj, wl)


async def _replace_affected(
    t: Tools, obj: JsonDict, wl: Workload, held: list[Held], failed: list[Held], what: str
) -> ReconcileResult | None:
    """Swap the failed units for healthy ones; None when no replacement can be found."""
    keep = [h for h in held if h not in failed]
    units = plan_replacement_on(
        t.fleet.sync(),
        request_from(obj),
        keep=[h.unit for h in keep],
        failed=[h.unit for h in failed],
    )
    if units is None:
        return None
    # Old entries first: a crash in between leaves missing units, which the next reconcile
    # fills the same way; the other order would leave two entries with one index.
    await t.write.remove_entries(failed)
    kept = {h.index for h in keep}
    new_units = [u for u in units if u.index not in kept]
    await t.write.write_entries(wl, new_units, units[0])
    # The status names the new units before the failed unit's claims go: deleting them is
    # what lets its pods be replaced, so a replacement pod never runs while the status still
    # names the failed UltraServer (README: failure strategies). A crash right after the status
    # write leaves those claims outside the workload's nodes; the next reconcile deletes
    # them as strays.
    result = await finish(t, obj, wl, list(units), None)
    evicted = await delete_claims(
        t.ctx, wl.namespace, wl.wid, on_nodes={n for h in failed for n in h.nodes}
    )
    replaced = ", ".join(
        f"unit {u.index} → {u.ultraserver} ({', '.join(u.nodes)})" for u in new_units
    )
    await t.write.event(
        wl,
        EventType.WARNING,
        "UnitsReplaced",
        f"{what}; replaced {replaced}; deleted claims {', '.join(evicted) or 'none'}",
    )
    return result


async def _degraded(
    t: Tools, obj: JsonDict, wl: Workload, held: list[Held], message: str
) -> ReconcileResult:
    """Keep what the workload holds and say it is degraded."""
    await ensure_template(t.fleet, obj, wl)
    await t.write.set_status(
        wl,
        obj,
        StatusUpdate(
            PARTIALLY_ALLOCATED,
            wl.wid,
            (
                Cond(COND_ALLOCATED, True, "Allocated", allocated_message(h.unit for h in held)),
                Cond(COND_DEGRADED, True, "NodeFailure", message),
                Cond(COND_READY, False, "NodeFailure", message),
            ),
            ultraservers=tuple(sorted({h.ultraserver for h in held})),
            total_nodes=sum(len(h.nodes) for h in held),
            allocated=True,
        ),
        event=(EventType.WARNING, "NodeFailure", message),
    )
    log.warning("workload %s degraded: %s", wl.key, message)
    return ReconcileResult(None)
