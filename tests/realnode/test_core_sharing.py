"""Core sharing on the real control plane and real nodes (docs/configuration.md, "Sharing a
device by its cores"; examples/specs/neuron-core-share.yaml).

1.37 (``DRAConsumableCapacity`` on), on the package's cluster with kn-1's plugin restarted with
``--core-sharing`` for this module: pods whose claims ask ``logicalCores`` share one device of
the real scheduler's choosing, each container with cores of its own (disjoint
``NEURON_RT_VISIBLE_CORES``, in the node's LNC); a device's cores are never over-committed (a
fifth core claim for a full device waits, one free to go elsewhere does); a whole-device claim
waits while the device has shares, and a core claim while it is held whole. A share asking
another LNC is refused with what to do.

1.34 as users run it, with the feature off (the project's shared 1.34 control plane turns the
alpha gate on for ``distinctAttribute``, so this module starts one of its own without it, and
one node whose plugin has ``--core-sharing``): the API server drops the sharing of the slice
and the capacity requests of the template, so the plugin publishes exclusive devices once,
without a republish loop, and each core claim gets a whole device. The kubelet-only minors
skip: this is the control plane's feature.
"""

from __future__ import annotations

import copy
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from neuron_dra.common.constants import CAPACITY_LOGICAL_CORES
from neuron_dra.sim.paths import repo_root
from neuron_dra.sim.realcluster import enabled_minors
from neuron_dra.sim.simcluster import SimCluster, SimNode
from neuron_dra.sim.worlds import own_control_plane

from .conftest import NS
from .test_device_taints import (
    at_least,
    device_template,
    pool_generation,
    quick_pod,
    slice_device,
    unschedulable,
)
from .test_kubelet_side import nodes

pytestmark = pytest.mark.asyncio(loop_scope="package")

EXAMPLE = repo_root() / "examples" / "specs" / "neuron-core-share.yaml"
CORES_PER_DEVICE = 4  # trn2.48xlarge at its default LNC 2
SHARING = ("--core-sharing=true",)


@dataclass
class Sharing:
    """The cluster of this module's minor and its node whose plugin shares devices."""

    sim: SimCluster
    node: str


async def restart_plugin(sim: SimCluster, node: str, args: tuple[str, ...]) -> None:
    """The node's plugin again, with ``args`` (as a DaemonSet rollout with the new value)."""
    rn = nodes(sim)
    rn.node_args[node] = args
    rn.stop_plugin(node)
    await rn.wait_ready(rn.start_plugin(node))


def sharable(sim: SimCluster, node: str) -> bool | None:
    """Whether the node's slice offers its devices for sharing; None while it has no
    ``logicalCores`` capacity (not yet published by a plugin with the flag)."""
    dev = slice_device(sim, node, "neurondevice0")
    if CAPACITY_LOGICAL_CORES not in (dev.get("capacity") or {}):
        return None
    return bool(dev.get("allowMultipleAllocations"))


@pytest_asyncio.fixture(scope="module", loop_scope="package")
async def sharing_cluster(cluster: SimCluster, kubelet: str) -> AsyncIterator[Sharing]:
    if kubelet not in enabled_minors():
        pytest.skip("core sharing is the control plane's: tested with its own kubelets")
    if at_least(cluster, (1, 36)):
        await restart_plugin(cluster, "kn-1", SHARING)
        await cluster.wait_until(lambda: sharable(cluster, "kn-1") is not None, "kn-1 sharable")
        yield Sharing(cluster, "kn-1")
        await restart_plugin(cluster, "kn-1", ())
        await cluster.wait_until(lambda: sharable(cluster, "kn-1") is None, "kn-1 exclusive")
        return
    off = {"DRAConsumableCapacity": False}
    with own_control_plane(f"real-{kubelet}", feature_gates=off) as cp:
        assert cp is not None
        async with SimCluster(
            [SimNode("cs-0", "trn2.48xlarge")],
            kubernetes="real",
            control_plane=cp,
            minor=cp.minor,
            kubelet_minor=kubelet,
            plugin_args=SHARING,
            controller=False,
        ) as own:
            await own.wait_until(lambda: sharable(own, "cs-0") is not None, "cs-0 published")
            yield Sharing(own, "cs-0")


@pytest_asyncio.fixture(loop_scope="package")
async def shared(sharing_cluster: Sharing) -> AsyncIterator[Sharing]:
    """The module's cluster for one test; its pods, claims and templates gone afterwards."""
    yield sharing_cluster
    sim = sharing_cluster.sim
    for p in sim.pods(NS):
        await sim.delete("v1", "Pod", p["metadata"]["name"], NS)
    for kind in ("ResourceClaimTemplate", "ResourceClaim"):
        for o in sim.view.list("resource.k8s.io/v1", kind, NS):
            await sim.delete("resource.k8s.io/v1", kind, o["metadata"]["name"], NS)
    await sim.wait_until(lambda: sim.idle(NS), "pods gone and every claim unprepared")


def example_template(cores: int = 1, *, name: str | None = None, device: int | None = None,
                     lnc: int | None = None) -> dict[str, Any]:  # fmt: skip
    """The example's template, asking ``cores`` (on device ``device``; with a NeuronConfig)."""
    docs = [d for d in yaml.safe_load_all(Path(EXAMPLE).read_text()) if d]
    (template,) = [d for d in docs if d["kind"] == "ResourceClaimTemplate"]
    template = copy.deepcopy(template)
    template["metadata"]["name"] = name or f"cores-{cores}"
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    request["exactly"]["capacity"]["requests"][CAPACITY_LOGICAL_CORES] = str(cores)
    if device is not None:
        cel = f"device.attributes['neuron.aws.com'].deviceId == {device}"
        request["exactly"]["selectors"] = [{"cel": {"expression": cel}}]
    if lnc is not None:
        params = {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig"}
        template["spec"]["spec"]["devices"]["config"] = [
            {
                "opaque": {
                    "driver": "neuron.aws.com",
                    "parameters": {**params, "logicalNeuronCore": lnc},
                }
            }
        ]
    return dict(template)


def result_of(sim: SimCluster, pod_name: str) -> dict[str, Any]:
    """The one allocation result of the pod's claim."""
    pod = sim.pod(pod_name)
    assert pod is not None
    (claim,) = sim.claims_of(pod).values()
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return dict(result)


def core_set(visible: str) -> set[int]:
    """The cores of a ``NEURON_RT_VISIBLE_CORES`` value: one id or one range."""
    m = re.fullmatch(r"(\d+)(?:-(\d+))?", visible)
    assert m, f"not one contiguous range: {visible!r}"
    first = int(m.group(1))
    return set(range(first, int(m.group(2) or first) + 1))


async def inside(sim: SimCluster, pod_name: str) -> tuple[list[str], dict[str, str]]:
    pod = sim.pod(pod_name)
    assert pod is not None
    seen = await nodes(sim).look_inside(pod, "main")
    return seen.device_nodes, seen.env


async def run_pods(sim: SimCluster, node: str, *pods: tuple[str, str]) -> None:
    for name, template in pods:
        await sim.apply(quick_pod(name, node, template))
    names = [name for name, _ in pods]
    await sim.wait_until(lambda: sim.running(names), f"{names} Running")


async def delete_pods(sim: SimCluster, *names: str) -> None:
    for name in names:
        await sim.delete("v1", "Pod", name, NS)
    await sim.wait_until(lambda: all(sim.pod(n) is None for n in names), f"{names} gone")


async def test_pods_share_a_device_on_cores_of_their_own(shared: Sharing) -> None:
    sim, node = shared.sim, shared.node
    for cores in (1, 2):
        await sim.apply(example_template(cores))
    if not at_least(sim, (1, 36)):
        await _whole_devices_on_a_server_without_the_feature(sim, node)
        return
    assert sharable(sim, node) is True
    # Two 1-core pods, then a 2-core one: the scheduler packs them onto one device.
    await run_pods(sim, node, ("core-a", "cores-1"), ("core-b", "cores-1"))
    await run_pods(sim, node, ("core-c", "cores-2"))
    results = {name: result_of(sim, name) for name in ("core-a", "core-b", "core-c")}
    (device,) = {r["device"] for r in results.values()}
    index = int(device.removeprefix("neurondevice"))
    taken: set[int] = set()
    for name, want in (("core-a", 1), ("core-b", 1), ("core-c", 2)):
        result = results[name]
        assert result["shareID"] and result["consumedCapacity"][CAPACITY_LOGICAL_CORES] == str(want)
        device_nodes, env = await inside(sim, name)
        assert device_nodes == [f"/dev/neuron{index}"]
        got = core_set(env["NEURON_RT_VISIBLE_CORES"])
        assert len(got) == want and min(got) % want == 0, (name, got)  # aligned to its size
        assert not got & taken, f"{name}'s cores {got} overlap another pod's {taken}"
        taken |= got
        # The node's LNC: no override in the container, ids counted in logical cores of 2.
        assert "NEURON_LOGICAL_NC_CONFIG" not in env
        # status.devices names the share and says which cores.
        pod = sim.pod(name)
        assert pod is not None
        (claim,) = sim.claims_of(pod).values()
        (status,) = claim["status"]["devices"]
        assert status["shareID"] == result["shareID"]
        assert status["data"]["visibleCores"] == env["NEURON_RT_VISIBLE_CORES"]
    first = index * CORES_PER_DEVICE
    assert taken == set(range(first, first + CORES_PER_DEVICE)), "the device's four cores"

    # Full: a fifth core claim for this device is not allocated, one free to go elsewhere is.
    await sim.apply(example_template(1, name="core-on-full", device=index))
    await sim.apply(quick_pod("core-d", node, "core-on-full"))
    await sim.wait_until(lambda: unschedulable(sim, "core-d"), "core-d unschedulable")
    await run_pods(sim, node, ("core-e", "cores-1"))
    assert result_of(sim, "core-e")["device"] != device
    await delete_pods(sim, "core-d", "core-e")

    # A whole-device claim waits while the device has shares ...
    await sim.apply(device_template("whole", index))
    await sim.apply(quick_pod("whole", node, "whole"))
    await sim.wait_until(lambda: unschedulable(sim, "whole"), "whole unschedulable")
    await delete_pods(sim, "core-a", "core-b", "core-c")
    await sim.wait_until(lambda: sim.running(["whole"]), "whole Running once the shares ended")
    device_nodes, env = await inside(sim, "whole")
    assert device_nodes == [f"/dev/neuron{index}"]
    assert core_set(env["NEURON_RT_VISIBLE_CORES"]) == set(range(first, first + 4))
    whole = result_of(sim, "whole")
    assert whole["consumedCapacity"][CAPACITY_LOGICAL_CORES] == str(CORES_PER_DEVICE)
    # ... and a core claim while the device is held whole.
    await sim.apply(quick_pod("core-f", node, "core-on-full"))
    await sim.wait_until(lambda: unschedulable(sim, "core-f"), "core-f unschedulable")
    await delete_pods(sim, "whole")
    await sim.wait_until(lambda: sim.running(["core-f"]), "core-f Running once whole ended")
    device_nodes, env = await inside(sim, "core-f")
    assert device_nodes == [f"/dev/neuron{index}"]
    assert core_set(env["NEURON_RT_VISIBLE_CORES"]) == {first}


async def _whole_devices_on_a_server_without_the_feature(sim: SimCluster, node: str) -> None:
    """The slice's sharing and the template's capacity requests are dropped; each core claim
    gets a whole device; the plugin published once and stopped sending what is dropped."""
    assert sharable(sim, node) is False
    stored = sim.view.get("resource.k8s.io/v1", "ResourceClaimTemplate", "cores-1", NS)
    assert stored is not None
    (request,) = stored["spec"]["spec"]["devices"]["requests"]
    assert "capacity" not in request["exactly"], "the server drops the capacity request"
    await run_pods(sim, node, ("core-a", "cores-1"), ("core-b", "cores-1"))
    devices = set()
    for name in ("core-a", "core-b"):
        result = result_of(sim, name)
        assert "shareID" not in result and "consumedCapacity" not in result
        devices.add(result["device"])
        index = int(result["device"].removeprefix("neurondevice"))
        device_nodes, env = await inside(sim, name)
        assert device_nodes == [f"/dev/neuron{index}"]
        first = index * CORES_PER_DEVICE
        assert core_set(env["NEURON_RT_VISIBLE_CORES"]) == set(range(first, first + 4))
    assert len(devices) == 2, "a whole device each"
    # Created once (generation 0) and never written again: the plugin builds the slice as
    # this server keeps it once it saw the fields dropped, instead of republishing them.
    assert pool_generation(sim, node) == 0


async def test_a_share_at_another_lnc_is_refused_with_what_to_do(shared: Sharing) -> None:
    sim, node = shared.sim, shared.node
    if not at_least(sim, (1, 36)):
        pytest.skip("no shares before 1.36 (the test above shows whole devices)")
    await sim.apply(example_template(1, name="core-lnc-1", lnc=1))
    await sim.apply(quick_pod("lnc-1", node, "core-lnc-1"))
    (event,) = await sim.wait_until(
        lambda: sim.events("lnc-1", "FailedPrepareDynamicResources")[:1],
        "FailedPrepareDynamicResources",
    )
    note = str(event.get("note") or event.get("message") or "")
    assert "logicalNeuronCore 1" in note and "remove the NeuronConfig" in note, note
