"""The simulated control plane as one object: claim controller, scheduler and one kubelet per
node, started and stopped together; plus the project's DeviceClasses.

    async with ControlPlane(kube, registrar_dirs={"trn2-0": Path(...)}) as cp:
        await ensure_device_classes(kube)
        rs = await cp.replica_set("default", "train", 2, pod_template)

Node plugins are not part of it: run them (``KubeletPlugin``) yourself, pointing their
registration directory at the one given for their node here.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from neuron_dra.common.deviceclasses import default_device_classes
from neuron_dra.common.k8s.client import DEVICE_CLASSES, KubeClient
from neuron_dra.common.k8s.errors import AlreadyExistsError

from .base import JsonDict, Loop
from .claims import ClaimController
from .kubelet import SimKubelet
from .podsets import RECREATE_GROUP, Group, PodSet, ReplicaSet, from_manifest
from .scheduler import Scheduler

log = logging.getLogger(__name__)


async def ensure_device_classes(kube: KubeClient) -> list[JsonDict]:
    """Create the project's DeviceClasses (``neuron.aws.com``, ``ultraserver.neuron.aws.com``)
    unless they exist; returns the objects as the server has them."""
    api = kube.resource(DEVICE_CLASSES)
    out: list[JsonDict] = []
    for obj in default_device_classes():
        try:
            out.append(await api.create(obj))
        except AlreadyExistsError:
            out.append(await api.get(obj["metadata"]["name"]))
    return out


class ControlPlane:
    def __init__(
        self,
        kube: KubeClient,
        *,
        registrar_dirs: Mapping[str, Path],
        simulate_control_plane: bool = True,
    ) -> None:
        """``simulate_control_plane=False`` runs only the kubelets (and the workload
        controllers asked for): on a real control plane, the real scheduler and
        resourceclaim controller do the rest."""
        self.kube = kube
        self.claims: ClaimController | None = (
            ClaimController(kube) if simulate_control_plane else None
        )
        self.scheduler: Scheduler | None = Scheduler(kube) if simulate_control_plane else None
        self.kubelets: dict[str, SimKubelet] = {
            node: SimKubelet(kube, node, path) for node, path in registrar_dirs.items()
        }
        self.workloads: list[PodSet] = []
        self._started: list[Loop[Any]] = []

    @property
    def loops(self) -> list[Loop[Any]]:
        central: list[Loop[Any]] = [c for c in (self.claims, self.scheduler) if c is not None]
        return [*central, *self.kubelets.values()]

    async def start(self) -> None:
        for loop in self.loops:
            if loop not in self._started:
                await loop.start()
                self._started.append(loop)

    async def stop(self) -> None:
        for workload in reversed(self.workloads):
            await self._stop_quietly(workload)
        self.workloads.clear()
        for loop in reversed(self._started):
            await self._stop_quietly(loop)
        self._started.clear()

    async def restart_kubelet(self, node: str, registrar_dir: Path) -> None:
        """A new kubelet for ``node`` (its node came back): it knows nothing of before."""
        old = self.kubelets.get(node)
        if old is not None:
            await self._stop_quietly(old)
            with contextlib.suppress(ValueError):
                self._started.remove(old)
        kubelet = SimKubelet(self.kube, node, registrar_dir)
        self.kubelets[node] = kubelet
        await kubelet.start()
        self._started.append(kubelet)

    @staticmethod
    async def _stop_quietly(loop: Loop[Any]) -> None:
        try:
            await loop.stop()
        except Exception:
            log.exception("stopping %s failed", loop.name)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def replica_set(
        self, namespace: str, name: str, replicas: int, pod_template: Mapping[str, Any]
    ) -> ReplicaSet:
        """Start a :class:`ReplicaSet` that is stopped with the control plane."""
        rs = ReplicaSet(self.kube, namespace, name, replicas, pod_template)
        await rs.start()
        self.workloads.append(rs)
        return rs

    async def group(
        self,
        namespace: str,
        name: str,
        pod_template: Mapping[str, Any],
        *,
        size: int = 4,
        restart_policy: str = RECREATE_GROUP,
    ) -> Group:
        """Start a LeaderWorkerSet-like :class:`Group` stopped with the control plane."""
        group = Group(
            self.kube, namespace, name, pod_template, size=size, restart_policy=restart_policy
        )
        await group.start()
        self.workloads.append(group)
        return group

    async def run(self, manifest: Mapping[str, Any], namespace: str = "default") -> PodSet:
        """Start the controller for a Deployment or LeaderWorkerSet manifest
        (:func:`.podsets.from_manifest`), stopped with the control plane."""
        workload = from_manifest(self.kube, manifest, namespace)
        await workload.start()
        self.workloads.append(workload)
        return workload

    async def remove(self, workload: PodSet, *, delete_pods: bool = True) -> None:
        """Stop one workload controller (and by default delete its pods)."""
        with contextlib.suppress(ValueError):
            self.workloads.remove(workload)
        await workload.stop(delete_pods=delete_pods)
