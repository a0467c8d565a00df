"""Structured allocation of one ResourceClaim, as kube-scheduler's DRA plugin does it.

Covers what our users write: ``exactly`` requests (``ExactCount``/``All``, class and request
selectors, tolerations of device taints) and ``firstAvailable`` subrequests (tried in order;
results name ``req/sub``), ``matchAttribute`` (and ``distinctAttribute``) constraints, one node
per claim, only the newest generation of each pool, devices in use unavailable. Class and claim
configs are copied into the result as the scheduler does. ``adminAccess`` requests take devices
in use too, and their results (marked ``adminAccess``) leave the devices free for others.
Consumable capacity, partitionable devices (counters) and slices selected by node labels are
not modelled; nor is the namespace label admin access needs (the API server checks it).

Search: nodes in name order, the first feasible one wins. Per node, requests are filled in
order by backtracking; the candidates of a request are grouped by the values of the constrained
attributes not yet fixed (e.g. one group per ``devicegroup4_id``), groups too small are skipped,
and different subsets of a group are only tried when a later request could want the same
devices. A step budget bounds pathological claims.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Final

from neuron_dra.sim.allocation.explain import node_reasons
from neuron_dra.sim.allocation.model import (
    Alternative,
    Claim,
    ClaimError,
    Constraint,
    Device,
    DeviceKey,
    Matcher,
    NodeDevices,
    gather_nodes,
    parse_claim,
)

DEFAULT_MAX_STEPS: Final = 100_000


@dataclass(frozen=True)
class AllocatedDevice:
    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool = False

    @property
    def key(self) -> DeviceKey:
        return (self.driver, self.pool, self.device)


@dataclass(frozen=True)
class AllocationResult:
    """A successful allocation: ``allocation`` is what goes into ``status.allocation``."""

    node_name: str
    devices: tuple[AllocatedDevice, ...]
    allocation: dict[str, Any]
    #: Selector errors on devices the scheduler would not have reached (e.g. a selector that
    #: fails on ``neuronnode``); harmless here, but worth showing in ``check-claim``.
    warnings: tuple[str, ...] = ()

    @property
    def device_keys(self) -> set[DeviceKey]:
        """The devices the allocation puts in use (admin-access ones stay free)."""
        return {d.key for d in self.devices if not d.admin_access}


@dataclass(frozen=True)
class NodeExplanation:
    node_name: str
    reasons: tuple[str, ...]

    def __str__(self) -> str:
        return f"node {self.node_name}: {'; '.join(self.reasons)}"


@dataclass(frozen=True)
class AllocationFailure:
    """Why the claim was not allocated.

    ``error`` means the claim cannot be allocated anywhere as written (unknown class, selector
    that fails to compile or to evaluate, ...): kube-scheduler reports it as an error rather
    than waiting for devices. ``nodes`` explains each node tried otherwise.
    """

    message: str
    nodes: tuple[NodeExplanation, ...] = ()
    error: bool = False

    def __str__(self) -> str:
        return self.message

    def details(self) -> str:
        """The message plus one line per node, for ``check-claim``."""
        lines = [self.message]
        lines += [f"  {n}" for n in self.nodes if len(self.nodes) > 1]
        return "\n".join(lines)


# --- search --------------------------------------------------------------------------------------


class _GaveUp(Exception):
    pass


class _Aborted(Exception):
    """The claim cannot be allocated as written (kube-scheduler returns an error)."""


_UNSET: Final = object()


@dataclass
class _Search:
    matcher: Matcher
    node: NodeDevices
    claim: Claim
    unavailable: set[DeviceKey]
    max_steps: int
    steps: int = 0
    chosen: set[DeviceKey] = field(default_factory=set)
    picks: list[tuple[Alternative, list[Device]]] = field(default_factory=list)
    fixed: list[object] = field(default_factory=list)
    used: list[set[object]] = field(default_factory=list)
    # For pruning: devices any of requests[i:] could use, and how many they need at least.
    reachable: list[set[DeviceKey]] = field(default_factory=list)
    needed: list[int] = field(default_factory=list)

    def run(self) -> bool:
        self.fixed = [_UNSET] * len(self.claim.constraints)
        self.used = [set() for _ in self.claim.constraints]
        reachable: set[DeviceKey] = set()
        needed = 0
        for request in reversed(self.claim.requests):
            for alt in request.alternatives:
                reachable |= {d.key for d in self.matcher.matches(self.node, alt).devices}
            needed += min(1 if alt.all_mode else alt.count for alt in request.alternatives)
            self.reachable.insert(0, set(reachable))
            self.needed.insert(0, needed)
        return self._solve(0)

    def _solve(self, i: int) -> bool:
        if i == len(self.claim.requests):
            return True
        free = self.reachable[i] - self.unavailable - self.chosen
        if len(free) < self.needed[i]:
            return False
        return any(self._try(alt, i) for alt in self.claim.requests[i].alternatives)

    def _applicable(self, alt: Alternative) -> list[tuple[int, Constraint]]:
        return [(ci, c) for ci, c in enumerate(self.claim.constraints) if c.applies(alt)]

    def _blocked(self, d: Device, alt: Alternative) -> bool:
        return (
            (d.key in self.unavailable and not alt.admin_access)
            or d.key in self.chosen
            or bool(d.untolerated_taints(alt.tolerations))
        )

    def _try(self, alt: Alternative, i: int) -> bool:
        self._step()
        applicable = self._applicable(alt)
        devices = self.matcher.matches(self.node, alt).devices
        if alt.all_mode:
            if not devices or any(d.pool_incomplete for d in devices):
                return False
            self._check_all(alt, devices, applicable)
            if any(self._blocked(d, alt) for d in devices):
                return False
            return self._commit(alt, devices, applicable, i)

        free = [d for d in devices if not self._blocked(d, alt) and self._admissible(d, applicable)]
        if len(free) < alt.count:
            return False
        unfixed = [
            c.attribute for ci, c in applicable if not c.distinct and self.fixed[ci] is _UNSET
        ]
        groups: dict[tuple[object, ...], list[Device]] = {}
        for d in free:
            groups.setdefault(tuple(d.attribute(a) for a in unfixed), []).append(d)
        distinct = [c.attribute for _, c in applicable if c.distinct]
        for members in groups.values():
            if len(members) < alt.count:
                continue
            for combo in self._combos(members, alt.count, i, distinct):
                if self._commit(alt, combo, applicable, i):
                    return True
        return False

    def _admissible(self, d: Device, applicable: Sequence[tuple[int, Constraint]]) -> bool:
        for ci, c in applicable:
            value = d.attribute(c.attribute)
            if value is None:
                return False
            if c.distinct:
                if value in self.used[ci]:
                    return False
            elif self.fixed[ci] is not _UNSET and value != self.fixed[ci]:
                return False
        return True

    def _check_all(
        self,
        alt: Alternative,
        devices: Sequence[Device],
        applicable: Sequence[tuple[int, Constraint]],
    ) -> None:
        """An ``All`` request takes its devices in scan order, each as kube-scheduler does:
        one in use (or with a taint not tolerated) ends the attempt, one that breaks a
        constraint is an error for the whole claim ("it does not make sense to declare a
        claim where a constraint prevents getting all devices"), raised as ``_Aborted``."""
        fixed = list(self.fixed)
        used = [set(u) for u in self.used]
        for d in devices:
            if self._blocked(d, alt):
                return
            for ci, c in applicable:
                value = d.attribute(c.attribute)
                if c.distinct:
                    ok = value is not None and value not in used[ci]
                    used[ci].add(value)
                else:
                    ok = value is not None and fixed[ci] in (_UNSET, value)
                    fixed[ci] = value
                if not ok:
                    raise _Aborted(
                        f"request {alt.name}: cannot add device {d.pool}/{d.name} because "
                        f"the claim's constraint {c.describe()} would not be satisfied"
                    )

    def _combos(
        self, members: list[Device], count: int, i: int, distinct: Sequence[str]
    ) -> Iterator[list[Device]]:
        if not distinct and not self._later_overlap(members, i):
            # Any subset of the group satisfies the constraints equally and nothing later
            # competes for these devices: the first ``count`` are as good as any.
            yield members[:count]
            return
        for combo in itertools.combinations(members, count):
            self._step()
            if all(len({d.attribute(a) for d in combo}) == count for a in distinct):
                yield list(combo)

    def _later_overlap(self, members: Sequence[Device], i: int) -> bool:
        keys = {d.key for d in members}
        return any(
            d.key in keys
            for request in self.claim.requests[i + 1 :]
            for alt in request.alternatives
            for d in self.matcher.matches(self.node, alt).devices
        )

    def _commit(
        self,
        alt: Alternative,
        devices: list[Device],
        applicable: Sequence[tuple[int, Constraint]],
        i: int,
    ) -> bool:
        saved_fixed = list(self.fixed)
        added: list[tuple[int, object]] = []
        for ci, c in applicable:
            if c.distinct:
                for d in devices:
                    value = d.attribute(c.attribute)
                    if value not in self.used[ci]:
                        self.used[ci].add(value)
                        added.append((ci, value))
            elif devices:
                self.fixed[ci] = devices[0].attribute(c.attribute)
        self.chosen.update(d.key for d in devices)
        self.picks.append((alt, devices))
        if self._solve(i + 1):
            return True
        self.picks.pop()
        self.chosen.difference_update(d.key for d in devices)
        self.fixed = saved_fixed
        for ci, added_value in added:
            self.used[ci].discard(added_value)
        return False

    def _step(self) -> None:
        self.steps += 1
        if self.steps > self.max_steps:
            raise _GaveUp


# --- result --------------------------------------------------------------------------------------


def _node_selector(node: str) -> dict[str, Any]:
    return {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }


def _result(
    node: str,
    picks: Sequence[tuple[Alternative, list[Device]]],
    claim: Claim,
    classes: Mapping[str, Mapping[str, Any]],
    warnings: Sequence[str],
) -> AllocationResult:
    devices = tuple(
        AllocatedDevice(alt.name, d.driver, d.pool, d.name, alt.admin_access)
        for alt, devs in picks
        for d in devs
    )
    config: list[dict[str, Any]] = []
    for alt, _ in picks:
        class_spec = (classes.get(alt.class_name) or {}).get("spec") or {}
        for entry in class_spec.get("config") or []:
            config.append(
                {
                    "source": "FromClass",
                    "requests": [alt.name],
                    "opaque": copy.deepcopy(entry.get("opaque")),
                }
            )
    for entry in claim.config:
        item: dict[str, Any] = {"source": "FromClaim"}
        if entry.get("requests"):
            item["requests"] = list(entry["requests"])
        item["opaque"] = copy.deepcopy(entry.get("opaque"))
        config.append(item)
    device_section: dict[str, Any] = {
        "results": [
            {
                "request": d.request,
                "driver": d.driver,
                "pool": d.pool,
                "device": d.device,
                **({"adminAccess": True} if d.admin_access else {}),
            }
            for d in devices
        ]
    }
    if config:
        device_section["config"] = config
    allocation = {"devices": device_section, "nodeSelector": _node_selector(node)}
    return AllocationResult(node, devices, allocation, tuple(warnings))


def _check_errors(
    matcher: Matcher,
    node: NodeDevices,
    claim: Claim,
    picks: Sequence[tuple[Alternative, list[Device]]] | None,
    unavailable: AbstractSet[DeviceKey],
    reached: Callable[[int], bool],
) -> list[str]:
    """Raise ClaimError for a selector error the scheduler would have hit; return the rest.

    The scheduler evaluates the selectors of an ``All`` request on every device of the node
    before it allocates anything. Other requests evaluate them while it scans devices in
    order, skipping devices in use (checked first): when the search succeeds, up to the last
    device picked (and every device for a subrequest tried before the one picked); when it
    fails, every free device of every request the search reached, and it reaches a request
    only when the requests before it can be allocated together (``reached(i)``).
    """
    picked = {alt.name: devs for alt, devs in picks or ()}
    warnings: list[str] = []
    for i, request in enumerate(claim.requests):
        chosen = next(
            (k for k, alt in enumerate(request.alternatives) if alt.name in picked),
            len(request.alternatives),
        )
        in_use = set(unavailable)
        for _, earlier in (picks or ())[:i]:
            in_use.update(d.key for d in earlier)
        for k, alt in enumerate(request.alternatives):
            errors = matcher.matches(node, alt).errors
            if not errors:
                continue
            if alt.all_mode:
                raise ClaimError(errors[0][1])
            scanned = [(d, msg) for d, msg in errors if d.key not in in_use]
            devs = picked.get(alt.name)
            if scanned and (
                (picks is None and reached(i))  # the search failed: all it reached was scanned
                or (picks is not None and k < chosen)  # a subrequest tried and failed
                or (devs is not None and scanned[0][0].index < max(d.index for d in devs))
            ):
                raise ClaimError(scanned[0][1])
            warnings.extend(msg for _, msg in errors)
    return warnings


def _reached(
    matcher: Matcher,
    node: NodeDevices,
    claim: Claim,
    unavailable: AbstractSet[DeviceKey],
    max_steps: int,
) -> Callable[[int], bool]:
    """``reached(i)``: whether a failed search got to request ``i`` (its predecessors can
    be allocated together on the node)."""
    known: dict[int, bool] = {0: True}

    def reached(i: int) -> bool:
        if i not in known:
            prefix = Claim(claim.requests[:i], claim.constraints, claim.config)
            search = _Search(matcher, node, prefix, set(unavailable), max_steps)
            try:
                known[i] = search.run()
            except (_GaveUp, _Aborted):
                known[i] = True  # the scheduler got far enough to give up there too
        return known[i]

    return reached


def _summary(explanations: Sequence[NodeExplanation]) -> str:
    if len(explanations) == 1:
        return str(explanations[0])
    groups: dict[tuple[str, ...], list[str]] = {}
    for e in explanations:
        groups.setdefault(e.reasons, []).append(e.node_name)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    parts = [
        f"{len(nodes)} node{'' if len(nodes) == 1 else 's'}: {'; '.join(reasons)}"
        for reasons, nodes in ordered[:3]
    ]
    if len(ordered) > 3:
        parts.append(f"{len(ordered) - 3} other reasons")
    return f"0/{len(explanations)} nodes can allocate the claim: " + " | ".join(parts)


def allocate(
    claim_spec: Mapping[str, Any],
    *,
    classes: Mapping[str, Mapping[str, Any]],
    slices: Sequence[Mapping[str, Any]],
    allocated: AbstractSet[DeviceKey],
    node_name: str | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> AllocationResult | AllocationFailure:
    """Allocate devices for one claim (``ResourceClaim.spec``) as kube-scheduler would.

    ``classes``: DeviceClass name -> object; ``slices``: the ResourceSlices of all nodes;
    ``allocated``: (driver, pool, device) already in use; ``node_name``: only consider this
    node (a pod already bound). Pure: no I/O, inputs are not modified.
    """
    try:
        claim = parse_claim(claim_spec, classes)
    except ClaimError as err:
        return AllocationFailure(str(err), error=True)
    _, nodes = gather_nodes(slices)
    if node_name is not None:
        nodes = [n for n in nodes if n.name == node_name]
        if not nodes:
            return AllocationFailure(
                f"node {node_name}: no devices",
                (NodeExplanation(node_name, ("no devices",)),),
            )
    if not nodes:
        return AllocationFailure("no node has devices (no ResourceSlices)")
    unavailable = set(allocated)
    matcher = Matcher()
    explanations: list[NodeExplanation] = []
    found_on: AllocationResult | None = None
    for node in nodes:
        if found_on is not None and not _may_abort(matcher, node, claim):
            continue
        search = _Search(matcher, node, claim, unavailable, max_steps)
        gave_up: int | None = None
        try:
            found = search.run()
            warnings = _check_errors(
                matcher,
                node,
                claim,
                search.picks if found else None,
                unavailable,
                _reached(matcher, node, claim, unavailable, max_steps),
            )
        except _GaveUp:
            found, gave_up, warnings = False, max_steps, []
        except (ClaimError, _Aborted) as err:
            # kube-scheduler runs its filters on every node and one error fails the attempt,
            # whether or not another node fits.
            return AllocationFailure(
                str(err), (NodeExplanation(node.name, (str(err),)),), error=True
            )
        if found_on is not None:
            continue
        if found:
            found_on = _result(node.name, search.picks, claim, classes, warnings)
            continue
        explanations.append(
            NodeExplanation(
                node.name, node_reasons(matcher, node, claim, unavailable, gave_up=gave_up)
            )
        )
    if found_on is not None:
        return found_on
    return AllocationFailure(_summary(explanations), tuple(explanations))


def _may_abort(matcher: Matcher, node: NodeDevices, claim: Claim) -> bool:
    """Whether allocating ``claim`` on ``node`` could end in an error: a selector failing on
    one of its devices, or an ``All`` request with a constraint."""
    alternatives = [alt for request in claim.requests for alt in request.alternatives]
    return any(matcher.matches(node, alt).errors for alt in alternatives) or (
        bool(claim.constraints) and any(alt.all_mode for alt in alternatives)
    )
