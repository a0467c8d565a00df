"""The seed walkthrough that ``neuron-dra sim`` runs on the simulated cluster.

Each step applies manifests from ``examples/specs/`` the way a user would, waits for the
cluster to act on them, prints what happened as tables (which pod got which devices and what
its containers would see) and checks the outcome against what the seeds promise. A step that
does not behave raises :class:`StepFailed` with what was expected; steps clean up after
themselves so the next one starts from an idle cluster.

The steps live in one module per seed (``seed000``, ``seed001``, ``seed003``) on the tools
every step shares (``tools``; ``tables`` renders what the pods got);
:class:`Walkthrough` puts them together and :func:`run_walkthrough` runs them in order.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from neuron_dra.common.k8s.errors import KubeError
from neuron_dra.sim.commands.walkthrough.seed000 import OperatorSteps
from neuron_dra.sim.commands.walkthrough.seed001 import DeviceSteps
from neuron_dra.sim.commands.walkthrough.seed003 import InvalidCountSteps
from neuron_dra.sim.commands.walkthrough.tools import NS, StepFailed, expect


class Walkthrough(DeviceSteps, OperatorSteps, InvalidCountSteps):
    """Every step of the walkthrough, on one simulated cluster."""

    async def cleanup(self) -> None:
        for kind in ("ResourceClaimTemplate",):
            for obj in self.sim.view.list("resource.k8s.io/v1", kind, NS):
                await self.sim.delete("resource.k8s.io/v1", kind, obj["metadata"]["name"], NS)
        await self.idle()
        states = {
            u["metadata"]["name"]: (u.get("status") or {}).get("state")
            for u in self.sim.ultraservers()
        }
        expect(
            all(s == "Available" for s in states.values()), f"UltraServers Available, got {states}"
        )
        expect(not self.sim.pods(NS), "no pods left")
        self.say("  no pods, claims or CDI specs left; every UltraServer Available")


@dataclass
class Step:
    title: str
    run: Callable[[], Awaitable[None]]


def steps(w: Walkthrough) -> list[Step]:
    return [
        Step("The simulated cluster", w.cluster),
        Step("Connected devices: 4 devices in one row (DRA guide, example 1)", w.connected),
        Step(
            "Whole node, half node, driver version: xl / l / 2.24.7.0 templates (DRA guide)",
            w.sizes,
        ),
        Step("Logical NeuronCore size 1 (DRA guide, example 2)", w.lnc),
        Step(
            "4-node UltraServer groups with LeaderWorkerSet (DRA guide, example 3)",
            w.ultraserver_groups,
        ),
        Step(
            "UltraServer operator: workload, template, 8 ranked pods, cleanup (operator guide)",
            w.operator,
        ),
        Step("Invalid device count on trn1.32xlarge (scheduler extension docs)", w.invalid_count),
        Step("Cleanup", w.cleanup),
    ]


async def run_walkthrough(w: Walkthrough) -> list[tuple[str, str | None, float]]:
    """Run every step; (title, failure or None, seconds) per step. A failed step does not
    stop the others: each cleans up on success only, so later steps may fail after it."""
    results: list[tuple[str, str | None, float]] = []
    for n, step in enumerate(steps(w), 1):
        w.say(f"==> {n}. {step.title}")
        started = time.monotonic()
        error: str | None = None
        try:
            await step.run()
        except (StepFailed, KubeError, OSError, TimeoutError) as exc:
            error = f"{type(exc).__name__}: {exc}" if not isinstance(exc, StepFailed) else str(exc)
            w.say(f"  FAILED: {error}")
        elapsed = time.monotonic() - started
        if error is None:
            w.say(f"  ok ({elapsed:.1f} s)")
        w.say()
        results.append((step.title, error, elapsed))
    return results
