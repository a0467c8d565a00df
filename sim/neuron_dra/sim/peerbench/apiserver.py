"""The benchmark's objects on the API server: the nodes, their slices (and when one is
published), the peer's DeviceClass, each driver's claims and pods, and waiting for the
scheduler to allocate them."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from neuron_dra.common.k8s.client import (
    DEVICE_CLASSES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    KubeClient,
)
from neuron_dra.common.k8s.errors import AlreadyExistsError, NotFoundError
from neuron_dra.nodeplugin.kubeletapi import ClaimRef
from neuron_dra.sim.controlplane import ensure_device_classes
from neuron_dra.sim.simcluster.realworld import (
    SERVICE_ACCOUNTS,
    NodeLease,
    ensure_namespace,
    register_node,
)
from neuron_dra.sim.simcluster.topology import SimNode

from .driver import DEVICES, NAMESPACE, OUR_INSTANCE_TYPE, PAUSE_IMAGE, PEER_DRIVER, Driver


async def wait_for(
    predicate: Callable[[], Awaitable[bool]], what: str, limit: float, step: float = 0.05
) -> None:
    deadline = time.monotonic() + limit
    while not await predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {limit:.0f} s")
        await asyncio.sleep(step)


async def node_slices(kube: KubeClient, node: str) -> list[dict[str, Any]]:
    got = await kube.resource(RESOURCE_SLICES).list(field_selector=f"spec.nodeName={node}")
    items: list[dict[str, Any]] = got.get("items") or []
    return items


async def published_at(kube: KubeClient, node: str, ready: asyncio.Event) -> float:
    """perf_counter when a ResourceSlice of ``node`` shows up on a watch (set ``ready`` once
    the watch is open, so the caller starts the process after that)."""
    listed = await kube.resource(RESOURCE_SLICES).list(field_selector=f"spec.nodeName={node}")
    if listed.get("items"):
        raise RuntimeError(f"slices of {node} exist before the plugin started")
    rv = listed["metadata"]["resourceVersion"]
    async with await kube.resource(RESOURCE_SLICES).watch(
        resource_version=rv, field_selector=f"spec.nodeName={node}", timeout_seconds=120
    ) as stream:
        ready.set()
        async for event in stream:
            if event.type == "ADDED":
                return time.perf_counter()
    raise RuntimeError(f"the watch ended before a slice of {node} appeared")


async def delete_slices(kube: KubeClient, node: str) -> None:
    for item in await node_slices(kube, node):
        with contextlib.suppress(NotFoundError):
            await kube.resource(RESOURCE_SLICES).delete(item["metadata"]["name"])

    async def gone() -> bool:
        return not await node_slices(kube, node)

    await wait_for(gone, f"slices of {node} deleted", 30)


def device_class(driver: str) -> dict[str, Any]:
    """A DeviceClass named as ``driver`` that selects its devices (the peer's, the floor's)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": driver},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{driver}'"}}]},
    }


async def create_claims_and_pods(kube: KubeClient, d: Driver) -> None:
    """``DEVICES`` one-device claims, each used by a pod pinned to the driver's node: the real
    scheduler allocates the claims and reserves them for the pods (no kubelet runs them)."""
    for i in range(DEVICES):
        name = f"{d.label}-{i}"
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "dev", "exactly": {"deviceClassName": d.device_class, "count": 1}}
                    ]
                }
            },
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": d.node},
                "containers": [
                    {"name": "c", "image": PAUSE_IMAGE, "resources": {"claims": [{"name": "dev"}]}}
                ],
                "resourceClaims": [{"name": "dev", "resourceClaimName": name}],
            },
        }
        await kube.resource(RESOURCE_CLAIMS).create(claim, NAMESPACE)
        await kube.resource(PODS).create(pod, NAMESPACE)


async def allocated_claims(kube: KubeClient, d: Driver) -> list[ClaimRef] | None:
    """The driver's claims once every one is allocated and reserved, else None."""
    items = (await kube.resource(RESOURCE_CLAIMS).list(NAMESPACE)).get("items") or []
    mine = [c for c in items if str(c["metadata"]["name"]).startswith(f"{d.label}-")]
    if len(mine) < DEVICES:
        return None
    for c in mine:
        status = c.get("status") or {}
        if not status.get("allocation") or not status.get("reservedFor"):
            return None
    mine.sort(key=lambda c: int(str(c["metadata"]["name"]).rsplit("-", 1)[1]))
    return [
        ClaimRef(namespace=NAMESPACE, uid=c["metadata"]["uid"], name=c["metadata"]["name"])
        for c in mine
    ]


async def setup(kube: KubeClient, drivers: Sequence[Driver], leases: list[NodeLease]) -> None:
    """The namespace and both DeviceClasses, and a Node (kept Ready by a Lease) per driver:
    the harness plays the kubelets."""
    for index, d in enumerate(drivers):
        await register_node(kube, SimNode(d.node, OUR_INSTANCE_TYPE), index)
        lease = NodeLease(kube, d.node)
        lease.start()
        leases.append(lease)
    await setup_classes(kube)


async def setup_classes(kube: KubeClient, others: Sequence[str] = (PEER_DRIVER,)) -> None:
    """The namespace (with its default ServiceAccount, which pods need), our DeviceClasses
    and one for each driver of ``others``."""
    await ensure_namespace(kube, NAMESPACE)
    await ensure_device_classes(kube)
    for driver in others:
        with contextlib.suppress(AlreadyExistsError):
            await kube.resource(DEVICE_CLASSES).create(device_class(driver))

    async def default_sa() -> bool:
        try:
            await kube.resource(SERVICE_ACCOUNTS).get("default", NAMESPACE)
        except NotFoundError:
            return False
        return True

    await wait_for(default_sa, "the default ServiceAccount", 60)
