"""A claim across two DRA drivers aligned by Kubernetes' standard attribute
``resource.kubernetes.io/pcieRoot`` (examples/specs/neuron-efa-same-pcie-root.yaml, as users
apply it): a Neuron device and an EFA device under one PCIe root complex.

The second driver stands in for DRANET, the EFA DRA driver: the test publishes the ResourceSlice
DRANET would publish for trn2-0 (one device per EFA of the node's emulated PCI tree, with
``dra.net`` attributes and ``pcieRoot``) and DRANET's DeviceClass ``efa.networking.k8s.aws``.
No plugin of it runs on the node, so the pod is never prepared (the kubelet refuses a claim
whose driver has no plugin before it prepares any of it); what is checked is the allocation
the scheduler wrote: kube-scheduler of each pinned minor on the ``real-*`` worlds (on 1.34 the
attribute is as plain as any other), the simulated one on ``fake``, and our allocator's answer
for the same slices must be the same pair.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from neuron_dra.common.constants import ATTR_NUMA_NODE, ATTR_PCI_BUS_ID, ATTR_PCIE_ROOT, DRIVER_NAME
from neuron_dra.common.profiles import PROFILES
from neuron_dra.nodeplugin.discovery.emulated_pci import pci_layout
from neuron_dra.sim.allocation import AllocationResult, allocate
from neuron_dra.sim.paths import repo_root
from neuron_dra.sim.simcluster import SimCluster

pytestmark = pytest.mark.asyncio(loop_scope="package")

NODE = "trn2-0"
EFA_DRIVER = "dra.net"
EFA_CLASS = "efa.networking.k8s.aws"
EXAMPLE = repo_root() / "examples" / "specs" / "neuron-efa-same-pcie-root.yaml"
TEMPLATE = "neuron-efa-same-pcie-root"
IMAGE = "public.ecr.aws/docker/library/alpine:latest"
V1 = "resource.k8s.io/v1"
SLICE = f"{NODE}-{EFA_DRIVER}"


def efa_slice() -> dict[str, Any]:
    """What DRANET publishes for the node's EFA devices, in PCI address order."""
    efas = sorted(pci_layout(PROFILES["trn2.48xlarge"], with_efa=True).efa, key=lambda f: f.bus_id)
    devices = [
        {
            "name": "pci-" + f.bus_id.replace(":", "-").replace(".", "-"),
            "attributes": {
                f"{EFA_DRIVER}/pciAddress": {"string": f.bus_id},
                f"{EFA_DRIVER}/pciVendor": {"string": "Amazon.com, Inc."},
                f"{EFA_DRIVER}/pciDevice": {"string": "Elastic Fabric Adapter (EFA)"},
                f"{EFA_DRIVER}/rdma": {"bool": True},
                f"{EFA_DRIVER}/numaNode": {"int": f.numa_node},
                ATTR_PCIE_ROOT: {"string": f.pcie_root},
            },
        }
        for f in efas
    ]
    return {
        "apiVersion": V1,
        "kind": "ResourceSlice",
        "metadata": {"name": SLICE},
        "spec": {
            "driver": EFA_DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 0, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def efa_class() -> dict[str, Any]:
    expression = (
        f'device.driver == "{EFA_DRIVER}" && '
        f'device.attributes["{EFA_DRIVER}"].pciDevice == "Elastic Fabric Adapter (EFA)"'
    )
    return {
        "apiVersion": V1,
        "kind": "DeviceClass",
        "metadata": {"name": EFA_CLASS},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "resourceClaims": [{"name": "neuron-efa", "resourceClaimTemplateName": TEMPLATE}],
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "command": ["sleep", "infinity"],
                    "resources": {"claims": [{"name": "neuron-efa"}]},
                }
            ],
        },
    }


def attribute(sim: SimCluster, driver: str, device: str, name: str) -> Any:
    for s in sim.view.list(V1, "ResourceSlice"):
        spec = s.get("spec") or {}
        if spec.get("driver") != driver or spec.get("nodeName") != NODE:
            continue
        for d in spec.get("devices") or []:
            if d["name"] == device:
                value = (d.get("attributes") or {}).get(name) or {}
                return next(iter(value.values()), None)
    return None


@pytest_asyncio.fixture(loop_scope="package")
async def efa_driver(sim: SimCluster) -> AsyncIterator[None]:
    """DRANET's DeviceClass and trn2-0's EFA slice, for one test."""
    await sim.apply(efa_class())
    try:
        await sim.apply(efa_slice())
        yield
    finally:
        with contextlib.suppress(Exception):
            for p in sim.pods():
                await sim.delete("v1", "Pod", p["metadata"]["name"])
        await sim.delete(V1, "ResourceSlice", SLICE)
        await sim.delete(V1, "DeviceClass", EFA_CLASS)


async def test_a_neuron_device_and_an_efa_device_share_a_pcie_root(
    sim: SimCluster, efa_driver: None
) -> None:
    # Every Neuron device of the node publishes the three standard attributes.
    for i in range(16):
        device = f"neurondevice{i}"
        assert attribute(sim, DRIVER_NAME, device, ATTR_PCI_BUS_ID)
        assert str(attribute(sim, DRIVER_NAME, device, ATTR_PCIE_ROOT)).startswith("pci0000:")
        assert attribute(sim, DRIVER_NAME, device, ATTR_NUMA_NODE) in (0, 1)
    # Without the constraint the first of each would be taken: a pair under two roots, so
    # the allocation below cannot match by accident.
    first_efa = efa_slice()["spec"]["devices"][0]["name"]
    assert attribute(sim, DRIVER_NAME, "neurondevice0", ATTR_PCIE_ROOT) != attribute(
        sim, EFA_DRIVER, first_efa, ATTR_PCIE_ROOT
    )

    await sim.apply_file(EXAMPLE)
    await sim.apply(pod("aligned"))

    def allocated() -> dict[str, Any] | None:
        p = sim.pod("aligned")
        claims = list(sim.claims_of(p).values()) if p else []
        return claims[0] if claims and (claims[0].get("status") or {}).get("allocation") else None

    claim = await sim.wait_until(allocated, "the claim allocated")
    results = claim["status"]["allocation"]["devices"]["results"]
    got = {r["request"]: (r["driver"], r["pool"], r["device"]) for r in results}
    assert set(got) == {"neuron", "efa"}
    assert got["neuron"][:2] == (DRIVER_NAME, NODE) and got["efa"][:2] == (EFA_DRIVER, NODE)
    neuron_root = attribute(sim, DRIVER_NAME, got["neuron"][2], ATTR_PCIE_ROOT)
    efa_root = attribute(sim, EFA_DRIVER, got["efa"][2], ATTR_PCIE_ROOT)
    assert neuron_root == efa_root, f"{got}: {neuron_root} != {efa_root}"

    # Our allocator (the simulated scheduler, check-claim) picks the very same pair.
    classes = {c["metadata"]["name"]: c for c in sim.view.list(V1, "DeviceClass")}
    ours = allocate(
        claim["spec"],
        classes=classes,
        slices=sim.view.list(V1, "ResourceSlice"),
        allocated=set(),
        node_name=NODE,
    )
    assert isinstance(ours, AllocationResult), ours
    assert {d.request: (d.driver, d.pool, d.device) for d in ours.devices} == got
