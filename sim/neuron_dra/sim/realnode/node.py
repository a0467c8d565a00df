"""One real Kubernetes node on this machine: its own containerd and kubelet (built from the
pinned modules), runc, cgroup root, ports and directories, in a mount namespace of its own
(:mod:`.layout`). The kubelet registers the Node with the node's identity
(``system:node:<name>``: the Node authorizer and NodeRestriction judge it) and runs real
containers; processes of ours started with :meth:`RealNode.spawn` (the kubelet plugin) live
in the same namespace and see what a DaemonSet pod's hostPaths would.

    node = RealNode(spec, bins, workdir / "trn2-0")
    node.start()      # containerd serving, images imported, kubelet healthy
    node.kill(KUBELET); node.restart(KUBELET)
    node.reboot()     # everything stops, a new boot id, everything starts again
    node.stop()       # nothing of the node is left: processes, mounts, cgroups
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from neuron_dra.sim.realcluster.identities import KUBERNETES_SERVICE_IP
from neuron_dra.sim.realcluster.processes import Component, tail

from . import cgroups
from .configs import KUBELET_HEALTHZ_PORT, cni_conflist, containerd_config, kubelet_config
from .images import SANDBOX_IMAGE
from .layout import NodeLayout
from .namespace import (
    NodeError,
    NodeNamespace,
    NodeNetwork,
    die_with_us,
    set_boot_id,
    write_proc_sys,
)
from .netns import call_in

CONTAINERD = "containerd"
KUBELET = "kubelet"
COMPONENTS = (CONTAINERD, KUBELET)
_SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class NodeBinaries:
    """The kubelet of the node's minor and the containerd build (containerd, ctr, shim)."""

    kubelet: Path
    containerd_dir: Path

    @property
    def ctr(self) -> Path:
        return self.containerd_dir / "ctr"


@dataclass(frozen=True)
class NodeSpec:
    """What the node is: its name, labels, ports, cgroup root and how it reaches the API."""

    name: str
    kubeconfig: Path  # the node's identity, system:node:<name>
    client_ca: Path  # the CA whose client certificates (the API server's) may call the kubelet
    kubelet_port: int
    address: str  # the node's address (layout.node_address), on its own loopback
    pod_subnet: str  # its pods' addresses (layout.pod_subnet)
    api_server: str  # host:port of the API server on the host's loopback
    cgroup_root: str
    #: image archives imported into the node's containerd (images.build_images first; the
    #: product's, from hack/build-image --local, where a test installs it)
    images: tuple[Path, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    verbosity: int = 2


def node_network(spec: NodeSpec) -> NodeNetwork:
    """The node's addresses and relays: the API server reaches its kubelet; its kubelet,
    plugin and hostNetwork pods reach the API server by the kubeconfig's address or by the
    ``kubernetes`` Service's ClusterIP (what in-cluster clients dial)."""
    return NodeNetwork(
        addresses=(spec.address, KUBERNETES_SERVICE_IP),
        ins=(f"127.0.0.1:{spec.kubelet_port}",),
        outs=(
            (spec.api_server, spec.api_server),
            (f"{KUBERNETES_SERVICE_IP}:443", spec.api_server),
        ),
    )


class RealNode:
    def __init__(
        self, spec: NodeSpec, bins: NodeBinaries, root: Path, *, ready_limit: float = 60.0
    ) -> None:
        self.spec = spec
        self.bins = bins
        self.layout = NodeLayout(spec.name, root)
        self.ready_limit = ready_limit
        self.namespace = NodeNamespace(self.layout, node_network(spec))
        self.components: dict[str, Component] = {}
        self.spawned: dict[str, Component] = {}
        self.boot_id = str(uuid.uuid4())
        self._booted = False

    @property
    def name(self) -> str:
        return self.spec.name

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> RealNode:
        """Start the node; once more after :meth:`stop` it boots again (a new boot id), on
        the disk it had."""
        if self._booted:
            self.boot_id = str(uuid.uuid4())
        self._booted = True
        try:
            self.prepare()
            self._boot()
        except BaseException:
            self.stop()
            raise
        return self

    def prepare(self) -> None:
        """The node's directories and configuration files (nothing runs yet)."""
        sock = str(self.layout.containerd_socket)
        if len(sock.encode()) > 107:  # sun_path: the socket is reached from here by this path
            raise NodeError(
                f"node {self.name}: {sock} is {len(sock)} bytes, longer than a unix socket "
                "path may be (107): give the node a shorter directory"
            )
        for d in self.layout.directories():
            d.mkdir(parents=True, exist_ok=True)
        write_proc_sys(self.layout, self.boot_id)
        cfg = self.layout.config_dir
        (cfg / "containerd.toml").write_text(
            containerd_config(self.layout, sandbox_image=SANDBOX_IMAGE)
        )
        (cfg / "cni").mkdir(exist_ok=True)
        (cfg / "cni" / "10-pods.conflist").write_text(
            json.dumps(cni_conflist(self.spec.pod_subnet))
        )
        kubelet_yaml = kubelet_config(
            port=self.spec.kubelet_port,
            cgroup_root="/" + self.spec.cgroup_root,
            client_ca=self.spec.client_ca,
            feature_gates=self.spec.feature_gates,
        )
        (cfg / "kubelet.yaml").write_text(yaml.safe_dump(kubelet_yaml))
        log = self.layout.log_dir
        self.components[CONTAINERD] = Component(
            CONTAINERD,
            [
                "env", f"PATH={self.bins.containerd_dir}:{_SYSTEM_PATH}",
                str(self.bins.containerd_dir / "containerd"),
                "--config", str(cfg / "containerd.toml"),
            ],
            log / "containerd.log",
            None,
        )  # fmt: skip
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.spec.labels.items()))
        self.components[KUBELET] = Component(
            KUBELET,
            [
                str(self.bins.kubelet),
                "--config", str(cfg / "kubelet.yaml"),
                "--kubeconfig", str(self.spec.kubeconfig),
                "--hostname-override", self.name,
                "--node-ip", self.spec.address,
                *(["--node-labels", labels] if labels else []),
                f"--v={self.spec.verbosity}",
            ],
            log / "kubelet.log",
            f"http://127.0.0.1:{KUBELET_HEALTHZ_PORT}/healthz",
        )  # fmt: skip

    def _boot(self) -> None:
        """Namespace, cgroups, containerd (images imported), kubelet: in that order."""
        for step, _ in self.boot_steps():
            step()

    def boot_steps(self) -> list[tuple[Callable[[], None], bool]]:
        """The steps of a boot, each quick to start or a wait, and whether it may run on a
        thread of its own: :class:`.fleet.RealNodeFleet` takes many nodes through them side
        by side. Steps that start the node's processes may not (a child started with
        ``--pdeathsig`` dies with the thread that started it)."""
        return [
            (self._begin, False),
            (self._wait_containerd, True),
            (self._import_images, True),
            (lambda: self._launch(self.components[KUBELET]), False),
            (self._wait_kubelet, True),
        ]

    def _begin(self) -> None:
        self.namespace.start()
        cgroups.create(self.spec.cgroup_root)
        self._launch(self.components[CONTAINERD])

    def stop(self, *, graceful: bool = True) -> None:
        """Stop the kubelet first (so it starts nothing new), then everything else of the
        node: our spawned processes, containerd, the shims and the pods' processes. Not
        ``graceful``: everything is killed at once (a node whose disk goes with it: nothing
        it would write on the way down is read again)."""
        end = _terminate if graceful else _kill
        for comp in (self.components.get(KUBELET), *self.spawned.values()):
            if comp is not None:
                end(comp)
        comp = self.components.get(CONTAINERD)
        if comp is not None:
            end(comp)
        self.namespace.stop()
        cgroups.remove(self.spec.cgroup_root)

    def reboot(self) -> None:
        """The node goes down hard and comes back with a new boot id: every process of the
        node is killed (pods included), the node's disk (its directories) stays."""
        self.halt()
        self._boot()

    def halt(self) -> None:
        """The first half of :meth:`reboot`: the node is down, with a new boot id for when it
        boots again (:meth:`boot_steps`; a caller with an event loop runs them itself)."""
        for comp in (*self.spawned.values(), *self.components.values()):
            _kill(comp)
        self.namespace.stop()
        cgroups.remove(self.spec.cgroup_root)
        # What a reboot wipes: /run is a tmpfs on a real node.
        run = self.layout.host_path("/run")
        for child in sorted(run.rglob("*"), key=lambda p: -len(p.parts)):
            if child.is_dir() and not child.is_symlink():
                child.rmdir()
            else:
                child.unlink()
        self.layout.cdi_dir.mkdir(parents=True, exist_ok=True)
        self.boot_id = str(uuid.uuid4())
        set_boot_id(self.layout, self.boot_id)

    # --- components ------------------------------------------------------------------------

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal ``containerd`` or ``kubelet`` (SIGKILL by default) and reap it."""
        comp = self.components[name]
        if comp.proc is not None and comp.proc.poll() is None:
            comp.proc.send_signal(sig)
            comp.proc.wait(timeout=30)

    def restart(self, name: str) -> None:
        self.relaunch(name)
        self.wait_up(name)

    def relaunch(self, name: str) -> None:
        """Start ``containerd`` or ``kubelet`` again (stopped first if it runs) without
        waiting: from the thread the node's processes should die with."""
        comp = self.components[name]
        _terminate(comp)
        comp.restarts += 1
        self._launch(comp)

    def wait_up(self, name: str) -> None:
        """Until ``containerd`` serves or the ``kubelet`` is healthy (a thread may wait)."""
        if name == CONTAINERD:
            self._wait_containerd()
        else:
            self._wait_kubelet()

    def running(self, name: str) -> bool:
        comp = self.components.get(name) or self.spawned.get(name)
        return comp is not None and comp.proc is not None and comp.proc.poll() is None

    def spawn(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> Component:
        """Start one of our processes inside the node (a kubelet plugin, say); its output goes
        to ``logs/<name>.log``. Stopped with the node, or by :meth:`stop_spawned`."""
        prefix = ["env", *(f"{k}={v}" for k, v in (env or {}).items())] if env else []
        comp = Component(name, [*prefix, *argv], self.layout.log_dir / f"{name}.log", None)
        self.spawned[name] = comp
        self._launch(comp)
        return comp

    def stop_spawned(self, name: str, *, kill: bool = False) -> None:
        comp = self.spawned.pop(name, None)
        if comp is not None:
            (_kill if kill else _terminate)(comp)

    def _launch(self, comp: Component) -> None:
        out = comp.log.open("ab")
        try:
            comp.proc = subprocess.Popen(
                die_with_us(self.namespace.enter(comp.argv)),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            out.close()

    # --- waiting ---------------------------------------------------------------------------

    def _wait(self, comp: Component, ready: object, what: str) -> None:
        deadline = time.monotonic() + self.ready_limit
        while time.monotonic() < deadline:
            assert comp.proc is not None
            if comp.proc.poll() is not None:
                raise NodeError(
                    f"node {self.name}: {comp.name} exited with {comp.proc.returncode}; "
                    f"log {comp.log}:\n{tail(comp.log)}"
                )
            if callable(ready) and ready():
                return
            time.sleep(0.05)
        raise NodeError(f"node {self.name}: {what} after {self.ready_limit:.0f} s; log {comp.log}")

    def _wait_containerd(self) -> None:
        sock = self.layout.containerd_socket

        def serving() -> bool:
            with socket.socket(socket.AF_UNIX) as s:
                try:
                    s.connect(str(sock))
                except OSError:
                    return False
            return True

        self._wait(self.components[CONTAINERD], serving, "containerd not serving")

    def _wait_kubelet(self) -> None:
        comp = self.components[KUBELET]
        assert comp.health_url is not None
        url = comp.health_url

        def healthy() -> bool:
            return self.http_ok(url)

        self._wait(comp, healthy, "kubelet not healthy")

    def http_ok(self, url: str) -> bool:
        """Whether ``url``, on the node's network (its loopback, its ports), answers 200."""

        def get() -> bool:
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    return bool(r.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        return call_in(self.namespace.netns, get)

    def ctr(self, *args: str) -> str:
        """``ctr`` against the node's containerd, in Kubernetes' namespace (``images tag A B``:
        a new image name for a rolling update without a registry)."""
        proc = subprocess.run(
            [str(self.bins.ctr), "--address", str(self.layout.containerd_socket),
             "--namespace", "k8s.io", *args],
            capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip
        if proc.returncode != 0:
            raise NodeError(f"node {self.name}: ctr {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def _import_images(self) -> None:
        for archive in self.spec.images:
            self.ctr("images", "import", str(archive))


def _terminate(comp: Component, limit: float = 15.0) -> None:
    proc = comp.proc
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=limit)


def _kill(comp: Component) -> None:
    proc = comp.proc
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)
