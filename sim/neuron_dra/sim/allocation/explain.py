"""Why a claim does not fit a node: short, precise reasons for ``check-claim`` and pod Events.

Only called after the search failed on a node. Each request is judged on its own first (the
selector that matched nothing, too few free devices, a constraint no subset satisfies); when
every request would fit alone, the reason is their combination.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from neuron_dra.sim.allocation.model import (
    Alternative,
    Claim,
    Constraint,
    Device,
    DeviceKey,
    Matcher,
    NodeDevices,
    short_expression,
)

_MAX_NAMED = 4


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _names(devices: Sequence[Device]) -> str:
    shown = ", ".join(d.name for d in devices[:_MAX_NAMED])
    return shown + (f", +{len(devices) - _MAX_NAMED}" if len(devices) > _MAX_NAMED else "")


def _selector_reason(matcher: Matcher, node: NodeDevices, alt: Alternative) -> str | None:
    """The first selector (class, then request) after which no device is left."""
    class_counts = matcher.survivors(node.devices, alt.class_selectors)
    if class_counts and class_counts[-1] == 0:
        return f"none of the {_plural(len(node.devices), 'device')} matches class {alt.class_name}"
    of_class = [d for d in node.devices if matcher.selected(d, alt.class_selectors)]
    counts = matcher.survivors(of_class, alt.selectors)
    for i, n in enumerate(counts):
        if n == 0:
            before = counts[i - 1] if i else len(of_class)
            return (
                f"selector `{short_expression(alt.selectors[i].expression)}` matches none of "
                f"the {_plural(before, 'device')} of class {alt.class_name}"
            )
    return None


def _largest_group(devices: Sequence[Device], attrs: Sequence[str]) -> tuple[int, int]:
    """(size of the largest set sharing every attribute, devices lacking one of them)."""
    groups: Counter[tuple[object, ...]] = Counter()
    lacking = 0
    for d in devices:
        values = [d.attribute(a) for a in attrs]
        if any(v is None for v in values):
            lacking += 1
        else:
            groups[tuple(values)] += 1
    return (max(groups.values()) if groups else 0), lacking


def alternative_reason(
    matcher: Matcher,
    node: NodeDevices,
    alt: Alternative,
    constraints: Sequence[Constraint],
    unavailable: set[DeviceKey],
) -> str | None:
    """Why ``alt`` cannot be satisfied on ``node`` even alone; None if it could."""
    match = matcher.matches(node, alt)
    matching = match.devices
    if not matching:
        return _selector_reason(matcher, node, alt) or "no device matches"
    applicable = [c for c in constraints if c.applies(alt)]
    if alt.all_mode:
        incomplete = sorted({d.pool for d in matching if d.pool_incomplete})
        if incomplete:
            return f"asks for all devices, but pool {incomplete[0]} is being updated"
        in_use = [d for d in matching if d.key in unavailable]
        tainted = [
            d
            for d in matching
            if d.key not in unavailable and d.untolerated_taints(alt.tolerations)
        ]
        for busy, state in ((in_use, "in use"), (tainted, "tainted")):
            if busy:
                verb = "is" if len(busy) == 1 else "are"
                return (
                    f"asks for all {len(matching)} matching devices, but {len(busy)} {verb} "
                    f"{state} ({_names(busy)})"
                )
        for c in applicable:
            values = {d.attribute(c.attribute) for d in matching}
            if None in values:
                return f"not all {len(matching)} matching devices have {c.attribute}"
            if (c.distinct and len(values) < len(matching)) or (not c.distinct and len(values) > 1):
                verb = "have distinct" if c.distinct else "share"
                return f"the {len(matching)} matching devices do not all {verb} {c.attribute}"
        return None

    need = alt.count
    in_use = [d for d in matching if d.key in unavailable]
    tainted = [
        d for d in matching if d.key not in unavailable and d.untolerated_taints(alt.tolerations)
    ]
    free = [d for d in matching if d.key not in unavailable and d not in tainted]
    head = f"needs {_plural(need, 'device')}, {len(matching)} match"
    if len(matching) < need:
        return f"needs {_plural(need, 'device')}, only {len(matching)} match"
    if len(free) < need:
        why = []
        if in_use:
            why.append(f"{len(in_use)} in use")
        if tainted:
            why.append(f"{len(tainted)} tainted")
        verb = "is" if len(free) == 1 else "are"
        return f"{head}, but only {len(free)} {verb} free ({', '.join(why)})"
    which = "free ones " if in_use or tainted else ""
    shared = [c.attribute for c in applicable if not c.distinct]
    for attrs in ([a] for a in shared):
        largest, lacking = _largest_group(free, attrs)
        if largest < need:
            detail = f"at most {largest} do" if largest else "no device has it"
            if lacking and largest:
                detail += f"; {lacking} lack it"
            return f"{head}, but no {need} {which}share {attrs[0]} ({detail})"
    if len(shared) > 1:
        largest, _ = _largest_group(free, shared)
        if largest < need:
            return (
                f"{head}, but no {need} {which}share all of {', '.join(shared)} "
                f"(at most {largest} do)"
            )
    for c in applicable:
        if c.distinct:
            values = {d.attribute(c.attribute) for d in free} - {None}
            if len(values) < need:
                return f"{head}, but only {len(values)} {which}have distinct {c.attribute} values"
    return None


def node_reasons(
    matcher: Matcher,
    node: NodeDevices,
    claim: Claim,
    unavailable: set[DeviceKey],
    *,
    gave_up: int | None = None,
) -> tuple[str, ...]:
    reasons: list[str] = []
    if not node.devices:
        return ("no devices",)
    for request in claim.requests:
        alt_reasons = [
            alternative_reason(matcher, node, alt, claim.constraints, unavailable)
            for alt in request.alternatives
        ]
        if any(r is None for r in alt_reasons):
            continue
        if len(request.alternatives) == 1:
            reasons.append(f"request {request.name}: {alt_reasons[0]}")
        else:
            parts = "; ".join(
                f"{alt.name}: {r}" for alt, r in zip(request.alternatives, alt_reasons, strict=True)
            )
            reasons.append(f"request {request.name}: no subrequest fits ({parts})")
    if reasons:
        return tuple(reasons)
    if gave_up is not None:
        return (f"no allocation found within {gave_up} search steps",)
    names = [r.name for r in claim.requests]

    def scope(c: Constraint) -> list[str]:
        return sorted(c.requests) if c.requests else names

    spanning = [c for c in claim.constraints if len({r.split("/", 1)[0] for r in scope(c)}) > 1]
    if spanning:
        listed = ", ".join(f"{c.describe()} across {', '.join(scope(c))}" for c in spanning)
        return (f"each request fits alone, but no combination satisfies {listed}",)
    if claim.constraints:
        listed = ", ".join(f"{c.describe()} on {', '.join(scope(c))}" for c in claim.constraints)
        return (
            f"each request fits alone, but requests {', '.join(names)} cannot share the node's "
            f"free devices while keeping {listed}",
        )
    return (
        f"each request fits alone, but requests {', '.join(names)} together need more "
        "free matching devices than the node has",
    )
