"""The discovery fields of a NeuronUltraServer's status (pure).

This reconciler owns ``state``, ``nodeCount``, ``allocatedNodeCount``, the ``Ready`` and
``Degraded`` conditions and ``observedGeneration``; ``status.allocations`` is the workload
reconciler's, read here (the state depends on it) and passed through untouched.
``lastTransitionTime`` only moves when a condition's status flips, so an unchanged verdict
writes nothing (no status-write storms, as other DRA drivers had).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final

from neuron_dra.common.events import EventType
from neuron_dra.common.ultraserver import read_allocations

from .fields import as_mapping
from .spec import TopologyPlan

JsonDict = dict[str, Any]

CONDITION_READY: Final = "Ready"
CONDITION_DEGRADED: Final = "Degraded"

#: Longest condition message we build; the list of nodes is cut beyond this.
_MAX_MESSAGE: Final = 1000


class Reason(StrEnum):
    """Condition reasons, in priority order for ``Degraded`` (the first issue found wins)."""

    NODES_GONE = "NodesGone"
    INCONSISTENT_TOPOLOGY = "InconsistentTopology"
    NODE_MISSING = "NodeMissing"
    NODE_NOT_READY = "NodeNotReady"
    DEVICE_UNHEALTHY = "DeviceUnhealthy"
    ALL_NODES_READY = "AllNodesReady"
    AS_EXPECTED = "AsExpected"


_PRIORITY: Final = {r: i for i, r in enumerate(Reason)}


def join_names(items: Iterable[str], limit: int = 16) -> str:
    listed = list(items)
    head = ", ".join(listed[:limit])
    return head + (f" and {len(listed) - limit} more" if len(listed) > limit else "")


def allocated_nodes(nus: Mapping[str, Any]) -> set[str]:
    """Node names held by any allocation (the workload reconciler's record)."""
    return {n for entry in read_allocations(nus) for n in entry.nodes}


def allocation_refs(nus: Mapping[str, Any]) -> list[str]:
    return sorted({entry.workload_ref or "?" for entry in read_allocations(nus)})


def has_allocations(nus: Mapping[str, Any]) -> bool:
    return len(read_allocations(nus)) > 0


@dataclass(frozen=True)
class Health:
    """The verdict behind the Ready and Degraded conditions."""

    issues: tuple[tuple[Reason, str], ...] = ()
    ready_message: str = ""

    @property
    def degraded(self) -> bool:
        return bool(self.issues)

    @property
    def reason(self) -> Reason:
        if not self.issues:
            return Reason.AS_EXPECTED
        return min((r for r, _ in self.issues), key=lambda r: _PRIORITY[r])

    @property
    def message(self) -> str:
        text = "; ".join(msg for _, msg in self.issues)
        return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def assess(us_id: str, plan: TopologyPlan | None, nus: Mapping[str, Any]) -> Health:
    """Why the UltraServer is (not) fully usable; ``plan`` None means no node is left."""
    if plan is None:
        refs = allocation_refs(nus)
        return Health(
            (
                (
                    Reason.NODES_GONE,
                    f"no node of UltraServer {us_id} publishes a ResourceSlice any more; "
                    f"kept for {len(refs)} allocation(s): {join_names(refs)}",
                ),
            )
        )
    issues: list[tuple[Reason, str]] = []
    if plan.problems:
        issues.append((Reason.INCONSISTENT_TOPOLOGY, "; ".join(plan.problems)))
    if plan.missing_ids:
        listed = {n.name for n in plan.members}
        # Names of absent nodes are only known where an allocation still holds them.
        held = sorted(allocated_nodes(nus) - listed)
        text = (
            f"{len(plan.members)} of {len(plan.members) + len(plan.missing_ids)} nodes present; "
            f"missing node ids {', '.join(map(str, plan.missing_ids))}"
        )
        if held:
            text += f"; allocated nodes without a ResourceSlice: {join_names(held)}"
        issues.append((Reason.NODE_MISSING, text))
    not_ready = [
        f"{n.name} (nodeId {n.node_id}, {'no Node object' if n.state == 'Missing' else 'NotReady'})"
        for n in plan.members
        if n.state != "Ready"
    ]
    if not_ready:
        issues.append((Reason.NODE_NOT_READY, f"nodes not Ready: {join_names(not_ready)}"))
    bad_devices = [
        f"{n.name}: {join_names(n.unhealthy_devices, 8)}"
        for n in plan.members
        if n.unhealthy_devices
    ]
    if bad_devices:
        issues.append((Reason.DEVICE_UNHEALTHY, f"unhealthy devices on {join_names(bad_devices)}"))
    return Health(
        tuple(issues),
        ready_message=f"{len(plan.members)} of {len(plan.members)} "
        "nodes Ready with healthy devices",
    )


def format_time(ts: datetime) -> str:
    """metav1.Time: RFC 3339, whole seconds, UTC."""
    if ts.tzinfo is not None:
        ts = ts.astimezone(UTC)
    return ts.strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: list[JsonDict],
    type_: str,
    status: str,
    reason: str,
    message: str,
    *,
    observed_generation: int | None,
    now: datetime,
) -> list[JsonDict]:
    """``conditions`` with ``type_`` set; ``lastTransitionTime`` only moves when status flips.

    Other condition types (another writer's) are kept as they are, in place.
    """
    out: list[JsonDict] = []
    found = False
    for cond in conditions:
        if not isinstance(cond, Mapping) or cond.get("type") != type_:
            out.append(cond)
            continue
        found = True
        same = cond.get("status") == status and isinstance(cond.get("lastTransitionTime"), str)
        out.append(
            _condition(
                type_,
                status,
                reason,
                message,
                observed_generation,
                str(cond["lastTransitionTime"]) if same else format_time(now),
            )
        )
    if not found:
        out.append(
            _condition(type_, status, reason, message, observed_generation, format_time(now))
        )
    return out


def _condition(
    type_: str, status: str, reason: str, message: str, generation: int | None, ltt: str
) -> JsonDict:
    cond: JsonDict = {"type": type_, "status": status}
    if generation is not None:
        cond["observedGeneration"] = generation
    cond.update(lastTransitionTime=ltt, reason=reason, message=message)
    return cond


def get_condition(nus: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    conditions = as_mapping(nus.get("status")).get("conditions")
    if isinstance(conditions, list):
        for cond in conditions:
            if isinstance(cond, Mapping) and cond.get("type") == type_:
                return cond
    return None


def desired_state(plan: TopologyPlan | None, nus: Mapping[str, Any]) -> str:
    """Available / PartiallyAllocated / FullyAllocated, by what is left to allocate.

    Health does not enter: a node going NotReady does not free or fill anything, and the
    allocator reads the conditions for health.
    """
    if not has_allocations(nus):
        return "Available"
    members = {n.name for n in plan.members} if plan is not None else set()
    return "PartiallyAllocated" if members - allocated_nodes(nus) else "FullyAllocated"


def desired_status(
    us_id: str,
    plan: TopologyPlan | None,
    nus: Mapping[str, Any],
    *,
    now: datetime,
) -> JsonDict:
    """``nus.status`` with this reconciler's fields recomputed and everything else untouched.

    ``nus`` must be the object the status write will be guarded by (its allocations decide the
    state); ``status.allocations`` and conditions of other types pass through unchanged.
    """
    status: JsonDict = copy.deepcopy(dict(as_mapping(nus.get("status"))))
    generation = as_mapping(nus.get("metadata")).get("generation")
    gen = generation if isinstance(generation, int) and not isinstance(generation, bool) else None
    health = assess(us_id, plan, nus)
    conditions = status.get("conditions")
    conds: list[JsonDict] = list(conditions) if isinstance(conditions, list) else []
    wanted: tuple[tuple[str, str, str, str], ...]
    if health.degraded:
        wanted = (
            (CONDITION_READY, "False", health.reason, health.message),
            (CONDITION_DEGRADED, "True", health.reason, health.message),
        )
    else:
        wanted = (
            (CONDITION_READY, "True", Reason.ALL_NODES_READY, health.ready_message),
            (CONDITION_DEGRADED, "False", Reason.AS_EXPECTED, ""),
        )
    for type_, cond_status, reason, message in wanted:
        conds = set_condition(
            conds, type_, cond_status, reason, message, observed_generation=gen, now=now
        )
    status["state"] = desired_state(plan, nus)
    status["nodeCount"] = len(plan.members) if plan is not None else 0
    status["allocatedNodeCount"] = len(allocated_nodes(nus))
    status["conditions"] = conds
    if gen is not None:
        status["observedGeneration"] = gen
    return status


@dataclass(frozen=True)
class HealthEvent:
    """An Event to record about a NUS whose ``Degraded`` condition was just written."""

    type_: EventType
    reason: str
    note: str


def health_event(
    us_id: str, old: Mapping[str, Any] | None, nus: Mapping[str, Any]
) -> HealthEvent | None:
    """The Event a status write calls for, from the ``Degraded`` condition before (``old``)
    and after it (in ``nus``): a Warning when the UltraServer is degraded with a new verdict,
    ``Recovered`` when it stops being degraded, else none (an unchanged verdict is no news)."""
    new = get_condition(nus, CONDITION_DEGRADED)
    if new is None:
        return None
    was = old.get("status") if old else None
    changed = old is None or any(old.get(k) != new.get(k) for k in ("status", "reason", "message"))
    if new.get("status") == "True" and changed:
        return HealthEvent(
            EventType.WARNING,
            str(new.get("reason") or "Degraded"),
            f"UltraServer {us_id} degraded: {new.get('message') or ''}",
        )
    if new.get("status") == "False" and was == "True":
        ready = as_mapping(get_condition(nus, CONDITION_READY))
        return HealthEvent(
            EventType.NORMAL,
            "Recovered",
            f"UltraServer {us_id}: {ready.get('message') or 'all nodes Ready'}",
        )
    return None
