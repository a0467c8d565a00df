"""``hack/bench/peer --kubelets real``: both drivers as real kubelets see them.

Two real nodes (a real kubelet and containerd each, :mod:`neuron_dra.sim.realnode`) on a real
control plane; our plugin registered with one kubelet, the Go peer's with the other. Both run
as host processes, as in the harness, with their kubelet's registration and plugin
directories and the CDI directory its containerd reads (the node's private ``/var/lib`` and
``/run`` seen from the host; the endpoint each reports is a host path under ``/tmp``, which
the node's mount namespace shares). They reach the API server directly, without the node's
relay, as the harness's plugins do.

Then rounds of: one pod per driver, each with one one-device claim (from a
ResourceClaimTemplate), created together; wait until both are Running (a watch); delete
both; wait until both are gone (``--one-at-a-time``: each driver's pod alone, in turn).
After each round each kubelet's ``/metrics`` is read: the difference of its DRA histograms'
sums across the round is that round's Prepare and Unprepare as the kubelet timed them
(:mod:`.kubeletmetrics`: the buckets start at 100 ms, too coarse for a few-millisecond call).

``--ours floor`` puts the floor plugin (:mod:`.floorplugin`: a claim GET and the answer, no
more) in our plugin's slot, with a DeviceClass and template of its own driver, so that the
same rounds measure the least a Python plugin costs against the peer; ``--ours floor-files``
the same plus the file work of a correct driver (a CDI spec per claim, a checkpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from neuron_dra.common.constants import DRIVER_NAME
from neuron_dra.common.k8s.client import (
    NODES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    KubeClient,
    connect,
)
from neuron_dra.common.k8s.errors import AlreadyExistsError, GoneError, NotFoundError
from neuron_dra.sim.paths import chart_crd_dir
from neuron_dra.sim.peerbuild import PEER_MODULE, peer_binary, peer_module
from neuron_dra.sim.realcluster import ADMIN, RealControlPlane, bin_dir_for, free_port
from neuron_dra.sim.realnode.fleet import RealNodeFleet
from neuron_dra.sim.realnode.images import TEST_IMAGE
from neuron_dra.sim.realnode.layout import KUBELET_ROOT, NodeLayout
from neuron_dra.sim.realnode.node import RealNode
from neuron_dra.sim.scratch import keep, work_dir
from neuron_dra.sim.waiting import Listeners, wait_until

from . import kubeletmetrics as km
from .apiserver import setup_classes, wait_for
from .driver import (
    FLOORS,
    NAMESPACE,
    OUR_INSTANCE_TYPE,
    OURS_PLUGIN,
    PEER_DRIVER,
    Driver,
    our_argv,
    peer_argv,
)
from .floorplugin import FLOOR_DRIVER
from .harness import our_version, server_version
from .observe import (
    OUR_PREPARE_METRIC,
    PEER_PREPARE_METRIC,
    compile_project,
    our_http_port,
    prepare_metric,
    start_profiler,
    stop_profiler,
    tmpfs_dir,
)
from .plugins import alternating, start_plugin, stop_plugin
from .stats import OURS, PEER, KubeletView

NODE_LABELS = {"node.kubernetes.io/instance-type": OUR_INSTANCE_TYPE}
#: How often a kubelet's /metrics is read again while a round's Unprepare is not counted
#: yet: the kubelet reports it on no stream (the pod's deletion can reach the API server
#: before the count moves).
SCRAPE_POLL = 0.05


@dataclass(frozen=True)
class RealOptions:
    minor: str = "1.34"
    rounds: int = 100
    #: Unmeasured rounds first (the first waits for both registrations).
    warmup_rounds: int = 5
    workdir: Path | None = None
    compile: bool = True
    #: Bound for each awaited condition (seconds).
    limit: float = 120.0
    #: Sample our plugin with ``py-spy record --pid`` over the measured rounds into this file.
    profile_ours: Path | None = None
    #: Both drivers' pods at once (they share the CPUs at the moment of the calls), or one
    #: driver's pod after the other's is gone (``--one-at-a-time``).
    together: bool = True
    #: What runs in ours's slot: our plugin, or the floor plugin (:mod:`.floorplugin`).
    ours: str = OURS_PLUGIN


@dataclass
class RealResult:
    ours: KubeletView
    peer: KubeletView
    kubernetes: str
    started: float
    finished: float
    #: Seconds from creating both pods to both Running, per measured round.
    to_running: list[float] = field(default_factory=list)
    #: The kubelet's bucket bounds (seconds), as read.
    bucket_bounds: list[float] = field(default_factory=list)
    together: bool = True
    #: What ran in ours's slot (``RealOptions.ours``).
    ours_plugin: str = OURS_PLUGIN


def _progress(message: str) -> None:
    print(f"[peer-bench real] {message}", file=sys.stderr, flush=True)


def round_pod(d: Driver, name: str) -> dict[str, Any]:
    """One pod on the driver's node with one claim from the driver's template."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": d.node},
            "hostNetwork": True,  # the real nodes have no pod network to spare
            "containers": [
                {
                    "name": "c",
                    "image": TEST_IMAGE,
                    "command": ["sleep", "3600"],
                    "resources": {"claims": [{"name": "dev"}]},
                }
            ],
            "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": template_name(d)}],
        },
    }


def template_name(d: Driver) -> str:
    return f"{d.label}-one"


def claim_template(d: Driver) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": template_name(d), "namespace": NAMESPACE},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "dev", "exactly": {"deviceClassName": d.device_class, "count": 1}}
                    ]
                }
            }
        },
    }


class PodWatch:
    """The namespace's pods by name -> phase, kept by a watch; listeners hear every change."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.phases: dict[str, str] = {}
        self.listeners: Listeners = []
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        rv = await self._relist()
        self._task = asyncio.create_task(self._run(rv), name="pod-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _relist(self) -> str:
        got = await self.kube.resource(PODS).list(NAMESPACE)
        self.phases = {
            p["metadata"]["name"]: (p.get("status") or {}).get("phase", "")
            for p in got.get("items") or []
        }
        self._changed()
        return str(got["metadata"]["resourceVersion"])

    def _changed(self) -> None:
        for listener in list(self.listeners):
            listener()

    async def _run(self, rv: str) -> None:
        while True:
            try:
                async with await self.kube.resource(PODS).watch(
                    NAMESPACE, resource_version=rv, timeout_seconds=300
                ) as stream:
                    async for event in stream:
                        meta = event.object.get("metadata") or {}
                        rv = str(meta.get("resourceVersion") or rv)
                        if event.type == "BOOKMARK":
                            continue
                        if event.type == "DELETED":
                            self.phases.pop(meta["name"], None)
                        else:
                            status = event.object.get("status") or {}
                            self.phases[meta["name"]] = status.get("phase", "")
                        self._changed()
            except GoneError:
                rv = await self._relist()

    async def wait(self, predicate: Callable[[], bool], what: str, limit: float) -> None:
        await wait_until(predicate, what, limit, [self.listeners])


class KubeletMetrics:
    """Reads a real node's kubelet's ``/metrics`` over its port on the host's loopback (the
    node's relay), with a client certificate of the run's CA (the kubelet trusts it)."""

    def __init__(self, cp: RealControlPlane) -> None:
        cfg = cp.client_configuration(ADMIN)
        ctx = ssl.create_default_context()
        ctx.check_hostname = False  # the kubelet's self-signed serving certificate
        ctx.verify_mode = ssl.CERT_NONE
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        self._ssl = ctx
        self._http: aiohttp.ClientSession | None = None

    async def text(self, node: RealNode) -> str:
        if self._http is None:
            self._http = aiohttp.ClientSession()
        url = f"https://127.0.0.1:{node.spec.kubelet_port}/metrics"
        async with self._http.get(url, ssl=self._ssl) as resp:
            resp.raise_for_status()
            return await resp.text()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()


@dataclass
class Scrape:
    """One kubelet's four histograms at one moment."""

    prepare: km.Histogram | None
    unprepare: km.Histogram | None
    prepare_step: km.Histogram | None
    unprepare_step: km.Histogram | None

    @staticmethod
    def of(text: str, driver: str) -> Scrape:
        return Scrape(
            km.histogram(text, km.GRPC_METRIC, km.grpc_match(driver, km.PREPARE_METHOD)),
            km.histogram(text, km.GRPC_METRIC, km.grpc_match(driver, km.UNPREPARE_METHOD)),
            km.histogram(text, km.OPERATIONS_METRIC, km.operation_match("PrepareResources")),
            km.histogram(text, km.OPERATIONS_METRIC, km.operation_match("UnprepareResources")),
        )

    def moved_past(self, before: Scrape) -> bool:
        """Whether both the Prepare and the Unprepare of a round are counted."""
        return _count(self.prepare) > _count(before.prepare) and _count(self.unprepare) > _count(
            before.unprepare
        )


def _node_exists(kube: KubeClient, name: str) -> Callable[[], Awaitable[bool]]:
    async def exists() -> bool:
        try:
            await kube.resource(NODES).get(name)
        except NotFoundError:
            return False
        return True

    return exists


def _count(h: km.Histogram | None) -> float:
    return h.count if h is not None else 0.0


async def scrape_after_round(
    metrics: KubeletMetrics, node: RealNode, d: Driver, before: Scrape, limit: float
) -> Scrape:
    deadline = time.monotonic() + limit
    while True:
        now = Scrape.of(await metrics.text(node), d.driver_name)
        if now.moved_past(before):
            return now
        if time.monotonic() > deadline:
            raise TimeoutError(f"{d.label}: the kubelet counted no Prepare + Unprepare")
        await asyncio.sleep(SCRAPE_POLL)


def record(view: KubeletView, after: Scrape, before: Scrape) -> None:
    """One round's figures into ``view``: each only when it was one observation."""
    calls = (
        (view.prepare, after.prepare, before.prepare),
        (view.unprepare, after.unprepare, before.unprepare),
        (view.prepare_step, after.prepare_step, before.prepare_step),
        (view.unprepare_step, after.unprepare_step, before.unprepare_step),
    )
    got = [km.per_call(a, b) for _, a, b in calls]
    if any(g is None for g in got[:2]):
        view.skipped += 1
        return
    for (into, _, _), value in zip(calls, got, strict=True):
        if value is not None:
            into.append(value)


async def one_round(
    kube: KubeClient, pods: PodWatch, drivers: list[Driver], i: int, opts: RealOptions
) -> float:
    """Both pods together (created, Running, deleted, gone), or each driver's alone, the
    first one first on even rounds; seconds from the creates to Running (added up)."""
    if opts.together:
        return await _pods_round(kube, pods, drivers, i, opts.limit)
    took = 0.0
    for d in alternating(drivers, i):
        took += await _pods_round(kube, pods, [d], i, opts.limit)
    return took


async def _pods_round(
    kube: KubeClient, pods: PodWatch, drivers: list[Driver], i: int, limit: float
) -> float:
    """Create the drivers' pods, wait until all run, delete them, wait until all are gone;
    seconds from the creates to all Running."""
    names = [f"{d.label}-{i}" for d in drivers]
    api = kube.resource(PODS)
    t0 = time.perf_counter()
    made = [round_pod(d, n) for d, n in zip(drivers, names, strict=True)]
    await asyncio.gather(*(api.create(pod, NAMESPACE) for pod in made))
    await pods.wait(
        lambda: all(pods.phases.get(n) == "Running" for n in names), f"pods {names} Running", limit
    )
    took = time.perf_counter() - t0
    await asyncio.gather(*(api.delete(n, NAMESPACE) for n in names))
    await pods.wait(lambda: not any(n in pods.phases for n in names), f"{names} gone", limit)
    return took


async def measure_real(
    opts: RealOptions, cp: RealControlPlane, nodes: dict[str, RealNode], result: RealResult
) -> None:
    kubeconfig = cp.kubeconfig(ADMIN)
    drivers = [_driver(OURS, nodes[OURS], opts.ours), _driver(PEER, nodes[PEER], opts.ours)]
    views = {OURS: result.ours, PEER: result.peer}
    metrics = KubeletMetrics(cp)
    async with await connect(kubeconfig) as kube:
        pods = PodWatch(kube)
        try:
            # Ours's classes are always made; the peer's and the floor's are one per driver.
            await setup_classes(
                kube, [d.driver_name for d in drivers if d.driver_name != DRIVER_NAME]
            )
            for d in drivers:
                # Each plugin owns its slices by its Node, which the kubelet registers a
                # moment after it turns healthy.
                await wait_for(_node_exists(kube, d.node), f"Node {d.node}", opts.limit)
                with contextlib.suppress(AlreadyExistsError):
                    await kube.resource(RESOURCE_CLAIM_TEMPLATES).create(claim_template(d))
                took = await start_plugin(d, kube, kubeconfig)
                _progress(f"{d.label} published its slice {took:.2f} s after its start")
            await pods.start()
            last = {
                d.label: Scrape.of(await metrics.text(nodes[d.label]), d.driver_name)
                for d in drivers
            }
            first: dict[str, Scrape] = {}
            profiler: asyncio.subprocess.Process | None = None
            own0: dict[str, tuple[float, int] | None] = {}
            for i in range(opts.warmup_rounds + opts.rounds):
                if i == opts.warmup_rounds:
                    first = dict(last)
                    if opts.ours == OURS_PLUGIN:  # the floor serves no metrics
                        # Printed once it serves: by now (registered, pods prepared), surely.
                        drivers[0].metrics_port = our_http_port(drivers[0].log)
                    own0 = {d.label: await prepare_metric(d) for d in drivers}
                    profiler = await start_profiler(opts.profile_ours, drivers[0].pid)
                    _progress(f"{opts.warmup_rounds} warm-up rounds done")
                took = await one_round(kube, pods, drivers, i, opts)
                for d in drivers:
                    now = await scrape_after_round(
                        metrics, nodes[d.label], d, last[d.label], opts.limit
                    )
                    if i >= opts.warmup_rounds:
                        record(views[d.label], now, last[d.label])
                    last[d.label] = now
                if i >= opts.warmup_rounds:
                    result.to_running.append(took)
                    done = i + 1 - opts.warmup_rounds
                    if done % 20 == 0:
                        _progress(f"{done}/{opts.rounds} rounds")
            await stop_profiler(profiler)
            for d in drivers:
                _finish(views[d.label], last[d.label], first.get(d.label), result)
                before, after = own0.get(d.label), await prepare_metric(d)
                if before is not None and after is not None and after[1] > before[1]:
                    views[d.label].own_prepare_mean = (after[0] - before[0]) / (
                        after[1] - before[1]
                    )
        finally:
            await pods.stop()
            await metrics.close()
            for d in drivers:
                with contextlib.suppress(Exception):
                    await stop_plugin(d)


def _finish(view: KubeletView, last: Scrape, first: Scrape | None, result: RealResult) -> None:
    if last.prepare is None:
        return
    delta = last.prepare.minus(first.prepare if first else None)
    view.prepare_buckets = delta.buckets
    view.prepare_bucket_p50 = km.bucket_quantile(delta, 0.50)
    view.prepare_bucket_p99 = km.bucket_quantile(delta, 0.99)
    result.bucket_bounds = delta.finite_bounds


def _driver(label: str, node: RealNode, ours: str) -> Driver:
    """The driver of ``label`` on its node (in ours's slot, what ``ours`` names): its
    kubelet's registration and plugins directories and the CDI directory that node's
    containerd reads, as host paths."""
    root = node.layout.host_path(KUBELET_ROOT)
    if label == OURS and ours in FLOORS:
        version, argv, _ = FLOORS[ours]
        d = Driver(
            OURS, FLOOR_DRIVER, FLOOR_DRIVER, node.name, version, root,
            node.layout.cdi_dir, argv,
        )  # fmt: skip
    elif label == OURS:
        d = Driver(
            OURS, DRIVER_NAME, DRIVER_NAME, node.name, our_version(), root,
            node.layout.cdi_dir, our_argv,
        )  # fmt: skip
        d.prepare_metric = OUR_PREPARE_METRIC
    else:
        d = Driver(
            PEER, PEER_DRIVER, PEER_DRIVER, node.name, f"{PEER_MODULE} {peer_module().version}",
            root, node.layout.cdi_dir, peer_argv,
        )  # fmt: skip
        d.metrics_port, d.prepare_metric = free_port(), PEER_PREPARE_METRIC
    d.log_dir = node.layout.log_dir
    for path in (d.registrar, d.plugins_dir, d.cdi_root):
        path.mkdir(parents=True, exist_ok=True)
    return d


def cdi_on_tmpfs(node_root: Path, base: Path) -> Path:
    """Make the node's ``/var/run/cdi`` a directory of ``base`` (tmpfs), before the node
    exists: on a node ``/run`` is a tmpfs, where our CDI spec's fsyncs cost nothing, but a
    real node here keeps its ``/run`` on the work directory's disk. A symlink, because the
    plugins run on the host and containerd inside the node's mount namespace, where the
    host's ``/dev/shm`` is the same."""
    link = NodeLayout(node_root.name, node_root).cdi_dir
    target = base / node_root.name
    target.mkdir(parents=True, exist_ok=True)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target, target_is_directory=True)
    return target


def run_real(opts: RealOptions) -> RealResult:
    """Start a control plane and two real nodes (from the main thread: their processes die
    with it), measure both drivers through their kubelets, stop everything."""
    if opts.compile:
        compile_project()
    peer_binary()  # fail early, saying how to build it
    # Short: the nodes' socket paths under it must fit a sun_path.
    workdir = opts.workdir or work_dir("pk", Path("/tmp"))
    workdir.mkdir(parents=True, exist_ok=True)
    cp = RealControlPlane(
        bin_dir_for(opts.minor),
        opts.minor,
        workdir=workdir / "k8s",
        crd_paths=sorted(chart_crd_dir().glob("*.yaml")),  # our plugin watches NeuronUltraServers
    )
    fleet: RealNodeFleet | None = None
    cdi_base = work_dir("pk-cdi", Path(tmpfs_dir() or "/tmp"))
    ok = False
    started = time.time()
    try:
        cp.start()
        fleet = RealNodeFleet(cp, workdir=workdir / "n")
        names = [f"bk-{OURS}", f"bk-{PEER}"]
        for name in names:
            cdi_on_tmpfs(workdir / "n" / name, cdi_base)
        started_nodes = fleet.start([(name, NODE_LABELS) for name in names])
        nodes = dict(zip((OURS, PEER), started_nodes, strict=True))
        _progress("control plane and two real nodes up")
        result = RealResult(
            KubeletView(OURS, FLOORS[opts.ours][0] if opts.ours in FLOORS else our_version()),
            KubeletView(PEER, f"{PEER_MODULE} {peer_module().version}"),
            server_version(cp.kubectl("version", "-o", "json")),
            started,
            0.0,
            together=opts.together,
            ours_plugin=opts.ours,
        )
        asyncio.run(measure_real(opts, cp, nodes, result))
        result.finished = time.time()
        ok = True
        return result
    finally:
        if fleet is not None:
            fleet.stop()
        cp.stop()
        shutil.rmtree(cdi_base, ignore_errors=True)
        if ok:
            cp.remove_files()
        if ok and opts.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
        elif not ok:
            keep(workdir, "a failed benchmark's logs")
            _progress(f"failed: logs kept in {workdir}")
