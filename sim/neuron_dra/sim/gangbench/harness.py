"""The gang-start harness: a simulated cluster of UltraServers on a real control plane, and
``--runs`` applies of a 4 x 4 workload timed phase by phase.

Side effects live here (the control plane's processes, the cluster, ``kubectl``); the table
is :func:`report_table`, pure over :class:`GangRun` figures.
"""

from __future__ import annotations

import asyncio
import copy
import io
import json
import shutil
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from neuron_dra.common import constants as c
from neuron_dra.sim.commands.walkthrough import Walkthrough
from neuron_dra.sim.commands.walkthrough.seed000 import workload_for_sim
from neuron_dra.sim.commands.walkthrough.tools import ENV_RANK, ENV_RANK0
from neuron_dra.sim.controlplane.base import is_active
from neuron_dra.sim.paths import chart_crd_dir, repo_root
from neuron_dra.sim.peerbench.stats import percentile
from neuron_dra.sim.realcluster import ADMIN, RealControlPlane, bin_dir_for
from neuron_dra.sim.realcluster.processes import CONTROLLER_MANAGER, SCHEDULER
from neuron_dra.sim.realnode.podspec import for_real_nodes
from neuron_dra.sim.scratch import keep, work_dir
from neuron_dra.sim.simcluster import SimCluster, ultraservers
from neuron_dra.sim.simcluster.topology import ULTRASERVER_TYPE

from . import trace

T = TypeVar("T")
JsonDict = dict[str, Any]
NS = "default"
RESOURCE_V1 = "resource.k8s.io/v1"
TOPOLOGY_SIZE = 4
SPECS = repo_root() / "examples" / "specs"
#: Seed 000's Step 1 and Step 2 (the UltraServer Operator guide): the workload and its pods.
WORKLOAD_SPEC = SPECS / "ultraserver-workload.yaml"
DEPLOYMENT_SPEC = SPECS / "ultraserver-training-deployment.yaml"

#: Phases in the order they happen, each timed from the start of ``kubectl apply``.
PHASES: tuple[tuple[str, str], ...] = (
    ("applied", "kubectl apply returned"),
    ("template", "ResourceClaimTemplate created (controller)"),
    ("allocated", "workload Allocated (controller)"),
    ("tagged", "allocated nodes' slices tagged (kubelet plugins)"),
    ("created", "every claim created (resourceclaim controller)"),
    ("claims", "every claim allocated (kube-scheduler)"),
    ("prepared", "every pod Prepared with its rank"),
)


class RankError(AssertionError):
    """The pods were Prepared but their ranks are not the workload's."""


@dataclass(frozen=True)
class Options:
    runs: int = 20
    ultraservers: int = 6
    server_count: int = 4
    minor: str = "1.34"
    #: Bound for each awaited condition (seconds).
    limit: float = 120.0
    workdir: Path | None = None
    progress: bool = True
    #: The seed's order: apply the workload, wait for its ResourceClaimTemplate, then apply
    #: the Deployment (default: both in one ``kubectl apply -f``).
    two_step: bool = False
    #: Who runs the nodes: ``simulated`` kubelets (the recorded figures; 24 nodes fit) or
    #: ``real`` kubelets and containerd (a machine runs about a dozen).
    nodes: str = "simulated"
    #: Where the time goes (trace.py): the API server's audit log and the scheduler's and
    #: controller manager's metrics around each run, reported pod by pod; the work
    #: directory is kept. Costs the API server a little (its audit log).
    trace: bool = False
    #: ``-v`` of kube-scheduler and kube-controller-manager (a diagnosis; 0: their default).
    verbosity: int = 0
    #: Idle seconds before each apply. kube-controller-manager's clients may send 30
    #: requests at once and then 20 a second (its --kube-api-burst / --kube-api-qps
    #: defaults); the previous run's release spends the resourceclaim controller's budget
    #: (a GET, a status update and a DELETE per claim), so an apply right after it waits on
    #: that controller's client-side throttling. 2 s refills it: each run then measures an
    #: apply on an idle cluster. 0: back to back, as the first two rounds measured.
    settle: float = 2.0

    @property
    def pods(self) -> int:
        return self.server_count * TOPOLOGY_SIZE


@dataclass
class GangRun:
    index: int
    #: Phase name (:data:`PHASES`) -> seconds after ``kubectl apply`` started.
    phases: dict[str, float]
    ultraservers: list[str]
    #: ``kubectl delete`` started -> pods gone, claims unprepared, UltraServers Available.
    release: float = 0.0
    #: Wall-clock start of the apply and the moment every pod was Prepared (``--trace``).
    wall: tuple[float, float] = (0.0, 0.0)
    #: Component -> metric deltas over the run (``--trace``).
    metrics: dict[str, Any] | None = None
    #: CPU seconds this process (controller, plugins, simulated kubelets, the harness)
    #: used from the apply to every pod Prepared (``--trace``): near the wall time means
    #: they were starved of CPU.
    cpu: float = 0.0


@dataclass
class GangResult:
    options: Options
    runs: list[GangRun]
    kubernetes: str
    kubectl: str
    nodes: int
    #: Seconds from the control plane being up to every slice and UltraServer published.
    cluster_start: float
    started: float
    finished: float


# --- manifests --------------------------------------------------------------------------------


def manifests(name: str, server_count: int) -> list[JsonDict]:
    """The seed's workload (``topologySize: 4``, ``serverCount``) and its Deployment of
    ``4 x serverCount`` pods, renamed ``name`` / ``name-rct``: one ``kubectl apply -f``."""
    workload = workload_for_sim(yaml.safe_load(WORKLOAD_SPEC.read_text()), ULTRASERVER_TYPE)
    workload["metadata"] = {"name": name}
    workload["spec"]["topologySize"] = TOPOLOGY_SIZE
    workload["spec"]["serverCount"] = server_count
    workload["spec"]["resourceClaimTemplate"]["name"] = f"{name}-rct"
    deployment: JsonDict = copy.deepcopy(yaml.safe_load(DEPLOYMENT_SPEC.read_text()))
    deployment["metadata"] = {"name": name}
    spec = deployment["spec"]
    spec["replicas"] = server_count * TOPOLOGY_SIZE
    spec["selector"]["matchLabels"] = {"app": name}
    spec["template"]["metadata"]["labels"] = {"app": name}
    (claim,) = spec["template"]["spec"]["resourceClaims"]
    claim["resourceClaimTemplateName"] = f"{name}-rct"
    return [workload, deployment]


# --- the table (pure) -------------------------------------------------------------------------


def phase_seconds(runs: Sequence[GangRun], phase: str) -> list[float]:
    return [r.phases[phase] for r in runs]


def report_table(runs: Sequence[GangRun]) -> str:
    """Markdown: each phase since the apply (p50/p90/max over the runs) and the step from
    the phase before it (p50)."""
    lines = [
        f"| phase (seconds after `kubectl apply` started), n={len(runs)} | p50 | p90 | max "
        "| step p50 |",
        "|---|---:|---:|---:|---:|",
    ]
    previous: str | None = None
    for phase, label in PHASES:
        values = phase_seconds(runs, phase)
        steps = [r.phases[phase] - (r.phases[previous] if previous else 0.0) for r in runs]
        lines.append(
            f"| {label} | {percentile(values, 50):.2f} | {percentile(values, 90):.2f} "
            f"| {max(values):.2f} | {percentile(steps, 50):.2f} |"
        )
        previous = phase
    release = [r.release for r in runs]
    lines.append(
        f"| (after) `kubectl delete` → UltraServers free again | {percentile(release, 50):.2f} "
        f"| {percentile(release, 90):.2f} | {max(release):.2f} | |"
    )
    return "\n".join(lines)


# --- checks -----------------------------------------------------------------------------------


async def check_ranks(
    walk: Walkthrough, pods: Sequence[Mapping[str, Any]], workload: Mapping[str, Any]
) -> None:
    """What the e2e tests check of seed 000's workload, at 4 x ``serverCount``: ranks 0..n-1,
    one pod per allocated node, every rank told rank 0's address, 4 consecutive ranks per
    UltraServer, only the workload's UltraServers used."""
    sim = walk.sim
    ranks: dict[int, str] = {}
    hosts: set[str] = set()
    for pod in pods:
        view = await walk.view(pod)
        if ENV_RANK not in view.env or ENV_RANK0 not in view.env:
            raise RankError(f"pod {view.name} on {view.node}: no rank in {sorted(view.env)}")
        ranks[int(view.env[ENV_RANK])] = view.node
        hosts.add(view.env[ENV_RANK0])
    n = len(pods)
    if sorted(ranks) != list(range(n)):
        raise RankError(f"ranks {sorted(ranks)}, expected 0..{n - 1}")
    if len(set(ranks.values())) != n:
        raise RankError(f"two pods on one node: {ranks}")
    if hosts != {sim.node_address(ranks[0])}:
        raise RankError(f"rank-0 hosts {sorted(hosts)}, expected {sim.node_address(ranks[0])}")
    us_of = {node.name: node.ultraserver_id for node in sim.nodes}
    allocated = set((workload.get("status") or {}).get("allocatedUltraServers") or [])
    for first in range(0, n, TOPOLOGY_SIZE):
        unit = {us_of[ranks[r]] for r in range(first, first + TOPOLOGY_SIZE)}
        if len(unit) != 1 or not unit <= allocated:
            raise RankError(f"ranks {first}..{first + 3} on UltraServers {unit} ({allocated})")


def _tagged(sim: SimCluster) -> bool:
    return any(
        (d.get("attributes") or {}).get(c.ATTR_WORKLOAD_ID, {}).get("string")
        for s in sim.slices()
        for d in s["spec"].get("devices") or []
    )


def free(sim: SimCluster) -> bool:
    """Nothing of a run left: no pods, claims or workloads, every claim unprepared (CDI
    directories empty), every UltraServer Available and no slice tagged for a workload."""
    states = {(u.get("status") or {}).get("state") for u in sim.ultraservers()}
    return (
        sim.idle(NS)
        and not sim.view.list(c.CRD_API_VERSION, c.KIND_WORKLOAD, NS)
        and not sim.view.list(RESOURCE_V1, "ResourceClaimTemplate", NS)
        and states == {"Available"}
        and not _tagged(sim)
    )


# --- measuring --------------------------------------------------------------------------------


def _progress(opts: Options, text: str) -> None:
    if opts.progress:
        print(f"[gang-start] {text}", file=sys.stderr, flush=True)


async def kubectl(cp: RealControlPlane, *args: str) -> str:
    """The real kubectl of the control plane's minor, without blocking the event loop (the
    plugins, kubelets and controller share it)."""
    proc = await asyncio.create_subprocess_exec(
        str(cp.bin_dir / "kubectl"),
        "--kubeconfig",
        str(cp.kubeconfig(ADMIN)),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {err.decode().strip()}")
    return out.decode()


async def _timed(start: float, aw: Awaitable[T]) -> float:
    await aw
    return time.monotonic() - start


async def one_run(
    sim: SimCluster, cp: RealControlPlane, opts: Options, index: int, files: Path
) -> GangRun:
    name = f"gang-{index}"
    path = files / f"{name}.yaml"
    docs = manifests(name, opts.server_count)
    if sim.has_real_nodes:  # pods run as containers on this machine's real nodes
        docs = [for_real_nodes(d) for d in docs]
    path.write_text(yaml.safe_dump_all(docs))
    steps = [path]
    if opts.two_step:
        steps = [files / f"{name}-workload.yaml", files / f"{name}-deployment.yaml"]
        for step, doc in zip(steps, docs, strict=True):
            step.write_text(yaml.safe_dump(doc))
    n = opts.pods

    def state() -> bool:
        w = sim.workload(name, NS)
        return bool(w and (w.get("status") or {}).get("state") == "Allocated")

    def template() -> bool:
        return sim.view.get(RESOURCE_V1, "ResourceClaimTemplate", f"{name}-rct", NS) is not None

    def tagged() -> bool:
        # Any workload's tag: a run starts with none (``free``). Not gated on ``Allocated``:
        # the plugins tag as each NeuronUltraServer records its reservation, before the
        # workload's final status write.
        # Only the whole-node device, which the template selects: this runs on every API
        # write the cluster sees, in the process that also runs the controller and plugins.
        nodes = {
            s["spec"]["nodeName"]
            for s in sim.slices()
            for d in s["spec"].get("devices") or []
            if d.get("name") == c.NODE_DEVICE_NAME
            and (d.get("attributes") or {}).get(c.ATTR_WORKLOAD_ID, {}).get("string")
        }
        return len(nodes) >= n

    def created() -> bool:
        return len(sim.claims(NS)) >= n

    def claims() -> bool:
        done = [x for x in sim.claims(NS) if (x.get("status") or {}).get("allocation")]
        return len(done) >= n

    def prepared() -> list[JsonDict] | None:
        pods = [p for p in sim.pods(NS, f"app={name}") if is_active(p)]
        running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        return running if len(running) == n else None

    waits: dict[str, Callable[[], object]] = {
        "template": template,
        "allocated": state,
        "tagged": tagged,
        "created": created,
        "claims": claims,
        "prepared": prepared,
    }
    if opts.settle > 0:
        await asyncio.sleep(opts.settle)  # a fixed budget refills; no event tells when
    before = await _scrape(cp) if opts.trace else {}
    wall0, cpu0 = time.time(), time.process_time()
    start = time.monotonic()
    tasks = {
        phase: asyncio.ensure_future(
            _timed(start, sim.wait_until(pred, f"{name}: {phase}", opts.limit))
        )
        for phase, pred in waits.items()
    }
    try:
        await kubectl(cp, "apply", "-f", str(steps[0]))
        phases = {"applied": time.monotonic() - start}
        if len(steps) > 1:
            await tasks["template"]
            await kubectl(cp, "apply", "-f", str(steps[1]))
        for phase, task in tasks.items():
            phases[phase] = await task
    finally:
        for task in tasks.values():
            task.cancel()
    wall, cpu = (wall0, time.time()), time.process_time() - cpu0
    metrics = (
        {k: trace.delta(before[k], v) for k, v in (await _scrape(cp)).items()}
        if opts.trace
        else None
    )
    pods = prepared()
    workload = sim.workload(name, NS)
    assert pods is not None and workload is not None
    await check_ranks(Walkthrough(sim, io.StringIO()), pods, workload)
    used = sorted((workload.get("status") or {}).get("allocatedUltraServers") or [])

    start = time.monotonic()
    await kubectl(cp, "delete", "--wait=false", "-f", str(path))
    await sim.wait_until(lambda: free(sim), f"{name}: UltraServers free", opts.limit)
    return GangRun(
        index,
        phases,
        used,
        release=time.monotonic() - start,
        wall=wall,
        metrics=metrics,
        cpu=cpu,
    )


async def _scrape(cp: RealControlPlane) -> dict[str, dict[trace.MetricKey, float]]:
    scheduler, kcm = await asyncio.gather(
        asyncio.to_thread(cp.metrics, SCHEDULER), asyncio.to_thread(cp.metrics, CONTROLLER_MANAGER)
    )
    return {
        SCHEDULER: trace.parse_metrics(scheduler, trace.SCHEDULER_METRICS),
        CONTROLLER_MANAGER: trace.parse_metrics(kcm, trace.KCM_METRICS),
    }


def trace_report(runs: Sequence[GangRun], audit_log: Path) -> str:
    """Pod by pod, run by run (the audit log), then the summary and the metric deltas."""
    with audit_log.open() as f:
        writes = trace.parse_audit(f)
    per_run: list[list[trace.PodTimes]] = []
    out: list[str] = []
    for r in runs:
        t0, t1 = r.wall
        pods = trace.pod_times(writes, t0, t1, f"gang-{r.index}-")
        per_run.append(pods)
        skip = ("pods/binding", "resourceclaims/status", "leases")
        out += [
            f"== run {r.index}: this process's CPU {r.cpu:.2f} s in {t1 - t0:.2f} s; phases "
            + ", ".join(f"{k} {v:.3f}" for k, v in r.phases.items())
        ]
        out += [trace.pod_table(pods), *trace.others(writes, t0, t1, skip), ""]
    out += ["== summary", trace.summary(per_run), ""]
    for comp in (SCHEDULER, CONTROLLER_MANAGER):
        deltas = [(r.metrics or {}).get(comp, {}) for r in runs]
        out += [
            f"== {comp} metrics, summed over {len(runs)} runs",
            trace.metric_lines(deltas, ("",)),
            "",
        ]
    return "\n".join(out)


async def measure(opts: Options, cp: RealControlPlane, workdir: Path) -> GangResult:
    nodes = ultraservers(opts.ultraservers)
    begun = time.monotonic()
    files = workdir / "manifests"
    files.mkdir(parents=True, exist_ok=True)
    (workdir / "sim").mkdir(exist_ok=True)
    async with SimCluster(
        nodes,
        kubernetes="real",
        control_plane=cp,
        minor=opts.minor,
        limit=opts.limit,
        workdir=workdir / "sim",
        nodes_kind=opts.nodes,
    ) as sim:
        cluster_start = time.monotonic() - begun
        _progress(opts, f"{len(nodes)} nodes up in {cluster_start:.1f} s")
        # kubectl's discovery cache is filled once here, not on the first measured apply.
        await kubectl(cp, "api-resources", "-o", "name")
        runs: list[GangRun] = []
        for index in range(opts.runs):
            run = await one_run(sim, cp, opts, index, files)
            runs.append(run)
            _progress(
                opts,
                f"run {index + 1}/{opts.runs}: "
                + ", ".join(f"{k} {v:.2f}" for k, v in run.phases.items())
                + f"; released in {run.release:.2f} s",
            )
    return GangResult(opts, runs, "", "", len(nodes), cluster_start, 0.0, 0.0)


def run(opts: Options) -> GangResult:
    """Start a control plane (from the main thread, before any event loop: its children die
    with the thread that forked them), run the cluster and the runs on it, stop everything."""
    if opts.server_count > opts.ultraservers:
        raise ValueError(f"{opts.server_count} UltraServers wanted, {opts.ultraservers} exist")
    own = opts.workdir is None
    workdir = opts.workdir or work_dir("gang", Path("/tmp"))
    workdir.mkdir(parents=True, exist_ok=True)
    verbose = [f"-v={opts.verbosity}"] if opts.verbosity else []
    cp = RealControlPlane(
        bin_dir_for(opts.minor),
        opts.minor,
        workdir=workdir / "k8s",
        crd_paths=sorted(chart_crd_dir().glob("*.yaml")),
        audit_policy=trace.AUDIT_POLICY if opts.trace else None,
        component_args={SCHEDULER: verbose, CONTROLLER_MANAGER: verbose},
    )
    started = time.time()
    ok = False
    try:
        cp.start()
        versions = json.loads(cp.kubectl("version", "-o", "json"))
        result = asyncio.run(measure(opts, cp, workdir))
        result.kubernetes = str((versions.get("serverVersion") or {}).get("gitVersion") or "?")
        result.kubectl = str((versions.get("clientVersion") or {}).get("gitVersion") or "?")
        result.started, result.finished = started, time.time()
        if opts.trace:
            report = trace_report(result.runs, cp.audit_log)
            (workdir / "trace.txt").write_text(report)
            keep(workdir, "the gang-start trace")
            _progress(opts, f"trace in {workdir / 'trace.txt'} (logs in {cp.log_dir})")
        ok = True
        return result
    finally:
        cp.stop()
        if ok:
            cp.remove_files()  # a private work directory's control plane (see its doc)
        if own and ok and not opts.trace:
            shutil.rmtree(workdir, ignore_errors=True)
        elif not ok:
            keep(workdir, "a failed benchmark's logs")
            _progress(opts, f"failed: logs kept in {workdir}")
