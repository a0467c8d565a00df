"""Seed 002 (UltraServer environment and node labels, once written by an init script),
seeds 003 and 004 (Neuron scheduler extension: connected sets on trn1, contiguous rings on
inf2) on the simulated cluster."""

from __future__ import annotations

from typing import Any

import pytest
from neuron_dra.common import constants as c
from neuron_dra.sim.commands.walkthrough import Walkthrough
from neuron_dra.sim.simcluster import SimCluster

pytestmark = pytest.mark.asyncio(loop_scope="package")

NS = "default"
US_LABELS = (
    c.LABEL_ULTRASERVER_MODE,
    c.LABEL_ULTRASERVER_SERVER_ID_2,
    c.LABEL_ULTRASERVER_NODE_ID_2,
    c.LABEL_ULTRASERVER_SERVER_ID_4,
    c.LABEL_ULTRASERVER_NODE_ID_4,
)


def labels(sim: SimCluster, node: str) -> dict[str, str]:
    obj = sim.view.get("v1", "Node", node)
    assert obj is not None
    return dict(obj["metadata"].get("labels") or {})


async def test_ultraserver_node_labels_match_the_init_scripts(sim: SimCluster) -> None:
    def labelled() -> bool:
        return all(
            c.LABEL_ULTRASERVER_MODE in labels(sim, n.name) for n in sim.nodes if n.ultraserver_id
        )

    await sim.wait_until(labelled, "UltraServer node labels")
    by_us: dict[str, list[dict[str, str]]] = {}
    for n in sim.nodes:
        got = labels(sim, n.name)
        if n.ultraserver_id is None:
            assert not set(US_LABELS) & set(got), f"{n.name} is no UltraServer node"
            continue
        assert got[c.LABEL_ULTRASERVER_MODE] == "1_2_4"
        assert got[c.LABEL_ULTRASERVER_SERVER_ID_4] == n.ultraserver_id
        assert got[c.LABEL_ULTRASERVER_NODE_ID_4] == str(n.ultraserver_node_id)
        by_us.setdefault(n.ultraserver_id, []).append(got)
    for members in by_us.values():
        # Two 2-node groups per UltraServer: pairs {0,1} and {2,3}, node ids 0 and 1 in each.
        pairs: dict[str, list[str]] = {}
        for got in sorted(members, key=lambda m: int(m[c.LABEL_ULTRASERVER_NODE_ID_4])):
            pairs.setdefault(got[c.LABEL_ULTRASERVER_SERVER_ID_2], []).append(
                got[c.LABEL_ULTRASERVER_NODE_ID_2]
            )
        assert sorted(pairs.values()) == [["0", "1"], ["0", "1"]]


async def test_two_node_units_get_the_init_scripts_environment(
    sim: SimCluster, walk: Walkthrough
) -> None:
    workload = {
        "apiVersion": c.CRD_API_VERSION,
        "kind": c.KIND_WORKLOAD,
        "metadata": {"name": "pairs"},
        "spec": {"instanceType": "trn2u.48xlarge", "topologySize": 2, "serverCount": 2},
    }
    await sim.apply(workload)
    await sim.wait_until(
        lambda: ((sim.workload("pairs") or {}).get("status") or {}).get("state") == "Allocated",
        "workload pairs Allocated",
    )
    template: dict[str, Any] = {
        "metadata": {"labels": {"app": "pairs"}},
        "spec": {
            "resourceClaims": [{"name": "neuron", "resourceClaimTemplateName": "pairs"}],
            "containers": [
                {
                    "name": "worker",
                    "image": "public.ecr.aws/docker/library/alpine:latest",
                    "command": ["sleep", "infinity"],
                    "resources": {"claims": [{"name": "neuron"}]},
                }
            ],
        },
    }
    deploy = await sim.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "pairs"},
            "spec": {
                "replicas": 4,
                "selector": {"matchLabels": {"app": "pairs"}},
                "template": template,
            },
        }
    )
    pods = await walk.running_workload(deploy)
    envs = {}
    for pod in pods:
        v = await walk.view(pod)
        envs[int(v.env["NEURON_GLOBAL_TOPOID"])] = (v.node, v.env)
    assert sorted(envs) == [0, 1, 2, 3]
    leader = sim.node_address(envs[0][0])
    for rank, (node, env) in envs.items():
        got = labels(sim, node)
        assert env["NEURON_GLOBAL_TOPOID0_HOST"] == leader
        # 2-node mode: X2V (3) where the node offers vertical pairs, which trn2u does.
        assert env["NEURON_RT_ULTRASERVER_MODE"] == "3"
        assert env["NEURON_RT_ULTRASERVER_SERVER_ID"] == got[c.LABEL_ULTRASERVER_SERVER_ID_2]
        assert env["NEURON_RT_ULTRASERVER_NODE_ID"] == got[c.LABEL_ULTRASERVER_NODE_ID_2]
        assert env["NEURON_RT_ULTRASERVER_NODE_ID"] == str(rank % 2)
    # Each unit is one 2-node group: ranks 0,1 share a server id, as do 2,3.
    for first in (0, 2):
        ids = {envs[r][1]["NEURON_RT_ULTRASERVER_SERVER_ID"] for r in (first, first + 1)}
        assert len(ids) == 1


def trn1_template(count: int) -> dict[str, Any]:
    """``count`` devices of the trn1.32xlarge (no connectivity constraint: the plugin judges)."""
    sel = "device.attributes['neuron.aws.com'].instanceType == 'trn1.32xlarge'"
    request: dict[str, Any] = {
        "deviceClassName": "neuron.aws.com",
        "count": count,
        "selectors": [{"cel": {"expression": sel}}],
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"trn1-{count}"},
        "spec": {"spec": {"devices": {"requests": [{"name": "neurons", "exactly": request}]}}},
    }


@pytest.mark.parametrize("count", [1, 4, 8, 16])
async def test_trn1_connected_set_counts_are_prepared(walk: Walkthrough, count: int) -> None:
    """Seed 003: 1, 4, 8 and 16 devices are the trn1.32xlarge's connected sets."""
    await walk.sim.apply(trn1_template(count))
    await walk.create_pod(f"trn1-{count}", f"trn1-{count}")
    (pod,) = await walk.running([f"trn1-{count}"])
    view = await walk.view(pod)
    assert view.node == "trn1-0" and len(view.devices) == count
    assert view.device_nodes == sorted(
        (f"/dev/neuron{int(d.removeprefix('neurondevice'))}" for d in view.devices),
        key=lambda p: int(p.removeprefix("/dev/neuron")),
    )


@pytest.mark.parametrize("count", [2, 5, 7])
async def test_trn1_refuses_counts_that_are_not_connected_sets(
    walk: Walkthrough, count: int
) -> None:
    await walk.sim.apply(trn1_template(count))
    await walk.create_pod(f"trn1-{count}", f"trn1-{count}")
    (event,) = await walk.sim.wait_until(
        lambda: walk.sim.events(f"trn1-{count}", "FailedPrepareDynamicResources")[:1],
        "FailedPrepareDynamicResources",
    )
    assert (
        f"Instance type trn1.32xlarge does not support requests for device: {count}. "
        "Please request a different number of devices." in event["note"]
    )


async def test_walkthrough_invalid_count_step_passes(walk: Walkthrough) -> None:
    await walk.invalid_count()
    assert "FAILED" not in walk.out.getvalue()  # type: ignore[attr-defined]


def ring_template(
    name: str, count: int, *, group: bool = True, ids: list[int] | None = None
) -> dict[str, Any]:
    sel = "device.attributes['neuron.aws.com'].instanceType == 'inf2.48xlarge'"
    if ids is not None:
        sel += f" && device.attributes['neuron.aws.com'].deviceId in {ids}"
    exactly = {
        "deviceClassName": "neuron.aws.com",
        "count": count,
        "selectors": [{"cel": {"expression": sel}}],
    }
    devices: dict[str, Any] = {"requests": [{"name": "neurons", "exactly": exactly}]}
    if group:
        devices["constraints"] = [
            {"requests": ["neurons"], "matchAttribute": f"resource.aws.com/devicegroup{count}_id"}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": devices}},
    }


@pytest.mark.parametrize("count", [2, 3, 4, 6])
async def test_inf2_ring_sets_are_contiguous(walk: Walkthrough, count: int) -> None:
    await walk.sim.apply(ring_template(f"ring-{count}", count))
    names = [f"ring-{count}-{i}" for i in range(12 // count)]
    for name in names:
        await walk.create_pod(name, f"ring-{count}")
    seen: set[int] = set()
    for pod in await walk.running(names):
        v = await walk.view(pod)
        got = sorted(int(d.removeprefix("neurondevice")) for d in v.devices)
        assert got == list(range(got[0], got[0] + count)), f"{v.name}: {got} not contiguous"
        assert v.device_nodes == [f"/dev/neuron{i}" for i in got]
        seen |= set(got)
    assert seen == set(range(12))  # the ring is tiled without overlap


async def test_inf2_non_contiguous_devices_are_refused_at_prepare(walk: Walkthrough) -> None:
    await walk.sim.apply(ring_template("gappy", 3, group=False, ids=[0, 2, 4]))
    await walk.create_pod("gappy", "gappy")
    (event,) = await walk.sim.wait_until(
        lambda: walk.sim.events("gappy", "FailedPrepareDynamicResources")[:1],
        "FailedPrepareDynamicResources",
    )
    assert (
        "Instance type inf2.48xlarge does not support the device set 0, 2, 4: it is not one "
        "connected group. Constrain the request with matchAttribute: "
        "resource.aws.com/devicegroup3_id." in event["note"]
    )
