"""Node filters of the simulated scheduler (pure)."""

from __future__ import annotations

from typing import Any

from neuron_dra.sim.controlplane.placement import (
    REASON_AFFINITY,
    REASON_ANTI_AFFINITY,
    REASON_NOT_READY,
    REASON_SELECTOR,
    REASON_TAINT,
    REASON_UNSCHEDULABLE,
    PlacedPod,
    feasible_nodes,
)
from neuron_dra.sim.controlplane.podsets import exclusive_topology_affinity

US_LABEL = "neuron.amazonaws.com/ultraserver-server-id-4"


def node(name: str, *, ready: bool = True, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {k.replace("_", "/"): v for k, v in labels.items()}},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "default", "labels": {}}, "spec": spec}


def test_not_ready_cordoned_and_tainted_nodes_are_skipped_with_reasons() -> None:
    cordoned = node("b")
    cordoned["spec"] = {"unschedulable": True}
    tainted = node("c")
    tainted["spec"] = {"taints": [{"key": "aws.amazon.com/neuron", "effect": "NoSchedule"}]}
    nodes = [node("a", ready=False), cordoned, tainted]
    got = feasible_nodes(pod(), nodes, [])
    assert got.nodes == []
    assert got.rejected == {REASON_NOT_READY: 1, REASON_UNSCHEDULABLE: 1, REASON_TAINT: 1}
    assert got.message() == (
        "0/3 nodes are available: 1 node(s) had untolerated taint, "
        "1 node(s) were not ready, 1 node(s) were unschedulable."
    )
    tolerant = pod(tolerations=[{"key": "aws.amazon.com/neuron", "operator": "Exists"}])
    assert feasible_nodes(tolerant, nodes, []).nodes == ["c"]
    wrong_value = pod(tolerations=[{"key": "aws.amazon.com/neuron", "value": "x"}])
    assert feasible_nodes(wrong_value, nodes, []).nodes == []


def test_node_selector_and_required_node_affinity() -> None:
    nodes = [node("a", zone="1"), node("b", zone="2"), node("c")]
    assert feasible_nodes(pod(nodeSelector={"zone": "2"}), nodes, []).nodes == ["b"]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["1"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]},
                ]
            }
        }
    }
    got = feasible_nodes(pod(affinity=affinity), nodes, [])
    assert got.nodes == ["a", "b", "c"]  # terms are ORed; NotIn matches a missing label
    exists = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "Exists"}]}]
            }
        }
    }
    got = feasible_nodes(pod(affinity=exists), nodes, [])
    assert got.nodes == ["a", "b"] and got.rejected == {REASON_SELECTOR: 1}


def test_exclusive_topology_keeps_a_group_in_one_domain_and_others_out() -> None:
    nodes = [
        node("us0-n0", **{US_LABEL.replace("/", "_"): "us0"}),
        node("us0-n1", **{US_LABEL.replace("/", "_"): "us0"}),
        node("us1-n0", **{US_LABEL.replace("/", "_"): "us1"}),
        node("plain"),
    ]
    key = "leaderworkerset.sigs.k8s.io/group-key"

    def member(group: str) -> dict[str, Any]:
        p = pod(affinity=exclusive_topology_affinity(group, US_LABEL))
        p["metadata"]["labels"] = {key: group}
        return p

    # The first member of group g0 may go to any node in some domain (not "plain").
    first = feasible_nodes(member("g0"), nodes, [])
    assert first.nodes == ["us0-n0", "us0-n1", "us1-n0"]
    assert first.rejected == {REASON_AFFINITY: 1}

    placed = [PlacedPod("default", {key: "g0"}, "us0-n0")]
    # Its peers must follow it into us0 ...
    assert feasible_nodes(member("g0"), nodes, placed).nodes == ["us0-n0", "us0-n1"]
    # ... and another group must stay out of us0.
    other = feasible_nodes(member("g1"), nodes, placed)
    assert other.nodes == ["us1-n0"]
    assert other.rejected == {REASON_AFFINITY: 1, REASON_ANTI_AFFINITY: 2}
    # Pods of another namespace do not count.
    elsewhere = [PlacedPod("team-b", {key: "g0"}, "us0-n0")]
    assert feasible_nodes(member("g1"), nodes, elsewhere).nodes == ["us0-n0", "us0-n1", "us1-n0"]
