"""The workload and Deployment of seed 000 (the UltraServer Operator guide) as tests apply them,
and what the tests read of them (state, ranks), shared by the e2e packages."""

from __future__ import annotations

from typing import Any

import yaml
from neuron_dra.sim.commands.walkthrough import Walkthrough
from neuron_dra.sim.commands.walkthrough.seed000 import workload_for_sim
from neuron_dra.sim.paths import repo_root
from neuron_dra.sim.simcluster import SimCluster

NS = "default"
NAME = "my-training-job"
RCT = "my-training-job-rct"
SPECS = repo_root() / "examples" / "specs"


def seed_workload(strategy: str | None = None) -> dict[str, Any]:
    doc = yaml.safe_load((SPECS / "ultraserver-workload.yaml").read_text())
    out = workload_for_sim(doc, "trn2u.48xlarge")
    if strategy:
        out["spec"]["allocationPolicy"]["failureStrategy"] = strategy
    return out


def deployment() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(
        (SPECS / "ultraserver-training-deployment.yaml").read_text()
    )
    return doc


def state(sim: SimCluster) -> str | None:
    w = sim.workload(NAME)
    return None if w is None else (w.get("status") or {}).get("state")


async def ranks(walk: Walkthrough, pods: list[dict[str, Any]]) -> dict[int, tuple[str, str, str]]:
    """rank → (pod uid, node, rank-0 host)."""
    out = {}
    for pod in pods:
        v = await walk.view(pod)
        out[int(v.env["NEURON_GLOBAL_TOPOID"])] = (
            pod["metadata"]["uid"],
            v.node,
            v.env["NEURON_GLOBAL_TOPOID0_HOST"],
        )
    return out


async def allocated(sim: SimCluster) -> dict[str, Any]:
    w = await sim.wait_until(
        lambda: state(sim) == "Allocated" and sim.workload(NAME), "workload Allocated"
    )
    assert isinstance(w, dict)
    return w
