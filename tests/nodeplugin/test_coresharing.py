"""Core sharing, the published side (publish/coresharing.py) and the reading of allocations
(prepare/shares.py), and the publisher against a server that drops it (publish/gated.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from neuron_dra.common.constants import (
    ATTR_LOGICAL_CORE_COUNT,
    CAPACITY_LOGICAL_CORES,
)
from neuron_dra.common.profiles import PROFILES
from neuron_dra.nodeplugin.discovery.model import NeuronDevice, NodeInventory
from neuron_dra.nodeplugin.prepare.shares import ShareError, ShareRequest, read_shares
from neuron_dra.nodeplugin.publish import gated
from neuron_dra.nodeplugin.publish.coresharing import (
    share_sizes,
    sharing_dropped,
    without_sharing,
)
from neuron_dra.nodeplugin.publish.slices import build_resource_slices
from neuron_dra.sim.fakeapi.validation.consumable import gate_consumable_capacity

NODE = "ip-10-0-0-1.us-west-2.compute.internal"
UID = "0b7c6a51-4f7e-4f0e-9d52-3c1f0d2e8a11"
VERSION = "0.1.0"
TRN2 = PROFILES["trn2.48xlarge"]


def make_inventory(instance_type: str, *, lnc: int | None = None) -> NodeInventory:
    profile = PROFILES[instance_type]
    return NodeInventory(
        node_name=NODE,
        instance_type=instance_type,
        driver_version="2.24.7.0",
        devices=tuple(
            NeuronDevice(index=i, dev_path=f"/dev/neuron{i}", core_count=profile.cores_per_device)
            for i in range(profile.device_count)
        ),
        lnc_default=lnc,
    )


def slices(instance_type: str = "trn2.48xlarge", **kw: Any) -> list[dict[str, Any]]:
    return build_resource_slices(
        make_inventory(instance_type, **kw.pop("inventory", {})),
        node_name=NODE,
        node_uid=UID,
        node_labels={},
        dra_driver_version=VERSION,
        generation=0,
        **kw,
    )


def devices(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in objs for d in s["spec"]["devices"]}


def test_share_sizes_are_the_powers_of_two_up_to_the_device() -> None:
    assert share_sizes(4) == [1, 2, 4]
    assert share_sizes(8) == [1, 2, 4, 8]
    assert share_sizes(2) == [1, 2]
    assert share_sizes(1) == [1]
    assert share_sizes(6) == [1, 2, 4, 6]  # a count that is no power of two is one too
    assert len(share_sizes(1 << 20)) == 10  # the API server's limit on validValues


def test_sharing_off_publishes_what_it_always_did() -> None:
    assert slices() == slices(core_sharing=False)
    dev = devices(slices())["neurondevice0"]
    assert "allowMultipleAllocations" not in dev
    assert CAPACITY_LOGICAL_CORES not in dev["capacity"]


@pytest.mark.parametrize(
    ("instance_type", "lnc", "logical"),
    [("trn2.48xlarge", None, 4), ("trn2.48xlarge", 1, 8), ("trn1.32xlarge", None, 2)],
)
def test_each_device_is_sharable_by_its_logical_cores(
    instance_type: str, lnc: int | None, logical: int
) -> None:
    objs = slices(instance_type, core_sharing=True, inventory={"lnc": lnc})
    for name, dev in devices(objs).items():
        assert dev["allowMultipleAllocations"] is True, name
        assert dev["attributes"][ATTR_LOGICAL_CORE_COUNT] == {"int": logical}
        cap = dev["capacity"]
        # A claim asking nothing takes every core: whole-device claims and core claims
        # never meet on one device.
        assert cap[CAPACITY_LOGICAL_CORES] == {
            "value": str(logical),
            "requestPolicy": {
                "default": str(logical),
                "validValues": [str(v) for v in share_sizes(logical)],
            },
        }
        # The scheduler counts logical cores only: the others cost a core claim nothing.
        assert cap["cores"]["requestPolicy"] == {"default": "0"}
        assert cap["memory"]["requestPolicy"] == {"default": "0"}
        assert cap["cores"]["value"] == str(PROFILES[instance_type].cores_per_device)


def test_the_whole_node_device_is_never_shared() -> None:
    objs = slices("trn2u.48xlarge", core_sharing=True)
    node = devices(objs)["neuronnode"]
    assert "allowMultipleAllocations" not in node
    assert all("requestPolicy" not in c for c in node["capacity"].values())
    assert devices(objs)["neurondevice15"]["allowMultipleAllocations"] is True


def test_a_server_without_the_feature_keeps_exclusive_devices() -> None:
    """What a 1.34 server stores (the fake does what kube-apiserver's strategy does) is what
    the publisher then sends: without_sharing; and the publisher can tell it was dropped."""
    (sent,) = slices(core_sharing=True)
    stored = copy.deepcopy(sent)
    gate_consumable_capacity("resourceslices", stored, None)
    assert stored == without_sharing(sent)
    assert sharing_dropped(sent, stored)
    assert not sharing_dropped(sent, sent)
    assert not sharing_dropped(stored, stored)
    dev = devices([stored])["neurondevice0"]
    assert "allowMultipleAllocations" not in dev
    assert dev["capacity"][CAPACITY_LOGICAL_CORES] == {"value": "4"}
    # A stored slice that already uses the feature keeps it (the strategy's "in use" rule).
    again = copy.deepcopy(sent)
    gate_consumable_capacity("resourceslices", again, sent)
    assert again == sent


def test_the_publisher_builds_what_the_server_keeps_once_it_dropped_a_feature() -> None:
    (sent,) = slices(core_sharing=True, taint_effect="NoSchedule")
    stored = without_sharing(sent)
    assert [f.name for f in gated.newly_dropped(sent, stored, set())] == [gated.CORE_SHARING.name]
    assert gated.newly_dropped(sent, stored, {gated.CORE_SHARING.name}) == []
    assert gated.newly_dropped(sent, sent, set()) == []
    assert gated.as_kept([sent], {gated.CORE_SHARING.name}) == [stored]
    assert gated.as_kept([sent], set()) == [sent]
    assert "DRAConsumableCapacity" in gated.CORE_SHARING.message()


# --- reading an allocation ----------------------------------------------------------------------


def published(logical: int = 4) -> dict[str, Any]:
    return {f"neurondevice{i}": {ATTR_LOGICAL_CORE_COUNT: {"int": logical}} for i in range(16)} | {
        "neuronnode": {}
    }


def result(device: str, cores: str | None, share: str = "", request: str = "r") -> dict[str, Any]:
    out: dict[str, Any] = {"request": request, "driver": "neuron.aws.com", "pool": NODE}
    out["device"] = device
    if share:
        out["shareID"] = share
    if cores is not None:
        out["consumedCapacity"] = {CAPACITY_LOGICAL_CORES: cores, "cores": "0", "memory": "0"}
    return out


def read(results: list[dict[str, Any]], *, lnc: int | None = None, admin: bool = False) -> Any:
    return read_shares(results, published(), profile=TRN2, lnc=lnc, admin=admin)


SHARE_A = "0e9a8b6c-1d2e-4f30-8a4b-5c6d7e8f9012"


def test_a_result_consuming_part_of_a_device_is_a_share() -> None:
    ids, share = read([result("neurondevice3", "2", SHARE_A)])
    assert ids == (("neurondevice3", SHARE_A),)
    assert share == ShareRequest(device=3, cores=2, device_cores=4, share_id=SHARE_A)


def test_a_result_consuming_the_whole_device_is_a_whole_device() -> None:
    # With sharing on, a whole-device claim has a shareID too: it goes to the kubelet.
    ids, share = read([result("neurondevice3", "4", SHARE_A)])
    assert ids == (("neurondevice3", SHARE_A),) and share is None
    # Before the feature (1.34): nothing of it in the result.
    assert read([result("neurondevice3", None)]) == ((), None)
    # Consumed capacity in a qualified name counts the same.
    qualified = result("neurondevice3", None, SHARE_A)
    qualified["consumedCapacity"] = {f"neuron.aws.com/{CAPACITY_LOGICAL_CORES}": "1"}
    assert read([qualified])[1] == ShareRequest(3, 1, 4, SHARE_A)


def test_a_share_of_unknown_size_is_taken_whole() -> None:
    """Without the device's count in the slice (not published yet) the result counts as the
    whole device: it then collides with any other claim of the device, never overlaps one."""
    _, share = read_shares(
        [result("neurondevice3", "1", SHARE_A)],
        {"neurondevice3": {}},
        profile=TRN2,
        lnc=None,
        admin=False,
    )
    assert share is None


def test_an_admin_claim_holds_no_cores() -> None:
    ids, share = read([result("neurondevice3", "1", SHARE_A)], admin=True)
    assert ids == (("neurondevice3", SHARE_A),) and share is None


@pytest.mark.parametrize(
    "results",
    [
        [result("neurondevice3", "1", SHARE_A), result("neurondevice4", "1", "b")],
        [result("neurondevice3", "1", SHARE_A), result("neurondevice3", "1", "b", request="s")],
        [result("neurondevice3", "1", SHARE_A), result("neurondevice4", "4", "b")],
        [result("neurondevice3", "1", SHARE_A), result("neurondevice4", None)],
    ],
    ids=["two-devices", "twice-one-device", "beside-a-whole-one", "beside-an-exclusive-one"],
)
def test_a_share_must_be_the_claims_only_device(results: list[dict[str, Any]]) -> None:
    with pytest.raises(ShareError, match="one contiguous range of cores"):
        read(results)


def test_a_share_runs_at_the_nodes_lnc() -> None:
    with pytest.raises(ShareError, match="logicalNeuronCore 1") as exc:
        read([result("neurondevice3", "1", SHARE_A)], lnc=1)
    assert "remove the NeuronConfig" in str(exc.value)
    # The node's own value, configured explicitly, is fine.
    assert read([result("neurondevice3", "1", SHARE_A)], lnc=2)[1] is not None
