"""The soak's simulated nodes (the default): Node objects and their Leases written by the
soak, one plugin process per node on this machine, and simulated kubelets
(:class:`..controlplane.SimKubelet`) in the soak's process that call the plugins over their
gRPC sockets. A restarted plugin is registered again by its node's kubelet, as the
kubelet's plugin watcher does when the registration socket is re-created."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from neuron_dra.common.constants import DRIVER_NAME
from neuron_dra.sim.controlplane import ControlPlane
from neuron_dra.sim.kubeletclient import KubeletClient
from neuron_dra.sim.realcluster import ADMIN
from neuron_dra.sim.simcluster.realworld import NodeLease, register_node
from neuron_dra.sim.soak.children import PLUGIN, Child, PluginStartError
from neuron_dra.sim.soak.options import JsonDict

if TYPE_CHECKING:
    from neuron_dra.sim.soak.faults import Fault
    from neuron_dra.sim.soak.harness import Soak


class SimNodes:
    fault_weights: Mapping[str, int] = {}

    def __init__(self, soak: Soak) -> None:
        self.soak = soak
        self.sim: ControlPlane | None = None
        self.leases: list[NodeLease] = []

    def root(self, node: str) -> Path:
        return self.soak.nodes_dir / node

    def registrar_dir(self, node: str) -> Path:
        return self.root(node) / "registry"

    def checkpoint(self, node: str) -> Path:
        return self.root(node) / "plugins" / DRIVER_NAME / "checkpoint.json"

    def cdi_root(self, node: str) -> Path:
        return self.root(node) / "cdi"

    async def start(self) -> None:
        soak = self.soak
        assert soak.cp is not None and soak.kube is not None and soak.kubelet_kube is not None
        admin = soak.cp.kubeconfig(ADMIN)
        for index, node in enumerate(soak.nodes):
            await register_node(soak.kube, node, index)
            lease = NodeLease(soak.kubelet_kube, node.name)
            lease.start()
            self.leases.append(lease)
            self.root(node.name).mkdir(parents=True, exist_ok=True)
        for node in soak.nodes:
            soak.children[node.name] = Child(
                node.name,
                PLUGIN,
                [
                    sys.executable, "-m", "neuron_dra.sim.soak.procs", "plugin",
                    "--node-name", node.name, "--kubeconfig", str(admin),
                    "--cdi-root", str(self.cdi_root(node.name)),
                    "--kubelet-registrar-directory-path", str(self.registrar_dir(node.name)),
                    "--kubelet-plugins-directory-path", str(self.root(node.name) / "plugins"),
                    "--emulation-mode", node.instance_type,
                    "--emulated-ultraserver-id", str(node.ultraserver_id),
                    "--emulated-ultraserver-node-id", str(node.ultraserver_node_id),
                    "--http-port", "0",
                ],
                soak.workdir / "logs" / f"plugin-{node.name}.log",
            )  # fmt: skip
            soak.children[node.name].start()
        self.sim = ControlPlane(
            soak.kubelet_kube,
            registrar_dirs={n.name: self.registrar_dir(n.name) for n in soak.nodes},
            simulate_control_plane=False,
        )
        await self.sim.start()

    async def registered(self) -> bool | str:
        """True once every node's kubelet registered its plugin; else which have not, with
        the last line a dead plugin wrote (a plugin that cannot start says why there)."""
        assert self.sim is not None
        waiting = [n for n, k in self.sim.kubelets.items() if not k.registered.is_set()]
        if not waiting:
            return True
        dead = [self.soak.children[n] for n in waiting if not self.soak.children[n].running()]
        if dead:
            lines = dead[0].log.read_text(errors="replace").strip().splitlines() or ["(empty)"]
            raise PluginStartError(f"plugin {dead[0].name} exited: {lines[-1]}")
        return f"not yet registered: {waiting}"

    async def plugin_ready(self, child: Child) -> bool:
        return await self.soak.ready(child.http_port())

    def plugin_restarted(self, child: Child) -> None:
        asyncio.get_running_loop().create_task(self._reregister(child))

    async def _reregister(self, child: Child) -> None:
        """The kubelet's plugin watcher sees the re-created registration socket and
        registers the plugin again (GetInfo, NotifyRegistrationStatus)."""
        assert self.sim is not None
        kubelet = self.sim.kubelets[child.name]
        deadline = time.monotonic() + 120
        while child.http_port() is None:
            if time.monotonic() > deadline or not child.running():
                return
            await asyncio.sleep(0.2)
        fresh = KubeletClient(self.registrar_dir(child.name))
        while not fresh.plugins and time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                await fresh.register_all()
            if not fresh.plugins:
                await asyncio.sleep(0.3)
        old, kubelet.client = kubelet.client, fresh
        with contextlib.suppress(Exception):
            await old.close()

    def down(self) -> str | None:
        return None

    async def restart_dead(self) -> None:
        return None

    async def inject(self, fault: Fault) -> float:
        raise ValueError(f"simulated nodes have no {fault.kind} fault")

    def kubelet_prepared(self, node: str) -> set[str]:
        assert self.sim is not None
        return {uid for s in self.sim.kubelets[node].prepared.values() for uid in s.claims}

    def pod_container(self) -> JsonDict:
        return {"image": "registry.k8s.io/pause:3.10"}

    async def check_containers(self, snap: JsonDict, *, every: bool) -> list[tuple[str, str]]:
        # A simulated kubelet runs no container: what it would give is the CDI specs, which
        # the checkpoint-cdi check compares already.
        return []

    def containers_looked_into(self) -> int:
        return 0

    def container_looks_failed(self) -> list[str]:
        return []

    async def stop(self) -> None:
        if self.sim is not None:
            with contextlib.suppress(Exception):
                await self.sim.stop()
        for lease in self.leases:
            with contextlib.suppress(Exception):
                await lease.stop()
