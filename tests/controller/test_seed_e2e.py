"""Seed 000 end to end: the controller process and the node side of 16 emulated nodes.

Four trn2u.48xlarge UltraServers (4 nodes each) publish their slices through the real
``SlicePublisher`` and follow their reservations through the real ``ReservationWatcher``
(what each kubelet plugin runs); the real ``ControllerManager`` discovers the UltraServers
and allocates the seed's workload. Everything talks to the fake API server over HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest_asyncio
from kubernetes_asyncio import client as k8s
from neuron_dra.common.constants import DRIVER_NAMESPACE
from neuron_dra.common.k8s.client import KubeClient
from neuron_dra.common.ultraserver import node_reservations
from neuron_dra.controller.manager import ControllerManager, ManagerConfig
from neuron_dra.nodeplugin.discovery.emulation import scan_emulated, write_emulated_tree
from neuron_dra.nodeplugin.discovery.model import NodeInventory
from neuron_dra.nodeplugin.publish.metrics import PublisherMetrics
from neuron_dra.nodeplugin.publish.publisher import SlicePublisher
from neuron_dra.nodeplugin.reservations import ReservationWatcher
from neuron_dra.sim.fakeapi.server import FakeAPIServer
from prometheus_client import CollectorRegistry

STEP = 30.0
US = ["us-a", "us-b", "us-c", "us-d"]
WORKLOADS = "/apis/neuron.aws.com/v1beta1/namespaces/default/neuronultraserverworkloads"


def ready_node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"node.kubernetes.io/instance-type": "trn2u.48xlarge"},
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


@dataclass
class EmulatedNode:
    """The parts of a kubelet plugin that the controller interacts with."""

    name: str
    inventory: NodeInventory
    publisher: SlicePublisher
    reservations: ReservationWatcher


@dataclass
class Cluster:
    api: FakeAPIServer
    kube: KubeClient
    nodes: list[EmulatedNode] = field(default_factory=list)

    def workload_ids_on_slices(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for s in self.api.list("resource.k8s.io/v1", "ResourceSlice"):
            for dev in s["spec"]["devices"]:
                wid = dev.get("attributes", {}).get("workloadId", {}).get("string")
                if wid:
                    out[s["spec"]["nodeName"]] = wid
        return out

    async def eventually(self, what: str, predicate: Callable[[], bool]) -> None:
        # The fake server offers no hook for "controller converged"; poll its in-process
        # state at a short interval, bounded.
        async with asyncio.timeout(STEP):
            while not predicate():  # noqa: ASYNC110 - state spans many objects; no event
                await asyncio.sleep(0.05)
        assert predicate(), what


@pytest_asyncio.fixture
async def cluster(
    fake_apiserver: FakeAPIServer, kube_api_client: k8s.ApiClient, tmp_path: Path
) -> AsyncIterator[Cluster]:
    kube = KubeClient(kube_api_client)
    c = Cluster(fake_apiserver, kube)
    root = tmp_path  # pytest's: removed with the run's other temporary directories
    for us in US:
        for node_id in range(4):
            name = f"{us}-n{node_id}"
            fake_apiserver.create(ready_node(name))
            paths = write_emulated_tree(
                root / name,
                "trn2u.48xlarge",
                node_name=name,
                ultraserver_id=us,
                ultraserver_node_id=node_id,
            )
            inv = scan_emulated(paths, node_name=name)
            holder: list[SlicePublisher] = []
            watcher = ReservationWatcher(
                kube,
                node_name=name,
                on_change=lambda h=holder: h[0].request_sync(),
                registry=CollectorRegistry(),
            )
            pub = SlicePublisher(
                kube,
                node_name=name,
                dra_driver_version="0.1.0",
                inventory=lambda inv=inv: inv,
                workload_ids=watcher.workload_ids,
                metrics=PublisherMetrics(CollectorRegistry()),
            )
            holder.append(pub)
            c.nodes.append(EmulatedNode(name, inv, pub, watcher))
    for n in c.nodes:
        n.reservations.start()
        n.publisher.start()
    try:
        yield c
    finally:
        for n in c.nodes:
            await n.publisher.stop()
            await n.reservations.stop()


@contextlib.asynccontextmanager
async def controller(kube: KubeClient) -> AsyncIterator[ControllerManager]:
    manager = ControllerManager(
        kube, ManagerConfig(namespace=DRIVER_NAMESPACE, http_host="127.0.0.1", http_port=0)
    )
    await manager.start()
    try:
        yield manager
    finally:
        await manager.stop()


SEED = {
    "apiVersion": "neuron.aws.com/v1beta1",
    "kind": "NeuronUltraServerWorkload",
    "metadata": {"name": "my-training-job", "namespace": "default"},
    "spec": {
        "instanceType": "trn2u.48xlarge",
        "topologySize": 4,
        "serverCount": 2,
        "allocationPolicy": {"failureStrategy": "NoOp"},
        "resourceClaimTemplate": {"name": "my-training-job-rct"},
    },
}


async def test_seed_workload_allocates_two_ultraservers_and_releases_them(cluster: Cluster) -> None:
    api = cluster.api
    async with controller(cluster.kube) as manager:
        await cluster.eventually(
            "4 NeuronUltraServers discovered",
            lambda: (
                len(api.list("neuron.aws.com/v1beta1", "NeuronUltraServer", DRIVER_NAMESPACE)) == 4
            ),
        )
        # Indexed for the allocator in the background, before any workload asks.
        await cluster.eventually(
            "fleet indexed", lambda: manager.workloads.indexed_ultraservers() == 4
        )
        api.create(SEED)

        def workload() -> dict[str, Any]:
            obj = api.get(
                "neuron.aws.com/v1beta1", "NeuronUltraServerWorkload", "my-training-job", "default"
            )
            assert obj is not None
            return obj

        await cluster.eventually(
            "workload Allocated", lambda: workload().get("status", {}).get("state") == "Allocated"
        )
        status = workload()["status"]
        assert status["totalNodesAllocated"] == 8
        assert len(status["allocatedUltraServers"]) == 2
        wid = status["workloadId"]
        assert wid.startswith("my-training-job")

        rct = api.get(
            "resource.k8s.io/v1", "ResourceClaimTemplate", "my-training-job-rct", "default"
        )
        assert rct is not None
        assert rct["metadata"]["ownerReferences"][0]["name"] == "my-training-job"

        nus = api.list("neuron.aws.com/v1beta1", "NeuronUltraServer", DRIVER_NAMESPACE)
        allocated_nodes = {
            r.node_name for n in (x.name for x in cluster.nodes) for r in node_reservations(nus, n)
        }
        assert len(allocated_nodes) == 8
        ranks = sorted(r.rank for n in allocated_nodes for r in node_reservations(nus, n))
        assert ranks == list(range(8))
        # Each of exactly those 8 nodes publishes the workload id on its devices.
        await cluster.eventually(
            "tags on the 8 nodes",
            lambda: cluster.workload_ids_on_slices() == {n: wid for n in allocated_nodes},
        )

        api.delete(
            "neuron.aws.com/v1beta1", "NeuronUltraServerWorkload", "my-training-job", "default"
        )
        await cluster.eventually(
            "workload gone",
            lambda: (
                api.get(
                    "neuron.aws.com/v1beta1",
                    "NeuronUltraServerWorkload",
                    "my-training-job",
                    "default",
                )
                is None
            ),
        )
        assert (
            api.get("resource.k8s.io/v1", "ResourceClaimTemplate", "my-training-job-rct", "default")
            is None
        )
        assert cluster.workload_ids_on_slices() == {}
