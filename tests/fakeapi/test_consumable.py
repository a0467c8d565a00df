"""The fake API server is a 1.34 server: consumable capacity (DRAConsumableCapacity, alpha and
off there) is dropped from what is written, as kube-apiserver's strategies drop it, unless
the stored object already uses it; a test can switch the feature on (a 1.36+ server)."""

from __future__ import annotations

import copy
from typing import Any

from neuron_dra.sim.fakeapi.server import FakeAPIServer
from neuron_dra.sim.fakeapi.validation.consumable import gate_consumable_capacity

CAPACITY = {"requests": {"logicalCores": "1"}}
V1 = "resource.k8s.io/v1"


def claim_spec() -> dict[str, Any]:
    return {
        "devices": {
            "requests": [
                {"name": "a", "exactly": {"deviceClassName": "c", "capacity": CAPACITY}},
                {
                    "name": "b",
                    "firstAvailable": [{"name": "s", "deviceClassName": "c", "capacity": CAPACITY}],
                },
            ],
            "constraints": [{"requests": ["a"], "distinctAttribute": "x.io/y"}],
        }
    }


def shared_status() -> dict[str, Any]:
    result = {"request": "a", "driver": "d.io", "pool": "p", "device": "d0"}
    return {
        "allocation": {
            "devices": {
                "results": [{**result, "shareID": "u", "consumedCapacity": {"logicalCores": "1"}}]
            }
        },
        "devices": [{"driver": "d.io", "pool": "p", "device": "d0", "shareID": "u"}],
    }


def test_claims_and_templates_lose_their_capacity_requests() -> None:
    obj = {"spec": claim_spec(), "status": shared_status()}
    gate_consumable_capacity("resourceclaims", obj, None)
    a, b = obj["spec"]["devices"]["requests"]
    assert a["exactly"] == {"deviceClassName": "c"}
    assert b["firstAvailable"] == [{"name": "s", "deviceClassName": "c"}]
    assert obj["spec"]["devices"]["constraints"] == [{"requests": ["a"]}]
    (result,) = obj["status"]["allocation"]["devices"]["results"]
    assert "shareID" not in result and "consumedCapacity" not in result
    assert "shareID" not in obj["status"]["devices"][0]

    template = {"spec": {"spec": claim_spec()}}
    gate_consumable_capacity("resourceclaimtemplates", template, None)
    assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"] == {"deviceClassName": "c"}


def test_an_object_that_uses_the_feature_keeps_it() -> None:
    old = {"spec": claim_spec(), "status": shared_status()}
    new = copy.deepcopy(old)
    gate_consumable_capacity("resourceclaims", new, old)
    assert new == old


def test_the_server_drops_it_unless_switched_on() -> None:
    server = FakeAPIServer()
    template = {
        "apiVersion": V1,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "default"},
        "spec": {"spec": claim_spec()},
    }
    del template["spec"]["spec"]["devices"]["constraints"]
    stored = server.create(copy.deepcopy(template))
    assert "capacity" not in stored["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    server.core.consumable_capacity = True
    template["metadata"]["name"] = "kept"
    stored = server.create(template)
    assert stored["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == CAPACITY
