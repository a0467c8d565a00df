"""The chart on a real control plane: helm install/upgrade/uninstall against the real
kube-apiserver of a pinned minor, the chart's ServiceAccounts' tokens (TokenRequest), and
comparisons of what the chart renders with what the API server holds.

Used by test_helm_install.py, test_security.py and test_identity_flow.py; each test module owns
its control plane (flags such as the audit log differ, and installing the chart's cluster-wide
objects into the session's shared control plane would change what other tests run under).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from neuron_dra.sim.realcluster import (
    ADMIN,
    COMPONENTS,
    Identity,
    RealControlPlane,
    bin_dir_for,
)
from neuron_dra.sim.worlds import require_built

from .conftest import CHART, DEFAULT_NAMESPACE, DEFAULT_RELEASE, Helm, HelmError, Overrides

NS = DEFAULT_NAMESPACE
RELEASE = DEFAULT_RELEASE
PLUGIN_SA = f"{RELEASE}-kubelet-plugin"
CONTROLLER_SA = f"{RELEASE}-controller"
#: The kubelet plugin's and the controller's pods must not land on the simulated nodes (no
#: image runs there): the components run in the test process under the pods' identities.
NOWHERE = {"neuron-dra.test/nowhere": "true"}
OFF_NODES = Overrides.of(
    values={"kubeletPlugin.nodeSelector": NOWHERE, "controller.nodeSelector": NOWHERE}
)


def sa_user(name: str, namespace: str = NS) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


class ChartOnCluster:
    """helm and kubectl against one control plane."""

    def __init__(self, helm: Helm, cp: RealControlPlane) -> None:
        self.helm, self.cp = helm, cp
        self.kube_version = f"v{cp.minor}.0"

    def _helm(self, *args: str) -> str:
        proc = self.helm.run(*args, "--kubeconfig", str(self.cp.kubeconfig(ADMIN)))
        if proc.returncode != 0:
            raise HelmError(proc.stderr.strip())
        return proc.stdout

    def install(self, overrides: Overrides | None = None, *extra: str) -> str:
        return self._helm(
            "install", RELEASE, str(CHART), "--namespace", NS, "--create-namespace",
            *(overrides or Overrides()).args(), *extra,
        )  # fmt: skip

    def user_env(self) -> dict[str, str]:
        """The environment of a user's shell on this cluster: kubectl and helm on PATH,
        KUBECONFIG the admin's (helm's own configuration kept apart from the machine's)."""
        path = f"{self.cp.bin_dir}:{self.helm.binary.parent}:{os.environ.get('PATH', '')}"
        return {**self.helm.env, "PATH": path, "KUBECONFIG": str(self.cp.kubeconfig(ADMIN))}

    def run_script(self, script: Path, *args: str, limit: float = 600) -> str:
        """One of the scripts users run (examples/scripts/), as a user runs it; its output
        (HelmError with its output when it fails)."""
        proc = subprocess.run(
            ["bash", str(script), *args], capture_output=True, text=True,
            env=self.user_env(), timeout=limit, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise HelmError(f"{script.name} {' '.join(args)}: exit {proc.returncode}\n"
                            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")  # fmt: skip
        return proc.stdout

    def upgrade(self, overrides: Overrides | None = None, *extra: str) -> str:
        return self._helm(
            "upgrade", RELEASE, str(CHART), "--namespace", NS,
            *(overrides or Overrides()).args(), *extra,
        )  # fmt: skip

    def rollback(self, revision: int) -> str:
        return self._helm("rollback", RELEASE, str(revision), "--namespace", NS, "--wait=false")

    def uninstall(self) -> str:
        return self._helm("uninstall", RELEASE, "--namespace", NS)

    def release(self) -> dict[str, Any]:
        """``helm status -o json`` of the release."""
        return dict(json.loads(self._helm("status", RELEASE, "--namespace", NS, "-o", "json")))

    def rendered(
        self, overrides: Overrides | None = None, *, include_crds: bool = False
    ) -> list[dict[str, Any]]:
        """What ``helm template`` renders for these values on this minor."""
        from .conftest import Release

        return self.helm.template(
            overrides, Release(kube_version=self.kube_version), include_crds=include_crds
        )

    def live(self, objects: Sequence[dict[str, Any]]) -> dict[tuple[str, str, str], Any]:
        """The API server's copy of each object (``kubectl get -f``), keyed by
        (kind, namespace, name); absent ones are missing from the result."""
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir="/tmp") as f:
            yaml.safe_dump_all(list(objects), f)
            f.flush()
            out = self.cp.kubectl("get", "-f", f.name, "-o", "json", "--ignore-not-found")
        if not out.strip():
            return {}
        doc = json.loads(out)
        items = doc.get("items", [doc]) if doc.get("kind") == "List" else [doc]
        return {key(o): o for o in items}


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    m = obj["metadata"]
    return obj["kind"], m.get("namespace", ""), m["name"]


def not_in(want: Any, got: Any, path: str = "") -> list[str]:
    """Where ``want`` (a rendered object) is not contained in ``got`` (the live one, which
    carries the API server's defaults and metadata besides): one line per difference."""
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return [f"{path}: want a map, got {got!r}"]
        return [d for k, v in want.items() for d in not_in(v, got.get(k), f"{path}.{k}")]
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return [f"{path}: want {want!r}, got {got!r}"]
        pairs = enumerate(zip(want, got, strict=True))
        return [d for i, (w, g) in pairs for d in not_in(w, g, f"{path}[{i}]")]
    return [] if want == got else [f"{path}: want {want!r}, got {got!r}"]


# --- tokens of the chart's identities -------------------------------------------------------


def request_token(
    cp: RealControlPlane,
    service_account: str,
    *,
    namespace: str = NS,
    bound_pod: dict[str, Any] | None = None,
    seconds: int = 3600,
) -> str:
    """A token of ``service_account`` from the TokenRequest API, as the kubelet gets one for
    a pod's projected volume: bound to ``bound_pod`` when given (the API server then puts the
    pod's node into the token, ``authentication.kubernetes.io/node-name``)."""
    spec: dict[str, Any] = {"expirationSeconds": seconds}
    if bound_pod is not None:
        m = bound_pod["metadata"]
        spec["boundObjectRef"] = {
            "apiVersion": "v1", "kind": "Pod", "name": m["name"], "uid": m["uid"],
        }  # fmt: skip
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token"
    with _json_file(body) as file:
        out = cp.kubectl("create", "--raw", path, "-f", file)
    return str(json.loads(out)["status"]["token"])


@contextlib.contextmanager
def _json_file(obj: Any) -> Iterator[str]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir="/tmp") as f:
        json.dump(obj, f)
        f.flush()
        yield f.name


def create(cp: RealControlPlane, obj: dict[str, Any]) -> dict[str, Any]:
    """``kubectl create`` of one object as the admin; the created object."""
    with _json_file(obj) as file:
        return dict(json.loads(cp.kubectl("create", "-o", "json", "-f", file)))


def identity_pod(
    cp: RealControlPlane, node: str, service_account: str, name: str
) -> dict[str, Any]:
    """A pod of ``service_account`` placed on ``node`` (spec.nodeName), as the DaemonSet
    controller places a plugin pod: what a node-bound token is issued for."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"neuron-dra.test/identity": "true"}},
        "spec": {
            "nodeName": node,
            "serviceAccountName": service_account,
            "automountServiceAccountToken": False,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "plugin", "image": "neuron-dra:identity"}],
        },
    }
    return create(cp, pod)


def token_kubeconfig(cp: RealControlPlane, token: str, path: Path) -> Path:
    """A kubeconfig that authenticates with ``token`` (and verifies the server's CA)."""
    admin = yaml.safe_load(cp.kubeconfig(ADMIN).read_text())
    admin["users"] = [{"name": "user", "user": {"token": token}}]
    path.write_text(yaml.safe_dump(admin))
    return path


def kubectl_as(
    cp: RealControlPlane, kubeconfig: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """The real kubectl with ``kubeconfig`` (a token's): the completed process, failing or not."""
    return subprocess.run(
        [str(cp.bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig), *args],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip


# --- control planes with the chart installed ------------------------------------------------


@contextlib.contextmanager
def control_plane(
    minor: str,
    *,
    components: Sequence[str] = COMPONENTS,
    apiserver_args: Sequence[str] = (),
    audit_policy: str | None = None,
    workdir: Path | None = None,
) -> Iterator[RealControlPlane]:
    """A control plane of ``minor`` of its own, without the project's CRDs (helm installs
    them); skip (or on CI fail) when the minor is not built."""
    require_built(minor)
    with RealControlPlane(
        bin_dir_for(minor), minor, workdir=workdir, components=components,
        apiserver_args=apiserver_args, audit_policy=audit_policy,
    ) as cp:  # fmt: skip
        yield cp


def require_image() -> tuple[Path, str]:
    """The product image's archive and name (hack/build-image --local); skip (or on CI fail)
    when this tree's image is not built."""
    from neuron_dra.sim import imagebuild

    plan = imagebuild.plan()
    if not plan.archive.is_file():
        hint = f"the image of this tree is not built: run hack/build-image --local ({plan.ref})"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{hint} (CI=true: the installed-product tests must run, not skip)")
        pytest.skip(hint)
    return plan.archive, plan.ref


def user_identity(name: str, *groups: str) -> Identity:
    return Identity(name, groups)


def minor_params() -> list[Any]:
    from neuron_dra.sim.realcluster import enabled_minors

    return [pytest.param(m, id=f"real-{m}") for m in enabled_minors()]
