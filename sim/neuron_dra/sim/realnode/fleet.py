"""Real nodes for one control plane: as many as a test wants, started side by side.

    fleet = RealNodeFleet(control_plane, workdir=tmp / "nodes")
    fleet.start([("trn2-0", {"node.kubernetes.io/instance-type": "trn2.48xlarge"}), ...])
    ...
    fleet.stop()

The kubelets are of the control plane's minor unless ``kubelet_minor`` names another pinned
one (a node-only minor such as 1.36, run against a newer control plane as the version-skew
policy allows), or several (``"1.35,1.36"``), which the nodes get in turn: a cluster in the
middle of an upgrade. Nodes register with their own identity (``system:node:<name>``), their
names resolve to 127.0.0.1 for the API server (:meth:`RealControlPlane.add_node_names`),
and each has a cgroup root named after the process that owns it, so roots a killed run left
behind are found and removed by the next one.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from neuron_dra.sim.kubebuild import containerd_module, kube_module
from neuron_dra.sim.realcluster import RealControlPlane, node_identity, profile_for

from . import cgroups
from .configs import CNI_BIN_DIR, RUNC
from .images import BUSYBOX, ImageError, build_images
from .layout import PRIVATE_DIRS, node_address, pod_subnet
from .namespace import NodeError, kill_all
from .node import NodeBinaries, NodeSpec, RealNode
from .ports import PortLease, lease_port

_ROOT_PREFIX = "ndra-node-"


class NodeTierUnavailable(Exception):
    """Real nodes cannot run here; the message says what is missing and how to get it."""


def node_tier_problem(minor: str) -> str | None:
    """Why real nodes of ``minor`` cannot run on this machine, or None when they can."""
    if os.geteuid() != 0:
        return "real nodes need root (mount namespaces, cgroups)"
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"real nodes need {tool} (util-linux)"
    for path, package in ((RUNC, "runc"), (BUSYBOX, "busybox-static"), (
        f"{CNI_BIN_DIR}/loopback", "containernetworking-plugins"
    )):  # fmt: skip
        if not Path(path).exists():
            return f"{path} missing: run hack/k8s/node-packages (Debian's {package})"
    mod = kube_module(minor)
    if "kubelet" not in mod.binaries or not mod.built():
        return f"kubelet {minor} not built: run `hack/k8s/build --version {minor}`"
    if not containerd_module().built():
        return "containerd not built: run `hack/k8s/build --version containerd`"
    here = Path(__file__).resolve()
    for private in PRIVATE_DIRS:
        if here.is_relative_to(private):
            return f"the checkout is under {private}, which a real node replaces by its own"
    return None


#: inotify instances one node holds: the kubelet 6 (cAdvisor, the plugin watcher, the
#: flexvolume prober, its serving certificate, the client CA, one more), containerd 2.
INOTIFY_PER_NODE = 8


def inotify_room() -> tuple[int, int]:
    """(instances free for this user, the limit): the machine's
    ``fs.inotify.max_user_instances`` (128 by default) bounds how many real nodes run at
    once (``hack/k8s/node-packages`` raises it to 1024 where root may)."""
    limit = int(Path("/proc/sys/fs/inotify/max_user_instances").read_text())
    used = 0
    uid = os.geteuid()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if proc.stat().st_uid != uid:
                continue
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) == "anon_inode:inotify":
                    used += 1
        except OSError:
            continue
    return limit - used, limit


def check_room(count: int) -> None:
    free, limit = inotify_room()
    if count * INOTIFY_PER_NODE > free:
        raise NodeError(
            f"{count} more real nodes need ~{count * INOTIFY_PER_NODE} inotify instances; "
            f"{free} of the user's {limit} (fs.inotify.max_user_instances) are free: stop "
            f"other clusters' nodes first (about {limit // INOTIFY_PER_NODE - 2} run at once)"
        )


def kubelet_minors(spec: str) -> list[str]:
    """``"1.36"`` or ``"1.35,1.36"``: the kubelet minors nodes get in turn."""
    minors = [m.strip() for m in spec.split(",") if m.strip()]
    if not minors:
        raise NodeTierUnavailable(f"no kubelet minor in {spec!r}")
    return minors


def _cgroup_root(name: str) -> str:
    return f"{_ROOT_PREFIX}{os.getpid()}-{name}"


def kill_orphaned_shims(shim: Path) -> list[int]:
    """Kill the containerd shims (``shim``: our build's binary) that a killed run left: a
    shim daemonizes, so no parent-death signal reaches it, and it outlives its node's
    containerd on purpose (containers keep running through a containerd restart). A shim is
    an orphan when every process left in its node's mount namespace is a shim: the
    namespace's holder, containerd and the kubelet are gone. Returns the pids killed."""
    by_ns: dict[str, list[tuple[int, bool]]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ns = os.readlink(entry / "ns" / "mnt")
            argv0 = (entry / "cmdline").read_bytes().split(b"\0", 1)[0].decode()
        except OSError:
            continue
        by_ns.setdefault(ns, []).append((int(entry.name), argv0 == str(shim)))
    orphans = [
        pid
        for procs in by_ns.values()
        if all(is_shim for _, is_shim in procs)
        for pid, _ in procs
    ]
    kill_all(orphans)
    return orphans


def remove_orphaned_roots() -> None:
    """Remove what real nodes of a killed run left: their shims and the cgroup roots whose
    owning process is gone."""
    kill_orphaned_shims(containerd_module().bin_dir / "containerd-shim-runc-v2")
    for h in cgroups.hierarchies()[:1]:
        for d in h.glob(f"{_ROOT_PREFIX}*"):
            match = re.match(rf"{_ROOT_PREFIX}(\d+)-", d.name)
            if match and not Path(f"/proc/{match.group(1)}").exists():
                cgroups.remove(d.name)


class RealNodeFleet:
    def __init__(
        self,
        control_plane: RealControlPlane,
        *,
        workdir: Path,
        kubelet_minor: str | None = None,
        verbosity: int = 2,
        extra_images: Sequence[Path] = (),
    ) -> None:
        self.cp = control_plane
        #: Archives imported into every node beside the test images (the product's image).
        self.extra_images = tuple(extra_images)
        #: The kubelets' minors: nodes get them in turn (``"1.35,1.36"``: a cluster in the
        #: middle of an upgrade).
        self.minors = kubelet_minors(kubelet_minor or control_plane.minor)
        self.workdir = workdir
        self.verbosity = verbosity
        self.nodes: dict[str, RealNode] = {}
        self._leases: dict[str, PortLease] = {}
        self._started = 0
        for minor in self.minors:
            problem = node_tier_problem(minor)
            if problem:
                raise NodeTierUnavailable(problem)
        self.bins = {
            m: NodeBinaries(kube_module(m).bin_dir / "kubelet", containerd_module().bin_dir)
            for m in self.minors
        }

    def start(self, nodes: Sequence[tuple[str, Mapping[str, str]]]) -> list[RealNode]:
        """Start a node per ``(name, labels)``, side by side; returns once every kubelet is
        healthy (its Node registers a moment later)."""
        remove_orphaned_roots()
        check_room(len(nodes))
        try:
            images = build_images()
        except ImageError as err:
            raise NodeTierUnavailable(str(err)) from err
        self.cp.add_node_names([name for name, _ in nodes])
        started = []
        for name, labels in nodes:
            minor = self.minors[self._started % len(self.minors)]
            self._started += 1
            # The port the API server dials on the host (the relay binds it there).
            lease = self._leases[name] = lease_port()
            spec = NodeSpec(
                name=name,
                kubeconfig=self.cp.kubeconfig(node_identity(name)),
                client_ca=self.cp.ca_cert,
                kubelet_port=lease.port,
                address=node_address(self._started - 1),
                pod_subnet=pod_subnet(self._started - 1),
                api_server=self.cp.url.removeprefix("https://"),
                cgroup_root=_cgroup_root(name),
                images=(images, *self.extra_images),
                labels=labels,
                feature_gates=dict(profile_for(minor).feature_gates),
                verbosity=self.verbosity,
            )
            node = RealNode(spec, self.bins[minor], self.workdir / name)
            self.nodes[name] = node
            started.append(node)
        try:
            for node in started:
                node.prepare()
            steps = [node.boot_steps() for node in started]
            with ThreadPoolExecutor(max_workers=len(started) or 1) as pool:
                for i in range(len(steps[0]) if steps else 0):
                    if steps[0][i][1]:
                        # Image imports and waits side by side; the first error is raised.
                        for future in [pool.submit(s[i][0]) for s in steps]:
                            future.result()
                    else:
                        for node_steps in steps:
                            node_steps[i][0]()
        except BaseException:
            for node in started:
                self.stop_node(node.name)
            raise
        return started

    def stop_node(self, name: str, *, graceful: bool = True) -> None:
        node = self.nodes.pop(name, None)
        if node is not None:
            node.stop(graceful=graceful)
        lease = self._leases.pop(name, None)
        if lease is not None:
            lease.release()

    def stop(self) -> None:
        """The whole fleet goes: killed, not stopped one process at a time (a kubelet or a
        plugin draining on SIGTERM cost up to 15 s a node at every test's teardown)."""
        for name in list(self.nodes):
            self.stop_node(name, graceful=False)
