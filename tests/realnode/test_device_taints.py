"""Device taints on the real control plane and real nodes (docs/configuration.md, "Device
health and taints"): the plugin taints a device its health signals find failing, the real
scheduler keeps claims off it unless they tolerate the taint, the taint goes when the device
recovers; an admin's DeviceTaintRule (examples/specs/device-taint-rules.yaml) keeps claims
off a device, or evicts a node's pods with NoExecute.

1.37 has all of it on by default. On 1.34 (DRADeviceTaints off by default) the API server
drops the taints: the plugin publishes ``healthy: false`` only, once, and DeviceTaintRule is
not served in resource.k8s.io/v1. The taints are the control plane's business, so the
kubelet-only minors (1.35 and 1.36 nodes on the 1.37 control plane) skip these tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from neuron_dra.common.constants import TAINT_KEY_UNHEALTHY_COMPONENT
from neuron_dra.common.k8s.client import ApiResource, ResourceClient
from neuron_dra.common.k8s.errors import NotFoundError
from neuron_dra.nodeplugin.discovery.emulation import EmulatedPaths, mark_unhealthy
from neuron_dra.sim.paths import repo_root
from neuron_dra.sim.realcluster import enabled_minors
from neuron_dra.sim.simcluster import SimCluster

from .conftest import NS
from .test_kubelet_side import DATA_DIR, node, pod, slice_healthy

pytestmark = pytest.mark.asyncio(loop_scope="package")

DEVICE_TAINT_RULES = ApiResource(
    "resource.k8s.io", "v1", "devicetaintrules", "DeviceTaintRule", namespaced=False
)
RULES_EXAMPLE = repo_root() / "examples" / "specs" / "device-taint-rules.yaml"


@pytest.fixture(autouse=True)
def control_plane_minor(kubelet: str) -> None:
    if kubelet not in enabled_minors():
        pytest.skip("device taints are the control plane's: tested with its own kubelets")


def at_least(sim: SimCluster, minor: tuple[int, int]) -> bool:
    """Whether the control plane is ``minor`` or newer."""
    assert sim.real is not None
    return tuple(int(p) for p in sim.real.minor.split(".")[:2]) >= minor


def taints_served(sim: SimCluster) -> bool:
    return at_least(sim, (1, 36))  # DRADeviceTaints on by default


def slice_device(sim: SimCluster, node_name: str, device: str) -> dict[str, Any]:
    for sl in sim.slices():
        if sl["spec"].get("nodeName") == node_name:
            for d in sl["spec"].get("devices") or []:
                if d["name"] == device:
                    return dict(d)
    return {}


def pool_generation(sim: SimCluster, node_name: str) -> int:
    (sl,) = [s for s in sim.slices() if s["spec"].get("nodeName") == node_name]
    return int(sl["spec"]["pool"]["generation"])


def device_template(
    name: str, device_id: int, *, tolerate: str | None = None, unhealthy: bool = False
) -> dict[str, Any]:
    """A template for one device by its id (and the node's pod selector picks the node), with
    ``unhealthy`` only while its slice says ``healthy: false``."""
    expression = f"device.attributes['neuron.aws.com'].deviceId == {device_id}"
    if unhealthy:
        expression += " && device.attributes['neuron.aws.com'].healthy == false"
    exactly: dict[str, Any] = {
        "deviceClassName": "neuron.aws.com",
        "selectors": [{"cel": {"expression": expression}}],
    }
    if tolerate:
        exactly["tolerations"] = [{"key": tolerate, "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "d", "exactly": exactly}]}}},
    }


def quick_pod(name: str, on: str, template: str) -> dict[str, Any]:
    """:func:`pod`, gone at once when deleted or evicted (``sleep`` ignores SIGTERM)."""
    out: dict[str, Any] = pod(name, on, template_name=template)
    out["spec"]["terminationGracePeriodSeconds"] = 0
    return out


def unschedulable(sim: SimCluster, name: str) -> str | None:
    """The scheduler's message when it has found no place for pod ``name``."""
    p = sim.pod(name) or {}
    for cond in (p.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
            return str(cond.get("message") or "unschedulable")
    return None


async def observed(rules: ResourceClient, created: dict[str, Any], limit: float = 60) -> None:
    """Once the controller-manager's taint controller has written its condition for this
    generation of the DeviceTaintRule ``created`` (it does for every effect), watched from the
    creation on."""
    name, generation = created["metadata"]["name"], created["metadata"]["generation"]

    def seen(rule: dict[str, Any]) -> bool:
        return rule["metadata"]["name"] == name and any(
            c.get("type") == "EvictionInProgress" and c.get("observedGeneration") == generation
            for c in (rule.get("status") or {}).get("conditions") or []
        )

    async def watch() -> None:
        rv = created["metadata"]["resourceVersion"]
        async with await rules.watch(resource_version=rv, timeout_seconds=int(limit)) as stream:
            async for ev in stream:
                if ev.type == "MODIFIED" and seen(ev.object):
                    return
        raise AssertionError(f"the watch of {name} ended without the taint controller's condition")

    try:
        await asyncio.wait_for(watch(), limit)
    except TimeoutError:
        raise TimeoutError(f"{name}: no EvictionInProgress condition after {limit:g}s") from None


def emulated(sim: SimCluster, node_name: str) -> EmulatedPaths:
    root = node(sim, node_name).layout.host_path(f"{DATA_DIR}/emulated/{node_name}")
    return EmulatedPaths(root / "sys", root / "dev", root / "opt")


async def test_a_failing_device_is_tainted_kept_from_claims_and_untainted_on_recovery(
    sim: SimCluster,
) -> None:
    device = "neurondevice5"
    paths = emulated(sim, "kn-1")
    before = pool_generation(sim, "kn-1")
    mark_unhealthy(paths, 5, ["hbm"])
    try:
        await sim.wait_until(
            lambda: slice_healthy(sim, "kn-1", device) is False, "healthy=false in the slice"
        )
        if not taints_served(sim):
            # Dropped by the API server; the plugin noticed on its write and sent no more.
            assert "taints" not in slice_device(sim, "kn-1", device)
        else:
            await _kept_off_unless_tolerated(sim, device)
    finally:
        with contextlib.suppress(OSError):
            mark_unhealthy(paths, 5, [])
    await sim.wait_until(
        lambda: (
            "taints" not in slice_device(sim, "kn-1", device)
            and slice_healthy(sim, "kn-1", device) is True
        ),
        "the taint gone with the failure",
    )
    # One publish for the failure and one for the recovery: no republish loop, whether or not
    # the API server kept the taints.
    assert pool_generation(sim, "kn-1") == before + 2
    if taints_served(sim):
        await sim.wait_until(lambda: sim.running(["wants-5"]), "wants-5 Running once healed")


async def _kept_off_unless_tolerated(sim: SimCluster, device: str) -> None:
    (taint,) = await sim.wait_until(
        lambda: slice_device(sim, "kn-1", device).get("taints"), "the device's taint"
    )
    assert taint["key"] == TAINT_KEY_UNHEALTHY_COMPONENT and taint["value"] == "hbm"
    assert taint["effect"] == "NoSchedule" and taint["timeAdded"]
    await _scheduler_has_the_unhealthy_slice(sim, "kn-1", 5)
    # The real scheduler keeps a claim that does not tolerate it off the device (without the
    # taint it would be Running in a second) ...
    await sim.apply(device_template("dev5", 5))
    await sim.apply(quick_pod("wants-5", "kn-1", "dev5"))
    await sim.wait_until(lambda: unschedulable(sim, "wants-5"), "wants-5 unschedulable")
    # ... and gives it to one that tolerates it, which the plugin prepares.
    await sim.apply(device_template("dev5-tolerant", 5, tolerate=TAINT_KEY_UNHEALTHY_COMPONENT))
    await sim.apply(quick_pod("tolerant", "kn-1", "dev5-tolerant"))
    await sim.wait_until(lambda: sim.running(["tolerant"]), "tolerant Running")
    assert unschedulable(sim, "wants-5")
    await sim.delete("v1", "Pod", "tolerant", NS)


async def _scheduler_has_the_unhealthy_slice(
    sim: SimCluster, node_name: str, device_id: int
) -> None:
    """Wait until kube-scheduler has the slice that marks the device unhealthy, the write that
    carries its taint: our mirror having it says nothing of the scheduler's own informer, and a
    pod the scheduler places before it has the slice gets the device. A claim that tolerates
    the taint and wants the device only while it is ``healthy: false`` can be allocated from
    that slice alone. Its pod and claim are deleted then; a claim created after that reaches
    the scheduler's watch of claims after the deletion (one kind, in order): the device is
    free for it."""
    name = f"sees-{device_id}"
    template = device_template(
        f"dev{device_id}-unhealthy", device_id, tolerate=TAINT_KEY_UNHEALTHY_COMPONENT,
        unhealthy=True,
    )  # fmt: skip
    await sim.apply(template)
    await sim.apply(quick_pod(name, node_name, template["metadata"]["name"]))
    await sim.wait_until(
        lambda: (sim.pod(name) or {}).get("spec", {}).get("nodeName") == node_name,
        f"{name} placed by the scheduler from the slice with healthy=false",
    )

    def its_claims() -> list[dict[str, Any]]:
        return [
            x
            for x in sim.claims(NS)
            if any(o.get("kind") == "Pod" and o.get("name") == name
                   for o in x["metadata"].get("ownerReferences") or [])
        ]  # fmt: skip

    await sim.delete("v1", "Pod", name, NS)
    await sim.wait_until(
        lambda: sim.pod(name) is None and not its_claims(), f"{name} and its claim gone"
    )
    await sim.delete(
        "resource.k8s.io/v1", "ResourceClaimTemplate", template["metadata"]["name"], NS
    )


def example_rules(pool: str) -> dict[str, dict[str, Any]]:
    """The example's DeviceTaintRules by effect, aimed at ``pool`` (the node's name)."""
    docs = [d for d in yaml.safe_load_all(Path(RULES_EXAMPLE).read_text()) if d]
    out = {}
    for doc in docs:
        rule = copy.deepcopy(doc)
        rule["spec"]["deviceSelector"]["pool"] = pool
        out[rule["spec"]["taint"]["effect"]] = rule
    return out


async def test_admin_rules_keep_claims_off_a_device_and_evict_a_nodes_pods(
    sim: SimCluster,
) -> None:
    assert sim.kube is not None
    rules = sim.kube.resource(DEVICE_TAINT_RULES)
    if not at_least(sim, (1, 37)):
        # Not in resource.k8s.io/v1 before 1.37: a user applying the example is told so.
        with pytest.raises(NotFoundError):
            await rules.list()
        return
    by_effect = example_rules("kn-0")
    quarantine, drain = by_effect["NoSchedule"], by_effect["NoExecute"]
    assert quarantine["spec"]["deviceSelector"]["device"] == "neurondevice3"
    assert "device" not in drain["spec"]["deviceSelector"]
    created = await rules.create(quarantine)
    try:
        # The rule reaches the scheduler through its own watch, as it does the
        # controller-manager's, which says so in the rule's status. A pod applied in the same
        # millisecond as the rule may be placed before the scheduler has it (the likely cause
        # of one CI run where wants-3 never became unschedulable). So: the rule's status
        # first, then a pod started on another device (seconds for a container), and only
        # then the pod that wants device 3.
        await observed(rules, created)
        await sim.apply(device_template("dev1", 1))
        await sim.apply(quick_pod("running", "kn-0", "dev1"))
        await sim.wait_until(lambda: sim.running(["running"]), "running Running")
        # NoSchedule on device 3: a claim for it waits, the running pod stays.
        await sim.apply(device_template("dev3", 3))
        await sim.apply(quick_pod("wants-3", "kn-0", "dev3"))
        await sim.wait_until(lambda: unschedulable(sim, "wants-3"), "wants-3 unschedulable")
        assert sim.running(["running"])
        await rules.delete(quarantine["metadata"]["name"])
        await sim.wait_until(lambda: sim.running(["wants-3"]), "wants-3 Running, rule deleted")
        # NoExecute on the whole node: the controller-manager evicts both pods.
        await rules.create(drain)
        await sim.wait_until(
            lambda: sim.pod("running") is None and sim.pod("wants-3") is None,
            "kn-0's pods evicted",
        )
    finally:
        for rule in (quarantine, drain):
            with contextlib.suppress(NotFoundError):
                await rules.delete(rule["metadata"]["name"])
