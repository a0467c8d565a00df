"""Build the real Kubernetes components from the Go modules pinned under ``hack/k8s``.

Standard library only: ``hack/k8s/build`` runs this before any virtualenv exists, and the
real-cluster launcher imports it to find the binaries the build left.

Layout: ``hack/k8s/v<minor>/go.mod`` pins ``k8s.io/kubernetes`` at a release (with each
staging module replaced by its ``v0.<minor>.<patch>`` tag and etcd's server module), and
``hack/k8s/helm/go.mod`` pins helm. Each module is built into a cache directory keyed by
its version and the hash of its ``go.sum``, so a change of pin builds anew and an
unchanged pin is reused:

    $NEURON_DRA_K8S_CACHE (default ~/.cache/neuron-dra/k8s)/<version>-<go.sum hash>/bin
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .gobuild import (
    BuildError,
    GoBinary,
    add_build_flags,
    logger,
    read_go_mod,
    repo_root,
    required_version,
    skip_without_go,
    staged_go_build,
)

CACHE_ENV = "NEURON_DRA_K8S_CACHE"
CONTAINERD = "containerd"
CONTAINERD_MODULE = "github.com/containerd/containerd/v2"
HACK_DIR_ENV = "NEURON_DRA_K8S_HACK_DIR"
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
# The minor the seeds target; CI always runs it.
BASE_MINOR = "1.34"


@dataclass(frozen=True)
class Module:
    """One pinned Go module under hack/k8s and where its build is cached."""

    directory: Path
    name: str  # "1.34", "1.37" or "helm"
    version: str  # the pinned release: v1.34.12, v3.19.5
    go_sum_hash: str
    packages: tuple[str, ...]  # the main packages go.mod's ``tool`` block names

    @property
    def bin_dir(self) -> Path:
        return cache_root() / f"{self.version}-{self.go_sum_hash}" / "bin"

    @property
    def binaries(self) -> tuple[str, ...]:
        return tuple(binary_name(p) for p in self.packages)

    @property
    def has_control_plane(self) -> bool:
        """A minor pinned for its nodes only (its kubelet, run against a newer control
        plane as the version-skew policy allows) builds no control plane."""
        return all(b in self.binaries for b in CONTROL_PLANE)

    def built(self) -> bool:
        return all((self.bin_dir / b).is_file() for b in self.binaries)


def binary_name(package: str) -> str:
    """The file a main package builds: ``k8s.io/kubernetes/cmd/kubelet`` -> ``kubelet``,
    etcd's server module -> ``etcd``."""
    if package == "go.etcd.io/etcd/server/v3":
        return "etcd"
    return package.rstrip("/").rsplit("/", 1)[-1]


def tool_packages(go_mod: str) -> tuple[str, ...]:
    """The packages of go.mod's ``tool ( ... )`` block (or ``tool x`` lines), in order."""
    block = re.search(r"^tool\s*\((.*?)^\)", go_mod, re.MULTILINE | re.DOTALL)
    lines = block.group(1).splitlines() if block else []
    lines += [m.group(1) for m in re.finditer(r"^tool\s+([^\s(]\S*)\s*$", go_mod, re.MULTILINE)]
    packages = tuple(
        line.strip() for line in lines if line.strip() and not line.strip().startswith("//")
    )
    if not packages:
        raise BuildError("go.mod names no main package in a tool block")
    return packages


def hack_dir() -> Path:
    return Path(os.environ.get(HACK_DIR_ENV) or repo_root() / "hack" / "k8s")


def cache_root() -> Path:
    default = Path.home() / ".cache" / "neuron-dra" / "k8s"
    return Path(os.environ.get(CACHE_ENV) or default)


def load_module(directory: Path) -> Module:
    go_mod, digest = read_go_mod(directory)
    if directory.name == "helm":
        version = required_version(go_mod, "helm.sh/helm/v3")
        return Module(directory, "helm", version, digest, ("helm.sh/helm/v3/cmd/helm",))
    if directory.name == CONTAINERD:
        version = required_version(go_mod, CONTAINERD_MODULE)
        return Module(directory, CONTAINERD, version, digest, tool_packages(go_mod))
    version = required_version(go_mod, "k8s.io/kubernetes")
    name = directory.name.removeprefix("v")
    return Module(directory, name, version, digest, tool_packages(go_mod))


def kube_modules() -> list[Module]:
    """The pinned Kubernetes minors, oldest first."""
    dirs = [d for d in hack_dir().glob("v1.*") if (d / "go.mod").is_file()]
    mods = [load_module(d) for d in dirs]
    return sorted(mods, key=lambda m: tuple(int(p) for p in m.name.split(".")))


def kube_module(minor: str) -> Module:
    for mod in kube_modules():
        if mod.name == minor:
            return mod
    known = ", ".join(m.name for m in kube_modules())
    raise BuildError(f"no pinned Kubernetes {minor} under {hack_dir()} (pinned: {known})")


def control_plane_modules() -> list[Module]:
    """The pinned minors that build a whole control plane (the real tier's worlds)."""
    return [m for m in kube_modules() if m.has_control_plane]


def newest_minor() -> str:
    return control_plane_modules()[-1].name


def helm_module() -> Module:
    return load_module(hack_dir() / "helm")


def containerd_module() -> Module:
    """containerd, ctr and the runc shim of the real nodes (one pin for every minor)."""
    return load_module(hack_dir() / CONTAINERD)


def _kube_ldflags(version: str, build_date: str) -> str:
    major, minor = version.removeprefix("v").split(".")[:2]
    stamps = {
        "gitVersion": version,
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "buildDate": build_date,
    }
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {package}.{name}={value}" for name, value in stamps.items()]
    return " ".join(flags)


def _helm_ldflags(version: str, kube_minor: str) -> str:
    major, minor = kube_minor.split(".")
    flags = [
        "-s",
        "-w",
        f"-X helm.sh/helm/v3/internal/version.version={version}",
        "-X helm.sh/helm/v3/internal/version.gitTreeState=clean",
    ]
    for package in ("helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"):
        flags += [f"-X {package}.k8sVersionMajor={major}", f"-X {package}.k8sVersionMinor={minor}"]
    return " ".join(flags)


_log = logger("hack/k8s")


def build(mod: Module, *, force: bool = False) -> Path:
    """Build every binary of ``mod`` into its cache directory (reused when complete)."""
    build_date = "1970-01-01T00:00:00Z"  # reproducible: the pin, not the clock, names a build
    if mod.name == "helm":
        ldflags = _helm_ldflags(mod.version, BASE_MINOR)
    elif mod.name == CONTAINERD:
        ldflags = f"-s -w -X {CONTAINERD_MODULE}/version.Version={mod.version}"
    else:
        ldflags = _kube_ldflags(mod.version, build_date)
    return staged_go_build(
        mod.directory,
        mod.bin_dir,
        [GoBinary(binary_name(p), p, ldflags) for p in mod.packages],
        reuse=mod.built() and not force,
        label=f"{mod.name} {mod.version}",
        log=_log,
        go_missing="no Go toolchain on PATH: install Go >= 1.25 to build the components",
        env={},
    )


def _selected(version: str) -> list[Module]:
    if version == "all":
        return [*kube_modules(), helm_module(), containerd_module()]
    if version == "newest":
        return [kube_module(newest_minor())]
    if version == "helm":
        return [helm_module()]
    if version == CONTAINERD:
        return [containerd_module()]
    match = re.match(r"v?(\d+\.\d+)", version)
    if not match:
        raise BuildError(f"--version {version!r}: give a minor such as 1.34, 'newest' or 'all'")
    return [kube_module(match.group(1))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hack/k8s/build",
        description="Build the real Kubernetes components (and helm) from the pinned Go "
        "modules into a cache keyed by version and go.sum hash; reuse it when present.",
    )
    parser.add_argument(
        "--version",
        default="all",
        help="a pinned minor (1.34, 1.37), 'newest', 'helm', 'containerd' or 'all' (default)",
    )
    add_build_flags(
        parser,
        skips="the real test tier then skips",
        bin_dir="print each built bin directory on stdout",
    )
    args = parser.parse_args(argv)
    if skip_without_go(args):
        _log(
            "no Go toolchain: the real Kubernetes tier will skip. Install Go >= 1.25 and run "
            "hack/k8s/build to enable it."
        )
        return 0
    try:
        for mod in _selected(args.version):
            started = time.monotonic()
            bin_dir = build(mod, force=args.force)
            _log(f"{mod.name} {mod.version}: ready in {time.monotonic() - started:.0f} s")
            if args.print_bin_dir:
                print(bin_dir)
    except BuildError as err:
        _log(f"BUILD FAILED: {err}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
