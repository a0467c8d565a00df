"""Seed 000 (the UltraServer Operator guide) end to end: the workload as written in the seed, the
Deployment of its Step 2, ranks and deletion (the failure strategies, on clusters of their
own: tests/e2e_clusters)."""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Any

import pytest
import yaml
from neuron_dra.common import constants as c
from neuron_dra.nodeplugin.prepare import metadata
from neuron_dra.sim.commands.walkthrough import Walkthrough
from neuron_dra.sim.commands.walkthrough.seed000 import workload_for_sim
from neuron_dra.sim.simcluster import SimCluster

from .operator import NAME, NS, RCT, SPECS, allocated, deployment, ranks, seed_workload

pytestmark = pytest.mark.asyncio(loop_scope="package")


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
    # Each container's device metadata file (KEP-5304) carries its rank and leader too.
    for pod in pods[:2]:
        view = await walk.view(pod)
        (text,) = view.files.values()
        (device,) = metadata.decode(text)[0]["requests"][0]["devices"]
        assert device["name"] == c.NODE_DEVICE_NAME
        attrs = {k: next(iter(v.values())) for k, v in device["attributes"].items()}
        assert attrs["neuron.aws.com/globalTopologyId"] == int(view.env["NEURON_GLOBAL_TOPOID"])
        assert attrs["neuron.aws.com/globalTopologyId0Host"] == got[0][2]
        assert attrs["neuron.aws.com/ultraserverNodeCount"] == 4
        assert attrs["neuron.aws.com/workloadId"] == wid
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
    # The controller deletes the template before it drops the workload's finalizer, but the
    # templates' watch is not ordered with the workloads': wait for the template's deletion.
    await sim.wait_until(
        lambda: sim.view.get("resource.k8s.io/v1", "ResourceClaimTemplate", RCT, NS) is None,
        "the workload's template gone",
    )
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
