"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager
and kube-scheduler built from the modules pinned under ``hack/k8s`` (see :mod:`.kubebuild`).

    with RealControlPlane(bin_dir, "1.34") as cp:
        kubeconfig = cp.kubeconfig(ADMIN)
        node_kubeconfig = cp.kubeconfig(node_identity("trn2-0"))

What users run is what this runs: ``Node,RBAC`` authorization with ``NodeRestriction``
admission, service-account signing keys (the controller-manager runs each controller under
its own service account), the DRA API versions and feature gates of the minor, the
resourceclaim controller turning templates into claims, the real scheduler's DRA allocator.
Every identity is an X.509 client certificate signed by a CA made for the run (``openssl``),
so a kubeconfig for any user/groups — a node's ``system:node:<name>`` — can be issued at any
time. The serving certificate is signed by the same CA: clients verify TLS.

The class is synchronous on purpose: a pytest session shares one control plane among tests
that each run their own event loop. Children die with the process that started them
(``PR_SET_PDEATHSIG``), so a killed test run leaves no process behind.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

ETCD = "etcd"
APISERVER = "kube-apiserver"
CONTROLLER_MANAGER = "kube-controller-manager"
SCHEDULER = "kube-scheduler"
COMPONENTS = (ETCD, APISERVER, CONTROLLER_MANAGER, SCHEDULER)
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"


@dataclass(frozen=True)
class Identity:
    """Who a client certificate says the caller is (CN = user, O = groups)."""

    user: str
    groups: tuple[str, ...] = ()

    @property
    def file_stem(self) -> str:
        return "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in self.user)


ADMIN = Identity("neuron-dra-admin", ("system:masters",))
KUBE_CONTROLLER_MANAGER = Identity("system:kube-controller-manager")
KUBE_SCHEDULER = Identity("system:kube-scheduler")


def node_identity(node: str) -> Identity:
    """The identity a kubelet has: the Node authorizer and NodeRestriction key on it."""
    return Identity(f"system:node:{node}", ("system:nodes",))


@dataclass(frozen=True)
class MinorProfile:
    """What a minor needs switched on for the DRA features in this project's compass:
    prioritized list, admin access, device taints, partitionable devices, consumable
    capacity. Gates that are GA and locked in a minor must not be set there."""

    feature_gates: Mapping[str, bool]
    runtime_config: Sequence[str]


PROFILES: dict[tuple[int, int], MinorProfile] = {
    # 1.34: prioritized list and admin access are beta (on by default, set for clarity);
    # device taints, partitionable devices and consumable capacity are alpha. DeviceTaintRule
    # is served only by resource.k8s.io/v1alpha3.
    (1, 34): MinorProfile(
        feature_gates={
            "DRAPrioritizedList": True,
            "DRAAdminAccess": True,
            "DRADeviceTaints": True,
            "DRAPartitionableDevices": True,
            "DRAConsumableCapacity": True,
        },
        runtime_config=(
            "resource.k8s.io/v1beta1=true",
            "resource.k8s.io/v1beta2=true",
            "resource.k8s.io/v1alpha3=true",
        ),
    ),
    # 1.37: prioritized list and admin access are GA and locked; device taints (and their
    # rules) GA; partitionable devices and consumable capacity beta, on by default.
    (1, 37): MinorProfile(
        feature_gates={"DRAPartitionableDevices": True, "DRAConsumableCapacity": True},
        runtime_config=("resource.k8s.io/v1beta1=true", "resource.k8s.io/v1beta2=true"),
    ),
}


def profile_for(minor: str) -> MinorProfile:
    """The profile of ``minor``, or of the newest profiled minor below it."""
    want = tuple(int(p) for p in minor.removeprefix("v").split(".")[:2])
    known = [k for k in sorted(PROFILES) if k <= want]
    if not known:
        raise ValueError(f"no launch profile for Kubernetes {minor} (oldest known: 1.34)")
    return PROFILES[known[-1]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ControlPlaneError(RuntimeError):
    """A component failed to start or to become ready; the message names its log."""


@dataclass
class _Component:
    name: str
    argv: list[str]
    log: Path
    health_url: str | None
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0


class CertificateAuthority:
    """A CA for one run, made and used through the ``openssl`` command line."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cert = self.dir / "ca.crt"
        self.key = self.dir / "ca.key"
        _openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(self.key), "-out", str(self.cert), "-days", "3650",
            "-subj", "/CN=neuron-dra-test-ca",
        )  # fmt: skip

    def issue(self, stem: str, subject: str, extensions: str) -> tuple[Path, Path]:
        """A key and a certificate signed by this CA for ``subject`` (``/CN=.../O=...``)."""
        key, csr, crt = (self.dir / f"{stem}.{ext}" for ext in ("key", "csr", "crt"))
        ext_file = self.dir / f"{stem}.ext"
        ext_file.write_text(extensions + "\n")
        _openssl(
            "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", subject,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(self.cert), "-CAkey", str(self.key),
            "-CAcreateserial", "-days", "3650", "-out", str(crt), "-extfile", str(ext_file),
        )  # fmt: skip
        return crt, key

    def client_paths(self, identity: Identity) -> tuple[Path, Path]:
        stem = f"client-{identity.file_stem}"
        return self.dir / f"{stem}.crt", self.dir / f"{stem}.key"

    def client(self, identity: Identity) -> tuple[Path, Path]:
        subject = f"/CN={identity.user}" + "".join(f"/O={g}" for g in identity.groups)
        return self.issue(f"client-{identity.file_stem}", subject, "extendedKeyUsage=clientAuth")

    def server(self, stem: str, hosts: Iterable[str]) -> tuple[Path, Path]:
        sans = ",".join(f"IP:{h}" if h[0].isdigit() else f"DNS:{h}" for h in hosts)
        return self.issue(
            stem, f"/CN={stem}", f"subjectAltName={sans}\nextendedKeyUsage=serverAuth"
        )


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ControlPlaneError(f"openssl {args[0]} failed: {proc.stderr.strip()}")


@dataclass
class RealControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler as child processes.

    ``components`` picks a subset (the contract tests need only etcd and the apiserver);
    ``crd_paths`` are applied with the real kubectl once the apiserver is ready;
    ``apiserver_args`` are extra flags (an audit policy, say)."""

    bin_dir: Path
    minor: str
    workdir: Path | None = None
    components: Sequence[str] = COMPONENTS
    crd_paths: Sequence[Path] = ()
    apiserver_args: Sequence[str] = ()
    ready_limit: float = 90.0
    url: str = field(init=False, default="")
    _components: dict[str, _Component] = field(init=False, default_factory=dict)
    _kubeconfigs: dict[Identity, Path] = field(init=False, default_factory=dict)
    _own_workdir: bool = field(init=False, default=False)

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> RealControlPlane:
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="ndra-k8s-", dir="/tmp"))
            self._own_workdir = True
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        try:
            self._prepare()
            for name in COMPONENTS:
                if name in self.components:
                    self._launch(self._components[name])
                    self._wait_healthy(self._components[name])
                    if name == APISERVER:
                        self._wait_rbac_bootstrapped()
                        self._install_crds()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for comp in reversed(list(self._components.values())):
            self._terminate(comp)
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> RealControlPlane:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal one component (SIGKILL by default) and reap it; :meth:`restart` brings it
        back with the same flags, ports and data."""
        comp = self._components[name]
        if comp.proc is not None and comp.proc.poll() is None:
            comp.proc.send_signal(sig)
            comp.proc.wait(timeout=30)

    def restart(self, name: str) -> None:
        comp = self._components[name]
        self._terminate(comp)
        comp.restarts += 1
        self._launch(comp)
        self._wait_healthy(comp)

    def running(self, name: str) -> bool:
        proc = self._components[name].proc
        return proc is not None and proc.poll() is None

    def pids(self) -> dict[str, int]:
        return {
            n: c.proc.pid for n, c in self._components.items() if c.proc and c.proc.poll() is None
        }

    @property
    def log_dir(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "logs"

    # --- identities ------------------------------------------------------------------------

    def kubeconfig(self, identity: Identity = ADMIN) -> Path:
        """A kubeconfig file for ``identity`` (made once, then reused)."""
        if identity not in self._kubeconfigs:
            assert self.workdir is not None
            crt, key = self._ca.client(identity)
            path = self.workdir / "kubeconfigs" / f"{identity.file_stem}.kubeconfig"
            path.parent.mkdir(exist_ok=True)
            path.write_text(yaml.safe_dump(self._kubeconfig_doc(crt, key)))
            self._kubeconfigs[identity] = path
        return self._kubeconfigs[identity]

    def client_configuration(self, identity: Identity = ADMIN) -> Any:
        """A ``kubernetes_asyncio`` Configuration for ``identity`` (TLS verified)."""
        from kubernetes_asyncio import client as k8s

        self.kubeconfig(identity)
        crt, key = self._ca.client_paths(identity)
        cfg = k8s.Configuration(host=self.url)
        cfg.ssl_ca_cert = str(self._ca.cert)
        cfg.cert_file, cfg.key_file = str(crt), str(key)
        return cfg

    def _kubeconfig_doc(self, crt: Path, key: Path) -> dict[str, object]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "real",
                    "cluster": {"server": self.url, "certificate-authority": str(self._ca.cert)},
                }
            ],
            "users": [
                {
                    "name": "user",
                    "user": {"client-certificate": str(crt), "client-key": str(key)},
                }
            ],
            "contexts": [{"name": "real", "context": {"cluster": "real", "user": "user"}}],
            "current-context": "real",
        }

    def kubectl(self, *args: str, identity: Identity = ADMIN, check: bool = True) -> str:
        """Run the real kubectl of this minor; stdout, or :class:`ControlPlaneError`."""
        proc = subprocess.run(
            [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig(identity)), *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if check and proc.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    # --- internals -------------------------------------------------------------------------

    def _prepare(self) -> None:
        assert self.workdir is not None
        pki = self.workdir / "pki"
        self._ca = CertificateAuthority(pki)
        self._admin_pair = self._ca.client(ADMIN)
        serving_crt, serving_key = self._ca.server("apiserver", ["127.0.0.1", "localhost"])
        sa_key = pki / "sa.key"
        _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(sa_key))
        profile = profile_for(self.minor)
        gates = ",".join(f"{k}={str(v).lower()}" for k, v in profile.feature_gates.items())
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        self.url = f"https://127.0.0.1:{api_port}"
        etcd_url, peer_url = f"http://127.0.0.1:{etcd_port}", f"http://127.0.0.1:{peer_port}"
        self._add(
            ETCD,
            [
                "--name", "default", "--data-dir", str(self.workdir / "etcd"),
                "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", f"default={peer_url}",
                "--unsafe-no-fsync", "--log-level", "warn",
            ],
            f"{etcd_url}/health",
        )  # fmt: skip
        self._add(
            APISERVER,
            [
                "--etcd-servers", etcd_url,
                "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
                "--secure-port", str(api_port),
                "--tls-cert-file", str(serving_crt), "--tls-private-key-file", str(serving_key),
                "--client-ca-file", str(self._ca.cert),
                "--authorization-mode", "Node,RBAC",
                "--enable-admission-plugins", "NodeRestriction",
                "--service-account-issuer", SA_ISSUER,
                "--service-account-key-file", str(sa_key),
                "--service-account-signing-key-file", str(sa_key),
                "--api-audiences", SA_ISSUER,
                # No Endpoints for the "kubernetes" Service: nothing runs in a pod here, and
                # 1.37's reconciler refuses the loopback address we serve on.
                "--endpoint-reconciler-type", "none",
                "--service-cluster-ip-range", "10.96.0.0/16",
                "--allow-privileged=true",
                "--profiling=false",
                "--feature-gates", gates,
                "--runtime-config", ",".join(profile.runtime_config),
                *self.apiserver_args,
            ],
            f"{self.url}/readyz",
        )  # fmt: skip
        for name, identity in (
            (CONTROLLER_MANAGER, KUBE_CONTROLLER_MANAGER),
            (SCHEDULER, KUBE_SCHEDULER),
        ):
            if name not in self.components:
                continue
            port = free_port()
            kubeconfig = str(self.kubeconfig(identity))
            extra = (
                [
                    "--use-service-account-credentials=true",
                    "--service-account-private-key-file", str(sa_key),
                    "--root-ca-file", str(self._ca.cert),
                ]
                if name == CONTROLLER_MANAGER
                else []
            )  # fmt: skip
            self._add(
                name,
                [
                    "--kubeconfig", kubeconfig,
                    "--authentication-kubeconfig", kubeconfig,
                    "--authorization-kubeconfig", kubeconfig,
                    "--leader-elect=false",
                    "--bind-address", "127.0.0.1", "--secure-port", str(port),
                    "--cert-dir", str(self.workdir / name),
                    "--feature-gates", gates,
                    *extra,
                ],
                f"https://127.0.0.1:{port}/healthz",
            )  # fmt: skip

    def _add(self, name: str, args: list[str], health_url: str) -> None:
        assert self.workdir is not None
        argv = [str(self.bin_dir / name), *args]
        log = self.workdir / "logs" / f"{name}.log"
        self._components[name] = _Component(name, argv, log, health_url)

    def _launch(self, comp: _Component) -> None:
        out = comp.log.open("ab")
        try:
            comp.proc = subprocess.Popen(
                comp.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C to the test run reaches us, not them
                # PR_SET_PDEATHSIG fires when the *thread* that forked exits: only the main
                # thread lives as long as the process (elsewhere, atexit stops them).
                preexec_fn=(
                    _die_with_parent
                    if threading.current_thread() is threading.main_thread()
                    else None
                ),
            )
        finally:
            out.close()

    def _terminate(self, comp: _Component) -> None:
        proc = comp.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)

    def _admin_ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self._ca.cert))
        crt, key = self._admin_pair
        ctx.load_cert_chain(str(crt), str(key))
        return ctx

    def _wait_healthy(self, comp: _Component) -> None:
        """Poll the component's health endpoint: the only readiness signal a child process
        gives. Fails at once, quoting its log's tail, if the process exits."""
        assert comp.health_url is not None
        if comp.name == APISERVER:
            ctx: ssl.SSLContext | None = self._admin_ssl_context()
        elif comp.health_url.startswith("https"):
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE  # kcm/scheduler serve a self-signed pair
        else:
            ctx = None
        deadline = time.monotonic() + self.ready_limit
        last = ""
        while time.monotonic() < deadline:
            assert comp.proc is not None
            if comp.proc.poll() is not None:
                raise ControlPlaneError(
                    f"{comp.name} exited with {comp.proc.returncode}; log {comp.log}:\n"
                    + _tail(comp.log)
                )
            try:
                with urllib.request.urlopen(comp.health_url, context=ctx, timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError) as err:
                last = str(err)
            time.sleep(0.1)
        raise ControlPlaneError(
            f"{comp.name} not healthy after {self.ready_limit:.0f} s ({last}); log {comp.log}:\n"
            + _tail(comp.log)
        )

    def _wait_rbac_bootstrapped(self) -> None:
        """/readyz includes the RBAC bootstrap hook, but the components' identities need the
        bootstrap ClusterRoleBindings readable before they start: check one."""
        self._poll(
            lambda: (
                "system:kube-scheduler"
                in self.kubectl("get", "clusterrolebinding", "-o", "name", check=False)
            ),
            "bootstrap RBAC",
        )

    def _install_crds(self) -> None:
        if not self.crd_paths:
            return
        for path in self.crd_paths:
            self.kubectl("apply", "--server-side", "-f", str(path))
        names = [
            doc["metadata"]["name"]
            for path in self.crd_paths
            for doc in yaml.safe_load_all(path.read_text())
            if doc
        ]
        self.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s",
            *[f"crd/{n}" for n in names],
        )  # fmt: skip

    def _poll(self, predicate: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.ready_limit
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.1)
        raise ControlPlaneError(f"{what} not ready after {self.ready_limit:.0f} s")


def _tail(path: Path, lines: int = 30) -> str:
    """The log's klog error and fatal lines (``E1125 ...``, ``F1125 ...``) if it has any,
    else its last ``lines`` lines: what says why a component stopped."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    errors = [line for line in text if re.match(r"[EF]\d{4} ", line)]
    return "\n".join((errors or text)[-lines:])


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# --- one control plane per minor, shared by a test session ----------------------------------

#: Which minors the real tier runs: "all" pinned ones (default), or a comma list ("1.34").
MINORS_ENV = "NEURON_DRA_K8S_MINORS"
_shared: dict[str, RealControlPlane] = {}


class RealTierUnavailable(Exception):
    """The components of a minor are not built here; the message says how to build them."""


def enabled_minors() -> list[str]:
    from .kubebuild import kube_modules

    pinned = [m.name for m in kube_modules()]
    wanted = os.environ.get(MINORS_ENV, "all")
    if wanted == "all":
        return pinned
    return [m for m in (w.strip() for w in wanted.split(",")) if m in pinned]


def bin_dir_for(minor: str) -> Path:
    """The cached build of ``minor``, or :class:`RealTierUnavailable` saying how to build it."""
    from .kubebuild import kube_module

    mod = kube_module(minor)
    if not mod.built():
        raise RealTierUnavailable(
            f"real Kubernetes {minor} not built: run `hack/k8s/build --version {minor}` "
            f"(needs Go; cache {mod.bin_dir})"
        )
    return mod.bin_dir


def shared_control_plane(minor: str) -> RealControlPlane:
    """The session's control plane of ``minor`` (started on first use, stopped at exit),
    with the project's CRDs installed. Tests isolate by namespace or name prefix."""
    if minor not in _shared:
        from neuron_dra.sim.paths import chart_crd_dir

        cp = RealControlPlane(
            bin_dir_for(minor), minor, crd_paths=sorted(chart_crd_dir().glob("*.yaml"))
        )
        cp.start()
        _shared[minor] = cp
        if len(_shared) == 1:
            import atexit

            atexit.register(stop_shared_control_planes)
    return _shared[minor]


def stop_shared_control_planes() -> None:
    while _shared:
        _, cp = _shared.popitem()
        cp.stop()
