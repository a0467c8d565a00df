"""Device taints from health (publish/taints.py) and their place in the slices (slices.py,
sliceplan.py): pure, no API server."""

from __future__ import annotations

import copy
from typing import Any

from neuron_dra.common.constants import (
    NODE_DEVICE_NAME,
    TAINT_KEY_UNCORRECTED_ECC,
    TAINT_KEY_UNHEALTHY,
    TAINT_KEY_UNHEALTHY_COMPONENT,
)
from neuron_dra.nodeplugin.discovery.model import (
    FailureClass,
    HealthFault,
    NeuronDevice,
    NodeInventory,
)
from neuron_dra.nodeplugin.publish.sliceplan import plan_slices, slice_up_to_date
from neuron_dra.nodeplugin.publish.slices import build_resource_slices
from neuron_dra.nodeplugin.publish.taints import (
    carry_time_added,
    device_taints,
    node_device_taints,
    taint_value,
    taints_dropped,
)

COMPONENT = FailureClass.COMPONENT
ECC = FailureClass.UNCORRECTED_ECC


def fault(kind: FailureClass, item: str) -> HealthFault:
    return HealthFault(kind, item, f"{item} failed")


def device(index: int, *faults: HealthFault, healthy: bool | None = None) -> NeuronDevice:
    return NeuronDevice(
        index=index,
        dev_path=f"/dev/neuron{index}",
        core_count=8,
        healthy=not faults if healthy is None else healthy,
        faults=faults,
    )


def test_a_healthy_device_has_no_taints() -> None:
    assert device_taints(device(0), "NoSchedule") == []


def test_one_taint_per_failure_class_naming_what_failed() -> None:
    sick = device(
        1,
        fault(COMPONENT, "sram"),
        fault(ECC, "mem_ecc_uncorrected"),
        fault(COMPONENT, "hbm"),
        fault(ECC, "mem_ecc_repairable_uncorrected"),
        fault(ECC, "sram_ecc_uncorrected"),
    )
    assert device_taints(sick, "NoSchedule") == [
        {
            "key": TAINT_KEY_UNCORRECTED_ECC,
            "effect": "NoSchedule",
            "value": "mem.mem_repairable.sram",
        },
        {"key": TAINT_KEY_UNHEALTHY_COMPONENT, "effect": "NoSchedule", "value": "hbm.sram"},
    ]
    assert [t["effect"] for t in device_taints(sick, "NoExecute")] == ["NoExecute"] * 2


def test_taints_off_means_none_even_for_a_failing_device() -> None:
    assert device_taints(device(1, fault(COMPONENT, "hbm")), None) == []


def test_unhealthy_without_a_known_class_gets_the_generic_key_and_no_value() -> None:
    assert device_taints(device(2, healthy=False), "NoSchedule") == [
        {"key": TAINT_KEY_UNHEALTHY, "effect": "NoSchedule"}
    ]


def test_taint_values_are_valid_label_values_whatever_the_driver_writes() -> None:
    assert taint_value(["link/efa 0", "-hbm-"]) == "hbm-.link_efa_0"
    assert taint_value(["x" * 80]) == "x" * 63
    assert taint_value(["__"]) == ""


def test_the_whole_node_device_carries_the_taints_of_all_its_devices() -> None:
    devices = [device(0, fault(COMPONENT, "hbm")), device(1), device(2, fault(COMPONENT, "dma"))]
    assert node_device_taints(devices, "NoSchedule") == [
        {"key": TAINT_KEY_UNHEALTHY_COMPONENT, "effect": "NoSchedule", "value": "dma.hbm"}
    ]
    assert node_device_taints([device(0)], "NoSchedule") == []


def inventory(*devices: NeuronDevice, instance_type: str = "trn2u.48xlarge") -> NodeInventory:
    return NodeInventory(
        node_name="n1", instance_type=instance_type, driver_version="2.25.4.0", devices=devices
    )


def build(inv: NodeInventory, effect: str | None = "NoSchedule") -> list[dict[str, Any]]:
    return build_resource_slices(
        inv,
        node_name="n1",
        node_uid="uid-1",
        node_labels={},
        dra_driver_version="0.1.0",
        generation=0,
        taint_effect=effect,
    )


def by_name(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"]["devices"]}


def test_slices_carry_taints_only_on_failing_devices_and_keep_the_healthy_attribute() -> None:
    inv = inventory(*(device(i) for i in range(15)), device(15, fault(COMPONENT, "hbm")))
    devs = by_name(build(inv))
    assert devs["neurondevice15"]["taints"] == [
        {"key": TAINT_KEY_UNHEALTHY_COMPONENT, "effect": "NoSchedule", "value": "hbm"}
    ]
    assert devs["neurondevice15"]["attributes"]["healthy"] == {"bool": False}
    assert "taints" not in devs["neurondevice14"]
    assert devs[NODE_DEVICE_NAME]["taints"] == devs["neurondevice15"]["taints"]
    assert all("taints" not in d for d in by_name(build(inv, None)).values())


def with_time_added(slices: list[dict[str, Any]], when: str) -> list[dict[str, Any]]:
    """``slices`` as the API server returns them: every taint with ``timeAdded``."""
    out = copy.deepcopy(slices)
    for s in out:
        s["metadata"]["resourceVersion"] = "7"
        for d in s["spec"]["devices"]:
            for t in d.get("taints") or []:
                t.setdefault("timeAdded", when)
    return out


def test_a_published_taint_is_up_to_date_whatever_time_the_server_gave_it() -> None:
    inv = inventory(*(device(i) for i in range(15)), device(15, fault(ECC, "mem_ecc_uncorrected")))
    desired = build(inv)
    published = with_time_added(desired, "2026-11-26T01:00:00Z")
    assert slice_up_to_date(published[0], desired[0])
    assert plan_slices(published, desired).writes == 0


def test_a_republish_keeps_the_time_each_taint_was_first_added() -> None:
    first = inventory(*(device(i) for i in range(15)), device(15, fault(COMPONENT, "hbm")))
    published = with_time_added(build(first), "2026-11-26T01:00:00Z")
    # Device 3 fails too: an update, in which device 15's taint keeps its time and device 3's
    # is left for the server to stamp.
    second = inventory(
        *(device(i) for i in range(15) if i != 3),
        device(3, fault(COMPONENT, "sram")),
        device(15, fault(COMPONENT, "hbm")),
    )
    plan = plan_slices(published, build(second))
    (update,) = plan.update
    devs = by_name([update])
    assert devs["neurondevice15"]["taints"][0]["timeAdded"] == "2026-11-26T01:00:00Z"
    assert "timeAdded" not in devs["neurondevice3"]["taints"][0]
    # The whole-node device's taint changed value (hbm -> hbm.sram): a new taint, a new time.
    assert "timeAdded" not in devs[NODE_DEVICE_NAME]["taints"][0]


def test_carry_time_added_matches_key_value_and_effect() -> None:
    have = {
        "spec": {
            "devices": [
                {
                    "name": "d",
                    "taints": [
                        {"key": "k", "value": "a", "effect": "NoSchedule", "timeAdded": "T1"}
                    ],
                }
            ]
        }
    }
    want: dict[str, Any] = {
        "spec": {
            "devices": [
                {
                    "name": "d",
                    "taints": [
                        {"key": "k", "value": "a", "effect": "NoExecute"},
                        {"key": "k", "value": "a", "effect": "NoSchedule"},
                    ],
                }
            ]
        }
    }
    carry_time_added(have, want)
    assert [t.get("timeAdded") for t in want["spec"]["devices"][0]["taints"]] == [None, "T1"]


def test_taints_dropped_by_a_server_without_the_feature() -> None:
    inv = inventory(*(device(i) for i in range(15)), device(15, fault(COMPONENT, "hbm")))
    (sent,) = build(inv)
    (kept,) = with_time_added([sent], "T")
    dropped = copy.deepcopy(sent)
    for d in dropped["spec"]["devices"]:
        d.pop("taints", None)
    assert taints_dropped(sent, dropped)
    assert not taints_dropped(sent, kept)
    (healthy,) = build(inventory(*(device(i) for i in range(16))))
    assert not taints_dropped(healthy, healthy)
