"""The simulated cluster's nodes when they are real (:mod:`neuron_dra.sim.realnode`): real
kubelets and containerd run the pods, our kubelet plugin runs as a process inside each node
and registers with its kubelet through the kubelet's own plugin watcher, and what a
container got is read from inside it (``kubectl exec``), not from the CDI files.

Kept apart from :class:`.cluster.SimCluster` so the cluster reads the same on every world:
it asks this part to start, stop and fail nodes and plugins, and to look into containers.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from neuron_dra.sim.realcluster import RealControlPlane
from neuron_dra.sim.realcluster.processes import Component, tail
from neuron_dra.sim.realnode.fleet import RealNodeFleet
from neuron_dra.sim.realnode.layout import CDI_DIR, PLUGINS_DIR, PLUGINS_REGISTRY
from neuron_dra.sim.realnode.node import KUBELET, RealNode

from .containers import ContainerDevices
from .topology import SimNode

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]
PLUGIN = "neuron-dra-kubelet-plugin"
#: The directory where containers find the claims' device metadata files.
_METADATA_DIR = "/var/run/kubernetes.io/dra-device-attributes"
#: The last line of every complete look: an exec whose stream is cut (its node rebooting
#: under it) ends with kubectl's exit 0 and what was printed so far, so a look without this
#: line is an interrupted one, not a container without its env.
_LOOK_END = "LOOK-INSIDE-END"
#: What a container is asked: its Neuron device nodes (character devices only), the device
#: metadata files mounted into it (each on one line, base64), its env, then :data:`_LOOK_END`.
_LOOK_INSIDE = (
    'for d in /dev/neuron*; do [ -c "$d" ] && echo "DEVICE $d"; done; '
    f"for f in $(find {_METADATA_DIR} -type f 2>/dev/null); do "
    f'echo "FILE $f $(base64 < "$f" | tr -d "\\n")"; done; env; echo {_LOOK_END}'
)
#: kubectl errors that go away: the API server's resolver has not seen a new node's name
#: yet (it re-reads its hosts file at most every 5 s), or the container is just starting.
_TRANSIENT = re.compile(r"no such host|container not found|unable to upgrade|does not have a host")
#: How long a look inside waits, when its caller names no bound of its own: a bound for a
#: stuck ``kubectl exec``, not a slow one (on a 2-core machine running four real clusters one
#: took over 35 s).
_EXEC_LIMIT = 60.0
#: How long a plugin instance may take to be ready (registered, its slice published): the
#: node's own readiness bound, since a loaded machine starts the interpreter slowly.
PLUGIN_READY_LIMIT = 120.0


def node_labels(node: SimNode) -> dict[str, str]:
    """The labels a node's kubelet sets (``--node-labels``; NodeRestriction allows these)."""
    return {"node.kubernetes.io/instance-type": node.instance_type}


def plugin_argv(
    node: SimNode, kubeconfig: Path, pod_uid: str | None = None, extra: Sequence[str] = ()
) -> list[str]:
    """Our kubelet plugin as the chart's DaemonSet runs it, with the chart's default paths
    (inside the node they are the node's own), emulating the node's instance type; with a
    ``pod_uid`` its sockets are that pod's (two instances side by side during an upgrade)."""
    argv = [
        sys.executable, "-m", "neuron_dra.sim.soak.procs", "plugin",
        "--node-name", node.name,
        "--kubeconfig", str(kubeconfig),
        "--cdi-root", CDI_DIR,
        "--kubelet-registrar-directory-path", PLUGINS_REGISTRY,
        "--kubelet-plugins-directory-path", PLUGINS_DIR,
        "--emulation-mode", node.instance_type,
        "--http-port", "0",
    ]  # fmt: skip
    if node.ultraserver_id:
        argv += ["--emulated-ultraserver-id", node.ultraserver_id]
    if node.ultraserver_node_id is not None:
        argv += ["--emulated-ultraserver-node-id", str(node.ultraserver_node_id)]
    if pod_uid:
        argv += ["--pod-uid", pod_uid]
    return [*argv, *extra]


class LookCutShort(ValueError):
    """A look's output lacks its last line: the exec was cut off (the container or its node
    went away mid-look), so what it printed says nothing about the container."""


def parse_look_inside(output: str) -> ContainerDevices:
    """What :data:`_LOOK_INSIDE` printed, as the CDI resolution of the fake world gives it:
    env by name, device nodes in device order (pure). :class:`LookCutShort` when the output
    does not end with :data:`_LOOK_END`."""
    lines = output.rstrip("\n").splitlines()
    if not lines or lines[-1] != _LOOK_END:
        tail = lines[-1][:80] if lines else "nothing"
        raise LookCutShort(f"the look was cut short after {len(lines)} lines (last: {tail!r})")
    out = ContainerDevices()
    devices = []
    for line in lines[:-1]:
        if line.startswith("DEVICE "):
            devices.append(line.removeprefix("DEVICE ").strip())
        elif line.startswith("FILE "):
            path, _, data = line.removeprefix("FILE ").strip().partition(" ")
            out.files[path] = base64.b64decode(data).decode(errors="replace")
        elif re.match(r"[A-Za-z_][A-Za-z0-9_]*=", line):
            key, _, value = line.partition("=")
            out.env[key] = value
    out.device_nodes = sorted(devices, key=lambda d: int(re.sub(r"\D", "", d) or 0))
    return out


class DirectoryWatch:
    """Calls its listeners when a watched directory's entries change (its mtime moves):
    the kubelet's unprepare changes files inside a node, which no API event reports."""

    def __init__(self, dirs: Callable[[], Sequence[Path]], interval: float = 0.1) -> None:
        self.listeners: list[Callable[..., None]] = []
        self._dirs = dirs
        self._interval = interval
        self._seen: dict[Path, int] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="directory-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            now = {d: _mtime(d) for d in self._dirs()}
            if now != self._seen:
                self._seen = now
                for listener in list(self.listeners):
                    listener()
            await asyncio.sleep(self._interval)  # a file system has no change stream here


def _mtime(path: Path) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


class RealNodes:
    """The real nodes of one simulated cluster and the plugin process on each."""

    def __init__(
        self,
        control_plane: RealControlPlane,
        workdir: Path,
        *,
        kubelet_minor: str | None = None,
        kubelet_verbosity: int = 2,
        plugin_args: Sequence[str] = (),
    ) -> None:
        self.cp = control_plane
        self.plugin_args = tuple(plugin_args)
        #: Flags for one node's plugin only, after ``plugin_args`` (from its next start on).
        self.node_args: dict[str, tuple[str, ...]] = {}
        self.fleet = RealNodeFleet(
            control_plane,
            workdir=workdir,
            kubelet_minor=kubelet_minor,
            verbosity=kubelet_verbosity,
        )
        self.watch = DirectoryWatch(lambda: [n.layout.cdi_dir for n in self.fleet.nodes.values()])
        self.plugins: dict[str, Component] = {}
        self._specs: dict[str, SimNode] = {}
        self._kubeconfigs: dict[str, Path] = {}

    def node(self, name: str) -> RealNode:
        return self.fleet.nodes[name]

    def cdi_dir(self, name: str) -> Path:
        return self.fleet.nodes[name].layout.cdi_dir

    def start(self, nodes: Sequence[SimNode]) -> None:
        """Start the nodes (from the calling thread: their processes die with it)."""
        self.fleet.start([(n.name, node_labels(n)) for n in nodes])
        self._specs.update({n.name: n for n in nodes})
        self.watch.start()

    def start_plugin(
        self, name: str, kubeconfig: Path | None = None, *, pod_uid: str | None = None
    ) -> Component:
        """Start the plugin process of node ``name`` (again: the kubeconfig it had); with a
        ``pod_uid`` a second instance beside the first, as a rolling update runs it."""
        kubeconfig = kubeconfig or self._kubeconfigs[name]
        self._kubeconfigs[name] = kubeconfig
        node = self.fleet.nodes[name]
        # As the DaemonSet's pods do, every instance has a pod UID: its sockets carry it.
        uid = pod_uid or f"{name}-plugin"
        extra = (*self.plugin_args, *self.node_args.get(name, ()))
        argv = plugin_argv(self._specs[name], kubeconfig, uid, extra)
        comp = node.spawn(f"{PLUGIN}-{uid}", argv)
        if not pod_uid:
            self.plugins[name] = comp
        return comp

    def _node_of(self, comp: Component) -> RealNode:
        return next(n for n in self.fleet.nodes.values() if comp in n.spawned.values())

    async def wait_ready(self, comp: Component, limit: float = PLUGIN_READY_LIMIT) -> None:
        """Until the plugin instance's ``/readyz`` says yes: registered with the kubelet and
        its slice published (what the DaemonSet's readiness probe waits for). Its port is
        the one it printed when it started."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while loop.time() < deadline:
            if comp.proc is not None and comp.proc.poll() is not None:
                raise RuntimeError(f"plugin {comp.name} exited:\n{tail(comp.log)}")
            ports: list[str] = re.findall(
                r": http port (\d+)", comp.log.read_text(errors="replace")
            )
            node = self._node_of(comp)
            url = f"http://127.0.0.1:{ports[-1]}/readyz" if ports else ""
            ready = bool(ports) and await asyncio.to_thread(node.http_ok, url)
            if ready:
                return
            await asyncio.sleep(0.1)  # a readiness endpoint, polled like a kubelet probe
        # Which half of readiness is missing (registration or the slice) is in the plugin's log;
        # whether the kubelet saw its socket at all is in the kubelet's.
        kubelet = self._node_of(comp).components[KUBELET].log
        seen = [
            line
            for line in kubelet.read_text(errors="replace").splitlines()
            if comp.name.removeprefix(f"{PLUGIN}-") in line
        ]
        raise TimeoutError(
            f"plugin {comp.name} not ready after {limit:g} s; its log:\n{tail(comp.log)}\n"
            "the kubelet's lines about it:\n" + "\n".join(seen[-10:])
        )

    def plugin_failed(self) -> str | None:
        """A plugin that exited, with its log's telling lines (a start must not hang on it)."""
        for name, comp in self.plugins.items():
            if comp.proc is not None and comp.proc.poll() is not None:
                return f"plugin on {name} exited with {comp.proc.returncode}:\n{tail(comp.log)}"
        return None

    def stop_plugin(self, name: str, *, kill: bool = False, pod_uid: str | None = None) -> None:
        uid = pod_uid or f"{name}-plugin"
        if name in self.fleet.nodes:
            self.fleet.nodes[name].stop_spawned(f"{PLUGIN}-{uid}", kill=kill)
        if not pod_uid:
            self.plugins.pop(name, None)

    def fail(self, name: str) -> None:
        """The node dies: every process of it (kubelet, containerd, pods, plugin) is killed;
        its disk stays, for :meth:`recover`."""
        self.plugins.pop(name, None)
        self.fleet.nodes[name].stop()

    def recover(self, name: str) -> None:
        """The failed node boots again (a new boot id) and its plugin starts again."""
        self.fleet.nodes[name].start()
        self.start_plugin(name)

    async def stop(self) -> None:
        await self.watch.stop()
        self.plugins.clear()
        self.fleet.stop()

    async def look_inside(self, pod: Mapping[str, Any], container: str) -> ContainerDevices:
        """What ``container`` of ``pod`` has: its Neuron device nodes and environment, read
        with ``kubectl exec`` as a user would."""
        return await look_inside(self.cp, pod, container)


async def look_inside(
    cp: RealControlPlane, pod: Mapping[str, Any], container: str, limit: float = _EXEC_LIMIT
) -> ContainerDevices:
    """What ``container`` of ``pod`` has (its Neuron device nodes and environment), read with
    ``kubectl exec``; errors that go away (:data:`_TRANSIENT`) are retried for ``limit`` s."""
    meta = pod["metadata"]
    args = (
        "exec", "-n", str(meta.get("namespace") or "default"), str(meta["name"]),
        "-c", container, "--", "sh", "-c", _LOOK_INSIDE,
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while True:
        proc = await asyncio.create_subprocess_exec(
            str(cp.bin_dir / "kubectl"), "--kubeconfig", str(cp.kubeconfig()),
            f"--request-timeout={max(1, int(limit))}s",
            *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            # An exec into a node that is going down can hang past the request timeout
            # (the stream is upgraded): bounded here too.
            out, err = await asyncio.wait_for(proc.communicate(), limit + 5)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise RuntimeError(
                f"kubectl {' '.join(args[:4])}: no answer in {limit + 5:g} s"
            ) from None
        message = err.decode(errors="replace").strip()
        if proc.returncode == 0:
            try:
                return parse_look_inside(out.decode(errors="replace"))
            except LookCutShort as exc:
                message = str(exc)  # looked again, as a container that is just going away
        elif not _TRANSIENT.search(message):
            raise RuntimeError(f"kubectl {' '.join(args[:4])}: {message}")
        if loop.time() > deadline:
            raise RuntimeError(f"kubectl {' '.join(args[:4])}: {message}")
        log.info("kubectl exec into %s: %s (retrying)", meta["name"], message)
        await asyncio.sleep(0.5)  # the resolver's cache or a starting container
