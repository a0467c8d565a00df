"""What the workload's status should say: pure functions from what a reconcile decided to the
status object (conditions whose ``lastTransitionTime`` only moves on a flip, the allocation
stamp) and the messages and reason codes the conditions carry."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from neuron_dra.controller.allocation.planner import Unit

from .model import (
    ALLOCATING,
    COND_ALLOCATED,
    COND_PROGRESSING,
    COND_READY,
    RUNNING_STATES,
    Cond,
    JsonDict,
)


def rfc3339(ts: datetime) -> str:
    """Second precision, ``Z``: what the API server itself writes for ``date-time`` fields."""
    return ts.strftime("%Y-%m-%dT%H:%M:%SZ")


def with_condition(
    conditions: Sequence[Mapping[str, Any]], cond: Cond, now: str, generation: int | None
) -> list[JsonDict]:
    """``conditions`` with ``cond`` set; ``lastTransitionTime`` moves only when the status
    flips, so re-asserting a condition is not a change (no status write, no watch event)."""
    status = "True" if cond.status else "False"
    out: list[JsonDict] = []
    found = False
    for existing in conditions:
        if existing.get("type") != cond.type:
            out.append(dict(existing))
            continue
        found = True
        same = existing.get("status") == status
        updated: JsonDict = {
            "type": cond.type,
            "status": status,
            "reason": cond.reason,
            "message": cond.message,
            "lastTransitionTime": existing.get("lastTransitionTime") if same else now,
        }
        if not updated["lastTransitionTime"]:
            updated["lastTransitionTime"] = now
        if generation is not None:
            updated["observedGeneration"] = generation
        out.append(updated)
    if not found:
        new: JsonDict = {
            "type": cond.type,
            "status": status,
            "reason": cond.reason,
            "message": cond.message,
            "lastTransitionTime": now,
        }
        if generation is not None:
            new["observedGeneration"] = generation
        out.append(new)
    return out


@dataclass(frozen=True)
class StatusUpdate:
    """What one reconcile wants the workload status to say.

    ``ultraservers``/``total_nodes`` None leave those fields as they are; ``allocated``
    True stamps ``allocationTime`` on the transition into a running state (and keeps it while
    running), False clears it, None leaves it.
    """

    state: str
    workload_id: str
    conditions: tuple[Cond, ...] = ()
    ultraservers: tuple[str, ...] | None = None
    total_nodes: int | None = None
    allocated: bool | None = None


def not_allocated(state: str, wid: str, reason: str, message: str) -> StatusUpdate:
    """A workload that holds nothing: ``Allocated`` and ``Ready`` False for ``reason``."""
    return StatusUpdate(
        state,
        wid,
        (
            Cond(COND_ALLOCATED, False, reason, message),
            Cond(COND_READY, False, reason, "not allocated"),
        ),
        ultraservers=(),
        total_nodes=0,
        allocated=False,
    )


def desired_workload_status(
    current: Mapping[str, Any], update: StatusUpdate, now: datetime, generation: int | None
) -> JsonDict:
    """The workload's status after ``update``; fields we do not own pass through."""
    status: JsonDict = copy.deepcopy(dict(current))
    stamp = rfc3339(now)
    previous_state = status.get("state")
    status["state"] = update.state
    status["workloadId"] = update.workload_id
    if update.ultraservers is not None:
        status["allocatedUltraServers"] = list(update.ultraservers)
    if update.total_nodes is not None:
        status["totalNodesAllocated"] = update.total_nodes
    if update.allocated is True:
        # Stamped on the way into a running state and kept while it runs (a degraded or
        # repaired workload was allocated when it was allocated).
        if previous_state not in RUNNING_STATES or not status.get("allocationTime"):
            status["allocationTime"] = stamp
        # The same time under AWS's operator's name (the seed's guide says allocationTime).
        status["allocatedAt"] = status["allocationTime"]
    elif update.allocated is False:
        status.pop("allocationTime", None)
        status.pop("allocatedAt", None)
    conditions: list[JsonDict] = [dict(c) for c in status.get("conditions") or []]
    for cond in (*update.conditions, progressing(update.state)):
        conditions = with_condition(conditions, cond, stamp, generation)
    status["conditions"] = conditions
    if generation is not None:
        status["observedGeneration"] = generation
    return status


def progressing(state: str) -> Cond:
    """``Progressing`` as AWS's operator defines it: True while an allocation is under way
    (state ``Allocating``). Derived from the state, so it never contradicts it."""
    if state == ALLOCATING:
        return Cond(COND_PROGRESSING, True, ALLOCATING, "reserving nodes")
    return Cond(COND_PROGRESSING, False, state, f"not allocating (state {state})")


def allocated_message(units: Iterable[Unit]) -> str:
    """``8 nodes allocated; unit 0: us-a (n0, n1, n2, n3); unit 1: ...``."""
    ordered = sorted(units, key=lambda u: u.index)
    parts = [f"unit {u.index}: {u.ultraserver} ({', '.join(u.nodes)})" for u in ordered]
    return f"{sum(len(u.nodes) for u in ordered)} nodes allocated; " + "; ".join(parts)


def reason_code(decision_reason: str) -> str:
    """A condition reason for an allocator decision that granted nothing."""
    if decision_reason.startswith("queued behind"):
        return "Queued"
    if decision_reason.startswith("invalid request"):
        return "InvalidSpec"
    return "InsufficientCapacity"
