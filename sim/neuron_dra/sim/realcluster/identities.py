"""Who talks to the control plane: identities (client certificates' user and groups) and the
run's certificate authority that issues their certificates and the serving certificate."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .processes import ControlPlaneError

SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
#: The Service range and the "kubernetes" Service's ClusterIP (the range's first address),
#: which in-cluster clients dial and verify the serving certificate against.
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
SERVICE_NAMES = (
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


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
#: The API server's identity towards kubelets (logs, exec), as kubeadm names it.
KUBELET_CLIENT = Identity("kube-apiserver-kubelet-client", ("kubeadm:cluster-admins",))


def node_identity(node: str) -> Identity:
    """The identity a kubelet has: the Node authorizer and NodeRestriction key on it."""
    return Identity(f"system:node:{node}", ("system:nodes",))


class CertificateAuthority:
    """A CA for one run, made and used through the ``openssl`` command line."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cert = self.dir / "ca.crt"
        self.key = self.dir / "ca.key"
        openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(self.key), "-out", str(self.cert), "-days", "3650",
            "-subj", "/CN=neuron-dra-test-ca",
        )  # fmt: skip

    def issue(self, stem: str, subject: str, extensions: str) -> tuple[Path, Path]:
        """A key and a certificate signed by this CA for ``subject`` (``/CN=.../O=...``)."""
        key, csr, crt = (self.dir / f"{stem}.{ext}" for ext in ("key", "csr", "crt"))
        ext_file = self.dir / f"{stem}.ext"
        ext_file.write_text(extensions + "\n")
        openssl(
            "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", subject,
        )  # fmt: skip
        openssl(
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


def openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ControlPlaneError(f"openssl {args[0]} failed: {proc.stderr.strip()}")
