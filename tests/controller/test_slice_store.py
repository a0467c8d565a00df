"""The controller's slim ResourceSlice cache answers every question the full slices answer."""

from __future__ import annotations

import copy
import sys
from typing import Any

import pytest
from neuron_dra.controller import workloads
from neuron_dra.controller.caches import (
    NodeStore,
    SliceStore,
    SlimDevice,
    UltraServerStore,
    slim_node,
    slim_slice,
    without_managed_fields,
)
from neuron_dra.controller.discovery import group_ultraservers, node_state, slice_ultraserver_id
from neuron_dra.controller.main import release_free_heap
from pluginslices import trn2u_slices


def slices_of(
    node_id: int, *, unhealthy: tuple[int, ...] = (), tag: str | None = None
) -> list[dict[str, Any]]:
    out = trn2u_slices(
        f"n{node_id}",
        f"uid-{node_id}",
        node_id_4=node_id,
        unhealthy=unhealthy,
        workload_ids={"node": tag} if tag else None,
    )
    for s in out:
        s["metadata"]["resourceVersion"] = str(10 + node_id)
        s["metadata"]["managedFields"] = [{"manager": "plugin"}]
    return out


def test_slim_slice_keeps_what_the_controller_reads() -> None:
    full = [
        *slices_of(0),
        *slices_of(1, unhealthy=(3,)),
        *slices_of(2, tag="job-abc"),
        *slices_of(3),
    ]
    before = copy.deepcopy(full)
    slim = [slim_slice(s) for s in full]
    assert full == before  # the input is not modified
    nodes = {
        f"n{i}": {"status": {"conditions": [{"type": "Ready", "status": "True"}]}} for i in range(4)
    }
    assert group_ultraservers(slim, nodes) == group_ultraservers(full, nodes)
    for f, s in zip(full, slim, strict=True):
        assert slice_ultraserver_id(s) == slice_ultraserver_id(f)
        assert workloads.node_problem(nodes["n0"], [s]) == workloads.node_problem(nodes["n0"], [f])
        assert workloads.carries_tag([s], "job-abc") == workloads.carries_tag([f], "job-abc")
        assert "managedFields" not in s["metadata"]
        assert all("capacity" not in d for d in s["spec"]["devices"])
        kept, had = (len(x["spec"]["devices"][0]["attributes"]) for x in (s, f))
        assert kept < had
    assert workloads.carries_tag(slim[2:3], "job-abc")
    assert workloads.node_problem(nodes["n1"], slim[1:2]) == (
        "unhealthy devices: neurondevice3, neuronnode"
    )


def test_slice_store_stores_slim_objects() -> None:
    store = SliceStore()
    first, second = slices_of(0), slices_of(1)
    store.replace(first, "20")
    stored = store.list()[0]
    assert stored == slim_slice(first[0])
    delta = store.apply_event("MODIFIED", second[0])
    assert delta is not None and delta.new == slim_slice(second[0])
    assert len(store) == 2
    assert store.apply_event("DELETED", second[0]) is not None
    assert len(store) == 1


def test_equal_attribute_maps_are_shared_and_a_changed_one_is_not() -> None:
    slim = slim_slice(slices_of(0, unhealthy=(3,))[0])
    devices = slim["spec"]["devices"]
    attrs = [d["attributes"] for d in devices if d["name"].startswith("neurondevice")]
    healthy = [a for a in attrs if a.get("healthy") == {"bool": True}]
    assert len(healthy) == 15 and all(a is healthy[0] for a in healthy)
    sick = devices[3]["attributes"]
    assert sick == {**healthy[0], "healthy": {"bool": False}} and sick is not healthy[0]
    # Another slim of an equal slice shares the same maps (a relist costs no new ones).
    again = slim_slice(slices_of(0, unhealthy=(3,))[0])
    assert again["spec"]["devices"][0]["attributes"] is devices[0]["attributes"]


def _node(ready: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "n0",
            "labels": {"node.kubernetes.io/instance-type": "trn2u.48xlarge"},
            "annotations": {"big": "x" * 1000},
            "managedFields": [{"manager": "kubelet"}],
        },
        "spec": {"providerID": "aws:///us-west-2a/i-0", "unschedulable": True},
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": ready, "reason": "KubeletReady"},
            ],
            "images": [{"names": ["img"], "sizeBytes": 1}] * 50,
            "nodeInfo": {"kubeletVersion": "v1.34.0"},
        },
    }


def test_slim_node_keeps_what_the_controller_reads() -> None:
    for ready in ("True", "False", "Unknown"):
        full = _node(ready)
        before = copy.deepcopy(full)
        slim = slim_node(full)
        assert full == before
        assert node_state(slim) == node_state(full)
        assert workloads.node_ready(slim) == workloads.node_ready(full)
        assert slim["status"] == {"conditions": [full["status"]["conditions"][1]]}
        assert slim["metadata"]["labels"] == full["metadata"]["labels"]
        assert "annotations" not in slim["metadata"] and "managedFields" not in slim["metadata"]
        assert slim["spec"] == full["spec"]
    store = NodeStore()
    store.replace([_node("True")], "1")
    assert store.list()[0] == slim_node(_node("True"))
    delta = store.apply_event("MODIFIED", _node("False"))
    assert delta is not None and node_state(delta.new) == "NotReady"


def test_slim_devices_are_compact_read_only_mappings_equal_to_their_dicts() -> None:
    full = slices_of(0)[0]
    slim = slim_slice(full)
    device = slim["spec"]["devices"][0]
    assert isinstance(device, SlimDevice)  # not a dict: 56 bytes instead of 184
    expected = {"name": full["spec"]["devices"][0]["name"], "attributes": device["attributes"]}
    assert device == expected and expected == device and dict(device) == expected
    assert list(device) == ["name", "attributes"] and len(device) == 2
    assert device.get("capacity") is None and "capacity" not in device
    with pytest.raises(KeyError):
        device["capacity"]
    # Fields other than name and attributes are kept, after them; a device without
    # attributes has no "attributes" key (as its JSON had none).
    odd = {"name": "d", "nodeName": "n0", "capacity": {"x": {"value": "1"}}}
    spec = {"driver": "neuron.aws.com", "devices": [odd]}
    kept = slim_slice({"metadata": {}, "spec": spec})["spec"]["devices"][0]
    assert isinstance(kept, SlimDevice)
    assert list(kept.items()) == [("name", "d"), ("nodeName", "n0")]
    # A slim slice is slim: the store gets the same object back.
    assert slim_slice(slim) is slim


def test_ultraserver_store_drops_managed_fields_only() -> None:
    store = UltraServerStore()
    nus = {
        "metadata": {"name": "us-1", "namespace": "neuron-dra", "managedFields": [{"m": 1}]},
        "spec": {"nodes": ["n0"]},
        "status": {"state": "Available"},
    }
    store.replace([nus], "1")
    (stored,) = store.list()
    assert stored == {**nus, "metadata": {"name": "us-1", "namespace": "neuron-dra"}}
    assert "managedFields" in nus["metadata"]  # the input is not modified
    assert without_managed_fields(stored) is stored


def test_release_free_heap_trims_on_glibc() -> None:
    # Linux CI runs glibc: the call must reach malloc_trim, not quietly do nothing.
    assert release_free_heap() is (sys.platform == "linux")
