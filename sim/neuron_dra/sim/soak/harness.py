"""The chaos soak (issue 13): the whole system as separate processes on a real control plane,
a churn of workloads and claims, and kill -9 of every kind of process at random times, with
the promises users rely on checked all along and once everything has settled.

Processes (all on loopback, under one work directory, all started from the main thread with
``PR_SET_PDEATHSIG``, so a killed soak leaves nothing behind):

- etcd, kube-apiserver, kube-controller-manager, kube-scheduler (:mod:`..realcluster`; etcd's
  data dir survives its restarts);
- two ``neuron-dra-controller`` replicas with Lease leader election;
- one ``neuron-dra-kubelet-plugin`` per simulated node (UltraServers of 4 trn2u.48xlarge);
- in this process: the simulated kubelets (:class:`..controlplane.SimKubelet`, which call the
  plugins over their gRPC sockets), the nodes' registration and Lease renewal, the churn and
  the checker.

A dead process is restarted by a supervisor, as the kubelet restarts a container (a
controller replica that loses its lease exits on purpose and is restarted this way too).
A restarted plugin is registered again by its node's kubelet, as the kubelet's plugin
watcher does when the registration socket is re-created.

The fault schedule and the churn's choices are drawn from ``random.Random(seed)``: the same
seed replays the same sequence of faults and operations (timing, and so the interleaving
with the system's own work, differs between runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from neuron_dra.common.constants import (
    ATTR_WORKLOAD_ID,
    DRIVER_NAME,
    DRIVER_NAMESPACE,
    LABEL_WORKLOAD_ID,
)
from neuron_dra.common.k8s.client import (
    LEASES,
    NEURON_ULTRASERVER_WORKLOADS,
    NEURON_ULTRASERVERS,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    KubeClient,
    connect,
)
from neuron_dra.common.k8s.errors import NotFoundError
from neuron_dra.common.ultraserver import workload_id
from neuron_dra.nodeplugin.cdi import list_cdi_specs
from neuron_dra.nodeplugin.kubeletclient import KubeletClient
from neuron_dra.sim.controlplane import ControlPlane, ensure_device_classes
from neuron_dra.sim.realcluster import (
    ADMIN,
    APISERVER,
    CONTROLLER_MANAGER,
    ETCD,
    SCHEDULER,
    RealControlPlane,
    _die_with_parent,
    bin_dir_for,
)
from neuron_dra.sim.simcluster.realworld import (
    DEPLOYMENTS,
    SERVICE_ACCOUNTS,
    NodeLease,
    ensure_namespace,
    register_node,
)
from neuron_dra.sim.simcluster.topology import SimNode, ultraservers

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]
NS = "default"
CONTROLLER_LEASE = "neuron-dra-controller"
TOPOLOGY_SIZE = 4
INSTANCE_TYPE = "trn2u.48xlarge"

# Fault kinds (the process that gets kill -9).
LEADER = "controller-leader"
STANDBY = "controller-standby"
PLUGIN = "plugin"
FAULT_WEIGHTS: dict[str, int] = {
    LEADER: 3,
    STANDBY: 2,
    PLUGIN: 4,
    SCHEDULER: 1,
    CONTROLLER_MANAGER: 1,
    APISERVER: 2,
    ETCD: 2,
}
CONTROL_PLANE = (ETCD, APISERVER, CONTROLLER_MANAGER, SCHEDULER)
#: Longest nodes directory that leaves room for ``/<node>/plugins/<driver>/dra.sock``.
SHORT_PATH = 50


@dataclass
class Options:
    minutes: float = 5.0
    seed: int = 1
    nodes: int = 16
    minor: str = "1.34"
    workdir: Path | None = None
    #: Mean seconds between two faults (each waits for the system to be whole again).
    fault_interval: float = 20.0
    #: Mean seconds between two churn operations.
    op_interval: float = 1.5
    #: A deleted workload's devices must be free this long after the system is whole.
    free_bound: float = 60.0
    #: How long the system may take to be whole after a fault, or to converge at the end.
    recover_limit: float = 180.0
    converge_limit: float = 240.0
    keep: bool = False
    quiet: bool = False


SETPRIV = shutil.which("setpriv")


def popen(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start a child in its own session that dies with us (parent-death signal).

    The signal is set by ``setpriv --pdeathsig KILL`` (util-linux) where there is one: a
    ``preexec_fn`` runs Python between fork and exec, which is unsafe in a process with
    threads (gRPC's, asyncio's workers) and was seen to kill a freshly forked etcd with
    SIGSEGV before it ran."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [SETPRIV, "--pdeathsig", "KILL", "--", *argv] if SETPRIV else argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=None if SETPRIV else _die_with_parent,
        )


@dataclass
class Child:
    """One of our processes: a controller replica or a node's plugin."""

    name: str
    kind: str  # "controller" | "plugin"
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    log_offset: int = 0
    #: Down on purpose (a fault in progress): the supervisor leaves it alone.
    held: bool = False
    pids: list[int] = field(default_factory=list)
    starts: int = 0

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log_offset = self.log.stat().st_size if self.log.exists() else 0
        self.proc = popen(self.argv, self.log)
        self.pids.append(self.proc.pid)
        self.started_at = time.monotonic()
        self.starts += 1

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def terminate(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=20)

    def http_port(self) -> int | None:
        """The port the current process printed (``...: http port N``)."""
        try:
            with self.log.open("rb") as f:
                f.seek(self.log_offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return None
        found = re.findall(r": http port (\d+)", text)
        return int(found[-1]) if found else None

    @property
    def identity(self) -> str | None:
        """A controller's leader-election identity (``default_identity()``)."""
        if self.proc is None:
            return None
        return f"{socket.gethostname()}_{self.proc.pid}"


@dataclass
class Workload:
    name: str
    server_count: int
    mode: str  # "pods" | "deployment"
    created_at: float
    pods_created: bool = False
    wid: str | None = None


@dataclass
class Fault:
    at: float  # seconds into the run (planned)
    kind: str
    target: str  # process name
    downtime: float
    done_at: float | None = None
    recovery: float | None = None


def _percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def _slice_tags(slices: Iterable[JsonDict]) -> set[tuple[str, str]]:
    """(node, workloadId) for every device of our driver tagged with a workloadId."""
    out: set[tuple[str, str]] = set()
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != DRIVER_NAME:
            continue
        node = str(spec.get("nodeName") or "")
        for device in spec.get("devices") or []:
            for key, value in (device.get("attributes") or {}).items():
                if key.split("/")[-1] == ATTR_WORKLOAD_ID and isinstance(value, dict):
                    out.add((node, str(value.get("string"))))
    return out


def _entries(nus_objects: Iterable[JsonDict]) -> list[tuple[str, JsonDict]]:
    return [
        (str(n["metadata"]["name"]), e)
        for n in nus_objects
        for e in (n.get("status") or {}).get("allocations") or []
    ]


def _allocated_devices(claim: JsonDict) -> list[tuple[str, str]]:
    alloc = (claim.get("status") or {}).get("allocation") or {}
    return [
        (str(r.get("pool")), str(r.get("device")))
        for r in (alloc.get("devices") or {}).get("results") or []
        if r.get("driver") == DRIVER_NAME
    ]


class PluginStartError(RuntimeError):
    """A plugin died before registering: no retry helps (bad flags, a path too long)."""


class Soak:
    def __init__(self, options: Options) -> None:
        self.o = options
        self.rng = random.Random(options.seed)
        self.fault_rng = random.Random(options.seed * 7919 + 1)
        if options.nodes % TOPOLOGY_SIZE:
            raise ValueError(f"--nodes must be a multiple of {TOPOLOGY_SIZE}")
        self.nodes: list[SimNode] = ultraservers(options.nodes // TOPOLOGY_SIZE)
        self.workdir = options.workdir or Path(tempfile.mkdtemp(prefix="ndra-soak-", dir="/tmp"))
        self.nodes_dir = self._short_nodes_dir()
        self.cp: RealControlPlane | None = None
        self.kube: KubeClient | None = None  # churn + checker
        self.kubelet_kube: KubeClient | None = None
        self.sim: ControlPlane | None = None
        self.leases: list[NodeLease] = []
        self.children: dict[str, Child] = {}
        self.events: deque[str] = deque(maxlen=200)
        self.t0 = time.monotonic()
        self.violations: list[JsonDict] = []
        self.faults: list[Fault] = []
        self.ops: Counter[str] = Counter()
        self.op_failures: Counter[str] = Counter()
        self.self_exits: Counter[str] = Counter()
        self.workloads: dict[str, Workload] = {}
        self.plain: dict[str, str] = {}  # claim name → pod name
        self.pending_free: dict[str, tuple[float, str]] = {}  # wid → (deleted at, name)
        self.free_latency: list[float] = []
        self.whole_since: float | None = None
        self.counter = 0
        self.checks = 0
        self.http: aiohttp.ClientSession | None = None
        self._stop = asyncio.Event()
        #: Control-plane components down on purpose (a fault in progress).
        self._held_cp: set[str] = set()
        self._faults_over = False
        self._wake_faults = asyncio.Event()

    # --- bookkeeping ---------------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() - self.t0

    def event(self, text: str) -> None:
        line = f"{self.now():8.1f}s {text}"
        self.events.append(line)
        if not self.o.quiet:
            print(line, flush=True)

    def violate(self, kind: str, detail: str) -> None:
        record = {"at": round(self.now(), 1), "kind": kind, "detail": detail}
        self.violations.append(record)
        report = [
            f"VIOLATION {kind}: {detail}",
            f"  replay: hack/soak --seed {self.o.seed} --minutes {self.o.minutes:g} "
            f"--nodes {self.o.nodes} --minor {self.o.minor}",
            "  faults so far:",
            *(
                f"    {f.done_at or f.at:8.1f}s {f.kind} {f.target} (down {f.downtime:.1f}s)"
                for f in self.faults
                if f.done_at is not None
            ),
            "  last events:",
            *(f"    {e}" for e in list(self.events)[-40:]),
        ]
        print("\n".join(report), file=sys.stderr, flush=True)
        (self.workdir / "violations.log").open("a").write("\n".join(report) + "\n")

    def name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}-{self.counter}"

    # --- paths ---------------------------------------------------------------------------

    def _short_nodes_dir(self) -> Path:
        """Where the nodes' kubelet directories live. A plugin's socket path
        (``<dir>/<node>/plugins/neuron.aws.com/dra.sock``) must fit the 107 bytes of a Unix
        socket address, so a long work directory (pytest's) gets its nodes in a short
        directory under /tmp, linked from ``<workdir>/nodes`` so a kept work directory still
        holds everything."""
        nodes = self.workdir / "nodes"
        if len(str(nodes)) <= SHORT_PATH:
            return nodes
        short = Path(tempfile.mkdtemp(prefix="ndra-n-", dir="/tmp"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        nodes.unlink(missing_ok=True)
        nodes.symlink_to(short)
        return short

    def node_root(self, node: str) -> Path:
        return self.nodes_dir / node

    def cdi_root(self, node: str) -> Path:
        return self.node_root(node) / "cdi"

    def registrar_dir(self, node: str) -> Path:
        return self.node_root(node) / "registry"

    def checkpoint(self, node: str) -> Path:
        return self.node_root(node) / "plugins" / DRIVER_NAME / "checkpoint.json"

    # --- start and stop ------------------------------------------------------------------

    async def start(self) -> None:
        from neuron_dra.sim.paths import chart_crd_dir

        self.event(f"workdir {self.workdir}; {len(self.nodes)} nodes; seed {self.o.seed}")
        self.cp = RealControlPlane(
            bin_dir_for(self.o.minor),
            self.o.minor,
            workdir=self.workdir / "k8s",
            crd_paths=sorted(chart_crd_dir().glob("*.yaml")),
        )
        self.cp.start()  # from the main thread: its children die with us
        admin = self.cp.kubeconfig(ADMIN)
        self.kube = await connect(admin)
        self.kubelet_kube = await connect(admin)
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3))
        await ensure_namespace(self.kube, DRIVER_NAMESPACE)
        await self._wait(self._default_service_account, "default ServiceAccount", 60)
        await ensure_device_classes(self.kube)
        for index, node in enumerate(self.nodes):
            await register_node(self.kube, node, index)
            lease = NodeLease(self.kubelet_kube, node.name)
            lease.start()
            self.leases.append(lease)
            self.node_root(node.name).mkdir(parents=True, exist_ok=True)
        py = sys.executable
        procs = [py, "-m", "neuron_dra.sim.soak.procs"]
        for node in self.nodes:
            root = self.node_root(node.name)
            self.children[node.name] = Child(
                node.name,
                PLUGIN,
                [
                    *procs, "plugin", "--node-name", node.name, "--kubeconfig", str(admin),
                    "--cdi-root", str(self.cdi_root(node.name)),
                    "--kubelet-registrar-directory-path", str(self.registrar_dir(node.name)),
                    "--kubelet-plugins-directory-path", str(root / "plugins"),
                    "--emulation-mode", node.instance_type,
                    "--emulated-ultraserver-id", str(node.ultraserver_id),
                    "--emulated-ultraserver-node-id", str(node.ultraserver_node_id),
                    "--http-port", "0",
                ],
                self.workdir / "logs" / f"plugin-{node.name}.log",
            )  # fmt: skip
        for i in range(2):
            name = f"controller-{i}"
            self.children[name] = Child(
                name,
                "controller",
                [
                    *procs, "controller", "--kubeconfig", str(admin), "--leader-elect",
                    "--http-port", "0",
                ],
                self.workdir / "logs" / f"{name}.log",
            )  # fmt: skip
        for child in self.children.values():
            child.start()
        self.sim = ControlPlane(
            self.kubelet_kube,
            registrar_dirs={n.name: self.registrar_dir(n.name) for n in self.nodes},
            simulate_control_plane=False,
        )
        await self.sim.start()
        await self._wait(self._all_registered, "every plugin registered", 180)
        want = len(self.nodes) // TOPOLOGY_SIZE
        await self._wait(self._whole, "the system whole", self.o.recover_limit)

        async def discovered() -> bool:
            assert self.kube is not None
            items = (await self.kube.resource(NEURON_ULTRASERVERS).list_all(DRIVER_NAMESPACE)).items
            return len(items) >= want

        await self._wait(discovered, f"{want} NeuronUltraServers", 120)
        self.event(f"started in {self.now():.1f}s")

    async def _all_registered(self) -> bool | str:
        """True once every node's kubelet registered its plugin; else which have not, with
        the last line a dead plugin wrote (a plugin that cannot start says why there)."""
        assert self.sim is not None
        waiting = [n for n, k in self.sim.kubelets.items() if not k.registered.is_set()]
        if not waiting:
            return True
        dead = [self.children[n] for n in waiting if not self.children[n].running()]
        if dead:
            lines = dead[0].log.read_text(errors="replace").strip().splitlines() or ["(empty)"]
            raise PluginStartError(f"plugin {dead[0].name} exited: {lines[-1]}")
        return f"not yet registered: {waiting}"

    async def _default_service_account(self) -> bool:
        assert self.kube is not None
        try:
            await self.kube.resource(SERVICE_ACCOUNTS).get("default", NS)
        except NotFoundError:
            return False
        return True

    async def stop(self) -> None:
        self._stop.set()
        if self.sim is not None:
            with contextlib.suppress(Exception):
                await self.sim.stop()
        for lease in self.leases:
            with contextlib.suppress(Exception):
                await lease.stop()
        for child in self.children.values():
            child.terminate()
        for kube in (self.kube, self.kubelet_kube):
            if kube is not None:
                with contextlib.suppress(Exception):
                    await kube.close()
        if self.http is not None:
            await self.http.close()
        if self.cp is not None:
            self.cp.stop()

    # --- waiting -------------------------------------------------------------------------

    async def _wait(self, predicate: Callable[[], Awaitable[Any]], what: str, limit: float) -> Any:
        deadline = time.monotonic() + limit
        last: Any = None
        while True:
            try:
                last = await predicate()
                if last is True or (last and not isinstance(last, str)):
                    return last
            except PluginStartError:
                raise
            except Exception as exc:  # the API may be down: try again
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not after {limit:.0f}s ({last})")
            await asyncio.sleep(0.5)

    async def _ready(self, port: int | None, path: str = "/readyz") -> bool:
        if port is None or self.http is None:
            return False
        try:
            async with self.http.get(f"http://127.0.0.1:{port}{path}") as r:
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def leader(self) -> Child | None:
        """The controller replica holding the Lease (None if the holder is not alive)."""
        assert self.kube is not None
        lease = await self.kube.resource(LEASES).get(CONTROLLER_LEASE, DRIVER_NAMESPACE)
        holder = (lease.get("spec") or {}).get("holderIdentity")
        for child in self.children.values():
            if child.kind == "controller" and child.running() and child.identity == holder:
                return child
        return None

    async def _whole(self) -> bool | str:
        """Every process up; the apiserver ready; every plugin ready (registered, slice
        published, reservations listed); a live replica holds the leader Lease and is
        ready. Returns a reason string when not."""
        assert self.cp is not None
        for name in CONTROL_PLANE:
            if not self.cp.running(name):
                return f"{name} down"
        down = [c.name for c in self.children.values() if not c.running()]
        if down:
            return f"down: {down}"
        controllers = [c for c in self.children.values() if c.kind == "controller"]
        alive = await asyncio.gather(*(self._ready(c.http_port(), "/healthz") for c in controllers))
        if not all(alive):
            return "a controller replica not serving /healthz"
        leader = await self.leader()
        if leader is None:
            return "no live leader"
        if not await self._ready(leader.http_port()):
            return f"leader {leader.name} not ready"
        results = await asyncio.gather(
            *(self._ready(c.http_port()) for c in self.children.values() if c.kind == PLUGIN)
        )
        if not all(results):
            return f"{results.count(False)} plugins not ready"
        return True

    # --- supervisor ----------------------------------------------------------------------

    async def supervise(self) -> None:
        """Restart what died on its own (the kubelet's restart policy)."""
        assert self.cp is not None
        while not self._stop.is_set():
            for child in self.children.values():
                if not child.held and not child.running():
                    code = child.proc.returncode if child.proc else None
                    self.self_exits[child.kind] += 1
                    self.event(f"{child.name} exited by itself ({code}); restarting")
                    await asyncio.sleep(1.0)
                    await self._restart_child(child)
            for name in CONTROL_PLANE:
                if name not in self._held_cp and not self.cp.running(name):
                    self.self_exits[name] += 1
                    self.event(f"{name} exited by itself; restarting")
                    await self._restart_cp(name)
            await asyncio.sleep(1.0)

    async def _restart_child(self, child: Child) -> None:
        child.start()
        if child.kind == PLUGIN:
            asyncio.get_running_loop().create_task(self._reregister(child.name))

    async def _reregister(self, node: str) -> None:
        """The kubelet's plugin watcher sees the re-created registration socket and
        registers the plugin again (GetInfo, NotifyRegistrationStatus)."""
        assert self.sim is not None
        child = self.children[node]
        kubelet = self.sim.kubelets[node]
        deadline = time.monotonic() + 120
        while child.http_port() is None:
            if time.monotonic() > deadline or not child.running():
                return
            await asyncio.sleep(0.2)
        fresh = KubeletClient(self.registrar_dir(node))
        while not fresh.plugins and time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                await fresh.register_all()
            if not fresh.plugins:
                await asyncio.sleep(0.3)
        old, kubelet.client = kubelet.client, fresh
        with contextlib.suppress(Exception):
            await old.close()

    async def _restart_cp(self, name: str) -> None:
        """Relaunch a control-plane component from this (main) thread, so it still dies with
        us, and wait for its health endpoint in a worker thread."""
        assert self.cp is not None
        comp = self.cp._components[name]
        self.cp._terminate(comp)
        comp.restarts += 1
        comp.proc = popen(comp.argv, comp.log)
        try:
            await asyncio.to_thread(self.cp._wait_healthy, comp)
        except Exception as exc:
            self.event(f"{name} not healthy after restart: {exc}")

    # --- faults --------------------------------------------------------------------------

    def plan_faults(self) -> list[Fault]:
        plugins = [n.name for n in self.nodes]
        kinds = list(FAULT_WEIGHTS)
        weights = [FAULT_WEIGHTS[k] for k in kinds]
        out: list[Fault] = []
        t = 10.0
        end = self.o.minutes * 60
        while True:
            t += self.fault_rng.expovariate(1 / self.o.fault_interval)
            if t >= end:
                return out
            kind = self.fault_rng.choices(kinds, weights)[0]
            target = self.fault_rng.choice(plugins) if kind == PLUGIN else kind
            out.append(Fault(round(t, 1), kind, target, round(self.fault_rng.uniform(0, 4), 1)))

    async def inject(self, start: float) -> None:
        schedule = self.plan_faults()
        self.faults = schedule
        for fault in schedule:
            delay = start + fault.at - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake_faults.wait(), delay)
            if self._stop.is_set() or self._faults_over:
                return
            await self._one_fault(fault)

    async def _one_fault(self, fault: Fault) -> None:
        assert self.cp is not None
        target = fault.target
        if fault.kind in (LEADER, STANDBY):
            try:
                leader = await self.leader()
            except Exception:
                leader = None
            controllers = [c for c in self.children.values() if c.kind == "controller"]
            if leader is None:
                child = self.fault_rng.choice(controllers)
            elif fault.kind == LEADER:
                child = leader
            else:
                child = next(c for c in controllers if c is not leader)
            target = child.name
        fault.target = target
        fault.done_at = self.now()
        self.whole_since = None
        self.event(f"FAULT kill -9 {fault.kind} {target} (down {fault.downtime}s)")
        if fault.kind in CONTROL_PLANE:
            self._held_cp.add(target)
            self.cp.kill(target)
            await asyncio.sleep(fault.downtime)
            restarted = time.monotonic()
            await self._restart_cp(target)
            self._held_cp.discard(target)
        else:
            child = self.children[target]
            child.held = True
            child.kill9()
            await asyncio.sleep(fault.downtime)
            restarted = time.monotonic()
            await self._restart_child(child)
            child.held = False
        try:
            await self._wait(self._whole, f"whole after {fault.kind}", self.o.recover_limit)
        except TimeoutError as exc:
            self.violate("recovery", str(exc))
            return
        fault.recovery = time.monotonic() - restarted
        self.whole_since = self.now()
        self.event(f"whole again {fault.recovery:.1f}s after restarting {target}")

    # --- churn ---------------------------------------------------------------------------

    async def churn(self, end: float) -> None:
        while time.monotonic() < end and not self._stop.is_set():
            await asyncio.sleep(self.rng.expovariate(1 / self.o.op_interval))
            ops = ["workload+", "workload-", "claim+", "claim-"]
            live = len(self.workloads)
            max_workloads = max(1, len(self.nodes) // TOPOLOGY_SIZE)
            weights = [
                3 if live < max_workloads else 0,
                2 if live else 0,
                3 if len(self.plain) < len(self.nodes) else 0,
                2 if self.plain else 0,
            ]
            op = self.rng.choices(ops, weights)[0]
            # Drawn before the attempt, so a failed op does not shift the sequence.
            draw = self.rng.random()
            try:
                await self._advance()
                if op == "workload+":
                    await self.create_workload(draw)
                elif op == "workload-":
                    await self.delete_workload(draw)
                elif op == "claim+":
                    await self.create_claim(draw)
                else:
                    await self.delete_claim(draw)
                self.ops[op] += 1
            except Exception as exc:
                self.op_failures[op] += 1
                self.event(f"op {op} failed: {type(exc).__name__}: {str(exc)[:120]}")

    def _pod(self, name: str, claim: JsonDict, labels: JsonDict | None = None) -> JsonDict:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {"soak": "1"}},
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"claims": [{"name": "neuron"}]},
                    }
                ],
                "resourceClaims": [{"name": "neuron", **claim}],
                # Leases may lapse while the API server is down: no evictions for that.
                "tolerations": [{"operator": "Exists"}],
                "terminationGracePeriodSeconds": 5,
            },
        }

    async def create_workload(self, draw: float) -> None:
        assert self.kube is not None
        name = self.name("w")
        count = 1 if draw < 0.6 else 2
        mode = "deployment" if (draw * 10) % 1 < 0.3 else "pods"
        body = {
            "apiVersion": "neuron.aws.com/v1beta1",
            "kind": "NeuronUltraServerWorkload",
            "metadata": {"name": name},
            "spec": {
                "instanceType": INSTANCE_TYPE,
                "topologySize": TOPOLOGY_SIZE,
                "serverCount": count,
                "allocationPolicy": {"failureStrategy": "NoOp"},
                "resourceClaimTemplate": {"name": f"{name}-rct"},
            },
        }
        created = await self.kube.resource(NEURON_ULTRASERVER_WORKLOADS).create(body, NS)
        wid = workload_id(name, str(created["metadata"]["uid"]))
        self.workloads[name] = Workload(name, count, mode, self.now(), wid=wid)
        self.event(f"op create workload {name} serverCount={count} ({mode})")

    async def _advance(self) -> None:
        """Workloads that became Allocated get their pods (or Deployment)."""
        assert self.kube is not None
        for w in list(self.workloads.values()):
            if w.pods_created:
                continue
            obj = await self.kube.resource(NEURON_ULTRASERVER_WORKLOADS).get(w.name, NS)
            status = obj.get("status") or {}
            if status.get("state") != "Allocated":
                continue
            if status.get("workloadId") != w.wid:
                self.violate("workload-id", f"{w.name}: status says {status.get('workloadId')}")
            pods = TOPOLOGY_SIZE * w.server_count
            claim = {"resourceClaimTemplateName": f"{w.name}-rct"}
            labels = {"soak": "1", "workload": w.name}
            if w.mode == "deployment":
                template = self._pod("x", claim, labels)
                body = {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "metadata": {"name": w.name},
                    "spec": {
                        "replicas": pods,
                        "selector": {"matchLabels": labels},
                        "template": {"metadata": {"labels": labels}, "spec": template["spec"]},
                    },
                }
                await self.kube.resource(DEPLOYMENTS).create(body, NS)
            else:
                for i in range(pods):
                    await self.kube.resource(PODS).create(
                        self._pod(f"{w.name}-{i}", claim, labels), NS
                    )
            w.pods_created = True
            self.event(f"op workload {w.name} ({w.wid}) Allocated: {pods} pods ({w.mode})")

    async def _delete_workload_pods(self, w: Workload) -> None:
        assert self.kube is not None
        if w.mode == "deployment":
            with contextlib.suppress(NotFoundError):
                await self.kube.resource(DEPLOYMENTS).delete(
                    w.name, NS, propagation_policy="Background"
                )
        for pod in (
            await self.kube.resource(PODS).list_all(NS, label_selector=f"workload={w.name}")
        ).items:
            with contextlib.suppress(NotFoundError):
                await self.kube.resource(PODS).delete(pod["metadata"]["name"], NS)

    async def delete_workload(self, draw: float) -> None:
        assert self.kube is not None
        name = sorted(self.workloads)[int(draw * len(self.workloads))]
        w = self.workloads[name]
        api = self.kube.resource(NEURON_ULTRASERVER_WORKLOADS)
        wid = w.wid
        pods_first = (draw * 10) % 1 < 0.5
        if pods_first:
            await self._delete_workload_pods(w)
        with contextlib.suppress(NotFoundError):
            await api.delete(name, NS)
        if not pods_first:
            await self._delete_workload_pods(w)
        del self.workloads[name]
        if wid:
            self.pending_free[wid] = (time.monotonic(), name)
        order = "pods first" if pods_first else "workload first"
        self.event(f"op delete workload {name} ({wid}; {order})")

    async def create_claim(self, draw: float) -> None:
        assert self.kube is not None
        count = [1, 1, 4, 4, 8, 16][int(draw * 6)]
        name = self.name("c")
        exactly: JsonDict = {
            "deviceClassName": DRIVER_NAME,
            "allocationMode": "ExactCount",
            "count": count,
        }
        devices: JsonDict = {"requests": [{"name": "neurons", "exactly": exactly}]}
        if count > 1:
            devices["constraints"] = [
                {
                    "requests": ["neurons"],
                    "matchAttribute": f"resource.aws.com/devicegroup{count}_id",
                }
            ]
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "labels": {"soak": "1"}},
            "spec": {"devices": devices},
        }
        await self.kube.resource(RESOURCE_CLAIMS).create(claim, NS)
        pod = self._pod(f"{name}-pod", {"resourceClaimName": name})
        # Most plain claims stay off the first UltraServers (room for workloads); some roam.
        servers = len(self.nodes) // TOPOLOGY_SIZE
        if servers > 1 and (draw * 10) % 1 < 0.8:
            allowed = [n.name for n in self.nodes[(servers // 2) * TOPOLOGY_SIZE :]]
            pod["spec"]["affinity"] = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": allowed,
                                    }
                                ]
                            }
                        ]
                    }
                }
            }
        await self.kube.resource(PODS).create(pod, NS)
        self.plain[name] = f"{name}-pod"
        self.event(f"op create claim {name} count={count}")

    async def delete_claim(self, draw: float) -> None:
        assert self.kube is not None
        name = sorted(self.plain)[int(draw * len(self.plain))]
        pod = self.plain[name]
        with contextlib.suppress(NotFoundError):
            await self.kube.resource(PODS).delete(pod, NS)
        with contextlib.suppress(NotFoundError):
            await self.kube.resource(RESOURCE_CLAIMS).delete(name, NS)
        del self.plain[name]
        self.event(f"op delete claim {name}")

    # --- invariants ----------------------------------------------------------------------

    async def snapshot(self) -> JsonDict:
        assert self.kube is not None
        lists = await asyncio.gather(
            self.kube.resource(RESOURCE_CLAIMS).list_all(NS),
            self.kube.resource(NEURON_ULTRASERVERS).list_all(DRIVER_NAMESPACE),
            self.kube.resource(NEURON_ULTRASERVER_WORKLOADS).list_all(NS),
            self.kube.resource(RESOURCE_SLICES).list_all(),
            self.kube.resource(PODS).list_all(NS),
        )
        claims, nus, workloads, slices, pods = (x.items for x in lists)
        files: dict[str, tuple[dict[str, JsonDict], set[str]]] = {}
        for node in self.nodes:
            files[node.name] = (self._read_checkpoint(node.name), self._read_cdi(node.name))
        return {
            "claims": claims,
            "nus": nus,
            "workloads": workloads,
            "slices": slices,
            "pods": pods,
            "files": files,
        }

    def _read_checkpoint(self, node: str) -> dict[str, JsonDict]:
        try:
            doc = json.loads(self.checkpoint(node).read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            self.violate("checkpoint-unreadable", f"{node}: {exc}")
            return {}
        return dict((doc.get("data") or {}).get("claims") or {})

    def _read_cdi(self, node: str) -> set[str]:
        root = self.cdi_root(node)
        return set(list_cdi_specs(root)) if root.exists() else set()

    def check_always(self, snap: JsonDict) -> list[tuple[str, str]]:
        """What must hold at every instant, faults or not."""
        out: list[tuple[str, str]] = []
        claims: list[JsonDict] = snap["claims"]
        allocated = {c["metadata"]["uid"]: c for c in claims if _allocated_devices(c)}
        # 1. No device allocated to, or prepared for, two live (allocated) claims.
        holders: dict[tuple[str, str], set[str]] = {}
        for uid, c in allocated.items():
            for dev in _allocated_devices(c):
                holders.setdefault(dev, set()).add(uid)
        for node, (checkpoint, _) in snap["files"].items():
            for uid, entry in checkpoint.items():
                if uid not in allocated:
                    continue
                for d in entry.get("devices") or []:
                    holders.setdefault((node, str(d.get("deviceName"))), set()).add(uid)
        for dev, uids in holders.items():
            if len(uids) > 1:
                names = sorted(allocated[u]["metadata"]["name"] for u in uids)
                out.append(("double-use", f"device {dev} held by live claims {names}"))
        # 2. No node in two allocation entries; 3. all-or-nothing for Allocated workloads.
        entries = _entries(snap["nus"])
        seen: dict[str, str] = {}
        for nus, e in entries:
            for node in e.get("allocatedNodes") or []:
                ref = f"{e.get('workloadRef')}#{e.get('ultraserverIndex')}"
                if node in seen and seen[node] != ref:
                    out.append(("node-booked-twice", f"{node}: {seen[node]} and {ref} ({nus})"))
                seen[node] = ref
        live = {
            str(w["status"].get("workloadId")): w
            for w in snap["workloads"]
            if (w.get("status") or {}).get("workloadId")
            and not w["metadata"].get("deletionTimestamp")
        }
        for wid, w in live.items():
            if (w.get("status") or {}).get("state") != "Allocated":
                continue
            mine = [e for _, e in entries if e.get("workloadId") == wid]
            spec = w["spec"]
            sizes = sorted(len(e.get("allocatedNodes") or []) for e in mine)
            if len(mine) != int(spec["serverCount"]) or any(
                s != int(spec["topologySize"]) for s in sizes
            ):
                out.append(
                    (
                        "not-all-or-nothing",
                        f"{w['metadata']['name']} Allocated with units of sizes {sizes}, "
                        f"wants {spec['serverCount']}x{spec['topologySize']}",
                    )
                )
        # 4. A live workload's claims only on its reserved nodes.
        reserved: dict[str, set[str]] = {}
        for _, e in entries:
            reserved.setdefault(str(e.get("workloadId")), set()).update(
                e.get("allocatedNodes") or []
            )
        for c in claims:
            cwid = str((c["metadata"].get("labels") or {}).get(LABEL_WORKLOAD_ID) or "")
            if not cwid or cwid not in live:
                continue
            outside = {p for p, _ in _allocated_devices(c)} - reserved.get(cwid, set())
            if outside:
                out.append(
                    (
                        "outside-reservation",
                        f"claim {c['metadata']['name']} of {cwid} on {sorted(outside)}",
                    )
                )
        return out

    def _freed(self, snap: JsonDict, wid: str, name: str) -> str | None:
        """Why the deleted workload ``wid`` is not free yet (None once it is)."""
        if any(
            (w.get("status") or {}).get("workloadId") == wid or w["metadata"]["name"] == name
            for w in snap["workloads"]
        ):
            return "workload object still there"
        if any(e.get("workloadId") == wid for _, e in _entries(snap["nus"])):
            return "allocation entries remain"
        if any(t == wid for _, t in _slice_tags(snap["slices"])):
            return "slices still tagged"
        if any(
            (c["metadata"].get("labels") or {}).get(LABEL_WORKLOAD_ID) == wid
            for c in snap["claims"]
        ):
            return "claims remain"
        return None

    def check_frees(self, snap: JsonDict, *, final: bool = False) -> None:
        now = time.monotonic()
        for wid, (deleted_at, name) in list(self.pending_free.items()):
            why = self._freed(snap, wid, name)
            if why is None:
                self.free_latency.append(now - deleted_at)
                del self.pending_free[wid]
                continue
            if self.whole_since is None:
                continue
            since = max(deleted_at, self.t0 + self.whole_since)
            if now - since > self.o.free_bound or final:
                self.violate(
                    "not-freed",
                    f"workload {name} ({wid}) deleted {now - deleted_at:.0f}s ago, system "
                    f"whole for {now - self.t0 - self.whole_since:.0f}s: {why}",
                )
                del self.pending_free[wid]

    def check_converged(self, snap: JsonDict) -> list[tuple[str, str]]:
        """What must hold once the system has settled."""
        assert self.sim is not None
        out: list[tuple[str, str]] = []
        claims = {c["metadata"]["uid"]: c for c in snap["claims"]}
        running = {
            p["metadata"]["uid"]: p
            for p in snap["pods"]
            if (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        }
        for node, (checkpoint, cdi) in snap["files"].items():
            ck = set(checkpoint)
            kubelet = {uid for s in self.sim.kubelets[node].prepared.values() for uid in s.claims}
            expected = {
                uid
                for uid, c in claims.items()
                if any(p == node for p, _ in _allocated_devices(c))
                and any(
                    r.get("uid") in running
                    for r in (c.get("status") or {}).get("reservedFor") or []
                )
            }
            if ck != cdi:
                detail = f"checkpoint-only {sorted(ck - cdi)}, cdi-only {sorted(cdi - ck)}"
                out.append(("checkpoint-cdi", f"{node}: {detail}"))
            if ck != kubelet:
                detail = (
                    f"checkpoint-only {sorted(ck - kubelet)}, kubelet-only {sorted(kubelet - ck)}"
                )
                out.append(("checkpoint-kubelet", f"{node}: {detail}"))
            if expected - ck:
                out.append(("missing-prepare", f"{node}: {sorted(expected - ck)}"))
            if ck - set(claims):
                out.append(("orphan-prepare", f"{node}: {sorted(ck - set(claims))}"))
        live = {
            str(w["status"]["workloadId"])
            for w in snap["workloads"]
            if (w.get("status") or {}).get("workloadId")
        }
        want = {
            (str(n), str(e.get("workloadId")))
            for _, e in _entries(snap["nus"])
            if e.get("phase") != "Releasing" and e.get("workloadId") in live
            for n in e.get("allocatedNodes") or []
        }
        tags = _slice_tags(snap["slices"])
        if tags != want:
            out.append(
                (
                    "workload-tags",
                    f"slice-only {sorted(tags - want)}, nus-only {sorted(want - tags)}",
                )
            )
        return out

    async def checker(self) -> None:
        reported: set[tuple[str, str]] = set()
        while not self._stop.is_set():
            await asyncio.sleep(3.0)
            try:
                snap = await self.snapshot()
            except Exception:
                continue  # the API server may be down
            self.checks += 1
            for kind, detail in self.check_always(snap):
                # The same instance stays visible for a few rounds: report it once.
                if (kind, detail) not in reported:
                    reported.add((kind, detail))
                    self.violate(kind, detail)
            self.check_frees(snap)

    async def controller_settled(self) -> bool | str:
        """The leader's queues are empty and nothing is retried over 10 s."""
        leader = await self.leader()
        http = self.http
        if leader is None or http is None:
            return "no leader"

        async def sample() -> tuple[float, float]:
            async with http.get(f"http://127.0.0.1:{leader.http_port()}/metrics") as r:
                text = await r.text()
            depth = sum(
                float(v)
                for v in re.findall(r"^neuron_dra_workqueue_depth\{[^}]*\} (\S+)", text, re.M)
            )
            retries = sum(
                float(v)
                for v in re.findall(
                    r"^neuron_dra_workqueue_retries_total\{[^}]*\} (\S+)", text, re.M
                )
            )
            return depth, retries

        d0, r0 = await sample()
        await asyncio.sleep(10)
        d1, r1 = await sample()
        if d0 or d1 or r1 != r0:
            return f"leader {leader.name}: depth {d0}/{d1}, retries +{r1 - r0:.0f} in 10s"
        return True

    # --- the run -------------------------------------------------------------------------

    async def converge(self, what: str) -> None:
        """Wait for the system whole and every settled-state check passing."""
        self.event(f"converging ({what})")
        try:
            await self._wait(self._whole, f"whole ({what})", self.o.recover_limit)
        except TimeoutError as exc:
            self.violate("recovery", str(exc))
            return
        self.whole_since = self.whole_since or self.now()
        last: list[tuple[str, str]] = []

        async def settled() -> bool | str:
            nonlocal last
            snap = await self.snapshot()
            last = self.check_always(snap) + self.check_converged(snap)
            self.check_frees(snap)
            if last:
                return "; ".join(f"{k}: {d}" for k, d in last[:3])
            return True

        try:
            await self._wait(settled, f"settled ({what})", self.o.converge_limit)
        except TimeoutError:
            for kind, detail in last:
                self.violate(kind, f"{detail} (after {self.o.converge_limit:.0f}s)")
        try:
            await self._wait(self.controller_settled, "controller settled", 120)
        except TimeoutError as exc:
            self.violate("controller-not-converged", str(exc))

    async def cleanup(self) -> None:
        """Delete everything the churn made; every workload must then be freed."""
        assert self.kube is not None
        for name in list(self.workloads):
            await self.delete_workload(sorted(self.workloads).index(name) / len(self.workloads))
        for name in list(self.plain):
            await self.delete_claim(sorted(self.plain).index(name) / len(self.plain))
        self.whole_since = self.now()

        async def all_free() -> bool | str:
            snap = await self.snapshot()
            self.check_frees(snap)
            if self.pending_free:
                return f"{len(self.pending_free)} workloads not freed"
            busy = [c["metadata"]["name"] for c in snap["claims"]]
            if busy:
                return f"claims remain: {busy[:5]}"
            return True

        try:
            await self._wait(all_free, "everything freed", self.o.free_bound + 30)
        except TimeoutError:
            snap = await self.snapshot()
            self.check_frees(snap, final=True)
            left = [c["metadata"]["name"] for c in snap["claims"]]
            if left:
                self.violate("not-freed", f"claims left after cleanup: {left}")

    async def run(self) -> int:
        started = False
        tasks: list[asyncio.Task[Any]] = []
        try:
            await self.start()
            started = True
            begin = time.monotonic()
            end = begin + self.o.minutes * 60
            tasks = [
                asyncio.create_task(self.supervise(), name="supervise"),
                asyncio.create_task(self.checker(), name="checker"),
            ]
            faults = asyncio.create_task(self.inject(begin), name="faults")
            await self.churn(end)
            self.event("churn over; waiting for the last fault's recovery")
            # No new fault; the one under way finishes (restart, recovery measured).
            self._faults_over = True
            self._wake_faults.set()
            await faults
            for child in self.children.values():
                if child.held and not child.running():
                    await self._restart_child(child)
                    child.held = False
            for name in list(self._held_cp):
                await self._restart_cp(name)
                self._held_cp.discard(name)
            await self.converge("after the churn")
            await self.cleanup()
            await self.converge("after deleting everything")
        except Exception as exc:
            self.violate("harness", f"{type(exc).__name__}: {exc}")
        finally:
            self._stop.set()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            pids = [p for c in self.children.values() for p in c.pids]
            cp_pids = list(self.cp.pids().values()) if self.cp is not None else []
            await self.stop()
            self.check_leaks(pids + cp_pids)
        report = self.report(started)
        (self.workdir / "report.json").write_text(json.dumps(report, indent=2))
        print(self.summary(report), flush=True)
        if not self.violations and not self.o.keep:
            if self.nodes_dir.parent != self.workdir:
                shutil.rmtree(self.nodes_dir, ignore_errors=True)
            shutil.rmtree(self.workdir, ignore_errors=True)
        else:
            print(f"work directory kept: {self.workdir}", flush=True)
        return 1 if self.violations else 0

    def check_leaks(self, pids: list[int]) -> None:
        time.sleep(0.5)
        alive = [p for p in pids if _alive(p)]
        marker = str(self.workdir)
        strays = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmdline:
                strays.append(f"{entry.name}: {cmdline[:100]}")
        if alive or strays:
            self.violate("process-leak", f"alive {alive}; strays {strays}")

    # --- the record ----------------------------------------------------------------------

    def report(self, started: bool) -> JsonDict:
        by_kind: dict[str, list[float]] = {}
        for f in self.faults:
            if f.recovery is not None:
                by_kind.setdefault(f.kind, []).append(f.recovery)
        done = [f for f in self.faults if f.done_at is not None]
        return {
            "command": f"hack/soak --minutes {self.o.minutes:g} --seed {self.o.seed} "
            f"--nodes {self.o.nodes} --minor {self.o.minor}",
            "started": started,
            "duration_s": round(self.now(), 1),
            "nodes": len(self.nodes),
            "faults": dict(Counter(f.kind for f in done)),
            "plugins_killed": dict(Counter(f.target for f in done if f.kind == PLUGIN)),
            "self_exits": dict(self.self_exits),
            "recovery_s": {
                k: {
                    "n": len(v),
                    "p50": round(_percentile(v, 50), 1),
                    "p99": round(_percentile(v, 99), 1),
                    "max": round(max(v), 1),
                }
                for k, v in sorted(by_kind.items())
            },
            "operations": dict(self.ops),
            "operation_failures": dict(self.op_failures),
            "free_latency_s": {
                "n": len(self.free_latency),
                "p50": round(_percentile(self.free_latency, 50), 1),
                "p99": round(_percentile(self.free_latency, 99), 1),
            },
            "checks": self.checks,
            "violations": self.violations,
            "fault_schedule": [
                {"at": f.done_at, "kind": f.kind, "target": f.target, "down": f.downtime}
                for f in done
            ],
        }

    def summary(self, r: JsonDict) -> str:
        lines = [
            f"soak: {r['command']}",
            f"  ran {r['duration_s']}s on {r['nodes']} nodes; {r['checks']} invariant rounds",
            f"  faults: {r['faults']} (plugins: {len(r['plugins_killed'])} distinct)",
            f"  self-exits (restarted): {r['self_exits']}",
            f"  operations: {r['operations']} (failed, retried later: {r['operation_failures']})",
            f"  deleted workloads freed: {r['free_latency_s']}",
            "  recovery after restart (s):",
            *(
                f"    {k:<24} n={v['n']:<3} p50={v['p50']:<6} p99={v['p99']:<6} max={v['max']}"
                for k, v in r["recovery_s"].items()
            ),
            f"  violations: {len(r['violations'])}",
        ]
        return "\n".join(lines)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead (reaped by nobody yet).
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
