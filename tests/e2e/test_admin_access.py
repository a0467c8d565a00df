"""Admin access (KEP-5018, beta and on by default from 1.34, GA in 1.36): a monitoring pod
(neuron-monitor) in a namespace labelled for it claims every Neuron device of a node with
``adminAccess: true``, while another pod uses one of them. It is prepared with the devices'
nodes and none of the runtime's environment, and the devices stay usable by other claims
(examples/specs/admin-access-monitor.yaml; docs/configuration.md, "Monitoring")."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from neuron_dra.common.k8s.errors import AlreadyExistsError
from neuron_dra.nodeplugin.prepare import metadata
from neuron_dra.sim.commands.walkthrough import Walkthrough
from neuron_dra.sim.paths import repo_root
from neuron_dra.sim.simcluster import SimCluster
from neuron_dra.sim.simcluster.realworld import SERVICE_ACCOUNTS

pytestmark = pytest.mark.asyncio(loop_scope="package")

NODE = "trn2-0"
IMAGE = "public.ecr.aws/ubuntu/ubuntu:22.04"
EXAMPLE = repo_root() / "examples" / "specs" / "admin-access-monitor.yaml"


def one_device(name: str, device_id: int) -> dict[str, Any]:
    cel = (
        "device.attributes['neuron.aws.com'].instanceType == 'trn2.48xlarge' && "
        f"device.attributes['neuron.aws.com'].deviceId == {device_id}"
    )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "d",
                            "exactly": {
                                "deviceClassName": "neuron.aws.com",
                                "selectors": [{"cel": {"expression": cel}}],
                            },
                        }
                    ]
                }
            }
        },
    }


def pod(name: str, template: str, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceClaims": [{"name": "neuron", "resourceClaimTemplateName": template}],
        "containers": [
            {
                "name": "main",
                "image": IMAGE,
                "command": ["sleep", "infinity"],
                "resources": {"claims": [{"name": "neuron"}]},
            }
        ],
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def example() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The example's Namespace, ResourceClaimTemplate and DaemonSet."""
    docs = [d for d in yaml.safe_load_all(Path(EXAMPLE).read_text()) if d]
    by_kind = {d["kind"]: d for d in docs}
    return by_kind["Namespace"], by_kind["ResourceClaimTemplate"], by_kind["DaemonSet"]


async def test_a_monitor_watches_devices_in_use_without_their_env(walk: Walkthrough) -> None:
    sim = walk.sim
    namespace, watch, daemonset = example()
    ns = namespace["metadata"]["name"]
    assert namespace["metadata"]["labels"] == {"resource.kubernetes.io/admin-access": "true"}
    # The example's DaemonSet runs the same pod spec on every Neuron node; here one node's.
    monitor = pod("monitor", watch["metadata"]["name"], NODE)
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == monitor["spec"]["containers"][0]["resources"]

    await sim.apply(one_device("dev3", 3))
    await sim.apply(pod("user", "dev3", NODE))
    (user,) = await walk.running(["user"])
    user_env = (await walk.view(user)).env
    with contextlib.suppress(AlreadyExistsError):
        await sim.apply(namespace)
    if sim.is_real:
        await _default_service_account(sim, ns)
    try:
        await sim.apply(watch, ns)
        await sim.apply(monitor, ns)
        (mon,) = await sim.wait_until(lambda: sim.running(["monitor"], ns), "monitor Running")
        seen = await walk.view(mon)
        assert seen.device_nodes == [f"/dev/neuron{i}" for i in range(16)]
        assert not {k for k in seen.env if k.startswith("NEURON_")}, seen.env
        # Its device metadata file lists the devices with their slice attributes and none of
        # the settings (cores, LNC, ranks) of the claims that use them.
        (text,) = seen.files.values()
        devices = metadata.decode(text)[0]["requests"][0]["devices"]
        assert [d["name"] for d in devices] == [f"neurondevice{i}" for i in range(16)]
        assert devices[3]["attributes"]["neuron.aws.com/deviceId"] == {"int": 3}
        assert not any("neuron.aws.com/visibleCores" in d["attributes"] for d in devices)
        results = [r for c in sim.claims_of(mon).values() for r in _results(c)]
        assert len(results) == 16 and all(r.get("adminAccess") for r in results)
        # The user's pod keeps its device and its cores ...
        assert (await walk.view(user)).env == user_env
        # ... and a device the monitor watches is still free for a new claim.
        await sim.apply(one_device("dev4", 4))
        await sim.apply(pod("second-user", "dev4", NODE))
        (second,) = await walk.running(["second-user"])
        assert (await walk.view(second)).device_nodes == ["/dev/neuron4"]
    finally:
        await _remove(sim, ns, watch["metadata"]["name"])


def _results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return list(claim["status"]["allocation"]["devices"]["results"])


async def _default_service_account(sim: SimCluster, ns: str) -> None:
    """The ``default`` ServiceAccount of a new namespace (the controller-manager makes it a
    moment after the namespace; a pod is refused until then), awaited with a watch."""
    assert sim.kube is not None
    api = sim.kube.resource(SERVICE_ACCOUNTS)
    async with asyncio.timeout(60):
        stream = await api.watch(ns, field_selector="metadata.name=default")
        async with stream:
            async for event in stream:
                if event.type == "ADDED":
                    return


async def _remove(sim: SimCluster, ns: str, template: str) -> None:
    """The monitor gone and its claim unprepared (reset() cleans the default namespace)."""
    await sim.delete("v1", "Pod", "monitor", ns)
    await sim.delete("resource.k8s.io/v1", "ResourceClaimTemplate", template, ns)
    await sim.wait_until(
        lambda: not sim.pods(ns) and not sim.claims(ns), f"the monitor's pod and claim gone ({ns})"
    )
