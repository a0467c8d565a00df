"""The structured allocator (simulated scheduler, ``check-claim``) against our real slices."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from inventories import profile_inventory
from neuron_dra.common.profiles import PROFILES, UltraServerMode
from neuron_dra.nodeplugin.discovery.emulation import scan_emulated, write_emulated_tree
from neuron_dra.nodeplugin.discovery.model import (
    NodeInventory,
    UltraServerInfo,
)
from neuron_dra.nodeplugin.publish.slices import build_resource_slices
from neuron_dra.sim.allocation import (
    AllocationFailure,
    AllocationResult,
    CelError,
    allocate,
    compile_selector,
    device_view,
)

DRIVER = "neuron.aws.com"
G4 = "resource.aws.com/devicegroup4_id"
G8 = "resource.aws.com/devicegroup8_id"
UID = "0b7c6a51-4f7e-4f0e-9d52-3c1f0d2e8a11"
CLASS_EXPR = (
    'device.driver == "neuron.aws.com" && !("workloadId" in device.attributes["neuron.aws.com"])'
)
CLASSES: dict[str, dict[str, Any]] = {
    DRIVER: {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": CLASS_EXPR}}]},
    }
}
TRN2_SEL = "device.attributes['neuron.aws.com'].instanceType == 'trn2.48xlarge'"


def inventory(
    instance_type: str, node: str, *, ultraserver: UltraServerInfo | None = None
) -> NodeInventory:
    return profile_inventory(instance_type, node, ultraserver=ultraserver, efa=True)


def slices_for(
    instance_type: str,
    node: str,
    *,
    workload_ids: Mapping[int | str, str] | None = None,
    generation: int = 0,
    ultraserver: UltraServerInfo | None = None,
) -> list[dict[str, Any]]:
    return build_resource_slices(
        inventory(instance_type, node, ultraserver=ultraserver),
        node_name=node,
        node_uid=UID,
        node_labels={},
        dra_driver_version="0.1.0",
        generation=generation,
        workload_ids=workload_ids,
    )


def request(
    name: str = "neurons",
    *,
    count: int | None = None,
    all_mode: bool = False,
    selectors: Sequence[str] = (),
    device_class: str = DRIVER,
) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": device_class}
    if all_mode:
        body["allocationMode"] = "All"
    else:
        body["allocationMode"] = "ExactCount"
        if count is not None:
            body["count"] = count
    if selectors:
        body["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"name": name, "exactly": body}


def claim(
    *requests: dict[str, Any],
    constraints: Sequence[dict[str, Any]] = (),
    config: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = list(constraints)
    if config:
        devices["config"] = list(config)
    return {"devices": devices}


def ids(result: AllocationResult) -> list[int]:
    return sorted(int(d.device.removeprefix("neurondevice")) for d in result.devices)


def ok(outcome: AllocationResult | AllocationFailure) -> AllocationResult:
    assert isinstance(outcome, AllocationResult), outcome
    return outcome


def failed(outcome: AllocationResult | AllocationFailure) -> AllocationFailure:
    assert isinstance(outcome, AllocationFailure), outcome
    return outcome


def used(node: str, *indices: int) -> set[tuple[str, str, str]]:
    return {(DRIVER, node, f"neurondevice{i}") for i in indices}


TRN2 = slices_for("trn2.48xlarge", "node-a")
CONNECTED4 = claim(
    request(count=4, selectors=[TRN2_SEL]),
    constraints=[{"requests": ["neurons"], "matchAttribute": G4}],
)


# --- seed templates ------------------------------------------------------------------------------


def test_four_connected_devices_take_one_torus_row() -> None:
    result = ok(allocate(CONNECTED4, classes=CLASSES, slices=TRN2, allocated=set()))
    assert result.node_name == "node-a"
    assert ids(result) == [0, 1, 2, 3]
    assert result.allocation == {
        "devices": {
            "results": [
                {
                    "request": "neurons",
                    "driver": DRIVER,
                    "pool": "node-a",
                    "device": f"neurondevice{i}",
                }
                for i in range(4)
            ]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
            ]
        },
    }


def test_four_connected_devices_avoid_rows_with_a_device_in_use() -> None:
    busy = used("node-a", 1, 6, 8)
    result = ok(allocate(CONNECTED4, classes=CLASSES, slices=TRN2, allocated=busy))
    assert ids(result) == [12, 13, 14, 15]
    assert not result.device_keys & busy


def test_four_connected_devices_fail_when_every_row_is_broken() -> None:
    out = failed(
        allocate(CONNECTED4, classes=CLASSES, slices=TRN2, allocated=used("node-a", 0, 4, 8, 12))
    )
    assert not out.error
    assert out.message == (
        "node node-a: request neurons: needs 4 devices, 16 match, but no 4 free ones share "
        f"{G4} (at most 3 do)"
    )


def test_admin_access_takes_devices_in_use_and_leaves_them_in_use_for_others() -> None:
    """A monitoring claim (``adminAccess``) gets every device, in use or not; its results say
    so and put nothing in use."""
    watch = request(all_mode=True, selectors=[TRN2_SEL])
    watch["exactly"]["adminAccess"] = True
    busy = used("node-a", 1, 6)
    result = ok(allocate(claim(watch), classes=CLASSES, slices=TRN2, allocated=busy))
    assert ids(result) == list(range(16)) and not result.device_keys
    results = result.allocation["devices"]["results"]
    assert all(r["adminAccess"] is True for r in results)
    # Without adminAccess the same request waits for the devices in use.
    watch["exactly"].pop("adminAccess")
    assert not failed(allocate(claim(watch), classes=CLASSES, slices=TRN2, allocated=busy)).error


def test_xl_all_devices_of_trn2() -> None:
    xl = claim(request(all_mode=True, selectors=[TRN2_SEL]))
    result = ok(allocate(xl, classes=CLASSES, slices=TRN2, allocated=set()))
    assert ids(result) == list(range(16))
    out = failed(allocate(xl, classes=CLASSES, slices=TRN2, allocated=used("node-a", 3)))
    assert out.message == (
        "node node-a: request neurons: asks for all 16 matching devices, but 1 is in use "
        "(neurondevice3)"
    )


def test_xl_exact_count_16() -> None:
    xl = claim(request(count=16, selectors=[TRN2_SEL]))
    assert ids(ok(allocate(xl, classes=CLASSES, slices=TRN2, allocated=set()))) == list(range(16))


def test_l_eight_devices_take_a_half() -> None:
    large = claim(
        request(count=8, selectors=[TRN2_SEL]),
        constraints=[{"requests": ["neurons"], "matchAttribute": G8}],
    )
    assert ids(ok(allocate(large, classes=CLASSES, slices=TRN2, allocated=set()))) == list(range(8))
    result = ok(allocate(large, classes=CLASSES, slices=TRN2, allocated=used("node-a", 5)))
    assert ids(result) == list(range(8, 16))


@pytest.mark.parametrize(
    "selector",
    [
        TRN2_SEL + " && device.attributes['neuron.aws.com'].neuronDriverVersion == '2.24.7.0'",
        "device.attributes['neuron.aws.com'].draDriverVersion.compareTo(semver('0.1.0')) >= 0",
        "device.attributes['neuron.aws.com'].draDriverVersion.isGreaterThan(semver('0.0.9'))",
        "device.attributes['neuron.aws.com'].draDriverVersion == semver('0.1.0')",
    ],
)
def test_driver_version_selectors(selector: str) -> None:
    c = claim(
        request(count=8, selectors=[selector]),
        constraints=[{"requests": ["neurons"], "matchAttribute": G8}],
    )
    assert ids(ok(allocate(c, classes=CLASSES, slices=TRN2, allocated=set()))) == list(range(8))


def test_driver_version_mismatch_names_the_selector() -> None:
    sel = "device.attributes['neuron.aws.com'].neuronDriverVersion == '2.26.0.0'"
    out = failed(
        allocate(
            claim(request(count=8, selectors=[sel])), classes=CLASSES, slices=TRN2, allocated=set()
        )
    )
    assert out.message == (
        f"node node-a: request neurons: selector `{sel}` matches none of the 16 devices of class "
        f"{DRIVER}"
    )


def test_lnc_config_is_copied_from_claim_and_class() -> None:
    params = {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 1}
    classes = copy.deepcopy(CLASSES)
    class_opaque: dict[str, Any] = {
        "driver": DRIVER,
        "parameters": {"apiVersion": "neuron.aws.com/v1", "kind": "X"},
    }
    classes[DRIVER]["spec"]["config"] = [{"opaque": class_opaque}]
    c = claim(
        request(all_mode=True, selectors=[TRN2_SEL]),
        config=[
            {"requests": ["neurons"], "opaque": {"driver": DRIVER, "parameters": params}},
            {"opaque": {"driver": "efa.example.com", "parameters": {"x": 1}}},
        ],
    )
    before = json.dumps([c, classes], sort_keys=True)
    result = ok(allocate(c, classes=classes, slices=TRN2, allocated=set()))
    assert result.allocation["devices"]["config"] == [
        {"source": "FromClass", "requests": ["neurons"], "opaque": class_opaque},
        {
            "source": "FromClaim",
            "requests": ["neurons"],
            "opaque": {"driver": DRIVER, "parameters": params},
        },
        {"source": "FromClaim", "opaque": {"driver": "efa.example.com", "parameters": {"x": 1}}},
    ]
    assert json.dumps([c, classes], sort_keys=True) == before  # inputs untouched
    result.allocation["devices"]["config"][0]["opaque"]["parameters"]["kind"] = "changed"
    assert class_opaque["parameters"]["kind"] == "X"  # a copy, not shared


def test_ultraserver_node_device() -> None:
    us = UltraServerInfo(
        modes=(UltraServerMode.X4, UltraServerMode.X2V, UltraServerMode.X1),
        server_id_2="a1b2c3d4e5f60718",
        server_id_4="a1b2c3d4e5f60719",
        node_id_2=1,
        node_id_4=3,
    )
    slices = slices_for("trn2u.48xlarge", "us-node-0", ultraserver=us)
    c = claim(
        request(
            count=1,
            selectors=["device.attributes['neuron.aws.com'].resourceType == 'neuron_node'"],
        ),
        config=[
            {
                "requests": ["neurons"],
                "opaque": {
                    "driver": DRIVER,
                    "parameters": {
                        "apiVersion": "neuron.aws.com/v1alphav1",
                        "kind": "UltraServerConfig",
                        "ultraserverMode": 4,
                    },
                },
            }
        ],
    )
    result = ok(allocate(c, classes=CLASSES, slices=slices, allocated=set()))
    assert [d.device for d in result.devices] == ["neuronnode"]
    assert result.allocation["devices"]["config"][0]["opaque"]["parameters"]["ultraserverMode"] == 4
    # Connected devices still work on the UltraServer node; a selector that fails on the
    # neuronnode (no deviceId) is not reached, as in the scheduler, but is reported.
    c4 = claim(
        request(count=4, selectors=["device.attributes['neuron.aws.com'].deviceId >= 4"]),
        constraints=[{"matchAttribute": G4}],
    )
    result = ok(allocate(c4, classes=CLASSES, slices=slices, allocated=set()))
    assert ids(result) == [4, 5, 6, 7]
    assert result.warnings == (
        "request neurons: selector #0 on device us-node-0/neuronnode: "
        "CEL runtime error: no such key: deviceId",
    )


def test_selector_error_in_a_tried_subrequest_aborts() -> None:
    slices = slices_for("trn2u.48xlarge", "us-node-0")
    c = claim(
        {
            "name": "neurons",
            "firstAvailable": [
                {
                    "name": "many",
                    "deviceClassName": DRIVER,
                    "count": 17,
                    "selectors": [
                        {"cel": {"expression": "device.attributes['neuron.aws.com'].deviceId >= 0"}}
                    ],
                },
                {"name": "one", "deviceClassName": DRIVER},
            ],
        }
    )
    out = failed(allocate(c, classes=CLASSES, slices=slices, allocated=set()))
    assert out.error
    assert out.message == (
        "request neurons/many: selector #0 on device us-node-0/neuronnode: "
        "CEL runtime error: no such key: deviceId"
    )


def test_too_few_free_devices() -> None:
    c = claim(request(count=14))
    out = failed(allocate(c, classes=CLASSES, slices=TRN2, allocated=used("node-a", 1, 2, 3)))
    assert out.message == (
        "node node-a: request neurons: needs 14 devices, 16 match, but only 13 are free (3 in use)"
    )


def test_tainted_devices_need_a_toleration() -> None:
    slices = copy.deepcopy(TRN2)
    taint = {"key": "neuron.aws.com/unhealthy", "value": "true", "effect": "NoSchedule"}
    slices[0]["spec"]["devices"][0]["taints"] = [taint]
    result = ok(allocate(CONNECTED4, classes=CLASSES, slices=slices, allocated=set()))
    assert ids(result) == list(range(4, 8))
    tolerant = copy.deepcopy(CONNECTED4)
    tolerant["devices"]["requests"][0]["exactly"]["tolerations"] = [
        {"key": "neuron.aws.com/unhealthy", "operator": "Exists"}
    ]
    result = ok(allocate(tolerant, classes=CLASSES, slices=slices, allocated=set()))
    assert ids(result) == list(range(0, 4))
    xl = claim(request(all_mode=True))
    out = failed(allocate(xl, classes=CLASSES, slices=slices, allocated=set()))
    assert out.message == (
        "node node-a: request neurons: asks for all 16 matching devices, but 1 is tainted "
        "(neurondevice0)"
    )


def test_v1beta1_flat_requests_as_in_the_seed_templates() -> None:
    c = {
        "devices": {
            "requests": [
                {
                    "name": "neurons",
                    "deviceClassName": DRIVER,
                    "allocationMode": "ExactCount",
                    "count": 4,
                    "selectors": [{"cel": {"expression": TRN2_SEL}}],
                }
            ],
            "constraints": [{"requests": ["neurons"], "matchAttribute": G4}],
        }
    }
    result = ok(allocate({"spec": c}, classes=CLASSES, slices=TRN2, allocated=used("node-a", 0)))
    assert ids(result) == [4, 5, 6, 7]


def test_all_mode_waits_for_an_incomplete_pool() -> None:
    slices = copy.deepcopy(TRN2)
    slices[0]["spec"]["pool"]["resourceSliceCount"] = 2
    out = failed(
        allocate(claim(request(all_mode=True)), classes=CLASSES, slices=slices, allocated=set())
    )
    assert out.message == (
        "node node-a: request neurons: asks for all devices, but pool node-a is being updated"
    )
    result = ok(allocate(CONNECTED4, classes=CLASSES, slices=slices, allocated=set()))
    assert ids(result) == list(range(0, 4))


# --- firstAvailable ------------------------------------------------------------------------------


def first_available() -> dict[str, Any]:
    return claim(
        {
            "name": "neurons",
            "firstAvailable": [
                {"name": "eight", "deviceClassName": DRIVER, "count": 8},
                {"name": "four", "deviceClassName": DRIVER, "count": 4},
            ],
        },
        constraints=[{"requests": ["neurons"], "matchAttribute": G4}],
    )


def test_first_available_takes_the_first_subrequest_that_fits() -> None:
    # No 8 devices share one devicegroup4_id: the 8-device subrequest never fits.
    result = ok(allocate(first_available(), classes=CLASSES, slices=TRN2, allocated=set()))
    assert {d.request for d in result.devices} == {"neurons/four"}
    assert ids(result) == [0, 1, 2, 3]


def test_first_available_prefers_the_first_and_explains_all() -> None:
    c = first_available()
    c["devices"]["constraints"] = []
    result = ok(allocate(c, classes=CLASSES, slices=TRN2, allocated=set()))
    assert {d.request for d in result.devices} == {"neurons/eight"}
    out = failed(
        allocate(
            first_available(),
            classes=CLASSES,
            slices=TRN2,
            allocated=used("node-a", 0, 4, 8, 12),
        )
    )
    assert out.message == (
        "node node-a: request neurons: no subrequest fits (neurons/eight: needs 8 devices, 16 "
        f"match, but no 8 free ones share {G4} (at most 3 do); neurons/four: needs 4 devices, "
        f"16 match, but no 4 free ones share {G4} (at most 3 do))"
    )


def test_first_available_class_config_names_the_subrequest() -> None:
    classes = copy.deepcopy(CLASSES)
    classes[DRIVER]["spec"]["config"] = [{"opaque": {"driver": DRIVER, "parameters": {}}}]
    result = ok(allocate(first_available(), classes=classes, slices=TRN2, allocated=set()))
    assert result.allocation["devices"]["config"] == [
        {
            "source": "FromClass",
            "requests": ["neurons/four"],
            "opaque": {"driver": DRIVER, "parameters": {}},
        }
    ]


# --- failures and errors -------------------------------------------------------------------------


def test_trn1_seven_connected_is_impossible() -> None:
    slices = slices_for("trn1.32xlarge", "trn1-a")
    c = claim(request(count=7), constraints=[{"requests": ["neurons"], "matchAttribute": G4}])
    out = failed(allocate(c, classes=CLASSES, slices=slices, allocated=set()))
    assert not out.error
    assert out.message == (
        f"node trn1-a: request neurons: needs 7 devices, 16 match, but no 7 share {G4} "
        "(at most 4 do)"
    )


def test_inf2_ring_four_connected_is_an_aligned_block() -> None:
    slices = slices_for("inf2.48xlarge", "inf2-a")
    c = claim(request(count=4), constraints=[{"matchAttribute": G4}])
    assert ids(ok(allocate(c, classes=CLASSES, slices=slices, allocated=set()))) == [0, 1, 2, 3]
    result = ok(allocate(c, classes=CLASSES, slices=slices, allocated=used("inf2-a", 2)))
    assert ids(result) == [4, 5, 6, 7]
    three = claim(
        request(count=3), constraints=[{"matchAttribute": "resource.aws.com/devicegroup3_id"}]
    )
    result = ok(allocate(three, classes=CLASSES, slices=slices, allocated=used("inf2-a", 0)))
    assert ids(result) == [3, 4, 5]


def test_reserved_devices_are_excluded_by_the_class() -> None:
    slices = slices_for("trn2.48xlarge", "node-a", workload_ids={0: "wl-1", 5: "wl-2"})
    result = ok(allocate(CONNECTED4, classes=CLASSES, slices=slices, allocated=set()))
    assert ids(result) == [8, 9, 10, 11]
    all_of_them = claim(request(count=16))
    out = failed(allocate(all_of_them, classes=CLASSES, slices=slices, allocated=set()))
    assert out.message == "node node-a: request neurons: needs 16 devices, only 14 match"
    whole = slices_for("trn2.48xlarge", "node-a", workload_ids={"node": "wl"})
    out = failed(allocate(CONNECTED4, classes=CLASSES, slices=whole, allocated=set()))
    assert (
        out.message
        == f"node node-a: request neurons: none of the 16 devices matches class {DRIVER}"
    )


def test_expression_error_aborts_the_claim() -> None:
    c = claim(request(count=1, selectors=["device.attributes['neuron.aws.com'].noSuchThing == 1"]))
    out = failed(allocate(c, classes=CLASSES, slices=TRN2, allocated=set()))
    assert out.error
    assert out.message == (
        "request neurons: selector #0 on device node-a/neurondevice0: "
        "CEL runtime error: no such key: noSuchThing"
    )


def test_non_bool_and_compile_errors() -> None:
    out = failed(
        allocate(
            claim(request(selectors=["device.attributes['neuron.aws.com'].deviceId"])),
            classes=CLASSES,
            slices=TRN2,
            allocated=set(),
        )
    )
    assert out.error
    assert out.message.endswith("CEL result of type int is not a bool")
    out = failed(
        allocate(
            claim(request(selectors=["device.driver =="])),
            classes=CLASSES,
            slices=TRN2,
            allocated=set(),
        )
    )
    assert out.error and out.message.startswith("request neurons: selector #0: compilation failed")


def test_unknown_class_is_an_error() -> None:
    out = failed(
        allocate(claim(request(device_class="nope")), classes=CLASSES, slices=TRN2, allocated=set())
    )
    assert out.error and out.message == "request neurons: device class nope not found"


def test_several_nodes_first_feasible_by_name_and_summary() -> None:
    slices = slices_for("trn2.48xlarge", "node-b") + slices_for("trn2.48xlarge", "node-a")
    busy = used("node-a", 0, 4, 8, 12)
    assert (
        ok(allocate(CONNECTED4, classes=CLASSES, slices=slices, allocated=busy)).node_name
        == "node-b"
    )
    assert (
        ok(allocate(CONNECTED4, classes=CLASSES, slices=slices, allocated=set())).node_name
        == "node-a"
    )
    pinned = allocate(
        CONNECTED4, classes=CLASSES, slices=slices, allocated=busy, node_name="node-a"
    )
    assert failed(pinned).message.startswith("node node-a: request neurons: needs 4 devices")
    busy |= used("node-b", 1, 5, 9, 13)
    out = failed(allocate(CONNECTED4, classes=CLASSES, slices=slices, allocated=busy))
    assert out.message == (
        "0/2 nodes can allocate the claim: 2 nodes: request neurons: needs 4 devices, 16 match, "
        f"but no 4 free ones share {G4} (at most 3 do)"
    )
    assert [n.node_name for n in out.nodes] == ["node-a", "node-b"]
    assert out.details().count("\n") == 2


def test_only_the_newest_pool_generation_counts() -> None:
    old = slices_for("trn2.48xlarge", "node-a", generation=1)
    new = slices_for("trn2.48xlarge", "node-a", generation=2, workload_ids={0: "wl", 1: "wl"})
    for s in old:
        s["metadata"]["name"] += "-old"
    result = ok(allocate(CONNECTED4, classes=CLASSES, slices=old + new, allocated=set()))
    assert ids(result) == [4, 5, 6, 7]


def test_two_requests_share_a_group_through_one_constraint() -> None:
    c = claim(
        request("a", count=2),
        request("b", count=2, selectors=["device.attributes['neuron.aws.com'].deviceId % 2 == 1"]),
        constraints=[{"matchAttribute": G4}],
    )
    result = ok(allocate(c, classes=CLASSES, slices=TRN2, allocated=set()))
    by_request = {r: sorted(d.device for d in result.devices if d.request == r) for r in "ab"}
    # a must leave the odd devices of its row to b: backtracking within the group.
    assert by_request == {
        "a": ["neurondevice0", "neurondevice2"],
        "b": ["neurondevice1", "neurondevice3"],
    }
    impossible = claim(
        request("a", count=3),
        request("b", count=2),
        constraints=[{"matchAttribute": G4}],
    )
    out = failed(allocate(impossible, classes=CLASSES, slices=TRN2, allocated=set()))
    assert out.message == (
        f"node node-a: each request fits alone, but no combination satisfies matchAttribute {G4} "
        "across a, b"
    )


def test_search_budget_and_combined_constraints() -> None:
    # a takes one device of each row, so no full row is left for b: each fits alone only.
    c = claim(
        request("a", count=4),
        request("b", count=4),
        constraints=[
            {"requests": ["a"], "distinctAttribute": G4},
            {"requests": ["b"], "matchAttribute": G4},
        ],
    )
    out = failed(allocate(c, classes=CLASSES, slices=TRN2, allocated=set(), max_steps=500))
    assert out.message == "node node-a: no allocation found within 500 search steps"
    out = failed(allocate(c, classes=CLASSES, slices=TRN2, allocated=set()))
    assert out.message == (
        "node node-a: each request fits alone, but requests a, b cannot share the node's free "
        f"devices while keeping distinctAttribute {G4} on a, matchAttribute {G4} on b"
    )
    # Too many devices in total is caught by counting, before any search.
    c = claim(request("a", count=8), request("b", count=8), request("c", count=1))
    out = failed(allocate(c, classes=CLASSES, slices=TRN2, allocated=set(), max_steps=50))
    assert out.message == (
        "node node-a: each request fits alone, but requests a, b, c together need more free "
        "matching devices than the node has"
    )


def test_distinct_attribute() -> None:
    c = claim(request(count=4), constraints=[{"distinctAttribute": G4}])
    result = ok(allocate(c, classes=CLASSES, slices=TRN2, allocated=used("node-a", 0)))
    assert ids(result) == [1, 4, 8, 12]
    c = claim(request(count=5), constraints=[{"distinctAttribute": G4}])
    out = failed(allocate(c, classes=CLASSES, slices=TRN2, allocated=set()))
    assert out.message == (
        f"node node-a: request neurons: needs 5 devices, 16 match, but only 4 have distinct {G4} "
        "values"
    )


def test_capacity_quantity_selector() -> None:
    big = "device.capacity['neuron.aws.com'].memory.compareTo(quantity('64Gi')) >= 0"
    trn1 = slices_for("trn1.32xlarge", "a-trn1")  # 32Gi per device
    c = claim(request(count=2, selectors=[big]))
    result = ok(allocate(c, classes=CLASSES, slices=trn1 + TRN2, allocated=set()))
    assert result.node_name == "node-a"  # a-trn1 sorts first but its devices are too small


def test_determinism() -> None:
    slices = slices_for("trn2.48xlarge", "node-b") + TRN2 + slices_for("trn1.32xlarge", "node-c")
    busy = used("node-a", 2, 9)
    runs = {
        json.dumps(ok(allocate(CONNECTED4, classes=CLASSES, slices=s, allocated=busy)).allocation)
        for s in (slices, list(reversed(slices)), slices[1:] + slices[:1])
    }
    assert len(runs) == 1


# --- the CEL environment -------------------------------------------------------------------------


def trn2_device(index: int = 3) -> Any:
    return device_view(DRIVER, TRN2[0]["spec"]["devices"][index])


@pytest.mark.parametrize(
    "expression",
    [
        CLASS_EXPR,
        "device.attributes['neuron.aws.com'].draDriverVersion.major() == 0",
        "device.attributes['neuron.aws.com'].draDriverVersion.minor() == 1",
        "device.attributes['neuron.aws.com'].draDriverVersion.patch() == 0",
        "device.attributes['neuron.aws.com'].draDriverVersion.isLessThan(semver('1.0.0'))",
        "semver('1.0.0-alpha').isLessThan(semver('1.0.0-alpha.1'))",
        "semver('1.0.0-rc.1').compareTo(semver('1.0.0')) == -1",
        "semver('v2.1', true) == semver('2.1.0')",
        "isSemver('1.2.3') && !isSemver('2.24.7.0') && isSemver('v1', true)",
        "device.capacity['neuron.aws.com'].memory == quantity('96Gi')",
        "device.capacity['neuron.aws.com'].memory == quantity('98304Mi')",
        "device.capacity['neuron.aws.com'].memory.isGreaterThan(quantity('64Gi'))",
        "device.capacity['neuron.aws.com'].cores.asInteger() == 8",
        "device.capacity['neuron.aws.com'].cores.isInteger()",
        "device.capacity['neuron.aws.com'].cores.add(2).sub(quantity('1')).asInteger() == 9",
        "quantity('500m').asApproximateFloat() == 0.5 && !quantity('1.5').isInteger()",
        "quantity('-1Ki').sign() == -1 && quantity('0').sign() == 0",
        "isQuantity('1Gi') && !isQuantity('1GG')",
        "device.attributes['resource.aws.com'].devicegroup4_id != ''",
        "device.attributes['other.example.com'].size() == 0",
        "device.capacity['other.example.com'].size() == 0",
        "device.attributes['neuron.aws.com'].instanceType.startsWith('trn2')",
        "cel.bind(n, device.attributes['neuron.aws.com'], n.deviceId == 3 && n.healthy)",
        "!device.allowMultipleAllocations",
        "device.attributes['neuron.aws.com'].draDriverVersion != '0.1.0'",  # semver is no string
    ],
)
def test_cel_library_functions(expression: str) -> None:
    assert compile_selector(expression).evaluate(trn2_device()) is True


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("semver('2.24.7.0').major() == 2", "CEL runtime error: invalid semver: 2.24.7.0"),
        ("quantity('1.5').asInteger() == 1", "CEL runtime error: cannot convert value to integer"),
        ("quantity('x') == quantity('1')", "CEL runtime error: invalid quantity 'x'"),
        (
            "device.capacity['neuron.aws.com'].memory.compareTo(semver('1.0.0')) == 0",
            "CEL runtime error: no such overload: compareTo(kubernetes.Quantity, "
            "kubernetes.Semver)",
        ),
        ("device.attributes['neuron.aws.com'].x", "CEL runtime error: no such key: x"),
    ],
)
def test_cel_runtime_errors(expression: str, message: str) -> None:
    with pytest.raises(CelError) as err:
        compile_selector(expression).evaluate(trn2_device())
    assert str(err.value).startswith(message)


def test_cel_type_checked_at_compile_time() -> None:
    with pytest.raises(CelError, match=r"compilation failed.*isLessThan"):
        compile_selector("quantity('1').isLessThan(semver('1.0.0'))")
    assert compile_selector("device.driver == 'x'") is compile_selector("device.driver == 'x'")


# --- properties ----------------------------------------------------------------------------------

SLICE_SETS = {
    t: slices_for(t, f"{t.split('.')[0]}-node")
    for t in ("trn2.48xlarge", "trn1.32xlarge", "inf2.48xlarge")
}
SELECTORS: dict[str, str | None] = {
    "any": None,
    "even": "device.attributes['neuron.aws.com'].deviceId % 2 == 0",
    "low": "device.attributes['neuron.aws.com'].deviceId < 10",
    "trn2": TRN2_SEL,
}
PREDICATES: dict[str, Callable[[int, str], bool]] = {
    "any": lambda i, t: True,
    "even": lambda i, t: i % 2 == 0,
    "low": lambda i, t: i < 10,
    "trn2": lambda i, t: t == "trn2.48xlarge",
}


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[str, list[tuple[str, int, str]], set[int], str]:
    instance_type = draw(st.sampled_from(sorted(SLICE_SETS)))
    n_requests = draw(st.integers(1, 3))
    reqs = [
        (f"r{i}", draw(st.integers(1, 8)), draw(st.sampled_from(sorted(SELECTORS))))
        for i in range(n_requests)
    ]
    n = PROFILES[instance_type].device_count
    busy = draw(st.sets(st.integers(0, n - 1), max_size=n))
    return (
        instance_type,
        reqs,
        busy,
        draw(st.sampled_from(["none", G4, G8])),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_allocations_are_valid(scenario: Any) -> None:
    instance_type, reqs, busy, constraint = scenario
    node = f"{instance_type.split('.')[0]}-node"
    slices = SLICE_SETS[instance_type]
    c = claim(
        *(
            request(name, count=count, selectors=[e for e in [SELECTORS[s]] if e])
            for name, count, s in reqs
        ),
        constraints=[] if constraint == "none" else [{"matchAttribute": constraint}],
    )
    allocated = used(node, *busy)
    outcome = allocate(c, classes=CLASSES, slices=slices, allocated=allocated)
    devices = {d["name"]: d for d in slices[0]["spec"]["devices"]}
    if isinstance(outcome, AllocationFailure):
        assert not outcome.error
        assert outcome.message.startswith(f"node {node}: ")
        if len(reqs) == 1 and constraint != "none":
            # A single request fails only if no group has enough free matching devices.
            name, count, sel = reqs[0]
            groups: dict[str, int] = {}
            for i in range(PROFILES[instance_type].device_count):
                attrs = devices[f"neurondevice{i}"]["attributes"]
                if i in busy or not PREDICATES[sel](i, instance_type) or constraint not in attrs:
                    continue
                g = attrs[constraint]["string"]
                groups[g] = groups.get(g, 0) + 1
            assert max(groups.values(), default=0) < count
        return
    keys = [d.key for d in outcome.devices]
    assert len(keys) == len(set(keys))
    assert not set(keys) & allocated
    for name, count, sel in reqs:
        mine = [d for d in outcome.devices if d.request == name]
        assert len(mine) == count
        for d in mine:
            i = int(d.device.removeprefix("neurondevice"))
            assert PREDICATES[sel](i, instance_type)
    if constraint != "none":
        values = {devices[d.device]["attributes"][constraint]["string"] for d in outcome.devices}
        assert len(values) == 1


# --- standard attributes across drivers ----------------------------------------------------------

PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
NUMA_NODE = "resource.kubernetes.io/numaNode"
NIC_DRIVER = "nic.test.example"
NIC_CLASSES: dict[str, dict[str, Any]] = {
    **CLASSES,
    NIC_DRIVER: {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": NIC_DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{NIC_DRIVER}"'}}]},
    },
}


def emulated_slices(tmp_path: Path, node: str) -> list[dict[str, Any]]:
    """A trn2.48xlarge's slices as its plugin publishes them, PCI attributes included."""
    paths = write_emulated_tree(tmp_path / node, "trn2.48xlarge", node_name=node)
    return build_resource_slices(
        scan_emulated(paths, node_name=node),
        node_name=node,
        node_uid=UID,
        node_labels={},
        dra_driver_version="0.1.0",
        generation=0,
    )


def nic_slice(node: str, nics: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Another driver's node-local pool: NIC name -> its attributes."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{NIC_DRIVER}"},
        "spec": {
            "driver": NIC_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
            "devices": [{"name": n, "attributes": dict(a)} for n, a in nics.items()],
        },
    }


def by_driver(result: AllocationResult) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for d in result.devices:
        out.setdefault(d.driver, []).append(d.device)
    return {k: sorted(v) for k, v in out.items()}


def test_match_attribute_aligns_devices_of_two_drivers_under_one_pcie_root(
    tmp_path: Path,
) -> None:
    neuron = emulated_slices(tmp_path, "node-a")
    nics = nic_slice(
        "node-a",
        {
            "nic-far": {PCIE_ROOT: {"string": "pci0000:01"}},  # no Neuron device under it
            "nic-bare": {},  # publishes no root: never matches
            "nic-57": {PCIE_ROOT: {"string": "pci0000:57"}},  # devices 5 and 6 are under it
        },
    )
    slices = [*neuron, nics]
    pcie = [{"matchAttribute": PCIE_ROOT}]
    one = claim(request("n", count=1), request("nic", count=1, device_class=NIC_DRIVER))
    unaligned = ok(allocate(one, classes=NIC_CLASSES, slices=slices, allocated=set()))
    assert by_driver(unaligned) == {DRIVER: ["neurondevice0"], NIC_DRIVER: ["nic-far"]}
    one["devices"]["constraints"] = pcie
    aligned = ok(allocate(one, classes=NIC_CLASSES, slices=slices, allocated=set()))
    assert by_driver(aligned) == {DRIVER: ["neurondevice5"], NIC_DRIVER: ["nic-57"]}
    two = claim(
        request("n", count=2), request("nic", count=1, device_class=NIC_DRIVER), constraints=pcie
    )
    result = ok(allocate(two, classes=NIC_CLASSES, slices=slices, allocated=set()))
    assert by_driver(result)[DRIVER] == ["neurondevice5", "neurondevice6"]
    taken = {(DRIVER, "node-a", "neurondevice5")}
    result = ok(allocate(one, classes=NIC_CLASSES, slices=slices, allocated=taken))
    assert by_driver(result) == {DRIVER: ["neurondevice6"], NIC_DRIVER: ["nic-57"]}
    three = claim(
        request("n", count=3), request("nic", count=1, device_class=NIC_DRIVER), constraints=pcie
    )
    failed(allocate(three, classes=NIC_CLASSES, slices=slices, allocated=set()))


def test_match_attribute_on_the_numa_node_across_drivers(tmp_path: Path) -> None:
    slices = [
        *emulated_slices(tmp_path, "node-a"),
        nic_slice("node-a", {"cpu-numa1": {NUMA_NODE: {"int": 1}}}),
    ]
    c = claim(
        request("n", count=4),
        request("cpu", count=1, device_class=NIC_DRIVER),
        constraints=[{"matchAttribute": NUMA_NODE}],
    )
    result = ok(allocate(c, classes=NIC_CLASSES, slices=slices, allocated=set()))
    # Devices 4-11 sit on NUMA node 0 in the emulated layout; the first four of node 1 are 0-3.
    assert by_driver(result)[DRIVER] == [f"neurondevice{i}" for i in range(4)]
