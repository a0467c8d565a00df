"""What the simulated cluster reads of itself: objects by kind from its view of the API (the
fake's store or the real server's mirror), what each container got, and the conditions the
walkthrough and tests wait for (in-process, no API call)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from neuron_dra.common.constants import DRIVER_NAMESPACE
from neuron_dra.sim.controlplane import CDI_DEVICES_ANNOTATION
from neuron_dra.sim.controlplane.base import is_active
from neuron_dra.sim.controlplane.podsets import PodSet

from .containers import ContainerDevices, load_specs, resolve
from .mirror import ClusterReader
from .realnodes import RealNodes
from .realworld import node_is_ready
from .topology import SimNode

JsonDict = dict[str, Any]
RESOURCE_V1 = "resource.k8s.io/v1"
NEURON_V1BETA1 = "neuron.aws.com/v1beta1"


class ClusterReads:
    """Reads of :class:`.cluster.SimCluster`, which provides what is declared here."""

    nodes: list[SimNode]
    real_nodes: RealNodes | None

    @property
    def view(self) -> ClusterReader:
        raise NotImplementedError

    def cdi_root(self, node: str) -> Path:
        raise NotImplementedError

    def slices(self) -> list[JsonDict]:
        """The ResourceSlices of this cluster's nodes (a shared real API server may hold
        other tests' slices too)."""
        mine = {n.name for n in self.nodes}
        return [
            s
            for s in self.view.list(RESOURCE_V1, "ResourceSlice")
            if (s.get("spec") or {}).get("nodeName") in mine
        ]

    def node_address(self, name: str) -> str:
        """The address the kubelet plugin hands out for node ``name`` (rank 0's
        ``NEURON_GLOBAL_TOPOID0_HOST``), by the product's own preference among the addresses
        the Node reports: a simulated node reports an InternalDNS name as on EKS, a real
        kubelet without a cloud provider its Hostname."""
        from neuron_dra.nodeplugin.reservations import node_address

        node = self.view.get("v1", "Node", name)
        return (node_address(node) if node is not None else None) or name

    def ultraservers(self) -> list[JsonDict]:
        return self.view.list(NEURON_V1BETA1, "NeuronUltraServer", DRIVER_NAMESPACE)

    def workload(self, name: str, namespace: str = "default") -> JsonDict | None:
        return self.view.get(NEURON_V1BETA1, "NeuronUltraServerWorkload", name, namespace)

    def pod(self, name: str, namespace: str = "default") -> JsonDict | None:
        return self.view.get("v1", "Pod", name, namespace)

    def pods(self, namespace: str = "default", selector: str | None = None) -> list[JsonDict]:
        return self.view.list("v1", "Pod", namespace, label_selector=selector)

    def claim(self, name: str, namespace: str = "default") -> JsonDict | None:
        return self.view.get(RESOURCE_V1, "ResourceClaim", name, namespace)

    def claims(self, namespace: str = "default") -> list[JsonDict]:
        return self.view.list(RESOURCE_V1, "ResourceClaim", namespace)

    def claims_of(self, pod: Mapping[str, Any]) -> dict[str, JsonDict]:
        """Pod claim name → the ResourceClaim (those that exist)."""
        ns = pod["metadata"].get("namespace", "default")
        out: dict[str, JsonDict] = {}
        for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
            name = status.get("resourceClaimName")
            claim = self.claim(name, ns) if name else None
            if claim is not None:
                out[status["name"]] = claim
        return out

    def events(
        self, name: str | None = None, reason: str | None = None, namespace: str = "default"
    ) -> list[JsonDict]:
        return [
            e
            for e in self.view.list("events.k8s.io/v1", "Event", namespace)
            if (name is None or e.get("regarding", {}).get("name") == name)
            and (reason is None or e.get("reason") == reason)
        ]

    def whole(self) -> bool:
        """Every node Ready and its ResourceSlice published (after nodes came back)."""
        ready = {n["metadata"]["name"] for n in self.view.list("v1", "Node") if node_is_ready(n)}
        published = {s["spec"]["nodeName"] for s in self.slices()}
        names = {n.name for n in self.nodes}
        return names <= ready and names <= published

    def idle(self, namespace: str = "default") -> bool:
        """No pods or claims left in ``namespace`` and every node's CDI directory empty: the
        deleted pods' kubelets have unprepared their claims (for :meth:`wait_until`)."""
        return (
            not self.pods(namespace)
            and not self.claims(namespace)
            and not any(list(self.cdi_root(n.name).glob("*.json")) for n in self.nodes)
        )

    async def container_devices(self, pod: Mapping[str, Any]) -> dict[str, ContainerDevices]:
        """Container name → its Neuron device nodes and environment: read from inside each
        container that uses a claim on real nodes; on simulated ones, what a CDI runtime
        would inject from the plugin's spec files."""
        if self.real_nodes is not None:
            return {
                str(c["name"]): await self.real_nodes.look_inside(pod, str(c["name"]))
                for c in (pod.get("spec") or {}).get("containers") or []
                if (c.get("resources") or {}).get("claims")
            }
        node = (pod.get("spec") or {}).get("nodeName")
        raw = (pod["metadata"].get("annotations") or {}).get(CDI_DEVICES_ANNOTATION)
        if not node or not raw:
            return {}
        specs = load_specs(self.cdi_root(node))
        return {name: resolve(specs, ids) for name, ids in json.loads(raw).items()}

    def active_pods(self, workload: PodSet) -> list[JsonDict]:
        """The workload's pods that are neither being deleted nor terminal, by name."""
        pods = self.pods(workload.namespace, workload.label_selector)
        return [p for p in pods if is_active(p)]

    def running_workload(self, workload: PodSet) -> list[JsonDict] | None:
        """The workload's active pods, once it has as many as it wants and all of them are
        Running (for :meth:`wait_until`). Pods still Terminating are not counted."""
        pods = self.active_pods(workload)
        if len(pods) != workload.expected:
            return None
        if any(p.get("status", {}).get("phase") != "Running" for p in pods):
            return None
        return pods

    def running(self, names: Iterable[str], namespace: str = "default") -> list[JsonDict] | None:
        """The pods, once all of them are Running (for :meth:`wait_until`)."""
        out = []
        for name in names:
            pod = self.pod(name, namespace)
            if pod is None or pod.get("status", {}).get("phase") != "Running":
                return None
            out.append(pod)
        return out
