"""What the controller does with the spellings of AWS's shipped UltraServer operator (pure
parts; the whole migration runs on a real API server in tests/chart/test_aws_operator_migration.py).

docs/configuration.md, "Compatibility with AWS's UltraServer operator", is the table these
check a row each of: MigrateAffected is ReplaceAffected, the entry phases are Pending/Bound
(earlier spellings respelt), the workload status carries allocatedAt beside allocationTime and
a Progressing condition, ``config: {}`` means logicalNeuronCore 2.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from neuron_dra.common.models.configs import NeuronConfig, decode_opaque_config
from neuron_dra.common.models.crds import NeuronUltraServerWorkload
from neuron_dra.common.ultraserver import entry_phase, reservations
from neuron_dra.controller.templates import claim_template_for
from neuron_dra.controller.workloads import (
    ALLOCATED,
    ALLOCATING,
    PENDING,
    StatusUpdate,
    desired_workload_status,
)
from neuron_dra.controller.workloads.entries import tidy_entries
from neuron_dra.controller.workloads.model import Workload

NOW = datetime(2026, 7, 20, 10, 0, tzinfo=UTC)


def _workload(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "neuron.aws.com/v1beta1",
        "kind": "NeuronUltraServerWorkload",
        "metadata": {"name": "job", "namespace": "ml", "uid": "u-1"},
        "spec": {"instanceType": "trn2u.48xlarge", "topologySize": 4, "serverCount": 1, **spec},
    }


@pytest.mark.parametrize(
    ("written", "read"),
    [
        ("MigrateAffected", "ReplaceAffected"),
        ("ReplaceAffected", "ReplaceAffected"),
        ("RestartAll", "RestartAll"),
        (None, "NoOp"),
        # AWS's schema has no enum: a value stored under it that is no strategy does nothing,
        # as NoOp (the reconciler acts only on RestartAll and ReplaceAffected).
        ("Whatever", "Whatever"),
    ],
)
def test_failure_strategy_reads_migrate_affected_as_replace_affected(
    written: str | None, read: str
) -> None:
    policy = {} if written is None else {"failureStrategy": written}
    assert Workload.of(_workload(allocationPolicy=policy)).failure_strategy == read


def test_both_spellings_pass_the_model_and_others_do_not() -> None:
    for strategy in ("NoOp", "RestartAll", "ReplaceAffected", "MigrateAffected"):
        NeuronUltraServerWorkload.model_validate(
            _workload(allocationPolicy={"failureStrategy": strategy})
        )
    with pytest.raises(ValueError, match="MigrateAffected"):
        NeuronUltraServerWorkload.model_validate(
            _workload(allocationPolicy={"failureStrategy": "Retry"})
        )


def _lnc(obj: dict[str, Any]) -> int | None:
    for config in claim_template_for(obj, "job-1")["spec"]["spec"]["devices"]["config"]:
        decoded = decode_opaque_config(config["opaque"]["parameters"])
        if isinstance(decoded, NeuronConfig):
            return decoded.logical_neuron_core
    return None


def test_config_without_lnc_means_two_and_no_config_the_nodes_default() -> None:
    assert _lnc(_workload(config={})) == 2
    assert _lnc(_workload(config={"logicalNeuronCore": 1})) == 1
    assert _lnc(_workload()) is None  # no NeuronConfig: each node's own default
    model = NeuronUltraServerWorkload.model_validate(_workload(config={}))
    assert model.spec.config is not None and model.spec.config.logical_neuron_core == 2


def test_allocated_at_is_allocation_time_and_goes_with_it() -> None:
    up = StatusUpdate(ALLOCATED, "job-1", (), ("us-a",), 4, allocated=True)
    status = desired_workload_status({"state": PENDING}, up, NOW, 1)
    assert status["allocatedAt"] == status["allocationTime"] == "2026-07-20T10:00:00Z"
    gone = StatusUpdate(PENDING, "job-1", (), (), 0, allocated=False)
    cleared = desired_workload_status(status, gone, NOW, 1)
    assert "allocatedAt" not in cleared and "allocationTime" not in cleared


def test_progressing_is_true_only_while_allocating() -> None:
    def progressing(state: str) -> dict[str, Any]:
        status = desired_workload_status({}, StatusUpdate(state, "job-1"), NOW, 3)
        (cond,) = [c for c in status["conditions"] if c["type"] == "Progressing"]
        return dict(cond)

    assert progressing(ALLOCATING)["status"] == "True"
    for state in (PENDING, ALLOCATED):
        cond = progressing(state)
        assert cond["status"] == "False" and cond["reason"] == state
        assert cond["observedGeneration"] == 3


def _nus(*entries: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "us-a", "namespace": "neuron-dra-driver"},
        "spec": {"topology": [{"nodeName": f"n{i}", "nodeId": i} for i in range(4)]},
        "status": {"allocations": list(entries)},
    }


def _entry(phase: str | None, index: int = 0, nodes: tuple[str, ...] = ("n0", "n1")) -> Any:
    e = {
        "workloadRef": "ml/job",
        "workloadId": "job-1",
        "allocatedNodes": list(nodes),
        "leaderNodeName": "n0",
        "nodeCount": len(nodes),
        "ultraserverIndex": index,
        "allocatedAt": "2026-07-20T10:00:00Z",
    }
    if phase is not None:
        e["phase"] = phase
    return e


@pytest.mark.parametrize(
    ("stored", "tagged", "written"),
    [
        ("Pending", False, None),
        ("Pending", True, "Bound"),
        ("Bound", True, None),
        # Earlier versions' spellings are respelt: Reserved is Pending, Active is Bound.
        ("Reserved", False, "Pending"),
        ("Reserved", True, "Bound"),
        ("Active", False, "Bound"),
        ("Releasing", True, None),
    ],
)
def test_tidy_writes_the_phases_in_aws_words(
    stored: str, tagged: bool, written: str | None
) -> None:
    assert entry_phase(_entry(stored)) == {"Reserved": "Pending", "Active": "Bound"}.get(
        stored, stored
    )
    mutate = tidy_entries("ml/job", "job-1", leader="n0", publishes=lambda _: tagged)
    out = mutate(_nus(_entry(stored)))
    if written is None:
        assert out is None
    else:
        assert out is not None and out["status"]["allocations"][0]["phase"] == written


def test_the_shared_reader_defaults_a_missing_phase_to_pending() -> None:
    (r0, r1) = reservations(_nus(_entry(None)))
    assert r0.phase == r1.phase == "Pending" and (r0.rank, r1.rank) == (0, 1)
