"""Seed 000 (the UltraServer Operator guide): each failure strategy after a node of a running
workload dies, on a cluster of three UltraServers (one spare) with a control plane of its
own, shared by the strategies: after each, the failed node comes back (a new boot) and the
cluster is reset."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from e2e.operator import NAME, NS, allocated, deployment, ranks, seed_workload, state
from e2e.reset import reset
from neuron_dra.sim.commands.walkthrough import Walkthrough
from neuron_dra.sim.controlplane.podsets import PodSet
from neuron_dra.sim.simcluster import SimCluster, ultraservers
from neuron_dra.sim.simcluster.cluster import RECOVERY_LIMIT
from neuron_dra.sim.worlds import cluster_kwargs, own_control_plane

pytestmark = pytest.mark.asyncio(loop_scope="package")


# --- failure strategies: three UltraServers, so one is spare ---------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="package")
async def spare_world(world: str) -> AsyncIterator[tuple[SimCluster, Walkthrough]]:
    """One cluster of three UltraServers per world, with a control plane of its own; gone
    with this module (the sim command's tests start clusters of the same size)."""
    with own_control_plane(world) as cp:
        async with SimCluster(ultraservers(3), **cluster_kwargs(world, cp)) as sim:
            yield sim, Walkthrough(sim, io.StringIO())


@pytest_asyncio.fixture(loop_scope="package")
async def spare_cluster(
    spare_world: tuple[SimCluster, Walkthrough],
) -> AsyncIterator[tuple[SimCluster, Walkthrough]]:
    """The world's cluster for one test; afterwards the failed node comes back (a new boot)
    and everything the test made is gone."""
    yield spare_world
    await reset(spare_world[0])


async def run_and_fail(
    sim: SimCluster, walk: Walkthrough, strategy: str
) -> tuple[PodSet, dict[int, tuple[str, str, str]], str, str]:
    """Allocate the seed workload with ``strategy``, run the Deployment, kill rank 5's node.
    Returns (the Deployment, ranks before, the failed node, its UltraServer)."""
    await sim.apply(seed_workload(strategy))
    await allocated(sim)
    deploy = await sim.apply(deployment())
    before = await ranks(walk, await walk.running_workload(deploy))
    failed = before[5][1]
    await sim.fail_node(failed)
    us = next(n.ultraserver_id for n in sim.nodes if n.name == failed)
    assert us is not None
    return deploy, before, failed, us


def stuck_on(sim: SimCluster, node: str) -> list[dict[str, Any]]:
    """Pods deleted on ``node`` that stay Terminating: its kubelet is gone."""
    return [
        p
        for p in sim.pods(NS)
        if p["spec"].get("nodeName") == node and p["metadata"].get("deletionTimestamp")
    ]


def conditions(sim: SimCluster) -> dict[str, dict[str, Any]]:
    w = sim.workload(NAME) or {}
    return {x["type"]: x for x in (w.get("status") or {}).get("conditions") or []}


async def test_noop_reports_and_moves_nothing(
    spare_cluster: tuple[SimCluster, Walkthrough],
) -> None:
    sim, walk = spare_cluster
    _, before, failed, _ = await run_and_fail(sim, walk, "NoOp")
    await sim.wait_until(lambda: state(sim) == "PartiallyAllocated", "PartiallyAllocated")
    degraded = conditions(sim)["Degraded"]
    assert degraded["status"] == "True" and failed in degraded["message"]
    (event,) = await sim.wait_until(lambda: sim.events(NAME, "NodeFailure"), "NodeFailure")
    assert event["type"] == "Warning" and "NoOp" in event["note"]
    # Nothing moved: the same 8 pods on the same nodes; the spare stays free.
    pods = [p for p in sim.pods(NS)]
    assert sorted(p["metadata"]["uid"] for p in pods) == sorted(u for u, _, _ in before.values())
    spare = [u for u in sim.ultraservers() if u["status"]["state"] == "Available"]
    assert len(spare) == 1


async def test_restart_all_reallocates_everything_and_restarts_every_pod(
    spare_cluster: tuple[SimCluster, Walkthrough],
) -> None:
    sim, walk = spare_cluster
    deploy, before, failed, failed_us = await run_and_fail(sim, walk, "RestartAll")
    old = {u for u, _, _ in before.values()}

    def restarted() -> list[dict[str, Any]] | None:
        pods = sim.running_workload(deploy)
        if pods and not ({p["metadata"]["uid"] for p in pods} & old) and state(sim) == "Allocated":
            return pods
        return None

    pods = await sim.wait_until(restarted, "8 new pods Running after RestartAll", RECOVERY_LIMIT)
    after = await ranks(walk, pods)
    assert sorted(after) == list(range(8))
    nodes = {node for _, node, _ in after.values()}
    assert failed not in nodes
    status = await sim.wait_until(
        lambda: (s := (sim.workload(NAME) or {}).get("status") or {})
        and failed_us not in s["allocatedUltraServers"]
        and s,
        "the status naming the new allocation",
    )
    assert status["totalNodesAllocated"] == 8
    await sim.wait_until(lambda: sim.events(NAME, "NodeFailure"), "NodeFailure event")
    # The dead node's pod was deleted too, but no kubelet ends its grace period: it stays
    # Terminating (its claim held by it), as in Kubernetes, while its replacement runs.
    (stuck,) = stuck_on(sim, failed)
    assert stuck["metadata"]["uid"] in old


async def test_replace_affected_swaps_the_failed_unit_and_restarts_only_its_pods(
    spare_cluster: tuple[SimCluster, Walkthrough],
) -> None:
    sim, walk = spare_cluster
    deploy, before, failed, failed_us = await run_and_fail(sim, walk, "ReplaceAffected")
    us_of = {n.name: n.ultraserver_id for n in sim.nodes}
    affected = {r for r, (_, node, _) in before.items() if us_of[node] == failed_us}
    assert affected == {4, 5, 6, 7}

    kept = {before[r][0] for r in range(8) if r not in affected}
    old = {uid for uid, _, _ in before.values()}

    def replaced() -> list[dict[str, Any]] | None:
        pods = sim.running_workload(deploy)
        if not pods or state(sim) != "Allocated":
            return None
        uids = {p["metadata"]["uid"] for p in pods}
        return pods if len(uids) == 8 and uids & old == kept else None

    pods = await sim.wait_until(replaced, "the failed unit's pods replaced", RECOVERY_LIMIT)
    after = await ranks(walk, pods)
    assert sorted(after) == list(range(8))
    assert {r for r in after if after[r][0] != before[r][0]} == affected
    for r in range(4):
        assert after[r] == before[r]  # untouched: same pod, node and leader
    new_us = {us_of[after[r][1]] for r in affected}
    assert len(new_us) == 1 and failed_us not in new_us
    assert all(after[r][2] == sim.node_address(before[0][1]) for r in range(8))  # rank 0 stayed
    # The API server had the status naming the replacement before it had the claims'
    # deletion (tests/controller: test_replace_affected_names_the_new_unit_before_the_old_
    # claims_go); this cluster's view gets each kind by its own watch, in no order with the
    # others, so it may show the pods first.
    await sim.wait_until(
        lambda: failed_us not in (sim.workload(NAME) or {})["status"]["allocatedUltraServers"],
        "the status naming the replacement",
    )
    await sim.wait_until(lambda: sim.events(NAME, "UnitsReplaced"), "UnitsReplaced event")
    (stuck,) = stuck_on(sim, failed)
    assert stuck["metadata"]["uid"] == before[5][0]
