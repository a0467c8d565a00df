"""The plugin processes and the calls made to them: start (timed to its slice on a watch),
stop, registration as the kubelet does it, and timed Prepare/Unprepare calls."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from neuron_dra.common.k8s.client import KubeClient
from neuron_dra.nodeplugin.kubeletapi import ClaimRef
from neuron_dra.sim.kubeletclient import KubeletClient

from .apiserver import published_at
from .driver import SETPRIV, Driver


async def start_plugin(d: Driver, kube: KubeClient, kubeconfig: Path) -> float:
    """Start the driver's process; seconds from its start to its slice on a watch."""
    ready = asyncio.Event()
    watch = asyncio.create_task(published_at(kube, d.node, ready))
    await asyncio.wait_for(ready.wait(), 30)
    argv = d.argv_for(d, kubeconfig)
    if SETPRIV:  # the plugin dies with the harness (setpriv, not a fork-time hook in Python)
        argv = [SETPRIV, "--pdeathsig", "KILL", *argv]
    with d.log.open("ab") as log:
        # Logs to a file, as to a container runtime's: a pipe read by this process would wake
        # it (the kubelet's stand-in) for every line, in the middle of the calls it times.
        t0 = time.perf_counter()
        d.proc = await asyncio.create_subprocess_exec(
            *argv, stdout=log, stderr=log, stdin=asyncio.subprocess.DEVNULL
        )
    exited = asyncio.create_task(d.proc.wait())
    try:
        done, _ = await asyncio.wait({watch, exited}, timeout=120, return_when="FIRST_COMPLETED")
        if watch not in done:
            tail = d.log.read_text(errors="replace").splitlines()[-10:]
            why = f"exited {d.proc.returncode}" if exited in done else "published nothing"
            raise RuntimeError(f"{d.label} plugin {why}; log {d.log}:\n" + "\n".join(tail))
        at = watch.result()
    except BaseException:
        watch.cancel()
        await stop_plugin(d)
        raise
    finally:
        exited.cancel()
    return at - t0


async def stop_plugin(d: Driver) -> None:
    try:
        if d.kubelet is not None:
            await d.kubelet.close()
    finally:
        d.kubelet, d.plugin = None, None
        await _terminate(d)


async def _terminate(d: Driver) -> None:
    if d.proc is not None and d.proc.returncode is None:
        d.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(d.proc.wait(), 30)
        except TimeoutError:
            d.proc.kill()
            await d.proc.wait()
    d.proc = None


async def register(d: Driver) -> None:
    """Play the node's kubelet: GetInfo on the registration socket, NotifyRegistrationStatus,
    then connect to the plugin's DRA socket (:class:`KubeletClient`)."""
    d.kubelet = KubeletClient(d.registrar)
    deadline = time.monotonic() + 60
    while True:
        assert d.proc is not None
        if d.proc.returncode is not None:
            raise RuntimeError(f"{d.label} plugin exited {d.proc.returncode}; log {d.log}")
        got = await d.kubelet.register_all()
        if got:
            d.plugin = got[0]
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{d.label} plugin did not register; log {d.log}")
        await asyncio.sleep(0.05)


def check(d: Driver, results: dict[str, Any], what: str) -> None:
    errors = [r.error for r in results.values() if r.error]
    if errors:
        raise RuntimeError(f"{d.label} {what}: {errors[0]} (log {d.log})")


async def timed_prepare(d: Driver, refs: Sequence[ClaimRef]) -> float:
    t = time.perf_counter()
    got = await d.dra.prepare(refs)
    took = time.perf_counter() - t
    check(d, got, "NodePrepareResources")
    return took


async def timed_unprepare(d: Driver, refs: Sequence[ClaimRef]) -> float:
    t = time.perf_counter()
    got = await d.dra.unprepare(refs)
    took = time.perf_counter() - t
    check(d, got, "NodeUnprepareResources")
    return took


def alternating(drivers: Sequence[Driver], i: int) -> Iterator[Driver]:
    """Both drivers, the first one first on even rounds and last on odd ones: each takes
    its turn right after the other and right after the harness's own bookkeeping."""
    return iter(drivers if i % 2 == 0 else list(reversed(drivers)))
