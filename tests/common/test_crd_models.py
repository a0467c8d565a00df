"""The custom resource models accept what users and the controller write, and reject the
rest with a clear message."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from neuron_dra.common.models.crds import (
    NeuronUltraServer,
    NeuronUltraServerWorkload,
    UltraServerAllocation,
)
from pydantic import ValidationError

# The operator seed's Step 1, with the placeholder kept verbatim: it must apply as written.
SEED_STEP1 = """
apiVersion: neuron.aws.com/v1beta1
kind: NeuronUltraServerWorkload
metadata:
    name: my-training-job
spec:
    instanceType: <trn3pds instance type> # UltraServer instance type
    topologySize: 4                       # 4-node UltraServer
    serverCount: 2                        # Allocate 2 UltraServers (8 nodes total)
    allocationPolicy:
        failureStrategy: NoOp             # Options: RestartAll, ReplaceAffected, NoOp
    resourceClaimTemplate:
        name: my-training-job-rct         # Name for the auto-generated RCT
"""


def _workload(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"instanceType": "trn2u.48xlarge", "topologySize": 4, "serverCount": 1}
    return {
        "apiVersion": "neuron.aws.com/v1beta1",
        "kind": "NeuronUltraServerWorkload",
        "metadata": {"name": "job", "namespace": "team-a"},
        "spec": {**base, **spec},
    }


def test_seed_step1_parses() -> None:
    w = NeuronUltraServerWorkload.model_validate(yaml.safe_load(SEED_STEP1))
    assert w.spec.instance_type == "<trn3pds instance type>"
    assert w.spec.topology_size == 4
    assert w.spec.server_count == 2
    assert w.spec.allocation_policy.failure_strategy == "NoOp"
    assert w.resource_claim_template_name == "my-training-job-rct"
    assert w.node_count == 8


def test_defaults_applied() -> None:
    w = NeuronUltraServerWorkload.model_validate(_workload())
    assert w.spec.allocation_policy.failure_strategy == "NoOp"
    assert w.spec.config is None
    # The generated RCT is named after the workload unless the user says otherwise.
    assert w.resource_claim_template_name == "job"
    assert w.ref == "team-a/job"
    assert w.status.state is None


def test_empty_rct_ref_defaults_to_workload_name() -> None:
    w = NeuronUltraServerWorkload.model_validate(_workload(resourceClaimTemplate={}))
    assert w.resource_claim_template_name == "job"


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ({"topologySize": 3}, "topologySize must be 1, 2 or 4"),
        ({"topologySize": "4"}, "Input should be a valid integer"),
        ({"serverCount": 0}, "greater than or equal to 1"),
        ({"serverCount": 1001}, "less than or equal to 1000"),
        ({"instanceType": ""}, "at least 1 character"),
        ({"allocationPolicy": {"failureStrategy": "Retry"}}, "'NoOp'"),
        ({"resourceClaimTemplate": {"name": "Bad_Name"}}, "must be a lowercase RFC 1123 subdomain"),
        ({"config": {"logicalNeuronCore": 4}}, "logicalNeuronCore must be 1 or 2, got 4"),
        ({"topologySizes": 4}, "Extra inputs are not permitted"),
    ],
)
def test_bad_specs_rejected(spec: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        NeuronUltraServerWorkload.model_validate(_workload(**spec))


def test_missing_required_field_rejected() -> None:
    doc = _workload()
    del doc["spec"]["serverCount"]
    with pytest.raises(ValidationError, match="serverCount"):
        NeuronUltraServerWorkload.model_validate(doc)


def test_wire_form_is_camel_case_and_round_trips() -> None:
    w = NeuronUltraServerWorkload.model_validate(_workload(config={"logicalNeuronCore": 1}))
    w.status.state = "Allocated"
    w.status.workload_id = "job-1a2b3c4d"
    w.status.allocated_ultra_servers = ["us-0"]
    w.status.allocation_time = datetime(2025, 1, 15, 10, 30, tzinfo=UTC)
    wire = w.to_dict()
    assert wire["spec"]["allocationPolicy"] == {"failureStrategy": "NoOp"}
    assert wire["spec"]["config"] == {"logicalNeuronCore": 1}
    assert wire["status"]["allocatedUltraServers"] == ["us-0"]
    assert wire["status"]["allocationTime"] == "2025-01-15T10:30:00Z"
    assert "resourceClaimTemplate" not in wire["spec"]  # unset optional fields are omitted
    assert NeuronUltraServerWorkload.model_validate(wire) == w


def test_status_assignment_is_validated() -> None:
    w = NeuronUltraServerWorkload.model_validate(_workload())
    with pytest.raises(ValidationError):
        w.status.state = "Bound"  # type: ignore[assignment]  # the seed's stale state name


def test_metadata_keeps_unknown_fields() -> None:
    doc = _workload()
    doc["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    w = NeuronUltraServerWorkload.model_validate(doc)
    assert w.to_dict()["metadata"]["managedFields"] == [{"manager": "kubectl"}]


def _ultraserver() -> dict[str, Any]:
    return {
        "apiVersion": "neuron.aws.com/v1beta1",
        "kind": "NeuronUltraServer",
        "metadata": {"name": "cb-0123", "namespace": "neuron-dra-driver"},
        "spec": {
            "instanceType": "trn2u.48xlarge",
            "topology": [
                {"nodeName": f"node-{i}", "nodeId": i, "linkStatusHorizontal": "Up"}
                for i in range(4)
            ],
        },
        "status": {
            "state": "PartiallyAllocated",
            "nodeCount": 4,
            "allocatedNodeCount": 2,
            "allocations": [
                {
                    "workloadRef": "team-a/job",
                    "workloadId": "job-1a2b3c4d",
                    "allocatedNodes": ["node-0", "node-1"],
                    "leaderNodeName": "node-0",
                    "nodeCount": 2,
                    "ultraserverIndex": 0,
                    "phase": "Active",
                    "allocatedAt": "2025-01-15T10:30:00Z",
                }
            ],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "AllNodesReady",
                    "message": "",
                    "lastTransitionTime": "2025-01-15T10:30:00Z",
                }
            ],
        },
    }


def test_ultraserver_parses_with_defaults() -> None:
    us = NeuronUltraServer.model_validate(_ultraserver())
    assert [n.link_status_vertical for n in us.spec.topology] == ["Unknown"] * 4
    assert us.status.allocations[0].allocated_at == datetime(2025, 1, 15, 10, 30, tzinfo=UTC)
    assert NeuronUltraServer.model_validate(us.to_dict()) == us


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        (("spec", "topology", 0, "nodeId"), 4, "less than or equal to 3"),
        (("spec", "topology", 0, "linkStatusVertical"), "up", "'Up'"),
        (("status", "allocations", 0, "workloadRef"), "job", "should match pattern"),
        (("status", "allocations", 0, "allocatedNodes"), [], "allocatedNodes must not be empty"),
        (("status", "allocations", 0, "phase"), "Confirmed", "'Pending'"),
        (("status", "conditions", 0, "status"), "true", "'True'"),
        (("status", "state"), "Ready", "'Available'"),
    ],
)
def test_bad_ultraservers_rejected(path: tuple[Any, ...], value: Any, needle: str) -> None:
    doc = _ultraserver()
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ValidationError, match=needle):
        NeuronUltraServer.model_validate(doc)


def test_allocation_workload_id_fits_a_label_value() -> None:
    with pytest.raises(ValidationError, match="at most 63"):
        UltraServerAllocation(
            workload_ref="a/b",
            workload_id="x" * 64,
            allocated_nodes=["n"],
            node_count=1,
            ultraserver_index=0,
        )
