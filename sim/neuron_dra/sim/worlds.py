"""Which Kubernetes a test runs on, as pytest parameters: ``fake`` (our in-process API server
and simulated kubelets) and ``real-<minor>`` for each pinned minor of the real tier (a real
control plane, :mod:`.realcluster`, and for a simulated cluster real nodes, :mod:`.realnode`).

Off CI, a minor whose components are not built skips with one line saying how to build them;
with ``CI=true`` the real tier must never skip, so the same case fails instead.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from .realcluster import (
    RealControlPlane,
    RealTierUnavailable,
    bin_dir_for,
    enabled_minors,
    shared_control_plane,
)

FAKE = "fake"
REAL_PREFIX = "real-"


def world_params(*, fake: bool = True) -> list[str]:
    """``["fake", "real-1.34", "real-1.37"]`` (the real minors that are enabled)."""
    return [*([FAKE] if fake else []), *(f"{REAL_PREFIX}{m}" for m in enabled_minors())]


def minor_of(world: str) -> str | None:
    return world.removeprefix(REAL_PREFIX) if world.startswith(REAL_PREFIX) else None


def _unavailable(why: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{why} (CI=true: the real tier must run, not skip)")
    pytest.skip(why)


def require_built(minor: str) -> None:
    """Skip (or on CI fail) unless the components of ``minor`` are built."""
    try:
        bin_dir_for(minor)
    except RealTierUnavailable as err:
        _unavailable(str(err))


def require_real_nodes(minor: str) -> None:
    """Skip (or on CI fail) unless real nodes of ``minor`` can run here (root, the kubelet
    and containerd built, Debian's runc, busybox-static and CNI plugins installed)."""
    from .realnode.fleet import node_tier_problem

    problem = node_tier_problem(minor)
    if problem:
        _unavailable(f"real nodes {minor}: {problem}")


def real_control_plane(minor: str) -> RealControlPlane:
    """The shared control plane of ``minor``; skip (or on CI fail) when it is not built."""
    require_built(minor)
    return shared_control_plane(minor)


def cluster_kwargs(world: str, control_plane: RealControlPlane | None = None) -> dict[str, Any]:
    """``SimCluster`` arguments for ``world`` (the shared control plane unless one is given)."""
    minor = minor_of(world)
    if minor is None:
        return {"kubernetes": "fake"}
    require_real_nodes(minor)
    return {
        "kubernetes": "real",
        "control_plane": control_plane or real_control_plane(minor),
        "minor": minor,
    }


@contextlib.contextmanager
def own_control_plane(
    world: str, *, feature_gates: Mapping[str, bool] | None = None
) -> Iterator[RealControlPlane | None]:
    """A control plane of its own for a test that builds its own cluster beside the shared
    one (two clusters' controllers and node names would meet on one API server), with
    ``feature_gates`` over the minor's; ``None`` on the fake world, where every cluster has
    its own API server anyway."""
    minor = minor_of(world)
    if minor is None:
        yield None
        return
    from neuron_dra.sim.paths import chart_crd_dir

    require_built(minor)
    cp = RealControlPlane(
        bin_dir_for(minor),
        minor,
        crd_paths=sorted(chart_crd_dir().glob("*.yaml")),
        feature_gates=dict(feature_gates or {}),
    )
    with cp:
        yield cp
