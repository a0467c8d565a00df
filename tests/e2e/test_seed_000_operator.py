"""seeds/000 (UltraServer Operator) end to end: the workload as written in the seed, the
Deployment of its Step 2, ranks, deletion, and each failure strategy after a node dies."""

from __future__ import annotations

import copy
import io
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import pytest
import pytest_asyncio
import yaml
from neuron_dra.common import constants as c
from neuron_dra.sim.commands.walkthrough import Walkthrough
from neuron_dra.sim.commands.walkthrough.seed000 import workload_for_sim
from neuron_dra.sim.controlplane.workloads import PodSet
from neuron_dra.sim.paths import repo_root
from neuron_dra.sim.simcluster import SimCluster, ultraservers
from neuron_dra.sim.worlds import cluster_kwargs, own_control_plane

pytestmark = pytest.mark.asyncio(loop_scope="package")

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


async def test_seed_workload_and_deployment_get_ranked_pods_on_the_allocated_nodes(
    sim: SimCluster, walk: Walkthrough
) -> None:
    await sim.apply(seed_workload())
    status = (await allocated(sim))["status"]
    assert status["workloadId"].startswith(NAME)
    assert status["totalNodesAllocated"] == 8
    assert sorted(status["allocatedUltraServers"]) == sorted(
        {n.ultraserver_id for n in sim.nodes if n.ultraserver_id}
    )
    datetime.fromisoformat(status["allocationTime"].replace("Z", "+00:00"))
    rct = await sim.wait_until(
        lambda: sim.view.get("resource.k8s.io/v1", "ResourceClaimTemplate", RCT, NS), RCT
    )
    (owner,) = rct["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == (c.KIND_WORKLOAD, NAME)
    wid = status["workloadId"]
    # Each plugin tags its own slice when it sees the reservation: wait for all eight.
    tagged = await sim.wait_until(lambda: walk.tagged_nodes(wid, at_least=8), "8 nodes tagged")
    assert len(tagged) == 8 and all(n.startswith("trn2u-") for n in tagged)

    deploy = await sim.apply(deployment())
    pods = await walk.running_workload(deploy)
    # The Deployment's pods are named <deployment>-<pod-template-hash>-<5 random characters>.
    for p in pods:
        prefix, _hash, suffix = p["metadata"]["name"].rsplit("-", 2)
        assert prefix == "my-training-workload-deployment" and len(suffix) == 5, p
        assert p["metadata"]["labels"]["pod-template-hash"] == _hash
    got = await ranks(walk, pods)
    assert sorted(got) == list(range(8))
    nodes = [node for _, node, _ in got.values()]
    assert sorted(nodes) == tagged  # one pod per allocated node
    # One leader for every rank: rank 0's node, by the address its Node reports.
    assert {host for _, _, host in got.values()} == {sim.node_address(got[0][1])}
    # Ranks follow the units: the 4 nodes of an UltraServer hold 4 consecutive ranks.
    us_of = {n.name: n.ultraserver_id for n in sim.nodes}
    assert len({us_of[got[r][1]] for r in range(4)}) == 1
    assert len({us_of[got[r][1]] for r in range(4, 8)}) == 1

    # A ninth replica finds no node reserved for the workload and waits.
    assert sim.cp is not None
    first_eight = {p["metadata"]["name"] for p in pods}
    await sim.scale(deploy, 9)

    def ninth_refused() -> list[dict[str, Any]]:
        ninth = [p for p in sim.active_pods(deploy) if p["metadata"]["name"] not in first_eight]
        return [e for p in ninth for e in sim.events(p["metadata"]["name"], "FailedScheduling")]

    events = await sim.wait_until(ninth_refused, "ninth pod unschedulable")
    assert events[0]["type"] == "Warning"

    # Deleting the workload while its pods run: template, claims and tags go, nodes free.
    await sim.delete(c.CRD_API_VERSION, c.KIND_WORKLOAD, NAME, NS)
    await sim.wait_until(lambda: sim.workload(NAME) is None, "workload gone")
    assert sim.view.get("resource.k8s.io/v1", "ResourceClaimTemplate", RCT, NS) is None
    await sim.wait_until(lambda: not walk.tagged_nodes(wid), "tags cleared")
    await sim.wait_until(
        lambda: all(u["status"]["state"] == "Available" for u in sim.ultraservers()),
        "UltraServers Available",
    )

    def claims_of_workload() -> list[dict[str, Any]]:
        return [
            x
            for x in sim.claims(NS)
            if x["metadata"].get("labels", {}).get(c.LABEL_WORKLOAD_ID) == wid
        ]

    # The seed's cascade: the workload's pods are evicted with their claims. The Deployment
    # re-creates its pods, which stay Pending: their template is gone.
    await sim.wait_until(lambda: not claims_of_workload(), "the workload's claims gone")
    await sim.wait_until(
        lambda: (
            (pods := sim.pods(NS, "app=ultraserver-training"))
            and all(
                p["status"].get("phase") == "Pending" and not p["spec"].get("nodeName")
                for p in pods
            )
        ),
        "the Deployment's pods evicted and unschedulable",
    )
    assert not {p["metadata"]["uid"] for p in sim.pods(NS)} & {u for u, _, _ in got.values()}
    await sim.remove(deploy)


async def test_walkthrough_operator_step_passes(walk: Walkthrough) -> None:
    await walk.operator()
    assert "FAILED" not in walk.out.getvalue()  # type: ignore[attr-defined]


# --- failure strategies: three UltraServers, so one is spare ---------------------------------


@pytest_asyncio.fixture(loop_scope="package")
async def spare_cluster(world: str) -> AsyncIterator[tuple[SimCluster, Walkthrough]]:
    with own_control_plane(world) as cp:
        async with SimCluster(ultraservers(3), **cluster_kwargs(world, cp)) as sim:
            yield sim, Walkthrough(sim, io.StringIO())


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

    pods = await sim.wait_until(restarted, "8 new pods Running after RestartAll")
    after = await ranks(walk, pods)
    assert sorted(after) == list(range(8))
    nodes = {node for _, node, _ in after.values()}
    assert failed not in nodes
    status = sim.workload(NAME)["status"]  # type: ignore[index]
    assert failed_us not in status["allocatedUltraServers"]
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

    after = await ranks(walk, await sim.wait_until(replaced, "the failed unit's pods replaced"))
    assert sorted(after) == list(range(8))
    assert {r for r in after if after[r][0] != before[r][0]} == affected
    for r in range(4):
        assert after[r] == before[r]  # untouched: same pod, node and leader
    new_us = {us_of[after[r][1]] for r in affected}
    assert len(new_us) == 1 and failed_us not in new_us
    assert all(after[r][2] == sim.node_address(before[0][1]) for r in range(8))  # rank 0 stayed
    status = sim.workload(NAME)["status"]  # type: ignore[index]
    assert failed_us not in status["allocatedUltraServers"]
    await sim.wait_until(lambda: sim.events(NAME, "UnitsReplaced"), "UnitsReplaced event")
    (stuck,) = stuck_on(sim, failed)
    assert stuck["metadata"]["uid"] == before[5][0]


async def test_seed_workload_file_is_the_seed_as_written() -> None:
    doc = yaml.safe_load((SPECS / "ultraserver-workload.yaml").read_text())
    assert doc["spec"] == {
        "instanceType": "<trn3pds instance type>",
        "topologySize": 4,
        "serverCount": 2,
        "allocationPolicy": {"failureStrategy": "NoOp"},
        "resourceClaimTemplate": {"name": RCT},
    }
    filled = workload_for_sim(copy.deepcopy(doc), "trn2u.48xlarge")
    assert filled["spec"]["instanceType"] == "trn2u.48xlarge"
