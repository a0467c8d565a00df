"""The soak on real nodes (``hack/soak --real-nodes``): a real kubelet and containerd per node
(:mod:`neuron_dra.sim.realnode`), our plugin inside each node with the chart's paths,
registered by the kubelet's own plugin watcher, and the churn's pods run as real containers.

Its faults are the nodes' own: kill -9 of a kubelet or of a containerd (restarted after the
planned downtime, as systemd would), and a node reboot (every process of the node killed,
``/run`` wiped, a new boot id: the plugin drops its checkpoint and the kubelet prepares the
claims of the node's pods again). Its extra check looks inside every Running container
(``kubectl exec``): exactly its claims' device nodes and environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from neuron_dra.common.constants import DRIVER_NAME
from neuron_dra.common.profiles import profile_for
from neuron_dra.sim.realcluster import ADMIN
from neuron_dra.sim.realnode.fleet import RealNodeFleet
from neuron_dra.sim.realnode.images import TEST_IMAGE
from neuron_dra.sim.realnode.layout import PLUGINS_DIR
from neuron_dra.sim.realnode.namespace import NodeError
from neuron_dra.sim.realnode.node import COMPONENTS, CONTAINERD, KUBELET, RealNode
from neuron_dra.sim.simcluster.realnodes import look_inside, node_labels, plugin_argv
from neuron_dra.sim.soak import invariants
from neuron_dra.sim.soak.children import PLUGIN, Child, PluginStartError
from neuron_dra.sim.soak.options import INSTANCE_TYPE, JsonDict

if TYPE_CHECKING:
    from neuron_dra.sim.soak.faults import Fault
    from neuron_dra.sim.soak.harness import Soak

# Fault kinds of a real node.
KUBELET_KILL = "kubelet"
CONTAINERD_KILL = "containerd"
REBOOT = "node-reboot"
FAULT_WEIGHTS: Mapping[str, int] = {KUBELET_KILL: 2, CONTAINERD_KILL: 2, REBOOT: 1}
_KILLED = {KUBELET_KILL: KUBELET, CONTAINERD_KILL: CONTAINERD}
#: The kubelet's record of the claims it prepared (pkg/kubelet/cm/dra/state).
KUBELET_DRA_STATE = "/var/lib/kubelet/dra_manager_state"
#: New containers looked into per check round: the rest wait for the next round, so one
#: round stays short on a busy machine (each look is a ``kubectl exec``, bounded in time).
_LOOKS_PER_ROUND = 4
#: One look's bound (retrying what goes away): room for a loaded machine's ``kubectl exec``;
#: a look that fails is counted, reported, and tried again in a later round.
_LOOK_LIMIT = 30.0


def kubelet_prepared_claims(text: str) -> set[str]:
    """The claim UIDs with our driver's devices in the kubelet's DRA checkpoint (a JSON
    ``{"Data": "<JSON>", "Checksum": n}``)."""
    data = json.loads(json.loads(text)["Data"])
    return {
        str(entry["ClaimUID"])
        for entry in data.get("ClaimInfoStateList") or []
        if DRIVER_NAME in (entry.get("DriverState") or {})
    }


class RealSoakNodes:
    fault_weights: Mapping[str, int] = FAULT_WEIGHTS

    def __init__(self, soak: Soak) -> None:
        self.soak = soak
        self.fleet: RealNodeFleet | None = None
        #: (node, component) down on purpose: a fault in progress.
        self.held: set[tuple[str, str]] = set()
        #: Containers already looked into (their ids: a container restarted is a new one).
        self.looked: set[str] = set()
        #: Looks that failed (the pod gone or restarting, the API server down), with why.
        self.failed_looks: list[str] = []
        profile = profile_for(INSTANCE_TYPE)
        self.cores_per_device = profile.cores_per_device // profile.default_lnc

    def node(self, name: str) -> RealNode:
        assert self.fleet is not None
        return self.fleet.nodes[name]

    def checkpoint(self, node: str) -> Path:
        return self.node(node).layout.host_path(f"{PLUGINS_DIR}/{DRIVER_NAME}/checkpoint.json")

    def cdi_root(self, node: str) -> Path:
        return self.node(node).layout.cdi_dir

    async def start(self) -> None:
        soak = self.soak
        assert soak.cp is not None
        self.fleet = RealNodeFleet(soak.cp, workdir=soak.nodes_dir)
        # From the main thread: the nodes' processes die with the thread that started them.
        self.fleet.start([(n.name, node_labels(n)) for n in soak.nodes])
        admin = soak.cp.kubeconfig(ADMIN)
        for spec in soak.nodes:
            child = Child(
                spec.name,
                PLUGIN,
                # As the chart's DaemonSet runs it: its paths, a pod UID in its sockets.
                plugin_argv(spec, admin, f"{spec.name}-plugin"),
                soak.workdir / "logs" / f"plugin-{spec.name}.log",
                enter=self.node(spec.name).namespace.enter,
            )
            soak.children[spec.name] = child
            child.start()

    async def registered(self) -> bool | str:
        waiting = []
        for name, child in self.soak.children.items():
            if child.kind != PLUGIN:
                continue
            if not child.running():
                lines = child.log.read_text(errors="replace").strip().splitlines() or ["(empty)"]
                raise PluginStartError(f"plugin {name} exited: {lines[-1]}")
            if not await self.plugin_ready(child):
                waiting.append(name)
        return True if not waiting else f"not yet ready (registered, slice published): {waiting}"

    async def plugin_ready(self, child: Child) -> bool:
        port = child.http_port()
        if port is None:
            return False
        url = f"http://127.0.0.1:{port}/readyz"
        try:  # on the node's network; a node mid-reboot has none
            return await asyncio.to_thread(self.node(child.name).http_ok, url)
        except OSError:
            return False

    def plugin_restarted(self, child: Child) -> None:
        return None  # the node's kubelet sees the new registration socket itself

    def down(self) -> str | None:
        for name in sorted(self.fleet.nodes if self.fleet else ()):
            for comp in COMPONENTS:
                if not self.node(name).running(comp):
                    return f"{comp} of {name} down"
        return None

    async def restart_dead(self) -> None:
        for name in sorted(self.fleet.nodes if self.fleet else ()):
            node = self.node(name)
            for comp in COMPONENTS:
                if (name, comp) in self.held or node.running(comp):
                    continue
                self.soak.self_exits[comp] += 1
                self.soak.event(f"{comp} of {name} exited by itself; restarting")
                await self._relaunch(node, comp)

    async def _relaunch(self, node: RealNode, comp: str) -> None:
        node.relaunch(comp)  # from this (main) thread; the wait in a worker
        try:
            await asyncio.to_thread(node.wait_up, comp)
        except NodeError as exc:
            self.soak.event(f"{comp} of {node.name} not up after restart: {exc}")

    async def inject(self, fault: Fault) -> float:
        node = self.node(fault.target)
        if fault.kind in _KILLED:
            comp = _KILLED[fault.kind]
            self.held.add((node.name, comp))
            try:
                node.kill(comp)
                await asyncio.sleep(fault.downtime)
                restarted = time.monotonic()
                await self._relaunch(node, comp)
            finally:
                self.held.discard((node.name, comp))
            return restarted
        if fault.kind != REBOOT:
            raise ValueError(f"no real-node fault {fault.kind}")
        plugin = self.soak.children[node.name]
        plugin.held = True
        self.held.update((node.name, c) for c in COMPONENTS)
        try:
            plugin.kill9()
            await asyncio.to_thread(node.halt)
            await asyncio.sleep(fault.downtime)
            restarted = time.monotonic()
            for step, threaded in node.boot_steps():
                if threaded:
                    await asyncio.to_thread(step)
                else:
                    step()  # starts the node's processes: from the main thread
            # As the kubelet starts the DaemonSet's pod again once the node is up.
            plugin.start()
        finally:
            plugin.held = False
            self.held.difference_update((node.name, c) for c in COMPONENTS)
        return restarted

    def kubelet_prepared(self, node: str) -> set[str]:
        path = self.node(node).layout.host_path(KUBELET_DRA_STATE)
        try:
            return kubelet_prepared_claims(path.read_text())
        except FileNotFoundError:
            return set()

    def pod_container(self) -> JsonDict:
        return {"image": TEST_IMAGE, "command": ["sleep", "infinity"]}

    async def check_containers(self, snap: JsonDict, *, every: bool) -> list[tuple[str, str]]:
        soak = self.soak
        assert soak.cp is not None
        claims = {str(c["metadata"]["name"]): c for c in snap["claims"]}
        out: list[tuple[str, str]] = []
        looks = 0
        for pod in snap["pods"]:
            status = pod.get("status") or {}
            if status.get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
                continue
            for cs in status.get("containerStatuses") or []:
                cid = str(cs.get("containerID") or "")
                if not cid or "running" not in (cs.get("state") or {}):
                    continue
                if cid in self.looked and not every:
                    continue
                if looks >= _LOOKS_PER_ROUND and not every:
                    return out
                want = invariants.expected_container(
                    pod, claims, snap["nus"], self.cores_per_device
                )
                if want is None:
                    continue
                looks += 1
                try:
                    seen = await look_inside(soak.cp, pod, str(cs["name"]), _LOOK_LIMIT)
                except RuntimeError as exc:
                    # Gone, restarting, or the API server down: a later round looks again.
                    reason = str(exc).split("\n")[0][:160]
                    self.failed_looks.append(f"{pod['metadata']['name']}: {reason}")
                    soak.event(f"look into pod {pod['metadata']['name']} failed: {reason}")
                    continue
                self.looked.add(cid)
                for diff in invariants.container_differences(want, seen):
                    out.append(("container", f"pod {pod['metadata']['name']}: {diff}"))
        return out

    def containers_looked_into(self) -> int:
        return len(self.looked)

    def container_looks_failed(self) -> list[str]:
        return list(self.failed_looks)

    async def stop(self) -> None:
        if self.fleet is not None:
            with contextlib.suppress(Exception):
                self.fleet.stop()
