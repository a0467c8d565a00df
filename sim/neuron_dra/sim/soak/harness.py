"""The chaos soak (issue 13): the whole system as separate processes on a real control plane,
a churn of workloads and claims, and kill -9 of every kind of process at random times, with
the promises users rely on checked all along and once everything has settled.

Processes (all on loopback, under one work directory, all started from the main thread with
``PR_SET_PDEATHSIG``, so a killed soak leaves nothing behind):

- etcd, kube-apiserver, kube-controller-manager, kube-scheduler (:mod:`..realcluster`; etcd's
  data dir survives its restarts);
- two ``neuron-dra-controller`` replicas with Lease leader election;
- one ``neuron-dra-kubelet-plugin`` per node (UltraServers of 4 trn2u.48xlarge);
- the nodes (:mod:`.nodes`): simulated kubelets in this process (:mod:`.simnodes`, the
  default) or real nodes with real kubelets, containerd and containers (:mod:`.realnodes`,
  ``--real-nodes``, whose faults add kill -9 of a kubelet or a containerd and node reboots);
- in this process: the churn and the checker.

A dead process is restarted by a supervisor, as the kubelet restarts a container (a
controller replica that loses its lease exits on purpose and is restarted this way too).

The fault schedule and the churn's choices are drawn from ``random.Random(seed)``: the same
seed replays the same sequence of faults and operations (timing, and so the interleaving
with the system's own work, differs between runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import random
import shutil
import sys
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from neuron_dra.common.constants import DRIVER_NAMESPACE
from neuron_dra.common.k8s.client import LEASES, NEURON_ULTRASERVERS, KubeClient, connect
from neuron_dra.common.k8s.errors import NotFoundError
from neuron_dra.sim.controlplane import ensure_device_classes
from neuron_dra.sim.realcluster import ADMIN, RealControlPlane, bin_dir_for
from neuron_dra.sim.scratch import keep, work_dir
from neuron_dra.sim.simcluster.realworld import SERVICE_ACCOUNTS, ensure_namespace
from neuron_dra.sim.simcluster.topology import SimNode, ultraservers
from neuron_dra.sim.soak import faults, invariants, report, settling
from neuron_dra.sim.soak.children import CONTROLLER, PLUGIN, Child, PluginStartError, leaked
from neuron_dra.sim.soak.churn import Workload, churn
from neuron_dra.sim.soak.faults import Fault
from neuron_dra.sim.soak.nodes import SoakNodes
from neuron_dra.sim.soak.options import (
    CONTROL_PLANE,
    CONTROLLER_LEASE,
    NS,
    SHORT_PATH,
    TOPOLOGY_SIZE,
    JsonDict,
    Options,
)
from neuron_dra.sim.soak.realnodes import RealSoakNodes
from neuron_dra.sim.soak.simnodes import SimNodes
from neuron_dra.sim.soak.supervisor import restart_child, restart_cp, supervise

log = logging.getLogger(__name__)


class Soak:
    """One soak run: its processes, its state, and the run itself; the parts live in
    :mod:`.children`, :mod:`.supervisor`, :mod:`.faults`, :mod:`.churn`, :mod:`.settling`,
    :mod:`.invariants` and :mod:`.report`."""

    def __init__(self, options: Options) -> None:
        self.o = options
        self.rng = random.Random(options.seed)
        self.fault_rng = random.Random(options.seed * 7919 + 1)
        if options.nodes % TOPOLOGY_SIZE:
            raise ValueError(f"--nodes must be a multiple of {TOPOLOGY_SIZE}")
        self.nodes: list[SimNode] = ultraservers(options.nodes // TOPOLOGY_SIZE)
        # Read first, so that a wrong --fault is refused before anything is made.
        self.forced_faults = faults.forced_schedule(
            options.faults,
            [n.name for n in self.nodes],
            (RealSoakNodes if options.real_nodes else SimNodes).fault_weights,
        )
        self.workdir = options.workdir or work_dir("soak")
        self.workdir.mkdir(parents=True, exist_ok=True)  # --workdir may name a new directory
        self.cp: RealControlPlane | None = None
        self.kube: KubeClient | None = None  # churn + checker
        self.kubelet_kube: KubeClient | None = None
        self.node_side: SoakNodes = RealSoakNodes(self) if options.real_nodes else SimNodes(self)
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
        self.stopping = asyncio.Event()
        #: The checker's newest snapshot, and a flag it sets on each (the container looks
        #: read it instead of taking one of their own).
        self.latest_snapshot: JsonDict | None = None
        self.new_snapshot = asyncio.Event()
        #: Control-plane components down on purpose (a fault in progress).
        self.held_cp: set[str] = set()
        self.faults_over = False
        self.wake_faults = asyncio.Event()

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
            f"  replay: {self.o.command()}",
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

    @functools.cached_property
    def nodes_dir(self) -> Path:
        """Where the nodes' kubelet directories live (made at first use: a Soak that never
        starts, as the checks' tests make, leaves nothing behind). A plugin's socket path
        (``<dir>/<node>/plugins/neuron.aws.com/dra.sock``) must fit the 107 bytes of a Unix
        socket address, so a long work directory (pytest's) gets its nodes in a short
        directory under /tmp, linked from ``<workdir>/nodes`` so a kept work directory still
        holds everything."""
        nodes = self.workdir / "nodes"
        if len(str(nodes)) <= SHORT_PATH:
            return nodes
        short = work_dir("n")
        self.workdir.mkdir(parents=True, exist_ok=True)
        nodes.unlink(missing_ok=True)
        nodes.symlink_to(short)
        return short

    def cdi_root(self, node: str) -> Path:
        return self.node_side.cdi_root(node)

    def checkpoint(self, node: str) -> Path:
        return self.node_side.checkpoint(node)

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
        await self.wait(self._default_service_account, "default ServiceAccount", 60)
        await ensure_device_classes(self.kube)
        await self.node_side.start()
        procs = [sys.executable, "-m", "neuron_dra.sim.soak.procs"]
        for i in range(2):
            name = f"controller-{i}"
            self.children[name] = Child(
                name,
                CONTROLLER,
                [
                    *procs, "controller", "--kubeconfig", str(admin), "--leader-elect",
                    "--http-port", "0",
                ],
                self.workdir / "logs" / f"{name}.log",
            )  # fmt: skip
            self.children[name].start()
        await self.wait(self.node_side.registered, "every plugin registered", 180)
        want = len(self.nodes) // TOPOLOGY_SIZE
        await self.wait(self.whole, "the system whole", self.o.recover_limit)

        async def discovered() -> bool:
            assert self.kube is not None
            items = (await self.kube.resource(NEURON_ULTRASERVERS).list_all(DRIVER_NAMESPACE)).items
            return len(items) >= want

        await self.wait(discovered, f"{want} NeuronUltraServers", 120)
        self.event(f"started in {self.now():.1f}s")

    async def _default_service_account(self) -> bool:
        assert self.kube is not None
        try:
            await self.kube.resource(SERVICE_ACCOUNTS).get("default", NS)
        except NotFoundError:
            return False
        return True

    async def stop(self) -> None:
        self.stopping.set()
        for child in self.children.values():
            child.terminate()
        await self.node_side.stop()
        for kube in (self.kube, self.kubelet_kube):
            if kube is not None:
                with contextlib.suppress(Exception):
                    await kube.close()
        if self.http is not None:
            await self.http.close()
        if self.cp is not None:
            self.cp.stop()

    # --- waiting -------------------------------------------------------------------------

    async def wait(self, predicate: Callable[[], Awaitable[Any]], what: str, limit: float) -> Any:
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

    async def ready(self, port: int | None, path: str = "/readyz") -> bool:
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
            if child.kind == CONTROLLER and child.running() and child.identity == holder:
                return child
        return None

    async def whole(self) -> bool | str:
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
        node_down = self.node_side.down()
        if node_down:
            return node_down
        controllers = [c for c in self.children.values() if c.kind == CONTROLLER]
        alive = await asyncio.gather(*(self.ready(c.http_port(), "/healthz") for c in controllers))
        if not all(alive):
            return "a controller replica not serving /healthz"
        leader = await self.leader()
        if leader is None:
            return "no live leader"
        if not await self.ready(leader.http_port()):
            return f"leader {leader.name} not ready"
        results = await asyncio.gather(
            *(self.node_side.plugin_ready(c) for c in self.children.values() if c.kind == PLUGIN)
        )
        if not all(results):
            return f"{results.count(False)} plugins not ready"
        return True

    # --- the checks and the record (the tests call these on a Soak) ---------------------

    def plan_faults(self) -> list[Fault]:
        """The faults ``--fault`` names, else the seed's draw (drawn either way, so that the
        faults' own random choices, a replica when a controller fault fires, replay too)."""
        drawn = faults.plan_faults(
            self.fault_rng,
            [n.name for n in self.nodes],
            self.o.minutes,
            self.o.fault_interval,
            self.node_side.fault_weights,
        )
        return [dataclasses.replace(f) for f in self.forced_faults] if self.o.faults else drawn

    def check_always(self, snap: JsonDict) -> list[tuple[str, str]]:
        return invariants.always_violations(snap)

    def check_converged(self, snap: JsonDict) -> list[tuple[str, str]]:
        prepared = {node: self.node_side.kubelet_prepared(node) for node in snap["files"]}
        return invariants.converged_violations(snap, prepared)

    def report(self, started: bool) -> JsonDict:
        return report.report(self, started)

    # --- the run -------------------------------------------------------------------------

    async def run(self) -> int:
        started = False
        tasks: list[asyncio.Task[Any]] = []
        try:
            await self.start()
            started = True
            begin = time.monotonic()
            end = begin + self.o.minutes * 60
            tasks = [
                asyncio.create_task(supervise(self), name="supervise"),
                asyncio.create_task(settling.checker(self), name="checker"),
                asyncio.create_task(settling.container_checker(self), name="containers"),
            ]
            injecting = asyncio.create_task(faults.inject(self, begin), name="faults")
            if self.o.until_faults:
                await churn(
                    self,
                    begin + self.o.churn_limit,
                    lambda: injecting.done() and time.monotonic() >= end,
                )
                if not injecting.done():
                    self.violate("faults-not-reached", faults.not_reached(self.faults, self.o))
            else:
                await churn(self, end)
            self.event("churn over; waiting for the last fault's recovery")
            # No new fault; the one under way finishes (restart, recovery measured).
            self.faults_over = True
            self.wake_faults.set()
            await injecting
            for child in self.children.values():
                if child.held and not child.running():
                    await restart_child(self, child)
                    child.held = False
            for name in list(self.held_cp):
                await restart_cp(self, name)
                self.held_cp.discard(name)
            await settling.converge(self, "after the churn")
            await settling.cleanup(self)
            await settling.converge(self, "after deleting everything")
        except Exception as exc:
            self.violate("harness", f"{type(exc).__name__}: {exc}")
        finally:
            self.stopping.set()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            pids = [p for c in self.children.values() for p in c.pids]
            cp_pids = list(self.cp.pids().values()) if self.cp is not None else []
            await self.stop()
            leak = leaked(pids + cp_pids, str(self.workdir))
            if leak:
                self.violate("process-leak", leak)
        record = self.report(started)
        (self.workdir / "report.json").write_text(json.dumps(record, indent=2))
        print(report.summary(record), flush=True)
        if not self.violations and not self.o.keep:
            if self.nodes_dir.parent != self.workdir:
                shutil.rmtree(self.nodes_dir, ignore_errors=True)
            if self.cp is not None:
                self.cp.remove_files()
            shutil.rmtree(self.workdir, ignore_errors=True)
        else:
            keep(self.workdir, "the soak's work directory: a post-mortem's, or --keep")
            print(f"work directory kept: {self.workdir}", flush=True)
        return 1 if self.violations else 0
