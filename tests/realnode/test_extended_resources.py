"""Pods written for the Neuron device plugin run unchanged (KEP-5004, beta and on by default
from 1.36, GA in 1.37): ``resources.limits: aws.amazon.com/neuron: 4`` is allocated by the real
scheduler from our ResourceSlices through the DeviceClass ``extended-resource.neuron.aws.com``
(examples/specs/device-plugin-pod.yaml; docs/configuration.md, "Pods written for the device
plugin"), and the container gets the devices and the runtime environment the device plugin
gave. A count the scheduler fills with devices that are not one connected set is refused at
Prepare with the claim-based way to ask for one, never prepared silently.

On 1.34 (DRAExtendedResource off) no node offers the resource: the pod waits, unschedulable,
and nothing else changes. The kubelet-only minors skip: this is the control plane's feature
plus the kubelet of the same minor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from neuron_dra.sim.paths import repo_root
from neuron_dra.sim.realcluster import enabled_minors
from neuron_dra.sim.simcluster import SimCluster

from .test_device_taints import at_least, device_template, quick_pod, unschedulable
from .test_kubelet_side import nodes

pytestmark = pytest.mark.asyncio(loop_scope="package")

EXAMPLE = repo_root() / "examples" / "specs" / "device-plugin-pod.yaml"


@pytest.fixture(autouse=True)
def control_plane_minor(kubelet: str) -> None:
    if kubelet not in enabled_minors():
        pytest.skip("extended resources are the control plane's: tested with its own kubelets")


def example_pod(name: str, on: str) -> dict[str, Any]:
    """The example's pod as written for the device plugin, pinned to node ``on``."""
    (pod,) = [d for d in yaml.safe_load_all(Path(EXAMPLE).read_text()) if d]
    pod = dict(pod)
    pod["metadata"] = {"name": name}
    spec = dict(pod["spec"])
    spec["nodeSelector"] = {"kubernetes.io/hostname": on}
    spec["terminationGracePeriodSeconds"] = 0
    pod["spec"] = spec
    return pod


def extended_claim(sim: SimCluster, pod_name: str) -> dict[str, Any] | None:
    """The claim the scheduler made for the pod's extended resources, once allocated."""
    pod = sim.pod(pod_name) or {}
    status = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    name = status.get("resourceClaimName")
    for claim in sim.claims():
        if name and claim["metadata"]["name"] == name and claim.get("status", {}).get("allocation"):
            return dict(claim)
    return None


async def test_a_device_plugin_pod_spec_gets_four_connected_devices(sim: SimCluster) -> None:
    pod = example_pod("plugin-style", "kn-0")
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"] == {"aws.amazon.com/neuron": 4}
    await sim.apply(pod)
    if not at_least(sim, (1, 36)):
        why = await sim.wait_until(
            lambda: unschedulable(sim, "plugin-style"), "plugin-style unschedulable"
        )
        assert "aws.amazon.com/neuron" in why, why
        return
    (running,) = await sim.wait_until(lambda: sim.running(["plugin-style"]), "Running")
    claim = extended_claim(sim, "plugin-style")
    assert claim is not None
    results = claim["status"]["allocation"]["devices"]["results"]
    assert {(r["driver"], r["pool"]) for r in results} == {("neuron.aws.com", "kn-0")}
    assert sorted(r["device"] for r in results) == [f"neurondevice{i}" for i in range(4)]
    seen = await nodes(sim).look_inside(running, container["name"])
    assert seen.device_nodes == [f"/dev/neuron{i}" for i in range(4)]
    # trn2.48xlarge: 4 logical cores per device at the default LNC 2.
    assert seen.env["NEURON_RT_VISIBLE_CORES"] == "0-15"


async def test_an_unconnected_count_is_refused_with_the_claim_based_way(sim: SimCluster) -> None:
    if not at_least(sim, (1, 36)):
        pytest.skip("no extended resources before 1.36 (the test above shows the pod waits)")
    # Device 1 in use: the scheduler's first four free devices are 0, 2, 3, 4.
    await sim.apply(device_template("dev1", 1))
    await sim.apply(quick_pod("holds-1", "kn-1", "dev1"))
    await sim.wait_until(lambda: sim.running(["holds-1"]), "holds-1 Running")
    await sim.apply(example_pod("gappy", "kn-1"))
    (event,) = await sim.wait_until(
        lambda: sim.events("gappy", "FailedPrepareDynamicResources")[:1],
        "FailedPrepareDynamicResources",
    )
    note = str(event.get("note") or event.get("message") or "")
    assert "is not one connected group" in note, note
    assert "resources.limits aws.amazon.com/neuron" in note, note
    assert "matchAttribute" in note, note
