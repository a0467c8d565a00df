"""The generated ResourceClaimTemplate (docs/architecture.md, "UltraServer allocation")."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from neuron_dra.common.constants import LABEL_WORKLOAD_ID
from neuron_dra.common.models.configs import (
    NeuronConfig,
    UltraServerConfig,
    decode_opaque_config,
)
from neuron_dra.common.ultraserver import workload_id
from neuron_dra.controller.templates import (
    claim_template_for,
    node_selector_expression,
    template_matches,
    template_name,
)
from neuron_dra.sim.fakeapi.validation.builtin import (
    apply_builtin_defaults,
    validate_builtin,
    validate_object_meta,
)
from neuron_dra.sim.fakeapi.validation.device_selectors import compile_device_selector

WID = "my-training-job-1a2b3c4d"


def workload(
    *, rct: str | None = "my-training-job-rct", lnc: int | None = None, size: int = 4
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "instanceType": "trn2u.48xlarge",
        "topologySize": size,
        "serverCount": 2,
        "allocationPolicy": {"failureStrategy": "NoOp"},
    }
    if rct is not None:
        spec["resourceClaimTemplate"] = {"name": rct}
    if lnc is not None:
        spec["config"] = {"logicalNeuronCore": lnc}
    return {
        "apiVersion": "neuron.aws.com/v1beta1",
        "kind": "NeuronUltraServerWorkload",
        "metadata": {"name": "my-training-job", "namespace": "ml", "uid": "uid-1"},
        "spec": spec,
    }


def assert_valid(obj: dict[str, Any]) -> None:
    assert validate_object_meta(obj, namespaced=True) == []
    assert validate_builtin("resource.k8s.io", "resourceclaimtemplates", obj, None) == []


def test_seed_workload_template() -> None:
    rct = claim_template_for(workload(), WID)
    assert_valid(rct)
    assert rct["apiVersion"] == "resource.k8s.io/v1"
    assert rct["kind"] == "ResourceClaimTemplate"
    meta = rct["metadata"]
    assert (meta["name"], meta["namespace"]) == ("my-training-job-rct", "ml")
    assert meta["labels"] == {
        "app.kubernetes.io/managed-by": "neuron-dra-controller",
        LABEL_WORKLOAD_ID: WID,
    }
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "neuron.aws.com/v1beta1",
            "kind": "NeuronUltraServerWorkload",
            "name": "my-training-job",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert rct["spec"]["metadata"] == {"labels": {LABEL_WORKLOAD_ID: WID}}
    devices = rct["spec"]["spec"]["devices"]
    [req] = devices["requests"]
    assert req["name"] == "neuron-node"
    exactly = req["exactly"]
    assert exactly["deviceClassName"] == "ultraserver.neuron.aws.com"
    assert (exactly["allocationMode"], exactly["count"]) == ("ExactCount", 1)
    assert exactly["selectors"] == [{"cel": {"expression": node_selector_expression(WID)}}]
    # Only the UltraServer config: no logicalNeuronCore was asked for.
    [config] = devices["config"]
    assert config["opaque"]["driver"] == "neuron.aws.com"
    assert decode_opaque_config(config["opaque"]["parameters"]) == UltraServerConfig(
        ultraserver_mode=4
    )


@pytest.mark.parametrize("size", [1, 2, 4])
def test_ultraserver_mode_follows_topology_size_and_lnc_is_added(size: int) -> None:
    rct = claim_template_for(workload(lnc=2, size=size), WID)
    assert_valid(rct)
    configs = [c["opaque"]["parameters"] for c in rct["spec"]["spec"]["devices"]["config"]]
    assert [decode_opaque_config(p) for p in configs] == [
        UltraServerConfig(ultraserver_mode=size),
        NeuronConfig(logical_neuron_core=2),
    ]
    assert all(p["apiVersion"] == "neuron.aws.com/v1" for p in configs)


def test_name_defaults_to_the_workload_name() -> None:
    assert template_name(workload(rct=None)) == "my-training-job"
    assert template_name(workload(rct="")) == "my-training-job"
    rct = claim_template_for(workload(rct=None), WID)
    assert rct["metadata"]["name"] == "my-training-job"
    assert_valid(rct)


def evaluate(expression: str, attributes: dict[str, Any]) -> Any:
    program, error = compile_device_selector(expression)
    assert error is None and program is not None
    device = {"driver": "neuron.aws.com", "attributes": {"neuron.aws.com": attributes}}
    return program.eval(data={"device": device}).value()


def test_selector_matches_only_the_workloads_node_device() -> None:
    expr = node_selector_expression(WID)
    node = {"resourceType": "neuron_node"}
    assert evaluate(expr, {**node, "workloadId": WID}) is True
    assert evaluate(expr, {**node, "workloadId": "someone-else"}) is False
    assert evaluate(expr, {"resourceType": "neuron_device", "workloadId": WID}) is False
    # Unreserved devices (no workloadId) and devices without resourceType evaluate to false,
    # not to an error that would fail the claim's allocation.
    assert evaluate(expr, node) is False
    assert evaluate(expr, {"workloadId": WID}) is False


@pytest.mark.parametrize("bad", ["", "a b", 'x" || true || "', "-x", "x" * 64])
def test_selector_refuses_ids_that_are_not_label_values(bad: str) -> None:
    with pytest.raises(ValueError, match="not a valid label value"):
        node_selector_expression(bad)


@given(
    st.from_regex(r"[a-z0-9]([-a-z0-9]{0,60}[a-z0-9])?", fullmatch=True),
    st.uuids(),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([None, 1, 2]),
)
def test_every_generated_template_is_valid(
    name: str, uid: object, size: int, lnc: int | None
) -> None:
    obj = workload(rct=None, lnc=lnc, size=size)
    obj["metadata"] = {"name": name, "namespace": "team-a", "uid": str(uid)}
    wid = workload_id(name, str(uid))
    rct = claim_template_for(obj, wid)
    assert_valid(rct)
    assert rct["metadata"]["name"] == name
    assert rct["spec"]["metadata"]["labels"][LABEL_WORKLOAD_ID] == wid
    assert evaluate(
        rct["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"][
            "expression"
        ],
        {"resourceType": "neuron_node", "workloadId": wid},
    )


def stored(desired: dict[str, Any]) -> dict[str, Any]:
    """What the API server hands back: defaults applied, server fields added."""
    obj = copy.deepcopy(desired)
    apply_builtin_defaults("resource.k8s.io", "resourceclaimtemplates", obj)
    obj["metadata"].update(
        uid="rct-uid", resourceVersion="7", creationTimestamp="2025-01-01T00:00:00Z"
    )
    return obj


def test_template_matches_what_the_server_stored() -> None:
    desired = claim_template_for(workload(lnc=1), WID)
    existing = stored(desired)
    assert template_matches(existing, desired)
    # Labels added by someone else are not ours to remove.
    existing["metadata"]["labels"]["team"] = "ml"
    assert template_matches(existing, desired)


def test_template_differences_that_need_a_write() -> None:
    desired = claim_template_for(workload(), WID)
    other_spec = stored(claim_template_for(workload(lnc=2), WID))
    assert not template_matches(other_spec, desired)
    other_id = stored(claim_template_for(workload(), "my-training-job-ffffffff"))
    assert not template_matches(other_id, desired)
    relabelled = stored(desired)
    del relabelled["metadata"]["labels"][LABEL_WORKLOAD_ID]
    assert not template_matches(relabelled, desired)
    # A same-named template the workload does not own (e.g. created by a user).
    foreign = stored(desired)
    foreign["metadata"]["ownerReferences"] = []
    assert not template_matches(foreign, desired)
    previous_incarnation = stored(desired)
    previous_incarnation["metadata"]["ownerReferences"][0]["uid"] = "uid-0"
    assert not template_matches(previous_incarnation, desired)
