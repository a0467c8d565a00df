"""ResourceSlice content and UltraServer labels from a NodeInventory."""

from __future__ import annotations

import copy
import dataclasses
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from neuron_dra.common.constants import (
    LABEL_CAPACITY_BLOCK_ID,
    LABEL_NETWORK_NODE_LAYER1,
    LABEL_NETWORK_NODE_LAYER2,
    LABEL_NETWORK_NODE_LAYER3,
    LABEL_ULTRASERVER_MODE,
    LABEL_ULTRASERVER_NODE_ID_2,
    LABEL_ULTRASERVER_NODE_ID_4,
    LABEL_ULTRASERVER_SERVER_ID_2,
    LABEL_ULTRASERVER_SERVER_ID_4,
    MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE,
)
from neuron_dra.common.profiles import PROFILES, UltraServerMode, connected_groups
from neuron_dra.nodeplugin.discovery.facts import InventoryError
from neuron_dra.nodeplugin.discovery.model import (
    NeuronDevice,
    NodeInventory,
    PciLocation,
    UltraServerInfo,
)
from neuron_dra.nodeplugin.publish.labelplan import ultraserver_node_labels
from neuron_dra.nodeplugin.publish.slices import (
    SliceBuildError,
    build_resource_slices,
    check_device_limits,
    fallback_group_id,
    next_generation,
    slice_content_changed,
    slice_name,
)
from neuron_dra.sim.fakeapi.validation.builtin import validate_builtin, validate_object_meta
from neuron_dra.sim.fakeapi.validation.names import is_valid_label_value

NODE = "ip-10-0-0-1.us-west-2.compute.internal"
UID = "0b7c6a51-4f7e-4f0e-9d52-3c1f0d2e8a11"
VERSION = "0.1.0"
G4 = "resource.aws.com/devicegroup4_id"
G8 = "resource.aws.com/devicegroup8_id"
G16 = "resource.aws.com/devicegroup16_id"
G1 = "resource.aws.com/devicegroup1_id"

US_FULL = UltraServerInfo(
    modes=(UltraServerMode.X4, UltraServerMode.X2V, UltraServerMode.X1),
    server_id_2="a1b2c3d4e5f60718",
    server_id_4="a1b2c3d4e5f60719",
    node_id_2=1,
    node_id_4=3,
)


def efa_address(i: int) -> str:
    """One EFA per Neuron device (trn2): four per PCI bus, like 0000:10:1b.0 .. 0000:10:1e.0."""
    return f"0000:{0x10 + i // 4:02x}:{0x1B + i % 4:02x}.0"


def pci_location(i: int) -> PciLocation:
    """Two devices per root complex, the first half of the roots on NUMA node 0."""
    return PciLocation(f"0000:{0x11 + i:02x}:00.0", f"pci0000:{0x10 + i // 2 * 2:02x}", i // 8)


def make_inventory(
    instance_type: str,
    *,
    node: str = NODE,
    count: int | None = None,
    efa: bool = False,
    ultraserver: UltraServerInfo | None = None,
    lnc: int | None = None,
    unhealthy: tuple[int, ...] = (),
    chip: str | None = None,
    cores: int | None = None,
    pci: bool = False,
) -> NodeInventory:
    profile = PROFILES.get(instance_type)
    n = count if count is not None else profile.device_count if profile else 1
    return NodeInventory(
        node_name=node,
        instance_type=instance_type,
        driver_version="2.24.7.0",
        devices=tuple(
            NeuronDevice(
                index=i,
                dev_path=f"/dev/neuron{i}",
                core_count=cores
                if cores is not None
                else profile.cores_per_device
                if profile
                else 8,
                device_name=chip or (profile.device_name if profile else None),
                efa_pci_address=efa_address(i) if efa else None,
                healthy=i not in unhealthy,
                pci=pci_location(i) if pci else None,
            )
            for i in range(n)
        ),
        ultraserver=ultraserver,
        lnc_default=lnc,
    )


def build(inv: NodeInventory, **kw: Any) -> list[dict[str, Any]]:
    kw.setdefault("node_name", inv.node_name)
    kw.setdefault("node_uid", UID)
    kw.setdefault("node_labels", {})
    kw.setdefault("dra_driver_version", VERSION)
    kw.setdefault("generation", 0)
    return build_resource_slices(inv, **kw)


def devices_of(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"]["devices"]}


def attrs(slices: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """Attribute values without the type wrapper, e.g. {"deviceId": 3}."""
    return {k: next(iter(v.values())) for k, v in devices_of(slices)[name]["attributes"].items()}


def assert_api_valid(slices: list[dict[str, Any]]) -> None:
    for s in slices:
        assert validate_builtin("resource.k8s.io", "resourceslices", s, None) == []
        assert validate_object_meta(s, namespaced=False) == []


# --- whole-slice shape --------------------------------------------------------------------------


def test_trn2_slice_shape_and_validity() -> None:
    slices = build(make_inventory("trn2.48xlarge"), generation=7)
    assert len(slices) == 1
    s = slices[0]
    assert s["apiVersion"] == "resource.k8s.io/v1"
    assert s["kind"] == "ResourceSlice"
    assert s["metadata"]["name"] == f"{NODE}-neuron.aws.com-0"
    assert s["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": UID, "controller": True}
    ]
    assert s["spec"]["driver"] == "neuron.aws.com"
    assert s["spec"]["nodeName"] == NODE
    assert s["spec"]["pool"] == {"name": NODE, "generation": 7, "resourceSliceCount": 1}
    assert [d["name"] for d in s["spec"]["devices"]] == [f"neurondevice{i}" for i in range(16)]
    assert_api_valid(slices)


def test_trn2_device_attributes_exact() -> None:
    labels = {
        LABEL_NETWORK_NODE_LAYER1: "nn-1111",
        LABEL_NETWORK_NODE_LAYER2: "nn-2222",
        LABEL_NETWORK_NODE_LAYER3: "nn-3333",
    }
    slices = build(make_inventory("trn2.48xlarge"), node_labels=labels)
    device = devices_of(slices)["neurondevice6"]
    assert device["attributes"] == {
        "deviceId": {"int": 6},
        "resourceType": {"string": "neuron_device"},
        "instanceType": {"string": "trn2.48xlarge"},
        "neuronDriverVersion": {"string": "2.24.7.0"},
        "draDriverVersion": {"version": "0.1.0"},
        "coreCount": {"int": 8},
        "logicalCoreCount": {"int": 4},  # LNC 2 is the trn2 default
        "topology_x": {"int": 1},
        "topology_y": {"int": 2},
        "topology4_id": {"int": 1},
        "topology8_id": {"int": 0},
        G4: {"string": fallback_group_id(NODE, 4, 1)},
        G8: {"string": fallback_group_id(NODE, 8, 0)},
        G16: {"string": fallback_group_id(NODE, 16, 0)},
        "networkNodeLayer1": {"string": "nn-1111"},
        "networkNodeLayer2": {"string": "nn-2222"},
        "networkNodeLayer3": {"string": "nn-3333"},
        "healthy": {"bool": True},
    }
    assert device["capacity"] == {"memory": {"value": "96Gi"}, "cores": {"value": "8"}}


def test_pci_location_as_standard_attributes() -> None:
    slices = build(make_inventory("trn2u.48xlarge", ultraserver=US_FULL, pci=True))
    got = attrs(slices, "neurondevice9")
    assert {k: v for k, v in got.items() if k.startswith("resource.kubernetes.io/")} == {
        "resource.kubernetes.io/pciBusID": "0000:1a:00.0",
        "resource.kubernetes.io/pcieRoot": "pci0000:18",
        "resource.kubernetes.io/numaNode": 1,
    }
    assert devices_of(slices)["neurondevice9"]["attributes"]["resource.kubernetes.io/numaNode"] == {
        "int": 1
    }
    # The whole-node device spans every root complex: it has none of them.
    assert not [k for k in attrs(slices, "neuronnode") if k.startswith("resource.kubernetes.io/")]
    assert_api_valid(slices)


def test_pci_attributes_only_as_far_as_known() -> None:
    inv = make_inventory("trn2.48xlarge", pci=True)
    devices = list(inv.devices)
    devices[0] = dataclasses.replace(devices[0], pci=PciLocation("0000:11:00.0"))  # no root, NUMA
    devices[1] = dataclasses.replace(devices[1], pci=None)  # address unknown
    slices = build(dataclasses.replace(inv, devices=tuple(devices)))
    assert {k for k in attrs(slices, "neurondevice0") if "/" in k and "kubernetes" in k} == {
        "resource.kubernetes.io/pciBusID"
    }
    assert not [k for k in attrs(slices, "neurondevice1") if k.startswith("resource.kubernetes")]
    assert "resource.kubernetes.io/pcieRoot" in attrs(slices, "neurondevice2")


def test_driver_version_selector_attribute_from_seed() -> None:
    # The seed's "2.26-driver" template compares neuronDriverVersion to a dotted string.
    a = attrs(build(make_inventory("trn2.48xlarge")), "neurondevice0")
    assert a["neuronDriverVersion"] == "2.24.7.0"
    assert a["instanceType"] == "trn2.48xlarge"


def test_missing_driver_version_omits_attribute() -> None:
    inv = make_inventory("trn2.48xlarge")
    inv = NodeInventory(inv.node_name, inv.instance_type, None, inv.devices)
    assert "neuronDriverVersion" not in attrs(build(inv), "neurondevice0")


# --- connected groups -------------------------------------------------------------------------


def _groups(slices: list[dict[str, Any]], attr: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for d in devices_of(slices).values():
        a = {k: next(iter(v.values())) for k, v in d["attributes"].items()}
        if attr in a:
            out[a[attr]].append(a["deviceId"])
    return {k: sorted(v) for k, v in out.items()}


@pytest.mark.parametrize("instance_type", ["trn2.48xlarge", "trn1.32xlarge", "trn2u.48xlarge"])
@pytest.mark.parametrize("efa", [False, True])
def test_torus_groups_are_rows_halves_and_all(instance_type: str, efa: bool) -> None:
    slices = build(make_inventory(instance_type, efa=efa))
    rows = [list(range(r * 4, r * 4 + 4)) for r in range(4)]
    assert sorted(_groups(slices, G4).values()) == rows
    assert sorted(_groups(slices, G8).values()) == [list(range(8)), list(range(8, 16))]
    assert list(_groups(slices, G16).values()) == [list(range(16))]
    # Groups of different sizes never share an id by accident.
    ids = [set(_groups(slices, g)) for g in (G4, G8, G16)]
    assert not (ids[0] & ids[1]) and not (ids[1] & ids[2])


def test_devicegroup1_only_with_efa() -> None:
    assert _groups(build(make_inventory("trn2.48xlarge")), G1) == {}
    with_efa = _groups(build(make_inventory("trn2.48xlarge", efa=True)), G1)
    assert with_efa == {efa_address(i): [i] for i in range(16)}


def test_efa_rule_exact_hash() -> None:
    # sha256("0000:10:1b.0,0000:10:1c.0,0000:10:1d.0,0000:10:1e.0")[:16], computed offline.
    a = attrs(build(make_inventory("trn2.48xlarge", efa=True)), "neurondevice2")
    assert a[G4] == "51518278a38b2119"
    assert a[G1] == "0000:10:1d.0"


def test_efa_rule_deduplicates_shared_efa_devices() -> None:
    # trn1.32xlarge pairs two Neuron devices with one EFA: the group of four has two distinct
    # addresses, and the id hashes each once.
    inv = make_inventory("trn1.32xlarge")
    shared = tuple(
        NeuronDevice(
            index=d.index,
            dev_path=d.dev_path,
            core_count=2,
            efa_pci_address=efa_address(d.index // 2),
        )
        for d in inv.devices
    )
    inv = NodeInventory(NODE, "trn1.32xlarge", "2.24.7.0", shared)
    a = attrs(build(inv), "neurondevice0")
    # sha256("0000:10:1b.0,0000:10:1c.0")[:16]
    assert a[G4] == "a7a9d5442d7d002d"


def test_partial_efa_falls_back_for_that_group_only() -> None:
    inv = make_inventory("trn2.48xlarge", efa=True)
    devices = list(inv.devices)
    devices[5] = NeuronDevice(index=5, dev_path="/dev/neuron5", core_count=8)
    inv = NodeInventory(NODE, "trn2.48xlarge", "2.24.7.0", tuple(devices))
    slices = build(inv)
    assert attrs(slices, "neurondevice4")[G4] == fallback_group_id(NODE, 4, 1)
    assert attrs(slices, "neurondevice0")[G4] == "51518278a38b2119"
    assert G1 not in attrs(slices, "neurondevice5")
    assert attrs(slices, "neurondevice4")[G1] == efa_address(4)


def test_fallback_ids_are_stable_and_node_specific() -> None:
    a = build(make_inventory("trn2.48xlarge", node="node-a"), node_name="node-a")
    b = build(make_inventory("trn2.48xlarge", node="node-b"), node_name="node-b")
    assert a == build(make_inventory("trn2.48xlarge", node="node-a"), node_name="node-a")
    assert attrs(a, "neurondevice0")[G4] != attrs(b, "neurondevice0")[G4]


def test_inf2_ring_publishes_every_dividing_size_and_no_topology() -> None:
    slices = build(make_inventory("inf2.48xlarge"))
    assert_api_valid(slices)
    a = attrs(slices, "neurondevice7")
    sizes = sorted(int(k.split("devicegroup")[1].split("_")[0]) for k in a if "devicegroup" in k)
    assert sizes == [2, 3, 4, 6, 12]
    assert not any(k.startswith("topology") for k in a)
    assert a["coreCount"] == 2 and a["logicalCoreCount"] == 2
    assert sorted(_groups(slices, "resource.aws.com/devicegroup3_id").values()) == [
        [0, 1, 2],
        [3, 4, 5],
        [6, 7, 8],
        [9, 10, 11],
    ]
    assert devices_of(slices)["neurondevice0"]["capacity"]["memory"] == {"value": "32Gi"}


def test_trn1_2xlarge_single_device() -> None:
    slices = build(make_inventory("trn1.2xlarge"))
    assert_api_valid(slices)
    assert list(devices_of(slices)) == ["neurondevice0"]
    a = attrs(slices, "neurondevice0")
    assert not any("devicegroup" in k or k.startswith("topology") for k in a)
    assert a["coreCount"] == 2 and a["logicalCoreCount"] == 2


def test_trn1_32xlarge_logical_cores_ignore_stray_lnc() -> None:
    # A node-wide LNC file only counts where LNC exists.
    a = attrs(build(make_inventory("trn1.32xlarge", lnc=2)), "neurondevice3")
    assert a["logicalCoreCount"] == 2
    assert (a["topology_x"], a["topology_y"], a["topology4_id"], a["topology8_id"]) == (0, 3, 0, 0)


def test_trn2_node_default_lnc_1() -> None:
    assert (
        attrs(build(make_inventory("trn2.48xlarge", lnc=1)), "neurondevice0")["logicalCoreCount"]
        == 8
    )


@settings(max_examples=40, deadline=None)
@given(
    profile=st.sampled_from(sorted(PROFILES.values(), key=lambda p: p.name)),
    efa=st.booleans(),
)
def test_any_known_type_publishes_valid_slices_whose_groups_are_connected(
    profile: Any, efa: bool
) -> None:
    us = US_FULL if profile.ultraserver_capable else None
    slices = build(make_inventory(profile.name, efa=efa, ultraserver=us))
    assert_api_valid(slices)
    for size in range(2, profile.device_count + 1):
        groups = _groups(slices, f"resource.aws.com/devicegroup{size}_id")
        # Devices sharing an id are exactly one of the profile's connected groups.
        assert sorted(groups.values()) == [list(g) for g in connected_groups(profile, size)]


# --- UltraServer nodes and the neuronnode device --------------------------------------------


def test_trn2u_ultraserver_attributes_and_node_device() -> None:
    labels = {LABEL_CAPACITY_BLOCK_ID: "cr-0123456789abcdef0", LABEL_NETWORK_NODE_LAYER1: "nn-1"}
    slices = build(make_inventory("trn2u.48xlarge", ultraserver=US_FULL), node_labels=labels)
    assert_api_valid(slices)
    names = list(devices_of(slices))
    assert names == [*(f"neurondevice{i}" for i in range(16)), "neuronnode"]
    dev = attrs(slices, "neurondevice0")
    assert dev["ultraserverId"] == "a1b2c3d4e5f60719"
    assert dev["capacityBlockId"] == "cr-0123456789abcdef0"
    assert dev["ultraserverNodeId"] == 3
    assert dev["ultraserverModes"] == "1_2_4"
    node = devices_of(slices)["neuronnode"]
    assert node["attributes"] == {
        "resourceType": {"string": "neuron_node"},
        "instanceType": {"string": "trn2u.48xlarge"},
        "neuronDriverVersion": {"string": "2.24.7.0"},
        "draDriverVersion": {"version": "0.1.0"},
        "networkNodeLayer1": {"string": "nn-1"},
        "ultraserverId": {"string": "a1b2c3d4e5f60719"},
        "capacityBlockId": {"string": "cr-0123456789abcdef0"},
        "ultraserverNodeId": {"int": 3},
        "ultraserverModes": {"string": "1_2_4"},
        "healthy": {"bool": True},
    }
    assert node["capacity"] == {"memory": {"value": "1536Gi"}, "cores": {"value": "128"}}


def test_ultraserver_id_falls_back_to_capacity_block() -> None:
    us = UltraServerInfo(modes=(UltraServerMode.X4, UltraServerMode.X1))
    labels = {LABEL_CAPACITY_BLOCK_ID: "cr-0abc"}
    a = attrs(
        build(make_inventory("trn2u.48xlarge", ultraserver=us), node_labels=labels), "neuronnode"
    )
    assert a["ultraserverId"] == "cr-0abc"
    assert a["ultraserverModes"] == "1_4"
    assert "ultraserverNodeId" not in a


def test_non_ultraserver_node_has_no_node_device() -> None:
    slices = build(make_inventory("trn2.48xlarge"))
    assert "neuronnode" not in devices_of(slices)
    assert not any(k.startswith("ultraserver") for k in attrs(slices, "neurondevice0"))


def test_health_is_published() -> None:
    slices = build(make_inventory("trn2u.48xlarge", ultraserver=US_FULL, unhealthy=(9,)))
    assert attrs(slices, "neurondevice9")["healthy"] is False
    assert attrs(slices, "neurondevice8")["healthy"] is True
    assert attrs(slices, "neuronnode")["healthy"] is False


# --- workload tagging -----------------------------------------------------------------------


def test_whole_node_reservation_tags_every_device() -> None:
    inv = make_inventory("trn2u.48xlarge", ultraserver=US_FULL)
    slices = build(inv, workload_ids={"node": "train-7f3a"})
    for name in devices_of(slices):
        assert attrs(slices, name)["workloadId"] == "train-7f3a"
    assert_api_valid(slices)


def test_device_reservation_tags_device_and_node_device() -> None:
    inv = make_inventory("trn2u.48xlarge", ultraserver=US_FULL)
    slices = build(inv, workload_ids={3: "w-b", 4: "w-a"})
    assert attrs(slices, "neurondevice3")["workloadId"] == "w-b"
    assert attrs(slices, "neurondevice4")["workloadId"] == "w-a"
    assert "workloadId" not in attrs(slices, "neurondevice0")
    # neuronnode overlaps reserved devices, so it must not look free.
    assert attrs(slices, "neuronnode")["workloadId"] == "w-a"


def test_untagged_when_not_reserved() -> None:
    slices = build(make_inventory("trn2u.48xlarge", ultraserver=US_FULL))
    assert all("workloadId" not in attrs(slices, n) for n in devices_of(slices))


# --- limits -------------------------------------------------------------------------------------


def test_fullest_device_fits_the_attribute_limit() -> None:
    labels = {
        LABEL_CAPACITY_BLOCK_ID: "cr-0123456789abcdef0",
        LABEL_NETWORK_NODE_LAYER1: "a",
        LABEL_NETWORK_NODE_LAYER2: "b",
        LABEL_NETWORK_NODE_LAYER3: "c",
    }
    inv = make_inventory("trn2u.48xlarge", efa=True, ultraserver=US_FULL, pci=True)
    slices = build(inv, node_labels=labels, workload_ids={"node": "w"})
    device = devices_of(slices)["neurondevice0"]
    total = len(device["attributes"]) + len(device["capacity"])
    # Pinned so that adding an attribute is a deliberate decision about the 32 budget.
    assert total == 29 <= MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE
    assert_api_valid(slices)
    # Core sharing adds the logicalCores capacity.
    shared = devices_of(
        build(inv, node_labels=labels, workload_ids={"node": "w"}, core_sharing=True)
    )
    device = shared["neurondevice0"]
    assert len(device["attributes"]) + len(device["capacity"]) == 30


def _device(n_attrs: int) -> dict[str, Any]:
    attributes = {f"a{i}": {"int": i} for i in range(n_attrs - 1)}
    return {"name": "neurondevice0", "attributes": attributes, "capacity": {"c": {"value": "1"}}}


def test_limit_attribute_count() -> None:
    check_device_limits(_device(32))
    with pytest.raises(SliceBuildError, match="33 attributes and capacities"):
        check_device_limits(_device(33))


def test_limit_attribute_name() -> None:
    check_device_limits({"name": "d", "attributes": {"a" * 32: {"int": 1}}})
    with pytest.raises(SliceBuildError, match="C identifier"):
        check_device_limits({"name": "d", "attributes": {"a" * 33: {"int": 1}}})
    with pytest.raises(SliceBuildError, match="C identifier"):
        check_device_limits({"name": "d", "attributes": {"resource.aws.com/1abc": {"int": 1}}})


def test_limit_string_value() -> None:
    check_device_limits({"name": "d", "attributes": {"s": {"string": "x" * 64}}})
    with pytest.raises(SliceBuildError, match="longer than 64"):
        check_device_limits({"name": "d", "attributes": {"s": {"string": "x" * 65}}})


@pytest.mark.parametrize("version", ["v0.1.0", "0.1", "0.1.0.dev1", "01.2.3"])
def test_dra_driver_version_must_be_strict_semver(version: str) -> None:
    with pytest.raises(SliceBuildError, match="strict semver"):
        build(make_inventory("trn2.48xlarge"), dra_driver_version=version)


def test_semver_prerelease_and_build_accepted() -> None:
    slices = build(make_inventory("trn1.2xlarge"), dra_driver_version="1.2.3-rc.1+g1234abc")
    assert_api_valid(slices)


def test_owner_uid_required() -> None:
    with pytest.raises(SliceBuildError, match="uid"):
        build(make_inventory("trn1.2xlarge"), node_uid="")


def test_unknown_instance_type_is_an_inventory_error() -> None:
    inv = make_inventory("trn2.48xlarge")
    inv = NodeInventory(NODE, None, "2.24.7.0", inv.devices)
    with pytest.raises(InventoryError, match="instance type unknown"):
        build(inv)


def test_split_at_128_devices() -> None:
    # An unknown type with many devices: the generic profile (switch topology for Trainium3).
    inv = make_inventory("trn9.huge", count=200, chip="Trainium3", cores=8)
    slices = build(inv, generation=3)
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 72]
    assert [s["metadata"]["name"] for s in slices] == [
        f"{NODE}-neuron.aws.com-0",
        f"{NODE}-neuron.aws.com-1",
    ]
    assert all(s["spec"]["pool"]["resourceSliceCount"] == 2 for s in slices)
    assert all(s["spec"]["pool"]["generation"] == 3 for s in slices)
    assert len(devices_of(slices)) == 200
    assert_api_valid(slices)


def test_empty_node_publishes_one_empty_slice() -> None:
    inv = NodeInventory(NODE, None, None, ())
    slices = build(inv)
    assert len(slices) == 1 and slices[0]["spec"]["devices"] == []
    assert slices[0]["spec"]["pool"]["resourceSliceCount"] == 1
    assert_api_valid(slices)


def test_long_node_name_still_gives_valid_unique_slice_names() -> None:
    long_a = ("a" * 62 + ".") * 4 + "b"  # 253 characters
    long_b = ("a" * 62 + ".") * 4 + "c"
    assert len(long_a) == 253
    a, b = slice_name(long_a, 0), slice_name(long_b, 0)
    assert a != b and len(a) <= 253
    slices = build(make_inventory("trn1.2xlarge", node=long_a), node_name=long_a)
    assert_api_valid(slices)


# --- change detection and generations --------------------------------------------------------


def test_content_change_detection() -> None:
    inv = make_inventory("trn2.48xlarge")
    old = build(inv, generation=1)[0]
    same = build(inv, generation=5)[0]
    assert not slice_content_changed(old, same)

    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["resourceVersion"] = "999"
    relabelled["metadata"]["labels"] = {"x": "y"}
    assert not slice_content_changed(old, relabelled)

    requantified = copy.deepcopy(old)
    requantified["spec"]["devices"][0]["capacity"]["memory"]["value"] = str(96 * 1024**3)
    assert not slice_content_changed(old, requantified)

    tagged = build(inv, workload_ids={2: "w"})[0]
    assert slice_content_changed(old, tagged)
    unhealthy = build(make_inventory("trn2.48xlarge", unhealthy=(1,)))[0]
    assert slice_content_changed(old, unhealthy)


def test_next_generation() -> None:
    inv = make_inventory("trn2.48xlarge")
    desired = build(inv)
    assert next_generation([], desired) == 0
    assert next_generation(build(inv, generation=4), desired) == 4  # unchanged: no bump
    changed = build(inv, workload_ids={"node": "w"})
    assert next_generation(build(inv, generation=4), changed) == 5
    # A half-finished update left slices at different generations: move past the highest.
    big = make_inventory("trn9.huge", count=200, chip="Trainium3", cores=8)
    existing = build(big, generation=2)
    existing[1]["spec"]["pool"]["generation"] = 3
    assert next_generation(existing, build(big)) == 4
    # Fewer slices than before (devices disappeared): a change.
    assert (
        next_generation(
            existing, build(make_inventory("trn9.huge", count=10, chip="Trainium3", cores=8))
        )
        == 4
    )


# --- Node labels -----------------------------------------------------------------------------


def test_ultraserver_node_labels_full() -> None:
    labels = ultraserver_node_labels(make_inventory("trn2u.48xlarge", ultraserver=US_FULL))
    assert labels == {
        LABEL_ULTRASERVER_MODE: "1_2_4",
        LABEL_ULTRASERVER_SERVER_ID_2: "a1b2c3d4e5f60718",
        LABEL_ULTRASERVER_SERVER_ID_4: "a1b2c3d4e5f60719",
        LABEL_ULTRASERVER_NODE_ID_2: "1",
        LABEL_ULTRASERVER_NODE_ID_4: "3",
    }
    assert all(is_valid_label_value(v) == [] for v in labels.values())


def test_ultraserver_node_labels_before_election() -> None:
    us = UltraServerInfo(modes=(UltraServerMode.X4, UltraServerMode.X2V, UltraServerMode.X1))
    labels = ultraserver_node_labels(make_inventory("trn2u.48xlarge", ultraserver=us))
    assert labels == {LABEL_ULTRASERVER_MODE: "1_2_4"}


def test_ultraserver_node_labels_drop_invalid_values() -> None:
    us = UltraServerInfo(modes=(UltraServerMode.X4,), server_id_4="bad value!", node_id_4=0)
    labels = ultraserver_node_labels(make_inventory("trn2u.48xlarge", ultraserver=us))
    assert labels == {LABEL_ULTRASERVER_MODE: "4", LABEL_ULTRASERVER_NODE_ID_4: "0"}


@pytest.mark.parametrize("instance_type", ["trn2.48xlarge", "trn1.32xlarge", "inf2.48xlarge"])
def test_no_ultraserver_labels_elsewhere(instance_type: str) -> None:
    assert ultraserver_node_labels(make_inventory(instance_type)) == {}
