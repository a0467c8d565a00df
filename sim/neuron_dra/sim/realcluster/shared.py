"""One control plane per minor, shared by a test session, and where each minor's build is."""

from __future__ import annotations

import os
from pathlib import Path

from .controlplane import RealControlPlane

#: Which minors the real tier runs: "all" pinned ones (default), or a comma list ("1.34").
MINORS_ENV = "NEURON_DRA_K8S_MINORS"
_shared: dict[str, RealControlPlane] = {}


class RealTierUnavailable(Exception):
    """The components of a minor are not built here; the message says how to build them."""


def enabled_minors() -> list[str]:
    from ..kubebuild import control_plane_modules

    pinned = [m.name for m in control_plane_modules()]
    wanted = os.environ.get(MINORS_ENV, "all")
    if wanted == "all":
        return pinned
    return [m for m in (w.strip() for w in wanted.split(",")) if m in pinned]


def bin_dir_for(minor: str) -> Path:
    """The cached build of ``minor``, or :class:`RealTierUnavailable` saying how to build it."""
    from ..kubebuild import kube_module

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
