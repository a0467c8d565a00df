"""Restarting what died: the kubelet's restart policy for our processes, a relaunch of a
control-plane component, systemd's for a real node's kubelet and containerd."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

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
        await soak.node_side.restart_dead()
        await asyncio.sleep(1.0)


async def restart_child(soak: Soak, child: Child) -> None:
    child.start()
    if child.kind == PLUGIN:
        soak.node_side.plugin_restarted(child)


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
