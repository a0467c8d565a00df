"""Start a real etcd + kube-apiserver from ``KUBEBUILDER_ASSETS`` (envtest style).

The real-cluster test tier runs the same API contract tests against this and
against the fake API server, so any behaviour the fake gets wrong shows up as
a difference. Nothing is downloaded: the binaries must already be in
``$KUBEBUILDER_ASSETS`` (``etcd`` and ``kube-apiserver``), otherwise the tier
is skipped.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import uuid
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from types import TracebackType

import aiohttp
import yaml
from kubernetes_asyncio import client as k8s

ASSETS_ENV = "KUBEBUILDER_ASSETS"


def assets_dir() -> Path | None:
    """The directory holding etcd and kube-apiserver, or None when the tier is off."""
    value = os.environ.get(ASSETS_ENV)
    if not value:
        return None
    path = Path(value)
    if not (path / "etcd").is_file() or not (path / "kube-apiserver").is_file():
        return None
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RealAPIServer(AbstractAsyncContextManager["RealAPIServer"]):
    """etcd and kube-apiserver as child processes, with an admin bearer token."""

    def __init__(self, assets: Path, crd_paths: list[Path]) -> None:
        self._assets = assets
        self._crd_paths = crd_paths
        self._dir = Path(tempfile.mkdtemp(prefix="neuron-dra-envtest-"))
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._token = uuid.uuid4().hex
        self.url = ""

    def client_configuration(self) -> k8s.Configuration:
        cfg = k8s.Configuration(host=self.url)
        cfg.verify_ssl = False
        cfg.api_key = {"authorization": f"Bearer {self._token}"}
        return cfg

    def write_kubeconfig(self, path: Path) -> None:
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "envtest",
                            "cluster": {"server": self.url, "insecure-skip-tls-verify": True},
                        }
                    ],
                    "users": [{"name": "admin", "user": {"token": self._token}}],
                    "contexts": [
                        {"name": "envtest", "context": {"cluster": "envtest", "user": "admin"}}
                    ],
                    "current-context": "envtest",
                }
            )
        )

    async def __aenter__(self) -> RealAPIServer:
        etcd_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
        logs = self._dir / "logs"
        logs.mkdir()
        self._spawn(
            "etcd",
            [
                str(self._assets / "etcd"),
                "--data-dir",
                str(self._dir / "etcd"),
                "--listen-client-urls",
                f"http://127.0.0.1:{etcd_port}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{etcd_port}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",
            ],
            logs,
        )
        key = self._dir / "sa.key"
        keygen = await asyncio.create_subprocess_exec(
            "openssl",
            "genrsa",
            "-out",
            str(key),
            "2048",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await keygen.communicate()
        if keygen.returncode != 0:
            raise RuntimeError(f"openssl genrsa failed: {err.decode(errors='replace')}")
        (self._dir / "tokens.csv").write_text(f'{self._token},admin,admin,"system:masters"\n')
        self._spawn(
            "kube-apiserver",
            [
                str(self._assets / "kube-apiserver"),
                "--etcd-servers",
                f"http://127.0.0.1:{etcd_port}",
                "--cert-dir",
                str(self._dir / "certs"),
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                str(api_port),
                "--token-auth-file",
                str(self._dir / "tokens.csv"),
                "--authorization-mode",
                "RBAC",
                "--service-account-issuer",
                "https://kubernetes.default.svc",
                "--service-account-key-file",
                str(key),
                "--service-account-signing-key-file",
                str(key),
                "--service-cluster-ip-range",
                "10.0.0.0/24",
                "--disable-admission-plugins",
                "ServiceAccount",
                "--allow-privileged=true",
            ],
            logs,
        )
        self.url = f"https://127.0.0.1:{api_port}"
        await self._wait_ready()
        await self._install_crds()
        return self

    def _spawn(self, name: str, argv: list[str], logs: Path) -> None:
        out = (logs / f"{name}.log").open("wb")
        self._procs.append((name, subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)))

    async def _wait_ready(self, limit: float = 60.0) -> None:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        headers = {"Authorization": f"Bearer {self._token}"}
        deadline = time.monotonic() + limit
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                for name, proc in self._procs:
                    if proc.poll() is not None:
                        raise RuntimeError(f"{name} exited; logs in {self._dir / 'logs'}")
                try:
                    async with session.get(f"{self.url}/readyz", ssl=ctx, headers=headers) as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                # Polling is the only readiness signal a child process gives us.
                await asyncio.sleep(0.2)
        raise TimeoutError(f"kube-apiserver not ready after {limit}s; logs in {self._dir}")

    async def _install_crds(self) -> None:
        async with k8s.ApiClient(self.client_configuration()) as api:
            ext = k8s.ApiextensionsV1Api(api)
            names = []
            for path in self._crd_paths:
                for doc in yaml.safe_load_all(path.read_text()):
                    if doc:
                        await ext.create_custom_resource_definition(doc, _request_timeout=30)
                        names.append(doc["metadata"]["name"])
            deadline = time.monotonic() + 30
            for name in names:
                while True:
                    crd = await ext.read_custom_resource_definition(name, _request_timeout=30)
                    conds = {c.type: c.status for c in (crd.status.conditions or [])}
                    if conds.get("Established") == "True":
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"CRD {name} not established")
                    await asyncio.sleep(0.1)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for _, proc in reversed(self._procs):
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(self._dir, ignore_errors=True)
