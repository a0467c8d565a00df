"""The fault schedule (drawn from the seed, so it replays) and the injection of each fault:
kill -9 of a process, a short downtime, its restart, and the time until the system is whole."""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from neuron_dra.sim.realcluster import (
    APISERVER,
    CONTROLLER_MANAGER,
    ETCD,
    SCHEDULER,
)
from neuron_dra.sim.soak.children import CONTROLLER, PLUGIN
from neuron_dra.sim.soak.options import CONTROL_PLANE, Options
from neuron_dra.sim.soak.realnodes import REBOOT
from neuron_dra.sim.soak.supervisor import restart_child, restart_cp

if TYPE_CHECKING:
    from neuron_dra.sim.soak.harness import Soak

# Fault kinds (the process that gets kill -9).
LEADER = "controller-leader"
STANDBY = "controller-standby"
FAULT_WEIGHTS: dict[str, int] = {
    LEADER: 3,
    STANDBY: 2,
    PLUGIN: 4,
    SCHEDULER: 1,
    CONTROLLER_MANAGER: 1,
    APISERVER: 2,
    ETCD: 2,
}


@dataclass
class Fault:
    at: float  # seconds into the run (planned)
    kind: str
    target: str  # process name
    downtime: float
    done_at: float | None = None
    recovery: float | None = None


def plan_faults(
    fault_rng: random.Random,
    nodes: list[str],
    minutes: float,
    fault_interval: float,
    node_weights: Mapping[str, int] | None = None,
) -> list[Fault]:
    """Faults at exponential intervals (mean ``fault_interval`` s) over the run, each kind
    drawn by its weight, a plugin fault (or a fault of ``node_weights``: a real node's
    kubelet, containerd, reboot) on a random node, a downtime of up to 4 s."""
    table = {**FAULT_WEIGHTS, **(node_weights or {})}
    kinds = list(table)
    weights = [table[k] for k in kinds]
    out: list[Fault] = []
    t = 10.0
    end = minutes * 60
    while True:
        t += fault_rng.expovariate(1 / fault_interval)
        if t >= end:
            return out
        kind = fault_rng.choices(kinds, weights)[0]
        on_node = kind == PLUGIN or kind in (node_weights or {})
        target = fault_rng.choice(nodes) if on_node else kind
        out.append(Fault(round(t, 1), kind, target, round(fault_rng.uniform(0, 4), 1)))


def forced_schedule(
    texts: Sequence[str], nodes: Collection[str], node_weights: Mapping[str, int]
) -> list[Fault]:
    """The faults ``--fault AT:KIND:TARGET:DOWNTIME`` names, in the order given. A fault on
    a node (a plugin's, or one of ``node_weights``) targets one of ``nodes``; any other
    targets its kind (the controller faults pick the replica when they fire). Raises
    ValueError saying what to change."""
    kinds = {**FAULT_WEIGHTS, **node_weights}
    out = []
    for text in texts:
        parts = text.split(":")
        example = f"e.g. 8:{PLUGIN}:{min(nodes, default='NODE')}:1"
        if len(parts) != 4:
            raise ValueError(f"fault {text!r}: write AT:KIND:TARGET:DOWNTIME, {example}")
        at, kind, target, downtime = parts
        if kind not in kinds:
            raise ValueError(f"fault {text!r}: the kind is one of {', '.join(sorted(kinds))}")
        on_node = kind == PLUGIN or kind in node_weights
        if on_node and target not in nodes:
            raise ValueError(
                f"fault {text!r}: the target of {kind} is a node, one of {', '.join(nodes)}"
            )
        if not on_node and target != kind:
            raise ValueError(f"fault {text!r}: the target of {kind} is {kind} itself")
        try:
            seconds, down = float(at), float(downtime)
        except ValueError:
            raise ValueError(f"fault {text!r}: AT and DOWNTIME are seconds, {example}") from None
        if not (0 <= seconds < math.inf and 0 <= down < math.inf):
            raise ValueError(f"fault {text!r}: AT and DOWNTIME are seconds, 0 or more")
        out.append(Fault(seconds, kind, target, down))
    return out


def fault_text(fault: Fault) -> str:
    """``fault`` as ``--fault`` takes it (what :func:`forced_schedule` reads back)."""
    return f"{fault.at:g}:{fault.kind}:{fault.target}:{fault.downtime:g}"


def not_reached(schedule: list[Fault], options: Options) -> str:
    """What the churn's limit left undone: the faults that never fired (and those done, with
    the time each took to recover, which is where the limit went)."""
    missing = [
        f"{f.kind} on {f.target} (planned at {f.at:.0f}s)" for f in schedule if f.done_at is None
    ]
    done = [
        f"{f.kind} at {f.done_at:.0f}s: whole again after "
        + (f"{f.recovery:.1f}s" if f.recovery is not None else "(not seen)")
        for f in schedule
        if f.done_at is not None
    ]
    return (
        f"{len(missing)} of {len(schedule)} planned faults not reached in the churn's limit "
        f"of {options.churn_limit:g}s: {', '.join(missing)}; done: {'; '.join(done) or 'none'}"
    )


async def inject(soak: Soak, start: float) -> None:
    schedule = soak.plan_faults()
    soak.faults = schedule
    for fault in schedule:
        delay = start + fault.at - time.monotonic()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(soak.wake_faults.wait(), delay)
        if soak.stopping.is_set() or soak.faults_over:
            return
        await one_fault(soak, fault)


async def one_fault(soak: Soak, fault: Fault) -> None:
    assert soak.cp is not None
    target = fault.target
    if fault.kind in (LEADER, STANDBY):
        try:
            leader = await soak.leader()
        except Exception:
            leader = None
        controllers = [c for c in soak.children.values() if c.kind == CONTROLLER]
        if leader is None:
            child = soak.fault_rng.choice(controllers)
        elif fault.kind == LEADER:
            child = leader
        else:
            child = next(c for c in controllers if c is not leader)
        target = child.name
    fault.target = target
    fault.done_at = soak.now()
    soak.whole_since = None
    what = "reboot" if fault.kind == REBOOT else f"kill -9 {fault.kind}"
    soak.event(f"FAULT {what} {target} (down {fault.downtime}s)")
    if fault.kind in soak.node_side.fault_weights:
        restarted = await soak.node_side.inject(fault)
    elif fault.kind in CONTROL_PLANE:
        soak.held_cp.add(target)
        soak.cp.kill(target)
        await asyncio.sleep(fault.downtime)
        restarted = time.monotonic()
        await restart_cp(soak, target)
        soak.held_cp.discard(target)
    else:
        child = soak.children[target]
        child.held = True
        child.kill9()
        await asyncio.sleep(fault.downtime)
        restarted = time.monotonic()
        await restart_child(soak, child)
        child.held = False
    try:
        await soak.wait(soak.whole, f"whole after {fault.kind}", soak.o.recover_limit)
    except TimeoutError as exc:
        soak.violate("recovery", str(exc))
        return
    fault.recovery = time.monotonic() - restarted
    soak.whole_since = soak.now()
    # Where a slow recovery went: the restarted plugin's log tells when it reached each step
    # of its start (its first line: the interpreter up and the imports done).
    restarted_child = soak.children.get(target)
    phases = (
        restarted_child.start_phases()
        if restarted_child is not None and restarted_child.kind == PLUGIN
        else ""
    )
    soak.event(
        f"whole again {fault.recovery:.1f}s after restarting {target}"
        + (f" (its start: {phases})" if phases else "")
    )
