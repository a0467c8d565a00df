"""The side-by-side harness: our kubelet plugin and the Go peer on one real control plane.

The run and its measuring sequence live here; the side effects it drives are in
:mod:`.driver` (the drivers and their command lines), :mod:`.plugins` (their processes and
the gRPC calls), :mod:`.apiserver` (nodes, slices, claims) and :mod:`.observe` (/proc,
metrics, py-spy); :mod:`.stats` turns what this measures into the table.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from neuron_dra.common.constants import DRIVER_NAME
from neuron_dra.common.k8s.client import RESOURCE_CLAIMS, KubeClient, connect
from neuron_dra.sim.paths import chart_crd_dir
from neuron_dra.sim.peerbuild import PEER_MODULE, peer_binary, peer_module
from neuron_dra.sim.realcluster import ADMIN, RealControlPlane, bin_dir_for, free_port
from neuron_dra.sim.scratch import keep, work_dir
from neuron_dra.sim.simcluster.realworld import NodeLease

from .apiserver import allocated_claims, create_claims_and_pods, delete_slices, setup, wait_for
from .driver import DEVICES, PEER_DRIVER, Driver, our_argv, peer_argv
from .observe import (
    OUR_PREPARE_METRIC,
    PEER_PREPARE_METRIC,
    compile_project,
    cpu_seconds,
    our_http_port,
    prepare_metric,
    rss_kib,
    start_profiler,
    stop_profiler,
    tmpfs_dir,
)
from .plugins import (
    alternating,
    register,
    start_plugin,
    stop_plugin,
    timed_prepare,
    timed_unprepare,
)
from .stats import OURS, PEER, DriverFigures


@dataclass(frozen=True)
class Options:
    minor: str = "1.34"
    starts: int = 3
    warmup: int = 200
    cycles: int = 10_000
    batches: int = 100
    floor_calls: int = 300
    workdir: Path | None = None
    compile: bool = True
    #: Sample our plugin with ``py-spy record --pid`` over the measured cycles into this file
    #: (collapsed stacks, waits included).
    profile_ours: Path | None = None


def _progress(message: str) -> None:
    print(f"[peer-bench] {message}", file=sys.stderr, flush=True)


async def measure(
    opts: Options, cp: RealControlPlane, workdir: Path, cdi_base: Path, claim_get: list[float]
) -> list[Driver]:
    kubeconfig = cp.kubeconfig(ADMIN)
    ours = Driver(
        OURS, DRIVER_NAME, DRIVER_NAME, "bench-ours", our_version(),
        workdir / OURS, cdi_base / OURS,
        our_argv,
    )  # fmt: skip
    peer = Driver(
        PEER, PEER_DRIVER, PEER_DRIVER, "bench-peer", f"{PEER_MODULE} {peer_module().version}",
        workdir / PEER, cdi_base / PEER, peer_argv,
    )  # fmt: skip
    ours.prepare_metric = OUR_PREPARE_METRIC
    peer.metrics_port, peer.prepare_metric = free_port(), PEER_PREPARE_METRIC
    drivers = [ours, peer]
    for d in drivers:
        # The kubelet makes its plugins and registration directories; the peer expects them.
        for path in (d.registrar, d.plugins_dir, d.cdi_root):
            path.mkdir(parents=True, exist_ok=True)
    leases: list[NodeLease] = []
    async with await connect(kubeconfig) as kube:
        try:
            await setup(kube, drivers, leases)
            await _measure(opts, kube, kubeconfig, drivers, claim_get)
        finally:
            for d in drivers:
                with contextlib.suppress(Exception):
                    await stop_plugin(d)
            for lease in leases:
                await lease.stop()
    return drivers


async def _measure(
    opts: Options,
    kube: KubeClient,
    kubeconfig: Path,
    drivers: Sequence[Driver],
    claim_get: list[float],
) -> None:
    # Start-up, alternated; the last start of each stays up for the rest.
    for s in range(opts.starts):
        for d in alternating(drivers, s):
            if d.proc is not None:
                await stop_plugin(d)
                await delete_slices(kube, d.node)
            took = await start_plugin(d, kube, kubeconfig)
            d.figures.start_to_published.append(took)
            _progress(f"start {s + 1}/{opts.starts}: {d.label} published after {took:.2f} s")
    for d in drivers:
        await register(d)
        await create_claims_and_pods(kube, d)
    drivers[0].metrics_port = our_http_port(drivers[0].log)  # printed once it serves
    for d in drivers:

        async def allocated(d: Driver = d) -> bool:
            refs = await allocated_claims(kube, d)
            if refs is None:
                return False
            d.claims = refs
            return True

        await wait_for(allocated, f"{d.label}'s claims allocated by kube-scheduler", 120, 0.2)
    _progress("claims allocated by kube-scheduler; plugins registered")
    await asyncio.sleep(2)  # at rest: the publish done, nothing asked of the plugins yet
    for d in drivers:
        d.figures.rss_rest_kib = rss_kib(d.pid)

    for i in range(opts.warmup):
        for d in alternating(drivers, i):
            ref = [d.claims[i % DEVICES]]
            await timed_prepare(d, ref)
            await timed_unprepare(d, ref)
    for d in drivers:
        d.figures.rss_warm_kib = rss_kib(d.pid)
    _progress(f"warm-up of {opts.warmup} cycles done; {opts.cycles} measured cycles")

    profiler = await start_profiler(opts.profile_ours, drivers[0].pid)
    work0 = {d.label: await prepare_metric(d) for d in drivers}
    cpu0 = {d.label: cpu_seconds(d.pid) for d in drivers}
    sample_every = max(1, opts.cycles // 10)
    for i in range(opts.cycles):
        for d in alternating(drivers, i):
            ref = [d.claims[i % DEVICES]]
            d.figures.prepare_1.append(await timed_prepare(d, ref))
            d.figures.unprepare_1.append(await timed_unprepare(d, ref))
        if (i + 1) % sample_every == 0 or i + 1 == opts.cycles:
            for d in drivers:
                d.figures.rss_samples_kib.append(rss_kib(d.pid))
            if (i + 1) % (sample_every * 2) == 0:
                _progress(f"{i + 1} cycles")
    for d in drivers:
        d.figures.cycle_cpu_seconds = cpu_seconds(d.pid) - cpu0[d.label]
        d.figures.cycles = opts.cycles
        before, after = work0[d.label], await prepare_metric(d)
        if before is not None and after is not None and after[1] > before[1]:
            d.figures.own_prepare_mean = (after[0] - before[0]) / (after[1] - before[1])
    await stop_profiler(profiler)

    for b in range(opts.batches):
        for d in alternating(drivers, b):
            d.figures.prepare_16.append(await timed_prepare(d, d.claims))
            d.figures.unprepare_16.append(await timed_unprepare(d, d.claims))
    _progress(f"{opts.batches} 16-claim batches done")

    # The floor: a gRPC round trip alone (a Prepare of no claims) per driver, and a GET of
    # one claim with our API client (the plugin's), interleaved, with both plugins up.
    claims = kube.resource(RESOURCE_CLAIMS)
    for i in range(opts.floor_calls):
        for d in alternating(drivers, i):
            d.figures.empty_call.append(await timed_prepare(d, []))
        one = drivers[i % 2].claims[i % DEVICES]
        t = time.perf_counter()
        await claims.get(one.name, one.namespace)
        claim_get.append(time.perf_counter() - t)
    for d in drivers:
        d.figures.rss_end_kib = rss_kib(d.pid)


def our_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"neuron-dra {version('neuron-dra')}"
    except PackageNotFoundError:
        return "neuron-dra (source)"


@dataclass
class RunResult:
    ours: DriverFigures
    peer: DriverFigures
    claim_get: list[float]
    kubernetes: str
    started: float
    finished: float
    logs: dict[str, str]


def run(opts: Options) -> RunResult:
    """Start a control plane (from the main thread, before any event loop or gRPC thread
    exists), measure both drivers on it, stop everything."""
    if opts.compile:
        compile_project()
    peer_binary()  # fail early, saying how to build it
    workdir = opts.workdir or work_dir("peer-bench", Path("/tmp"))
    own_workdir = opts.workdir is None
    cdi_base = work_dir("peer-cdi", Path(tmpfs_dir() or "/tmp"))
    cp = RealControlPlane(
        bin_dir_for(opts.minor),
        opts.minor,
        workdir=workdir / "k8s",
        crd_paths=sorted(chart_crd_dir().glob("*.yaml")),  # our plugin watches NeuronUltraServers
    )
    started = time.time()
    ok = False
    try:
        cp.start()
        kubernetes = cp.kubectl("version", "-o", "json")
        claim_get: list[float] = []
        drivers = asyncio.run(measure(opts, cp, workdir, cdi_base, claim_get))
        ok = True
        return RunResult(
            drivers[0].figures,
            drivers[1].figures,
            claim_get,
            server_version(kubernetes),
            started,
            time.time(),
            {d.label: str(d.log) for d in drivers},
        )
    finally:
        cp.stop()
        shutil.rmtree(cdi_base, ignore_errors=True)
        if ok:
            cp.remove_files()
        if own_workdir and ok:
            shutil.rmtree(workdir, ignore_errors=True)
        elif not ok:
            keep(workdir, "a failed benchmark's logs")
            _progress(f"failed: logs kept in {workdir}")


def server_version(kubectl_json: str) -> str:
    import json

    info = json.loads(kubectl_json).get("serverVersion") or {}
    return str(info.get("gitVersion") or "?")
