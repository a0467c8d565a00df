"""Fixtures of the chart checks: the real helm (hack/k8s/build --version helm), run offline.

helm is built from the upstream module pinned in hack/k8s/helm and cached by version and
go.sum hash. Without it the chart checks skip with a hint, except on CI (CI=true), where
they must run and so fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from neuron_dra.sim.kubebuild import helm_module

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "neuron-dra-driver"
DEFAULT_RELEASE = "neuron-dra-driver"
DEFAULT_NAMESPACE = "neuron-dra-driver"
DEFAULT_KUBE_VERSION = "v1.34.2"


def require_helm() -> Path:
    """The helm binary; skip (or on CI fail) when it is not built."""
    mod = helm_module()
    if not mod.built():
        hint = f"helm {mod.version} is not built: run hack/k8s/build --version helm"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{hint} (CI=true: the chart checks must run, not skip)")
        pytest.skip(hint)
    return mod.bin_dir / "helm"


class HelmError(Exception):
    """helm exited non-zero; the message is its stderr."""


@dataclass(frozen=True)
class Overrides:
    """``--set`` expressions and ``--set-json`` values (dotted key -> any JSON value)."""

    sets: tuple[str, ...] = ()
    values: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, *sets: str, values: Mapping[str, Any] | None = None) -> Overrides:
        return cls(tuple(sets), dict(values or {}))

    def args(self) -> list[str]:
        out = [arg for s in self.sets for arg in ("--set", s)]
        for key, value in self.values.items():
            out += ["--set-json", f"{key}={json.dumps(value)}"]
        return out


@dataclass(frozen=True)
class Release:
    name: str = DEFAULT_RELEASE
    namespace: str = DEFAULT_NAMESPACE
    kube_version: str = DEFAULT_KUBE_VERSION


class Helm:
    """The real helm binary, isolated from the user's helm and kubectl configuration."""

    def __init__(self, binary: Path, home: Path) -> None:
        self.binary = binary
        self.env = {
            **os.environ,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
            "KUBECONFIG": str(home / "no-kubeconfig"),
        }

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.binary), *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=120,
            check=False,
        )

    def template_text(
        self,
        overrides: Overrides | None = None,
        release: Release | None = None,
        *,
        chart: Path = CHART,
        include_crds: bool = False,
        extra: Sequence[str] = (),
    ) -> str:
        """``helm template``'s output; HelmError (helm's stderr) when it fails."""
        release = release or Release()
        args = ["template", release.name, str(chart), "--namespace", release.namespace]
        args += ["--kube-version", release.kube_version, *(overrides or Overrides()).args()]
        if include_crds:
            args.append("--include-crds")
        proc = self.run(*args, *extra)
        if proc.returncode != 0:
            raise HelmError(proc.stderr.strip())
        return proc.stdout

    def template(
        self, overrides: Overrides | None = None, release: Release | None = None, **kw: Any
    ) -> list[dict[str, Any]]:
        """The rendered objects (CRDs too with ``include_crds=True``)."""
        text = self.template_text(overrides, release, **kw)
        return [d for d in yaml.safe_load_all(text) if d]

    def lint(self, overrides: Overrides | None = None, release: Release | None = None) -> str:
        """``helm lint --strict``'s output; HelmError (its output) when it fails."""
        release = release or Release()
        proc = self.run(
            "lint",
            "--strict",
            str(CHART),
            "--namespace",
            release.namespace,
            "--kube-version",
            release.kube_version,
            *(overrides or Overrides()).args(),
        )
        if proc.returncode != 0:
            raise HelmError(f"{proc.stdout}{proc.stderr}".strip())
        return proc.stdout


@pytest.fixture(scope="session")
def helm() -> Iterator[Helm]:
    binary = require_helm()
    with tempfile.TemporaryDirectory(prefix="neuron-dra-helm-") as home:
        yield Helm(binary, Path(home))
