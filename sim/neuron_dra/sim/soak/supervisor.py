"""Restarting what died: the kubelet's restart policy for our processes, a relaunch of a
control-plane component, and the kubelet's plugin watcher registering a restarted plugin."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

from neuron_dra.sim.kubeletclient import KubeletClient
from neuron_dra.sim.soak.children import PLUGIN, Child, popen
from neuron_dra.sim.soak.options import CONTROL_PLANE

if TYPE_CHECKING:
    from neuron_dra.sim.soak.harness import Soak


async def supervise(soak: Soak) -> None:
    """Restart what died on its own (the kubelet's restart policy)."""
    assert soak.cp is not None
    while not soak.stopping.is_set():
        for child in soak.children.values():
            if not child.held and not child.running():
                code = child.proc.returncode if child.proc else None
                soak.self_exits[child.kind] += 1
                soak.event(f"{child.name} exited by itself ({code}); restarting")
                await asyncio.sleep(1.0)
                await restart_child(soak, child)
        for name in CONTROL_PLANE:
            if name not in soak.held_cp and not soak.cp.running(name):
                soak.self_exits[name] += 1
                soak.event(f"{name} exited by itself; restarting")
                await restart_cp(soak, name)
        await asyncio.sleep(1.0)


async def restart_child(soak: Soak, child: Child) -> None:
    child.start()
    if child.kind == PLUGIN:
        asyncio.get_running_loop().create_task(reregister(soak, child.name))


async def reregister(soak: Soak, node: str) -> None:
    """The kubelet's plugin watcher sees the re-created registration socket and
    registers the plugin again (GetInfo, NotifyRegistrationStatus)."""
    assert soak.sim is not None
    child = soak.children[node]
    kubelet = soak.sim.kubelets[node]
    deadline = time.monotonic() + 120
    while child.http_port() is None:
        if time.monotonic() > deadline or not child.running():
            return
        await asyncio.sleep(0.2)
    fresh = KubeletClient(soak.registrar_dir(node))
    while not fresh.plugins and time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            await fresh.register_all()
        if not fresh.plugins:
            await asyncio.sleep(0.3)
    old, kubelet.client = kubelet.client, fresh
    with contextlib.suppress(Exception):
        await old.close()


async def restart_cp(soak: Soak, name: str) -> None:
    """Relaunch a control-plane component from this (main) thread, so it still dies with
    us, and wait for its health endpoint in a worker thread."""
    assert soak.cp is not None
    comp = soak.cp._components[name]
    soak.cp._terminate(comp)
    comp.restarts += 1
    comp.proc = popen(comp.argv, comp.log)
    try:
        await asyncio.to_thread(soak.cp._wait_healthy, comp)
    except Exception as exc:
        soak.event(f"{name} not healthy after restart: {exc}")
