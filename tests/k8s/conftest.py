"""Fixtures for the k8s plumbing tests: our raw-dict client on the fake API server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
from kubernetes_asyncio import client
from neuron_dra.common.k8s.client import KubeClient


@pytest_asyncio.fixture
async def kube(kube_api_client: client.ApiClient) -> AsyncIterator[KubeClient]:
    # The ApiClient belongs to the kube_api_client fixture, which closes it.
    yield KubeClient(kube_api_client)


def configmap(name: str, ns: str = "default", **data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns},
        "data": dict(data),
    }


def resource_slice(node: str, devices: int = 2, name: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-neuron.aws.com"},
        "spec": {
            "driver": "neuron.aws.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"neurondevice{i}",
                    "attributes": {
                        "deviceId": {"int": i},
                        "instanceType": {"string": "trn2.48xlarge"},
                        "resourceType": {"string": "neuron_device"},
                        "neuronDriverVersion": {"string": "2.24.7.0"},
                        "topology_x": {"int": i // 4},
                        "topology_y": {"int": i % 4},
                    },
                    "capacity": {"memory": {"value": "96Gi"}, "cores": {"value": "8"}},
                }
                for i in range(devices)
            ],
        },
    }
