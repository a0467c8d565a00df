"""The chaos soak's checks on hand-made snapshots (a checker that sees nothing cannot pass for
a system that breaks nothing), its fault schedule, and a short soak on simulated nodes; the
short soak on real nodes, with every kind of fault, is tests/soak/test_real_node_soak.py."""

from __future__ import annotations

import asyncio
import calendar
import json
import random
import shlex
from pathlib import Path
from typing import Any

import pytest
from neuron_dra.common.constants import LABEL_WORKLOAD_ID
from neuron_dra.sim.simcluster.containers import ContainerDevices
from neuron_dra.sim.soak import __main__ as soak_main
from neuron_dra.sim.soak import realnodes
from neuron_dra.sim.soak.children import PLUGIN, start_phases
from neuron_dra.sim.soak.faults import (
    FAULT_WEIGHTS,
    LEADER,
    Fault,
    forced_schedule,
    not_reached,
    plan_faults,
)
from neuron_dra.sim.soak.harness import Soak
from neuron_dra.sim.soak.invariants import (
    ContainerExpectation,
    container_differences,
    converged_violations,
    expected_container,
    freed,
    why_claim_remains,
)
from neuron_dra.sim.soak.options import Options
from neuron_dra.sim.worlds import require_built

MINOR = "1.34"
FINALIZER = "resource.kubernetes.io/delete-protection"


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

    soak.node_side.sim = Sim()  # type: ignore[attr-defined]
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


def test_a_claim_the_kubelet_holds_while_its_prepare_is_refused_is_no_orphan() -> None:
    """A real kubelet records a claim before its Prepare succeeds: kept while the pod waits,
    it is not an orphan; kept for a Running pod, it is (and the prepare is missing)."""
    claim = _claim("c", "u1", [("n0", "neurondevice0")])
    claim["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "p1"}]
    pod = {"metadata": {"name": "p", "uid": "p1"}, "status": {"phase": "Pending"}}
    snap = _snapshot(claims=[claim], pods=[pod], files={"n0": ({}, set())})
    assert converged_violations(snap, {"n0": {"u1"}}) == []
    pod["status"]["phase"] = "Running"
    kinds = {k for k, _ in converged_violations(snap, {"n0": {"u1"}})}
    assert kinds == {"checkpoint-kubelet", "missing-prepare"}


def test_an_allocated_workloads_pods_must_run_once_settled() -> None:
    workload = {
        "metadata": {"name": "w"},
        "spec": {"serverCount": 1, "topologySize": 4},
        "status": {"state": "Allocated"},
    }
    meta = {"name": "w-0", "uid": "p0", "labels": {"workload": "w"}}
    pod = {"metadata": meta, "status": {"phase": "Pending"}}
    snap = _snapshot(workloads=[workload], pods=[pod])
    assert {k for k, _ in converged_violations(snap, {})} == {"workload-pod-not-running"}
    pod["status"]["phase"] = "Running"
    assert converged_violations(snap, {}) == []


def test_a_claim_left_behind_is_reported_with_what_holds_it() -> None:
    """A claim that outlives its workload is reported with its deletion, finalizers, nodes,
    consumers (a pod stuck Terminating, a pod gone) and the nodes that still hold it
    prepared: what tells a kubelet that never unprepared from a controller that never
    released."""
    claim = _claim("w-3-neuron-x", "u1", [("n2", "neurondevice0")], **{LABEL_WORKLOAD_ID: "w1"})
    claim["metadata"] |= {"deletionTimestamp": "t", "finalizers": [FINALIZER]}
    claim["metadata"]["resourceVersion"] = "812"
    claim["status"]["reservedFor"] = [
        {"resource": "pods", "name": "w-3", "uid": "p3"},
        {"resource": "pods", "name": "w-9", "uid": "p9"},
    ]
    pod = {
        "metadata": {"name": "w-3", "uid": "p3", "deletionTimestamp": "t"},
        "spec": {"nodeName": "n2"},
        "status": {"phase": "Running"},
    }
    snap = _snapshot(
        claims=[claim], pods=[pod], files={"n2": ({"u1": {}}, set()), "n3": ({}, set())}
    )
    why = why_claim_remains(snap, claim)
    assert why == (
        f"w-3-neuron-x: deleting, finalizers ['{FINALIZER}'], allocated on ['n2'], reserved for "
        "['w-3 (Running on n2 deleting)', 'w-9 (gone)'], prepared on ['n2'], resourceVersion 812"
    )
    assert freed(snap, "w1", "w") == f"claims remain: {why}"
    assert freed(_snapshot(), "w1", "w") is None


def test_the_fault_schedule_replays_from_the_seed(tmp_path: Path) -> None:
    def plan(seed: int) -> list[Fault]:
        return Soak(Options(nodes=8, seed=seed, minutes=5, workdir=tmp_path)).plan_faults()

    assert plan(3) == plan(3) and plan(3) != plan(4)


def test_the_fault_schedule_has_the_real_nodes_faults_on_nodes(tmp_path: Path) -> None:
    nodes = [f"n{i}" for i in range(4)]
    schedule = plan_faults(random.Random(2), nodes, 30, 5.0, realnodes.FAULT_WEIGHTS)
    kinds = {f.kind for f in schedule}
    assert set(realnodes.FAULT_WEIGHTS) <= kinds and set(FAULT_WEIGHTS) <= kinds
    for f in schedule:
        on_node = f.kind == PLUGIN or f.kind in realnodes.FAULT_WEIGHTS
        assert (f.target in nodes) if on_node else f.target == f.kind
    assert not {f.kind for f in plan_faults(random.Random(2), nodes, 30, 5.0)} & set(
        realnodes.FAULT_WEIGHTS
    )


def test_the_faults_the_churns_limit_left_are_named_with_what_took_the_time() -> None:
    schedule = [
        Fault(8.0, LEADER, "controller-1", 1.0, done_at=8.2, recovery=41.5),
        Fault(14.0, PLUGIN, "trn2u-0-n2", 1.0, done_at=52.0),  # fired, not whole yet
        Fault(20.0, "etcd", "etcd", 2.0),
        Fault(26.0, "kubelet-kill", "trn2u-0-n1", 1.0),
    ]
    text = not_reached(schedule, Options(until_faults=True, churn_limit=60))
    assert text.startswith("2 of 4 planned faults not reached in the churn's limit of 60s: ")
    assert "etcd on etcd (planned at 20s), kubelet-kill on trn2u-0-n1 (planned at 26s)" in text
    assert "controller-leader at 8s: whole again after 41.5s" in text
    assert f"{PLUGIN} at 52s: whole again after (not seen)" in text


def test_the_replay_command_keeps_the_until_faults_mode() -> None:
    options = Options(minutes=1.25, seed=13, nodes=4, until_faults=True, churn_limit=900)
    assert options.command().endswith(" --until-faults --churn-limit 900")
    assert "--until-faults" not in Options().command()


def _replayed(options: Options) -> Options:
    """The options ``hack/soak`` reads from ``options``'s replay line."""
    argv = shlex.split(options.command())
    assert argv[0] == "hack/soak"
    return soak_main.options_of(soak_main.build_parser().parse_args(argv[1:]))


def test_the_replay_command_gives_back_the_runs_options_forced_faults_included() -> None:
    forced = Options(
        minutes=1.25,
        seed=13,
        nodes=4,
        minor="1.37",
        fault_interval=6.0,
        op_interval=0.5,
        free_bound=90.0,
        real_nodes=True,
        until_faults=True,
        churn_limit=600,
        faults=(f"8:{LEADER}:{LEADER}:1", "14.5:kubelet:trn2u-0-n1:0"),
    )
    assert _replayed(forced) == forced
    assert _replayed(Options()) == Options()


def test_forced_faults_replace_the_draw_and_wrong_ones_say_what_to_change(tmp_path: Path) -> None:
    options = Options(nodes=4, workdir=tmp_path, faults=(f"5:{PLUGIN}:trn2u-0-n2:1",))
    assert Soak(options).plan_faults() == [Fault(5.0, PLUGIN, "trn2u-0-n2", 1.0)]
    nodes = ["trn2u-0-n0", "trn2u-0-n1"]
    wrong = {
        "5:plugin:trn2u-0-n0": "write AT:KIND:TARGET:DOWNTIME, e.g. 8:plugin:trn2u-0-n0:1",
        "5:gpu:trn2u-0-n0:1": "the kind is one of controller-leader, controller-standby, etcd, ",
        "5:plugin:etcd:1": "the target of plugin is a node, one of trn2u-0-n0, trn2u-0-n1",
        "5:etcd:trn2u-0-n0:1": "the target of etcd is etcd itself",
        "soon:etcd:etcd:1": "AT and DOWNTIME are seconds",
        "5:etcd:etcd:-1": "AT and DOWNTIME are seconds, 0 or more",
        "5:kubelet:trn2u-0-n0:1": "the kind is one of",  # a real node's fault, simulated nodes
    }
    for text, why in wrong.items():
        with pytest.raises(ValueError, match=why):
            forced_schedule([text], nodes, {})
    assert forced_schedule(["5:kubelet:trn2u-0-n0:1"], nodes, realnodes.FAULT_WEIGHTS) == [
        Fault(5.0, "kubelet", "trn2u-0-n0", 1.0)
    ]


def test_hack_soak_refuses_a_wrong_fault_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        soak_main.main(["--nodes", "4", "--fault", "5:plugin:nowhere:1"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "the target of plugin is a node, one of trn2u-0-n0" in err and "Traceback" not in err


def test_the_kubelets_prepared_claims_are_read_from_its_checkpoint() -> None:
    data = {
        "kind": "DRACheckpoint",
        "apiVersion": "checkpoint.dra.kubelet.k8s.io/v1",
        "ClaimInfoStateList": [
            {"ClaimUID": "u1", "DriverState": {"neuron.aws.com": {"Devices": []}}},
            {"ClaimUID": "u2", "DriverState": {"gpu.example.com": {"Devices": []}}},
        ],
    }
    text = json.dumps({"Data": json.dumps(data), "Checksum": 1})
    assert realnodes.kubelet_prepared_claims(text) == {"u1"}


def _pod(claim_ref: dict[str, Any], node: str = "n0", **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "uid": "pu"},
        "spec": {"nodeName": node, "resourceClaims": [{"name": "neuron", **claim_ref}]},
        "status": {"phase": "Running", **status},
    }


def _nus_entry(wid: str, nodes: list[str], index: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "us0"},
        "status": {
            "allocations": [
                {
                    "workloadId": wid,
                    "workloadRef": "default/w",
                    "ultraserverIndex": index,
                    "nodeCount": len(nodes),
                    "allocatedNodes": nodes,
                }
            ]
        },
    }


def test_a_containers_devices_and_env_are_what_its_claims_give() -> None:
    plain = _claim("c", "u", [("n0", "neurondevice4"), ("n0", "neurondevice5")])
    want = expected_container(_pod({"resourceClaimName": "c"}), {"c": plain}, [], 4)
    assert want == ContainerExpectation(("/dev/neuron4", "/dev/neuron5"), "16-23", None)
    exact = ContainerDevices({"NEURON_RT_VISIBLE_CORES": "16-23"}, ["/dev/neuron4", "/dev/neuron5"])
    assert container_differences(want, exact) == []
    # Another claim's device, another claim's cores, a rank a plain claim never has.
    for seen in (
        ContainerDevices({"NEURON_RT_VISIBLE_CORES": "16-23"}, ["/dev/neuron4", "/dev/neuron6"]),
        ContainerDevices({"NEURON_RT_VISIBLE_CORES": "0-7"}, ["/dev/neuron4", "/dev/neuron5"]),
        ContainerDevices(
            {"NEURON_RT_VISIBLE_CORES": "16-23", "NEURON_GLOBAL_TOPOID": "0"},
            ["/dev/neuron4", "/dev/neuron5"],
        ),
    ):
        assert len(container_differences(want, seen)) == 1, seen


def test_a_workload_containers_rank_comes_from_its_units_entry() -> None:
    claim = _claim(
        "w-rct-x",
        "u",
        [("n2", f"neurondevice{i}") for i in range(16)],
        **{"neuron.aws.com/workload-id": "w-1"},
    )
    pod = _pod(
        {"resourceClaimTemplateName": "w-rct"},
        "n2",
        resourceClaimStatuses=[{"name": "neuron", "resourceClaimName": "w-rct-x"}],
    )
    nus = [_nus_entry("w-1", ["n0", "n1", "n2", "n3"], 1)]
    want = expected_container(pod, {"w-rct-x": claim}, nus, 4)
    assert want is not None and want.rank == "6" and want.visible_cores == "0-63"
    # Not yet known (no generated name) or the workload's entry gone: nothing to say.
    assert expected_container(_pod({"resourceClaimTemplateName": "w-rct"}), {}, nus, 4) is None
    assert expected_container(pod, {"w-rct-x": claim}, [], 4) is None


def test_short_soak_on_simulated_nodes(tmp_path: Path) -> None:
    """The default node side (simulated kubelets in the soak's process) still runs the soak:
    a plugin and the leader killed, nothing lost; the churn lasts until both have fired and
    the system recovered from each, however slow the machine."""
    require_built(MINOR)
    soak = Soak(
        Options(
            minutes=0.5,
            seed=13,
            nodes=4,
            minor=MINOR,
            workdir=tmp_path / "soak",
            fault_interval=1000.0,
            until_faults=True,
            faults=(f"5:{PLUGIN}:trn2u-0-n2:1", f"10:{LEADER}:{LEADER}:0.5"),
            quiet=True,
        )
    )
    code = asyncio.run(soak.run())
    report = soak.report(True)
    assert code == 0, report["violations"]
    assert report["faults"] == {PLUGIN: 1, LEADER: 1}, report["faults"]
    assert report["operations"] and report["checks"] > 0, report


pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")


def test_a_restarted_plugins_start_is_told_step_by_step_from_its_log() -> None:
    started = calendar.timegm((2026, 11, 28, 13, 10, 0, 0, 0, 0)) + 0.5
    log = "\n".join(
        [
            "Traceback of an earlier run, not a log line",
            "I1128 13:10:02.500000 neuron_dra.nodeplugin.plugin] emulating trn2u.48xlarge",
            "I1128 13:10:04.000000 neuron_dra.nodeplugin.publish] published 16 devices in 1",
            'I1128 13:10:05.250000 neuron_dra.nodeplugin.kubeletapi] kubelet plugin serving x="y"',
            "W1128 13:10:06.000000 neuron_dra.nodeplugin.kubeletapi] registered with the kubelet",
            "I1128 13:10:09.000000 neuron_dra.nodeplugin.publish] published 16 devices again",
        ]
    )
    assert start_phases(log, started) == (
        "first log +2.0s, published +3.5s, serving +4.8s, registered +5.5s"
    )
    assert start_phases("no log line here", started) == ""
