"""What the simulated cluster adds on a real control plane, where the real scheduler,
resourceclaim controller and Deployment/ReplicaSet controllers do their jobs: the nodes'
kubelet duties that are not DRA (registering the Node, keeping it Ready, renewing its Lease)
and a handle on a real Deployment shaped like the simulated workload controllers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from neuron_dra.common.k8s.client import (
    LEASES,
    NAMESPACES,
    NODES,
    ApiResource,
    KubeClient,
)
from neuron_dra.common.k8s.errors import AlreadyExistsError, ConflictError, NotFoundError
from neuron_dra.sim.controlplane.base import is_active

from .topology import SimNode, node_object, ready_condition

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]
DEPLOYMENTS = ApiResource("apps", "v1", "deployments", "Deployment", namespaced=True)
SERVICE_ACCOUNTS = ApiResource("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)
NODE_LEASE_NAMESPACE = "kube-node-lease"
#: The kubelet renews its Lease every 10 s (a quarter of the 40 s lease duration); the
#: node-lifecycle controller marks a node unreachable after --node-monitor-grace-period.
LEASE_DURATION_S = 40
LEASE_RENEW_S = 10.0
#: What a simulated node offers besides its devices (a trn2.48xlarge has 192 vCPUs and 2 TiB).
NODE_CAPACITY: Mapping[str, str] = {"cpu": "192", "memory": "2Ti", "pods": "110"}


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def real_node_object(node: SimNode, index: int) -> JsonDict:
    """The Node a kubelet registers, with the capacity the real scheduler checks."""
    obj = node_object(node, index)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = obj["status"]
    status["capacity"] = dict(NODE_CAPACITY)
    status["allocatable"] = dict(NODE_CAPACITY)
    status["conditions"] = [
        {**c, "lastHeartbeatTime": now, "lastTransitionTime": now} for c in status["conditions"]
    ]
    return obj


async def register_node(kube: KubeClient, node: SimNode, index: int) -> None:
    """Create the Node (or take it over after a restart) and post its status: Ready."""
    body = real_node_object(node, index)
    api = kube.resource(NODES)
    try:
        created = await api.create(body)
    except AlreadyExistsError:
        created = await api.get(node.name)
    await api.merge_patch(node.name, {"status": body["status"]}, subresource="status")
    log.debug("node %s registered (uid %s)", node.name, created["metadata"].get("uid"))


def node_is_ready(node: JsonDict) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )


async def set_node_ready(kube: KubeClient, name: str, ready: bool) -> None:
    """Post the Ready condition as the node's kubelet would (status subresource)."""
    api = kube.resource(NODES)
    node = await api.get(name)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = [
        c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") != "Ready"
    ]
    conditions.append(
        {**ready_condition(ready), "lastHeartbeatTime": now, "lastTransitionTime": now}
    )
    await api.merge_patch(name, {"status": {"conditions": conditions}}, subresource="status")


class NodeLease:
    """Renews ``kube-node-lease/<node>`` every :data:`LEASE_RENEW_S`, as the kubelet does, so
    the node-lifecycle controller keeps the node Ready. Stopping it is a node going silent."""

    def __init__(self, kube: KubeClient, node: str, node_uid: str | None = None) -> None:
        self.kube = kube
        self.node = node
        self.node_uid = node_uid
        self._task: asyncio.Task[None] | None = None

    async def renew(self) -> None:
        api = self.kube.resource(LEASES)
        spec = {
            "holderIdentity": self.node,
            "leaseDurationSeconds": LEASE_DURATION_S,
            "renewTime": _micro_now(),
        }
        try:
            lease = await api.get(self.node, NODE_LEASE_NAMESPACE)
        except NotFoundError:
            body: JsonDict = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.node, "namespace": NODE_LEASE_NAMESPACE},
                "spec": spec,
            }
            if self.node_uid:
                body["metadata"]["ownerReferences"] = [
                    {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": self.node_uid}
                ]
            with contextlib.suppress(AlreadyExistsError):
                await api.create(body, NODE_LEASE_NAMESPACE)
            return
        lease["spec"] = {**(lease.get("spec") or {}), **spec}
        with contextlib.suppress(ConflictError):
            await api.replace(lease)

    async def _run(self) -> None:
        while True:
            try:
                await self.renew()
            except Exception as exc:  # the API server may be restarting: try again
                log.info("lease of %s not renewed: %s", self.node, exc)
            await asyncio.sleep(LEASE_RENEW_S)  # the kubelet's renew interval, not a wait

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"lease-{self.node}"
            )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


async def ensure_namespace(kube: KubeClient, name: str) -> None:
    with contextlib.suppress(AlreadyExistsError):
        await kube.resource(NAMESPACES).create(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        )


class Deployment:
    """A real ``apps/v1`` Deployment, run by the real controller-manager, with the calls the
    simulated :class:`~neuron_dra.sim.controlplane.podsets.ReplicaSet` offers."""

    def __init__(
        self,
        kube: KubeClient,
        manifest: Mapping[str, Any],
        namespace: str,
        pods: Callable[[str, str], list[JsonDict]],
    ) -> None:
        self.kube = kube
        self.manifest = dict(manifest)
        meta = self.manifest.get("metadata") or {}
        self.namespace = str(meta.get("namespace") or namespace)
        self.set_name = str(meta.get("name"))
        spec = self.manifest.get("spec") or {}
        self.replicas = int(spec.get("replicas", 1))
        selector = (spec.get("selector") or {}).get("matchLabels") or {}
        self.label_selector = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        self._pods = pods

    @property
    def name(self) -> str:
        return f"deployment-{self.namespace}-{self.set_name}"

    @property
    def expected(self) -> int:
        return self.replicas

    async def start(self) -> None:
        await self.kube.resource(DEPLOYMENTS).create(self.manifest, self.namespace)

    async def scale(self, replicas: int) -> None:
        self.replicas = replicas
        await self.kube.resource(DEPLOYMENTS).merge_patch(
            self.set_name, {"spec": {"replicas": replicas}}, self.namespace
        )

    def current_pods(self) -> list[JsonDict]:
        pods = [p for p in self._pods(self.namespace, self.label_selector) if is_active(p)]
        return sorted(pods, key=lambda p: str(p["metadata"].get("name")))

    def pod_names(self) -> list[str]:
        return [str(p["metadata"]["name"]) for p in self.current_pods()]

    async def stop(self, *, delete_pods: bool = True) -> None:
        """Delete the Deployment; the garbage collector removes its ReplicaSet and pods
        (``delete_pods=False`` orphans them, as ``kubectl delete --cascade=orphan``)."""
        propagation = "Background" if delete_pods else "Orphan"
        with contextlib.suppress(NotFoundError):
            await self.kube.resource(DEPLOYMENTS).delete(
                self.set_name, self.namespace, propagation_policy=propagation
            )
