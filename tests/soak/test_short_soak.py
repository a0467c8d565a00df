"""The chaos soak (issue 13) in short: ``hack/soak`` with a fixed seed on 8 nodes for 75 s of
churn, with every kind of process killed (-9) at least once, must end with no
violation and no process left behind. The invariant checks themselves are exercised on
hand-made snapshots, so a checker that sees nothing cannot pass for a system that breaks
nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from neuron_dra.sim.realcluster import (
    APISERVER,
    CONTROLLER_MANAGER,
    ETCD,
    SCHEDULER,
)
from neuron_dra.sim.soak.children import PLUGIN
from neuron_dra.sim.soak.faults import LEADER, STANDBY, Fault
from neuron_dra.sim.soak.harness import Soak
from neuron_dra.sim.soak.options import Options
from neuron_dra.sim.worlds import require_built

MINOR = "1.34"
EVERY_KIND = (LEADER, STANDBY, PLUGIN, SCHEDULER, CONTROLLER_MANAGER, APISERVER, ETCD)


def _claim(name: str, uid: str, devices: list[tuple[str, str]], **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": uid, "labels": labels},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"driver": "neuron.aws.com", "pool": p, "device": d} for p, d in devices
                    ]
                }
            }
        },
    }


def _snapshot(**kw: Any) -> dict[str, Any]:
    return {"claims": [], "nus": [], "workloads": [], "slices": [], "pods": [], "files": {}, **kw}


def _soak(tmp_path: Path) -> Soak:
    return Soak(Options(nodes=4, workdir=tmp_path, quiet=True))


def test_the_checker_sees_a_device_prepared_for_two_live_claims(tmp_path: Path) -> None:
    soak = _soak(tmp_path)
    snap = _snapshot(
        claims=[_claim("a", "u1", [("n0", "neurondevice0")]), _claim("b", "u2", [])],
        files={
            "n0": (
                {
                    "u1": {"devices": [{"deviceName": "neurondevice0"}]},
                    "u2": {"devices": [{"deviceName": "neurondevice0"}]},
                },
                {"u1", "u2"},
            )
        },
    )
    # b is not allocated (a stale entry, unprepared soon): not two live claims.
    assert soak.check_always(snap) == []
    snap["claims"][1] = _claim("b", "u2", [("n0", "neurondevice1")])
    (kind, detail), *_ = soak.check_always(snap)
    assert kind == "double-use" and "neurondevice0" in detail


def test_the_checker_sees_claims_outside_the_reservation_and_partial_units(
    tmp_path: Path,
) -> None:
    soak = _soak(tmp_path)
    workload = {
        "metadata": {"name": "w"},
        "spec": {"serverCount": 2, "topologySize": 4},
        "status": {"state": "Allocated", "workloadId": "w-1"},
    }
    nus = {
        "metadata": {"name": "us0"},
        "status": {
            "allocations": [
                {"workloadId": "w-1", "workloadRef": "default/w", "allocatedNodes": ["a", "b"]}
            ]
        },
    }
    claim = _claim("c", "u", [("z", "neurondevice0")], **{"neuron.aws.com/workload-id": "w-1"})
    kinds = {
        k for k, _ in soak.check_always(_snapshot(claims=[claim], nus=[nus], workloads=[workload]))
    }
    assert kinds == {"not-all-or-nothing", "outside-reservation"}
    # Allocated only in the read after the entries' (its allocation finished in between): a
    # half-written view, not a half allocation.
    torn = _snapshot(claims=[], nus=[nus], workloads=[workload])
    torn["workloads_before"] = []
    assert soak.check_always(torn) == []


def test_the_checker_sees_orphans_and_tags_out_of_step(tmp_path: Path) -> None:
    soak = _soak(tmp_path)

    class Kubelet:
        prepared: dict[str, Any] = {}

    class Sim:
        kubelets = {"n0": Kubelet()}

    soak.sim = Sim()  # type: ignore[assignment]
    tagged = {
        "spec": {
            "driver": "neuron.aws.com",
            "nodeName": "n0",
            "devices": [{"name": "d", "attributes": {"workloadId": {"string": "gone-1"}}}],
        }
    }
    snap = _snapshot(files={"n0": ({"u9": {"devices": []}}, set())}, slices=[tagged])
    kinds = {k for k, _ in soak.check_converged(snap)}
    assert kinds == {"checkpoint-cdi", "checkpoint-kubelet", "orphan-prepare", "workload-tags"}


def test_the_fault_schedule_replays_from_the_seed(tmp_path: Path) -> None:
    def plan(seed: int) -> list[Fault]:
        return Soak(Options(nodes=8, seed=seed, minutes=5, workdir=tmp_path)).plan_faults()

    assert plan(3) == plan(3) and plan(3) != plan(4)


def test_short_soak_kills_every_kind_of_process_and_loses_nothing(tmp_path: Path) -> None:
    require_built(MINOR)
    soak = Soak(
        Options(
            minutes=1.25,
            seed=13,
            nodes=8,
            minor=MINOR,
            workdir=tmp_path / "soak",
            fault_interval=6.0,
            quiet=True,
        )
    )
    # Every kind at least once, in a replayable order, whatever the draw gives.
    planned = soak.plan_faults
    soak.plan_faults = lambda: _every_kind_first(planned())  # type: ignore[method-assign]
    code = asyncio.run(soak.run())
    report = soak.report(True)
    assert code == 0, report["violations"]
    assert set(report["faults"]) == set(EVERY_KIND), report["faults"]
    assert report["operations"], report
    assert report["free_latency_s"]["n"] > 0


def _every_kind_first(schedule: list[Fault]) -> list[Fault]:
    out = []
    for i, kind in enumerate(EVERY_KIND):
        target = "trn2u-1-n2" if kind == PLUGIN else kind
        out.append(Fault(8.0 + 6.0 * i, kind, target, 1.0))
    last = out[-1].at
    return out + [f for f in schedule if f.at > last]


pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")
