"""The control plane itself: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler of one minor, with the flags users run them with, started in order and
waited for; kubeconfigs and kubectl for any identity."""

from __future__ import annotations

import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from neuron_dra.sim.scratch import work_dir

from .identities import (
    ADMIN,
    KUBE_CONTROLLER_MANAGER,
    KUBE_SCHEDULER,
    KUBELET_CLIENT,
    KUBERNETES_SERVICE_IP,
    SA_ISSUER,
    SERVICE_CIDR,
    SERVICE_NAMES,
    CertificateAuthority,
    Identity,
    openssl,
)
from .kubeconfig import kubeconfig_doc
from .processes import (
    APISERVER,
    COMPONENTS,
    CONTROLLER_MANAGER,
    ETCD,
    SCHEDULER,
    Component,
    ControlPlaneError,
    as_user,
    free_port,
    give_to,
    launch,
    reachable,
    tail,
    terminate,
    unprivileged_ids,
    with_hosts_file,
)
from .profiles import profile_for


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
    #: An audit policy (YAML) to log by: the log is :attr:`audit_log`.
    audit_policy: str | None = None
    #: Feature gates over the minor's profile (a test of a gate's other state).
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    #: Extra flags per component name (a diagnosis's log verbosity, say): appended last.
    component_args: Mapping[str, Sequence[str]] = field(default_factory=dict)
    ready_limit: float = 90.0
    url: str = field(init=False, default="")
    _components: dict[str, Component] = field(init=False, default_factory=dict)
    _kubeconfigs: dict[Identity, Path] = field(init=False, default_factory=dict)
    _own_workdir: bool = field(init=False, default=False)
    #: Where the asked-for work directory leads when :meth:`start` had to redirect it.
    _redirect: Path | None = field(init=False, default=None)

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> RealControlPlane:
        if self.workdir is None:
            self.workdir = work_dir("k8s")
            self._own_workdir = True
        ids = unprivileged_ids()
        if ids is not None and not self.workdir.exists() and not reachable(ids, self.workdir):
            # Under a directory the control plane's user cannot walk (pytest's private tmp):
            # the files live in one it can, and the asked-for path leads there.
            self.workdir.parent.mkdir(parents=True, exist_ok=True)
            real = work_dir("k8s")
            self.workdir.symlink_to(real)
            self.workdir = real
            self._redirect = real
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

    def remove_files(self) -> None:
        """Remove, once stopped, the directory a redirect of the work directory led to. The
        caller's removal of its own directory takes the link away, not where it leads: every
        benchmark and soak on a private directory left ~80 MB behind."""
        if self._redirect is not None:
            shutil.rmtree(self._redirect, ignore_errors=True)
            self._redirect = None

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
    def audit_log(self) -> Path:
        """The API server's audit log (with an ``audit_policy``)."""
        assert self.workdir is not None
        return self.workdir / "logs" / "audit.log"

    @property
    def ca_cert(self) -> Path:
        """The run's CA: it signed the serving certificate and every client's."""
        return self._ca.cert

    @property
    def hosts_file(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "hosts"

    def add_node_names(self, names: Sequence[str]) -> None:
        """Make ``names`` resolve to 127.0.0.1 for the API server (real nodes' kubelets).

        Written in place (the API server's /etc/hosts is this file, bind-mounted). Go's
        resolver re-reads a changed hosts file at most every 5 s, so a name added now may
        resolve a few seconds later: callers of ``kubectl exec``/``logs`` retry on it."""
        known = set(self.hosts_file.read_text().split())
        new = [n for n in names if n not in known]
        if new:
            with self.hosts_file.open("a") as f:
                f.writelines(f"127.0.0.1 {n}\n" for n in new)

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
            path.write_text(yaml.safe_dump(kubeconfig_doc(self.url, self._ca.cert, crt, key)))
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
        # Pods reach the server at the "kubernetes" Service's ClusterIP (in-cluster config),
        # which each real node relays to it (realnode/forward.py).
        serving_crt, serving_key = self._ca.server(
            "apiserver", ["127.0.0.1", "localhost", KUBERNETES_SERVICE_IP, *SERVICE_NAMES]
        )
        # The API server reaches a node's kubelet (logs, exec) by the node's name, which
        # must resolve to 127.0.0.1: it reads a hosts file of its own (add_node_names).
        self.hosts_file.write_text("127.0.0.1 localhost\n")
        kubelet_client_crt, kubelet_client_key = self._ca.client(KUBELET_CLIENT)
        sa_key = pki / "sa.key"
        openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(sa_key))
        profile = profile_for(self.minor)
        wanted = {**profile.feature_gates, **self.feature_gates}
        gates = ",".join(f"{k}={str(v).lower()}" for k, v in wanted.items())
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
                # No Endpoints for the "kubernetes" Service (1.37's reconciler refuses the
                # loopback address we serve on): no kube-proxy reads them, each real node
                # relays the Service's ClusterIP to this server itself.
                "--endpoint-reconciler-type", "none",
                "--service-cluster-ip-range", SERVICE_CIDR,
                "--allow-privileged=true",
                "--profiling=false",
                "--feature-gates", gates,
                "--runtime-config", ",".join(profile.runtime_config),
                # Real nodes: their kubelets serve on loopback under the node's name.
                "--kubelet-preferred-address-types", "Hostname",
                "--kubelet-client-certificate", str(kubelet_client_crt),
                "--kubelet-client-key", str(kubelet_client_key),
                *self._audit_args(),
                *self.apiserver_args,
            ],
            f"{self.url}/readyz",
        )  # fmt: skip
        apiserver = self._components[APISERVER]
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
                    *self.component_args.get(name, ()),
                ],
                f"https://127.0.0.1:{port}/healthz",
            )  # fmt: skip
        # Every component as an unprivileged user (processes.UNPRIVILEGED_USER), owning the
        # run's files; the bind mount of the API server's hosts file needs root, so it is made
        # before the user changes.
        ids = unprivileged_ids()
        named = [Path(a.partition("=")[2] or a) for a in self.apiserver_args]
        files = [self.workdir, *(p for p in named if p.is_absolute() and p.exists())]
        if ids is not None and not all(reachable(ids, f) for f in files):
            ids = None  # files others cannot reach: run as we are
        for comp in self._components.values():
            comp.argv = as_user(ids, comp.argv)
        apiserver.argv = with_hosts_file(self.hosts_file, apiserver.argv)
        give_to(ids, self.workdir)

    def _audit_args(self) -> list[str]:
        if self.audit_policy is None:
            return []
        assert self.workdir is not None
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(self.audit_policy)
        return [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-maxsize=0",
        ]

    def metrics(self, name: str) -> str:
        """The Prometheus text of a running component's ``/metrics`` (kube-scheduler,
        kube-controller-manager: their secure port, as the admin, whom they authorize by
        delegation)."""
        comp = self._components[name]
        assert comp.health_url is not None and comp.health_url.startswith("https")
        ctx = self._admin_ssl_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # their serving pair is self-signed
        url = comp.health_url.rsplit("/", 1)[0] + "/metrics"
        with urllib.request.urlopen(url, context=ctx, timeout=10) as r:
            return str(r.read().decode())

    def _add(self, name: str, args: list[str], health_url: str) -> None:
        assert self.workdir is not None
        argv = [str(self.bin_dir / name), *args]
        log = self.workdir / "logs" / f"{name}.log"
        self._components[name] = Component(name, argv, log, health_url)

    def _launch(self, comp: Component) -> None:
        launch(comp)

    def _terminate(self, comp: Component) -> None:
        terminate(comp)

    def _admin_ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self._ca.cert))
        crt, key = self._admin_pair
        ctx.load_cert_chain(str(crt), str(key))
        return ctx

    def _wait_healthy(self, comp: Component) -> None:
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
                    + tail(comp.log)
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
            + tail(comp.log)
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
            "wait", "--for=condition=Established", "--timeout=120s",
            *[f"crd/{n}" for n in names],
        )  # fmt: skip

    def _poll(self, predicate: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.ready_limit
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.1)
        raise ControlPlaneError(f"{what} not ready after {self.ready_limit:.0f} s")
