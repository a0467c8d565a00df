"""The side-by-side harness: our kubelet plugin and the Go peer on one real control plane.

Side effects live here (processes, the API server, gRPC, /proc); :mod:`.stats` turns what
this measures into the table.
"""

from __future__ import annotations

import asyncio
import compileall
import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_dra.common.constants import DRIVER_NAME
from neuron_dra.common.k8s.client import (
    DEVICE_CLASSES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    KubeClient,
    connect,
)
from neuron_dra.common.k8s.errors import AlreadyExistsError, NotFoundError
from neuron_dra.nodeplugin.kubeletapi import ClaimRef
from neuron_dra.nodeplugin.kubeletclient import DraPlugin, KubeletClient
from neuron_dra.sim.controlplane import ensure_device_classes
from neuron_dra.sim.paths import chart_crd_dir
from neuron_dra.sim.peerbuild import PEER_MODULE, peer_binary, peer_module
from neuron_dra.sim.realcluster import ADMIN, RealControlPlane, bin_dir_for, free_port
from neuron_dra.sim.simcluster.realworld import (
    SERVICE_ACCOUNTS,
    NodeLease,
    ensure_namespace,
    register_node,
)
from neuron_dra.sim.simcluster.topology import SimNode

from .stats import OURS, PEER, DriverFigures

NAMESPACE = "peer-bench"
#: Devices per node, and so claims per driver: a trn2.48xlarge has 16 Neuron devices; the
#: peer is started with ``--num-devices 16``.
DEVICES = 16
OUR_INSTANCE_TYPE = "trn2.48xlarge"
PEER_DRIVER = "gpu.example.com"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
SETPRIV = shutil.which("setpriv")


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


@dataclass
class Driver:
    """One driver under test: its node, directories, process and kubelet-side connection."""

    label: str
    driver_name: str
    device_class: str
    node: str
    version: str
    root: Path
    cdi_root: Path
    argv_for: Callable[[Driver, Path], list[str]]
    figures: DriverFigures = field(init=False)
    proc: asyncio.subprocess.Process | None = None
    kubelet: KubeletClient | None = None
    plugin: DraPlugin | None = None
    claims: list[ClaimRef] = field(default_factory=list)
    #: Where its Prometheus metrics are served, and the histogram of its per-claim Prepare
    #: time there (ours: neuron_dra_prepare_seconds, the claim GET included; the peer's:
    #: its own work, no GET).
    metrics_port: int | None = None
    prepare_metric: str = ""

    def __post_init__(self) -> None:
        self.figures = DriverFigures(self.label, self.version)

    @property
    def registrar(self) -> Path:
        return self.root / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.root / "plugins"

    @property
    def log(self) -> Path:
        return self.root / "plugin.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def dra(self) -> DraPlugin:
        assert self.plugin is not None
        return self.plugin


def _our_argv(d: Driver, kubeconfig: Path) -> list[str]:
    return [
        sys.executable, "-m", "neuron_dra.nodeplugin.main",
        "--node-name", d.node, "--kubeconfig", str(kubeconfig),
        "--cdi-root", str(d.cdi_root),
        "--kubelet-registrar-directory-path", str(d.registrar),
        "--kubelet-plugins-directory-path", str(d.plugins_dir),
        "--emulation-mode", OUR_INSTANCE_TYPE,
        "--http-port", "0",
    ]  # fmt: skip


def _peer_argv(d: Driver, kubeconfig: Path) -> list[str]:
    return [
        str(peer_binary()),
        "--node-name", d.node, "--kubeconfig", str(kubeconfig),
        "--cdi-root", str(d.cdi_root),
        "--kubelet-registrar-directory-path", str(d.registrar),
        "--kubelet-plugins-directory-path", str(d.plugins_dir),
        "--num-devices", str(DEVICES),
        "--metrics-port", str(d.metrics_port),
        # client-go's defaults (5 QPS, burst 10) would make the benchmark measure the
        # peer's client-side throttle: each Prepare GETs its claims. Ours has none.
        "--kube-api-qps", "1000", "--kube-api-burst", "1000",
    ]  # fmt: skip


# --- /proc ----------------------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tmpfs_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


def compile_project() -> None:
    """Byte-compile our packages, as installing a wheel or building an image does (see
    hack/bench/prepare); quiet: the plugin's start would show any error."""
    import neuron_dra

    for directory in neuron_dra.__path__:
        compileall.compile_dir(directory, quiet=2)


# --- the API server -------------------------------------------------------------------------


async def wait_for(
    predicate: Callable[[], Awaitable[bool]], what: str, limit: float, step: float = 0.05
) -> None:
    deadline = time.monotonic() + limit
    while not await predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {limit:.0f} s")
        await asyncio.sleep(step)


async def node_slices(kube: KubeClient, node: str) -> list[dict[str, Any]]:
    got = await kube.resource(RESOURCE_SLICES).list(field_selector=f"spec.nodeName={node}")
    items: list[dict[str, Any]] = got.get("items") or []
    return items


async def published_at(kube: KubeClient, node: str, ready: asyncio.Event) -> float:
    """perf_counter when a ResourceSlice of ``node`` shows up on a watch (set ``ready`` once
    the watch is open, so the caller starts the process after that)."""
    listed = await kube.resource(RESOURCE_SLICES).list(field_selector=f"spec.nodeName={node}")
    if listed.get("items"):
        raise RuntimeError(f"slices of {node} exist before the plugin started")
    rv = listed["metadata"]["resourceVersion"]
    async with await kube.resource(RESOURCE_SLICES).watch(
        resource_version=rv, field_selector=f"spec.nodeName={node}", timeout_seconds=120
    ) as stream:
        ready.set()
        async for event in stream:
            if event.type == "ADDED":
                return time.perf_counter()
    raise RuntimeError(f"the watch ended before a slice of {node} appeared")


async def delete_slices(kube: KubeClient, node: str) -> None:
    for item in await node_slices(kube, node):
        with contextlib.suppress(NotFoundError):
            await kube.resource(RESOURCE_SLICES).delete(item["metadata"]["name"])

    async def gone() -> bool:
        return not await node_slices(kube, node)

    await wait_for(gone, f"slices of {node} deleted", 30)


def peer_device_class() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": PEER_DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{PEER_DRIVER}'"}}]},
    }


async def create_claims_and_pods(kube: KubeClient, d: Driver) -> None:
    """``DEVICES`` one-device claims, each used by a pod pinned to the driver's node: the real
    scheduler allocates the claims and reserves them for the pods (no kubelet runs them)."""
    for i in range(DEVICES):
        name = f"{d.label}-{i}"
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "dev", "exactly": {"deviceClassName": d.device_class, "count": 1}}
                    ]
                }
            },
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": d.node},
                "containers": [
                    {"name": "c", "image": PAUSE_IMAGE, "resources": {"claims": [{"name": "dev"}]}}
                ],
                "resourceClaims": [{"name": "dev", "resourceClaimName": name}],
            },
        }
        await kube.resource(RESOURCE_CLAIMS).create(claim, NAMESPACE)
        await kube.resource(PODS).create(pod, NAMESPACE)


async def allocated_claims(kube: KubeClient, d: Driver) -> list[ClaimRef] | None:
    """The driver's claims once every one is allocated and reserved, else None."""
    items = (await kube.resource(RESOURCE_CLAIMS).list(NAMESPACE)).get("items") or []
    mine = [c for c in items if str(c["metadata"]["name"]).startswith(f"{d.label}-")]
    if len(mine) < DEVICES:
        return None
    for c in mine:
        status = c.get("status") or {}
        if not status.get("allocation") or not status.get("reservedFor"):
            return None
    mine.sort(key=lambda c: int(str(c["metadata"]["name"]).rsplit("-", 1)[1]))
    return [
        ClaimRef(namespace=NAMESPACE, uid=c["metadata"]["uid"], name=c["metadata"]["name"])
        for c in mine
    ]


# --- the plugin processes -------------------------------------------------------------------


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


OUR_PREPARE_METRIC = "neuron_dra_prepare_seconds"
PEER_PREPARE_METRIC = "dra_example_driver_prepare_claim_duration_seconds"


async def prepare_metric(d: Driver) -> tuple[float, int] | None:
    """(sum of seconds, count) of the driver's own per-claim Prepare histogram."""
    if d.metrics_port is None:
        return None
    import aiohttp

    url = f"http://127.0.0.1:{d.metrics_port}/metrics"
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        text = await resp.text()
    return parse_sum_count(text, d.prepare_metric)


def our_http_port(log: Path) -> int | None:
    """The port our plugin printed last (``neuron-dra-kubelet-plugin: http port N``; the log
    is appended to by every start)."""
    found = re.findall(rb"http port (\d+)", log.read_bytes())
    return int(found[-1]) if found else None


def parse_sum_count(text: str, metric: str) -> tuple[float, int] | None:
    """A histogram's ``_sum`` and ``_count`` from Prometheus text (all label sets added)."""
    total, count, seen = 0.0, 0, False
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name == f"{metric}_sum":
            total += float(line.rsplit(" ", 1)[1])
            seen = True
        elif name == f"{metric}_count":
            count += int(float(line.rsplit(" ", 1)[1]))
    return (total, count) if seen else None


async def start_profiler(path: Path | None, pid: int) -> asyncio.subprocess.Process | None:
    """``py-spy record`` attached to ``pid`` (without pausing it), or None."""
    if path is None:
        return None
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    proc = await asyncio.create_subprocess_exec(
        py_spy, "record", "--pid", str(pid), "--idle", "--nonblocking", "--rate", "200",
        "--format", "raw", "-o", str(path),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    await asyncio.sleep(1)  # attached
    return proc


async def stop_profiler(proc: asyncio.subprocess.Process | None) -> None:
    if proc is not None:
        proc.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
        await asyncio.wait_for(proc.wait(), 60)


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


# --- the run --------------------------------------------------------------------------------


def _progress(message: str) -> None:
    print(f"[peer-bench] {message}", file=sys.stderr, flush=True)


async def measure(
    opts: Options, cp: RealControlPlane, workdir: Path, cdi_base: Path, claim_get: list[float]
) -> list[Driver]:
    kubeconfig = cp.kubeconfig(ADMIN)
    ours = Driver(
        OURS, DRIVER_NAME, DRIVER_NAME, "bench-ours", _our_version(),
        workdir / OURS, cdi_base / OURS,
        _our_argv,
    )  # fmt: skip
    peer = Driver(
        PEER, PEER_DRIVER, PEER_DRIVER, "bench-peer", f"{PEER_MODULE} {peer_module().version}",
        workdir / PEER, cdi_base / PEER, _peer_argv,
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
            await _setup(kube, drivers, leases)
            await _measure(opts, kube, kubeconfig, drivers, claim_get)
        finally:
            for d in drivers:
                with contextlib.suppress(Exception):
                    await stop_plugin(d)
            for lease in leases:
                await lease.stop()
    return drivers


async def _setup(kube: KubeClient, drivers: Sequence[Driver], leases: list[NodeLease]) -> None:
    await ensure_namespace(kube, NAMESPACE)
    await ensure_device_classes(kube)
    with contextlib.suppress(AlreadyExistsError):
        await kube.resource(DEVICE_CLASSES).create(peer_device_class())
    for index, d in enumerate(drivers):
        await register_node(kube, SimNode(d.node, OUR_INSTANCE_TYPE), index)
        lease = NodeLease(kube, d.node)
        lease.start()
        leases.append(lease)

    async def default_sa() -> bool:
        try:
            await kube.resource(SERVICE_ACCOUNTS).get("default", NAMESPACE)
        except NotFoundError:
            return False
        return True

    await wait_for(default_sa, "the default ServiceAccount", 60)


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


def _our_version() -> str:
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
    workdir = opts.workdir or Path(tempfile.mkdtemp(prefix="ndra-peer-bench-", dir="/tmp"))
    own_workdir = opts.workdir is None
    cdi_base = Path(tempfile.mkdtemp(prefix="ndra-peer-cdi-", dir=tmpfs_dir()))
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
            _server_version(kubernetes),
            started,
            time.time(),
            {d.label: str(d.log) for d in drivers},
        )
    finally:
        cp.stop()
        shutil.rmtree(cdi_base, ignore_errors=True)
        if own_workdir and ok:
            shutil.rmtree(workdir, ignore_errors=True)
        elif not ok:
            _progress(f"failed: logs kept in {workdir}")


def _server_version(kubectl_json: str) -> str:
    import json

    info = json.loads(kubectl_json).get("serverVersion") or {}
    return str(info.get("gitVersion") or "?")
