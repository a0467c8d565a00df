"""Seed 001 (the Neuron DRA guide) examples 1-3 on the simulated cluster, from the manifests in
examples/specs/ as users apply them."""

from __future__ import annotations

import pytest
from neuron_dra.common import constants as c
from neuron_dra.sim.commands.walkthrough import Walkthrough
from neuron_dra.sim.commands.walkthrough.tables import core_count
from neuron_dra.sim.commands.walkthrough.tools import G4, G8
from neuron_dra.sim.simcluster import SimCluster

pytestmark = pytest.mark.asyncio(loop_scope="package")

ROWS = [set(range(r, r + 4)) for r in (0, 4, 8, 12)]
HALVES = [set(range(0, 8)), set(range(8, 16))]


def indices(devices: list[str]) -> set[int]:
    return {int(d.removeprefix("neurondevice")) for d in devices}


async def test_example_1_connected_devices_are_one_torus_row(walk: Walkthrough) -> None:
    await walk.apply_spec("connected-4-devices.yaml")
    names = ["c4-a", "c4-b", "c4-c", "c4-d", "c4-e"]
    for name in names:
        await walk.create_pod(name, "1x4-connected-neurons")
    pods = await walk.running(names)
    views = [await walk.view(p) for p in pods]
    by_node: dict[str, list[set[int]]] = {}
    for v in views:
        got = indices(v.devices)
        assert got in ROWS, f"{v.name}: {sorted(got)} is not a row of the 4x4 torus"
        assert len({walk.device_attr(v.node, d, G4) for d in v.devices}) == 1
        # The container gets exactly those device nodes and their cores (LNC 2: 4 per device).
        assert v.device_nodes == [f"/dev/neuron{i}" for i in sorted(got)]
        assert core_count(v.env["NEURON_RT_VISIBLE_CORES"]) == 16
        by_node.setdefault(v.node, []).append(got)
    # Only trn2.48xlarge nodes match the selector; five rows need both of them, no row twice.
    assert set(by_node) == {"trn2-0", "trn2-1"}
    for rows in by_node.values():
        assert len(rows) == len({frozenset(r) for r in rows})


async def test_rct1_xl_rct2_l_and_driver_version(walk: Walkthrough) -> None:
    wanted = {
        "xl": ("all-devices-xl.yaml", "xl-trn2", 16),
        "l": ("half-node-l.yaml", "l-trn2", 8),
        "drv": ("driver-version.yaml", "driver-2.24.7.0-trn2", 8),
    }
    for pod, (spec, template, _) in wanted.items():
        await walk.apply_spec(spec)
        await walk.create_pod(pod, template)
    views = {v.name: v for v in [await walk.view(p) for p in await walk.running(list(wanted))]}
    assert indices(views["xl"].devices) == set(range(16))
    for name in ("l", "drv"):
        got = indices(views[name].devices)
        assert got in HALVES, f"{name}: {sorted(got)} is not a half"
        assert len({walk.device_attr(views[name].node, d, G8) for d in views[name].devices}) == 1
        drivers = {
            walk.device_attr(views[name].node, d, c.ATTR_NEURON_DRIVER_VERSION)
            for d in views[name].devices
        }
        assert drivers == {"2.24.7.0"}
    # 32 devices asked for, 32 on the two trn2.48xlarge: the halves share the node xl left.
    assert views["l"].node == views["drv"].node != views["xl"].node


async def test_example_2_lnc_1_reaches_the_container(walk: Walkthrough) -> None:
    await walk.apply_spec("lnc1.yaml")
    await walk.create_pod("lnc", "all-neurons-lnc-1")
    (pod,) = await walk.running(["lnc"])
    v = await walk.view(pod)
    assert len(v.devices) == 16
    assert v.env["NEURON_LOGICAL_NC_CONFIG"] == "1"
    assert v.env["NEURON_RT_VISIBLE_CORES"] == "0-127"  # 16 devices x 8 cores at LNC 1


async def test_example_3_four_node_groups_each_fill_one_ultraserver(
    walk: Walkthrough, sim: SimCluster
) -> None:
    await walk.apply_spec("ultraserver-4-node.yaml")
    (lws,) = await walk.apply_spec("ultraserver-4-node-lws.yaml")
    assert lws.pod_names() == sorted(
        ["vllm-0", "vllm-0-1", "vllm-0-2", "vllm-0-3", "vllm-1", "vllm-1-1", "vllm-1-2", "vllm-1-3"]
    )
    pods = await walk.running(lws.pod_names())
    groups: dict[str, set[str]] = {}
    for pod in pods:
        v = await walk.view(pod)
        node = sim.view.get("v1", "Node", v.node)
        assert node is not None
        us = node["metadata"]["labels"][c.LABEL_ULTRASERVER_SERVER_ID_4]
        group = pod["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"]
        groups.setdefault(group, set()).add(us)
        # One whole node: the neuronnode device, all 16 device nodes, the 4-node mode.
        assert v.devices == ["neuronnode"]
        assert len(v.device_nodes) == 16
        assert v.env["NEURON_RT_ULTRASERVER_MODE"] == "1"  # the driver's X4
        assert v.env["NEURON_RT_ULTRASERVER_SERVER_ID"] == us
        assert (
            v.env["NEURON_RT_ULTRASERVER_NODE_ID"]
            == node["metadata"]["labels"][c.LABEL_ULTRASERVER_NODE_ID_4]
        )
        role = pod["metadata"]["labels"]["role"]
        assert role == ("leader" if pod["metadata"]["name"] in ("vllm-0", "vllm-1") else "worker")
    assert sorted(groups) == ["0", "1"]
    assert all(len(servers) == 1 for servers in groups.values())
    assert groups["0"] != groups["1"]


@pytest.mark.parametrize("step", ["cluster", "connected", "sizes", "lnc", "ultraserver_groups"])
async def test_walkthrough_step_passes(walk: Walkthrough, step: str) -> None:
    """The steps ``neuron-dra sim`` shows for seed 001 check themselves; they pass here."""
    await getattr(walk, step)()
    assert "FAILED" not in walk.out.getvalue()  # type: ignore[attr-defined]
