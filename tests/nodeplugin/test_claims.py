"""Planning a claim: results, config merging, validation against this node."""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from neuron_dra.common.profiles import (
    PROFILES,
    UltraServerMode,
    UnknownInstanceType,
    connected_groups,
)
from neuron_dra.nodeplugin.discovery.model import (
    NeuronDevice,
    NodeInventory,
    UltraServerInfo,
)
from neuron_dra.nodeplugin.prepare.claims import (
    ClaimError,
    ClaimPlan,
    plan_claim,
    plan_claim_on,
    published_facts,
)
from neuron_dra.nodeplugin.prepare.node import PrepareNode
from neuron_dra.nodeplugin.publish.slices import build_resource_slices

NODE = "ip-1-1-1-1.region.compute.internal"
CLAIM_UID = "5e1f2b9c-0d7a-4c3e-9f1b-2a6d8e4c7b10"
KEY = "default/pod0-neurons-zdk76"

US_FULL = UltraServerInfo(
    modes=(UltraServerMode.X4, UltraServerMode.X2V, UltraServerMode.X1),
    server_id_2="a1b2c3d4e5f60718",
    server_id_4="a1b2c3d4e5f60719",
    node_id_2=1,
    node_id_4=3,
)


def make_inventory(
    instance_type: str, *, ultraserver: UltraServerInfo | None = None, count: int | None = None
) -> NodeInventory:
    p = PROFILES[instance_type]
    n = p.device_count if count is None else count
    return NodeInventory(
        node_name=NODE,
        instance_type=instance_type,
        driver_version="2.24.7.0",
        devices=tuple(
            NeuronDevice(index=i, dev_path=f"/dev/neuron{i}", core_count=p.cores_per_device)
            for i in range(n)
        ),
        ultraserver=ultraserver,
    )


def published_for(
    inv: NodeInventory, workload_ids: dict[int | str, str] | None = None
) -> dict[str, dict[str, Any]]:
    slices = build_resource_slices(
        inv,
        node_name=NODE,
        node_uid="node-uid",
        node_labels={},
        dra_driver_version="0.1.0",
        workload_ids=workload_ids or {},
        generation=0,
    )
    return {d["name"]: d["attributes"] for s in slices for d in s["spec"]["devices"]}


def result(
    device: str, request: str = "neurons", *, driver: str = "neuron.aws.com", pool: str = NODE
) -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": pool, "device": device}


def opaque(
    params: Any,
    *,
    requests: list[str] | None = None,
    source: str = "FromClaim",
    driver: str = "neuron.aws.com",
) -> dict[str, Any]:
    entry: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def lnc(value: Any, api: str = "neuron.aws.com/v1") -> dict[str, Any]:
    return {"apiVersion": api, "kind": "NeuronConfig", "logicalNeuronCore": value}


def us_mode(value: Any) -> dict[str, Any]:
    return {
        "apiVersion": "neuron.aws.com/v1",
        "kind": "UltraServerConfig",
        "ultraserverMode": value,
    }


def make_claim(
    results: list[dict[str, Any]],
    config: list[dict[str, Any]] | None = None,
    *,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "pod0-neurons-zdk76", "namespace": "default", "uid": CLAIM_UID}
    if labels:
        meta["labels"] = labels
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": {"requests": [{"name": "neurons"}]}},
        "status": {"allocation": {"devices": {"results": results, "config": config or []}}},
    }


def devices(*indices: int, request: str = "neurons") -> list[dict[str, Any]]:
    return [result(f"neurondevice{i}", request) for i in indices]


def plan(
    claim: dict[str, Any],
    inv: NodeInventory,
    published: dict[str, dict[str, Any]] | None = None,
) -> ClaimPlan:
    return plan_claim(
        claim,
        node=PrepareNode(inv),
        published=published if published is not None else published_for(inv),
    )


TRN2 = make_inventory("trn2.48xlarge")
TRN2U = make_inventory("trn2u.48xlarge", ultraserver=US_FULL)
TRN1 = make_inventory("trn1.32xlarge")


# --- the seed's examples ---------------------------------------------------------------------


def test_seed_1x4_connected_devices() -> None:
    # The allocation shown in the seed lists the row out of order.
    p = plan(make_claim(devices(2, 3, 1, 0)), TRN2)
    assert p == ClaimPlan(
        claim_uid=CLAIM_UID,
        namespace="default",
        name="pod0-neurons-zdk76",
        devices=tuple((("neurons",), f"neurondevice{i}") for i in range(4)),
        device_indices=(0, 1, 2, 3),
        lnc=None,
        ultraserver_mode_nodes=None,
        workload_id=None,
    )


def test_seed_xl_all_16() -> None:
    p = plan(make_claim(devices(*range(16))), TRN2)
    assert p.device_indices == tuple(range(16))


def test_seed_l_8_and_driver_version() -> None:
    p = plan(make_claim(devices(*range(8, 16))), TRN2)
    assert p.device_indices == tuple(range(8, 16))


@pytest.mark.parametrize(
    "api", ["neuron.aws.com/v1", "neuron.aws.com/v1alphav1", "resource.neuron.aws.com/v1alphav1"]
)
def test_seed_lnc_1_all_devices(api: str) -> None:
    claim = make_claim(devices(*range(16)), [opaque(lnc(1, api), requests=["neurons"])])
    assert plan(claim, TRN2).lnc == 1


def test_seed_ultraserver_4_node() -> None:
    claim = make_claim([result("neuronnode")], [opaque(us_mode(4), requests=["neurons"])])
    p = plan(claim, TRN2U)
    assert p.devices == ((("neurons",), "neuronnode"),)
    assert p.device_indices == tuple(range(16))
    assert p.ultraserver_mode_nodes == 4
    assert p.uses_node_device


def test_ultraserver_and_lnc_together() -> None:
    claim = make_claim(
        [result("neuronnode")],
        [opaque(us_mode(2), requests=["neurons"]), opaque(lnc(1), requests=["neurons"])],
    )
    p = plan(claim, TRN2U)
    assert (p.ultraserver_mode_nodes, p.lnc) == (2, 1)


# --- results ---------------------------------------------------------------------------------


def test_other_drivers_results_are_ignored() -> None:
    results = [*devices(0, 1, 2, 3), result("pci-0000-10-1b-0", "efa", driver="dra.net", pool="x")]
    assert plan(make_claim(results), TRN2).device_indices == (0, 1, 2, 3)


def test_results_from_another_pool_are_rejected() -> None:
    claim = make_claim([result("neurondevice0", pool="ip-9-9-9-9")])
    with pytest.raises(ClaimError, match="allocated from pool ip-9-9-9-9") as e:
        plan(claim, TRN2)
    assert e.value.permanent


def test_subrequests_and_shared_devices_keep_request_names() -> None:
    claim = make_claim(
        [
            result("neurondevice4", "neurons/big"),
            result("neurondevice5", "neurons/big"),
            result("neurondevice6", "neurons/big"),
            result("neurondevice7", "neurons/big"),
            result("neurondevice7", "monitor"),
        ]
    )
    p = plan(claim, TRN2)
    assert p.devices[-1] == (("neurons/big", "monitor"), "neurondevice7")
    assert p.device_indices == (4, 5, 6, 7)


def test_unallocated_claim_is_retryable() -> None:
    claim = make_claim([])
    del claim["status"]
    with pytest.raises(ClaimError, match="not allocated") as e:
        plan(claim, TRN2)
    assert not e.value.permanent


@pytest.mark.parametrize("device", ["neurondevice16", "neurondevice01", "gpu0"])
def test_unknown_device_names_rejected(device: str) -> None:
    with pytest.raises(ClaimError, match=f"device {device} is not published by node {NODE}"):
        plan(make_claim([result(device)]), TRN2)


def test_published_device_missing_from_inventory_rejected() -> None:
    published = published_for(TRN2)
    inv = make_inventory("trn2.48xlarge", count=15)
    with pytest.raises(ClaimError, match="neurondevice15 is not present"):
        plan(make_claim([result("neurondevice15")]), inv, published)


def test_node_device_overlapping_devices_rejected() -> None:
    claim = make_claim([result("neuronnode"), result("neurondevice3", "extra")])
    with pytest.raises(ClaimError, match=r"neuronnode .* and neurondevice3 overlap"):
        plan(claim, TRN2U)


# --- connected sets ---------------------------------------------------------------------------


def test_an_extended_resource_claim_that_is_not_connected_says_to_use_a_claim() -> None:
    """The scheduler's claim for ``aws.amazon.com/neuron: 4`` has no request a user can
    constrain: the refusal says so and names the claim-based way (never a silent set)."""
    claim = make_claim(devices(0, 2, 3, 4, request="container-0-request-0"))
    claim["metadata"]["annotations"] = {"resource.kubernetes.io/extended-resource-claim": "true"}
    with pytest.raises(ClaimError) as e:
        plan(claim, TRN2)
    assert "device set 0, 2, 3, 4" in str(e.value)
    assert "resources.limits aws.amazon.com/neuron" in str(e.value)
    assert "matchAttribute constraint on resource.aws.com/devicegroup<N>_id" in str(e.value)
    assert e.value.permanent
    # A connected set from the same path is prepared like any other.
    claim = make_claim(devices(4, 5, 6, 7, request="container-0-request-0"))
    claim["metadata"]["annotations"] = {"resource.kubernetes.io/extended-resource-claim": "true"}
    assert plan(claim, TRN2).device_indices == (4, 5, 6, 7)


def test_connected_set_error_exact() -> None:
    with pytest.raises(ClaimError) as e:
        plan(make_claim(devices(*range(7))), TRN1)
    assert str(e.value) == (
        "Instance type trn1.32xlarge does not support requests for device: 7. "
        "Please request a different number of devices."
    )
    assert e.value.permanent


def test_supported_count_in_wrong_shape_is_explained() -> None:
    # Four devices, but not a row: the count is fine, the shape is not.
    with pytest.raises(ClaimError, match=r"device set 1, 2, 3, 4: .*devicegroup4_id"):
        plan(make_claim(devices(1, 2, 3, 4)), TRN2)
    with pytest.raises(ClaimError, match="device set 9, 10, 13, 14"):
        plan(make_claim(devices(9, 10, 13, 14)), TRN1)


def test_ring_wraparound_rejected_for_contiguous_cores() -> None:
    inf2 = make_inventory("inf2.48xlarge")
    assert plan(make_claim(devices(5, 6, 7)), inf2).device_indices == (5, 6, 7)
    with pytest.raises(ClaimError, match="not consecutive"):
        plan(make_claim(devices(11, 0)), inf2)


@given(
    name=st.sampled_from(sorted(n for n, p in PROFILES.items() if p.device_count > 1)),
    data=st.data(),
)
def test_every_published_group_is_accepted(name: str, data: st.DataObject) -> None:
    inv = make_inventory(name)
    profile = PROFILES[name]
    sizes = [s for s in range(1, profile.device_count + 1) if connected_groups(profile, s)]
    size = data.draw(st.sampled_from(sizes))
    group = data.draw(st.sampled_from(connected_groups(profile, size)))
    assert plan(make_claim(devices(*group)), inv).device_indices == group


# --- configs: decoding ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {**lnc(1), "logicalNeuronCoreCount": 1},
            'unknown field "logicalNeuronCoreCount" in NeuronConfig',
        ),
        (
            {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig"},
            'NeuronConfig requires field "logicalNeuronCore"',
        ),
        (lnc("1"), 'logicalNeuronCore must be an integer, got string "1"'),
        (lnc(3), "logicalNeuronCore must be 1 or 2, got 3"),
        (us_mode(3), "ultraserverMode must be 1, 2 or 4, got 3"),
        ({**lnc(1), "kind": "GpuConfig"}, 'unsupported kind "GpuConfig"'),
        ({**lnc(1), "apiVersion": "neuron.aws.com/v2"}, "unsupported apiVersion"),
        ("logicalNeuronCore: 1", "opaque parameters must be an object"),
    ],
)
def test_bad_configs_name_claim_index_and_field(params: Any, message: str) -> None:
    claim = make_claim(devices(0), [opaque(lnc(2), source="FromClass"), opaque(params)])
    with pytest.raises(ClaimError) as e:
        plan(claim, TRN2)
    text = str(e.value)
    assert text.startswith(f"claim {KEY}: invalid claim config #1 for driver neuron.aws.com: ")
    assert message in text
    assert e.value.permanent


def test_bad_class_config_says_class() -> None:
    claim = make_claim(devices(0), [opaque(lnc(5), source="FromClass")])
    with pytest.raises(ClaimError, match="invalid class config #0"):
        plan(claim, TRN2)


def test_configs_for_other_drivers_are_not_ours_to_judge() -> None:
    claim = make_claim(devices(0), [opaque({"whatever": True}, driver="dra.net")])
    assert plan(claim, TRN2).lnc is None


# --- configs: precedence ----------------------------------------------------------------------


def test_claim_config_beats_class_config() -> None:
    claim = make_claim(
        devices(0),
        [opaque(lnc(2), requests=["neurons"], source="FromClass"), opaque(lnc(1))],
    )
    assert plan(claim, TRN2).lnc == 1


def test_request_specific_beats_whole_claim_within_a_source() -> None:
    specific_first = [opaque(lnc(1), requests=["neurons"]), opaque(lnc(2))]
    assert plan(make_claim(devices(0), specific_first), TRN2).lnc == 1


def test_later_wins_among_equals() -> None:
    assert plan(make_claim(devices(0), [opaque(lnc(2)), opaque(lnc(1))]), TRN2).lnc == 1
    assert plan(make_claim(devices(0), [opaque(lnc(1)), opaque(lnc(2))]), TRN2).lnc == 2


def test_config_for_another_request_does_not_apply() -> None:
    claim = make_claim(devices(0), [opaque(lnc(1), requests=["other"])])
    assert plan(claim, TRN2).lnc is None


def test_request_config_covers_its_subrequests_only() -> None:
    results = devices(0, 1, 2, 3, request="neurons/row")
    assert plan(make_claim(results, [opaque(lnc(1), requests=["neurons"])]), TRN2).lnc == 1
    sub = [opaque(lnc(1), requests=["neurons/other"])]
    assert plan(make_claim(results, sub), TRN2).lnc is None


def test_conflicting_values_across_requests_rejected() -> None:
    claim = make_claim(
        [*devices(0, 1, 2, 3, request="a"), *devices(4, 5, 6, 7, request="b")],
        [opaque(lnc(1), requests=["a"]), opaque(lnc(2), requests=["b"])],
    )
    with pytest.raises(ClaimError, match=r"conflicting logicalNeuronCore values \(1 for request a"):
        plan(claim, TRN2)


# --- configs: fit the node ------------------------------------------------------------------


def test_lnc_2_not_allowed_on_trn1() -> None:
    claim = make_claim(devices(0, 1, 2, 3), [opaque(lnc(2))])
    with pytest.raises(ClaimError, match=r"logicalNeuronCore 2 is not supported on trn1\.32xlarge"):
        plan(claim, TRN1)
    # LNC 1 is what trn1 has anyway.
    assert plan(make_claim(devices(0, 1, 2, 3), [opaque(lnc(1))]), TRN1).lnc == 1


def test_ultraserver_config_on_plain_node() -> None:
    claim = make_claim(devices(0), [opaque(us_mode(4))])
    with pytest.raises(ClaimError, match=r"needs an UltraServer node.*trn2.48xlarge") as e:
        plan(claim, TRN2)
    assert e.value.permanent


def test_ultraserver_mode_not_offered_by_node() -> None:
    inv = make_inventory(
        "trn2u.48xlarge",
        ultraserver=UltraServerInfo(
            modes=(UltraServerMode.X4, UltraServerMode.X1), server_id_4="a" * 16, node_id_4=0
        ),
    )
    claim = make_claim([result("neuronnode")], [opaque(us_mode(2))])
    with pytest.raises(ClaimError, match=r"ultraserverMode 2 .*supported node counts: 1, 4"):
        plan(claim, inv)


def test_ultraserver_before_election_is_retryable() -> None:
    inv = make_inventory("trn2u.48xlarge", ultraserver=UltraServerInfo(modes=(UltraServerMode.X4,)))
    claim = make_claim([result("neuronnode")], [opaque(us_mode(4))])
    with pytest.raises(ClaimError, match="election not complete") as e:
        plan(claim, inv)
    assert not e.value.permanent


def test_single_node_mode_needs_no_election() -> None:
    inv = make_inventory("trn2u.48xlarge", ultraserver=UltraServerInfo(modes=(UltraServerMode.X1,)))
    claim = make_claim([result("neuronnode")], [opaque(us_mode(1))])
    assert plan(claim, inv).ultraserver_mode_nodes == 1


# --- workload reservations --------------------------------------------------------------------

LABEL = "neuron.aws.com/workload-id"


def test_reserved_devices_need_the_workloads_claim() -> None:
    published = published_for(TRN2U, {"node": "train-a-1x2"})
    claim = make_claim([result("neuronnode")], [opaque(us_mode(4))])
    with pytest.raises(ClaimError) as e:
        plan(claim, TRN2U, published)
    assert "reserved for workload train-a-1x2" in str(e.value)
    assert "belongs to no workload" in str(e.value)

    other = make_claim([result("neuronnode")], [opaque(us_mode(4))], labels={LABEL: "train-b"})
    with pytest.raises(ClaimError, match=r"reserved for workload train-a-1x2.*workload train-b"):
        plan(other, TRN2U, published)

    mine = make_claim([result("neuronnode")], [opaque(us_mode(4))], labels={LABEL: "train-a-1x2"})
    assert plan(mine, TRN2U, published).workload_id == "train-a-1x2"


def test_admin_access_watches_any_devices_even_a_workloads() -> None:
    """adminAccess (a monitoring claim): no connected-set rule, no workload check, no
    configuration; it holds none of its devices."""
    published = published_for(TRN2U, {"node": "train-a-1x2"})
    watched = [{**result(f"neurondevice{i}"), "adminAccess": True} for i in (0, 5, 9)]
    got = plan(make_claim(watched, [opaque(lnc(1))]), TRN2U, published)
    assert got.admin_access and got.device_indices == (0, 5, 9) and got.held_indices == ()
    assert (got.workload_id, got.lnc, got.ultraserver_mode_nodes) == (None, None, None)


def test_read_only_published_views_are_checked_too() -> None:
    # The publisher shares MappingProxyType views; a dict-only check once let every claim
    # through on reserved nodes.
    published = {
        name: types.MappingProxyType(dict(attrs))
        for name, attrs in published_for(TRN2U, {"node": "train-a"}).items()
    }
    claim = make_claim([result("neuronnode")], [opaque(us_mode(4))])
    with pytest.raises(ClaimError, match="reserved for workload train-a"):
        plan(claim, TRN2U, types.MappingProxyType(published))


def test_node_device_checks_every_overlapped_device() -> None:
    # Only device 5 is reserved, and neuronnode carries the tag too; a claim of another
    # workload for the whole node must not slip through.
    published = published_for(TRN2U, {5: "w-a"})
    published["neuronnode"] = {
        k: v for k, v in published["neuronnode"].items() if k != "workloadId"
    }
    claim = make_claim([result("neuronnode")], labels={LABEL: "w-b"})
    with pytest.raises(ClaimError, match="device neurondevice5 is reserved for workload w-a"):
        plan(claim, TRN2U, published)


def test_unreserved_devices_are_free_for_anyone() -> None:
    published = published_for(TRN2, {5: "w-a"})
    assert plan(make_claim(devices(0, 1, 2, 3)), TRN2, published).workload_id is None


def test_a_workloads_claim_waits_for_its_devices_to_be_tagged() -> None:
    # The scheduler placed the claim by a tag this node no longer (or not yet) publishes,
    # e.g. while RestartAll moves the workload: preparing it would start a rank-less
    # container. Refused (the kubelet retries), not permanently.
    published = published_for(TRN2U, {})
    claim = make_claim([result("neuronnode")], [opaque(us_mode(4))], labels={LABEL: "train-a"})
    with pytest.raises(ClaimError, match=r"belongs to workload train-a.*not reserved") as e:
        plan(claim, TRN2U, published)
    assert not e.value.permanent


# --- the node's facts from its ResourceSlice (what check-claim checks against) ----------------


@pytest.mark.parametrize(
    ("name", "ultraserver"),
    [(n, None) for n in sorted(PROFILES)]
    + [
        ("trn2u.48xlarge", US_FULL),
        ("trn2u.48xlarge", UltraServerInfo(modes=(UltraServerMode.X1,))),
        ("trn3p.48xlarge", US_FULL),
    ],
)
def test_published_facts_are_the_inventorys(name: str, ultraserver: UltraServerInfo | None) -> None:
    inv = make_inventory(name, ultraserver=ultraserver)
    from_slice = published_facts(published_for(inv))
    # Only the election cannot be read back: the slice has no 2-node ids.
    assert from_slice == dataclasses.replace(PrepareNode(inv).facts(), ultraserver_elected=None)


def test_published_facts_need_one_known_instance_type() -> None:
    published = published_for(TRN2)
    with pytest.raises(UnknownInstanceType, match="none"):
        published_facts({})
    renamed = {n: {**a, "instanceType": {"string": "trn9.huge"}} for n, a in published.items()}
    with pytest.raises(UnknownInstanceType, match=r"trn9\.huge"):
        published_facts(renamed)
    mixed = {**published, "neurondevice0": renamed["neurondevice0"]}
    with pytest.raises(UnknownInstanceType, match=r"trn2\.48xlarge, trn9\.huge"):
        published_facts(mixed)


def _outcome(run: Any) -> ClaimPlan | tuple[str, bool]:
    try:
        plan: ClaimPlan = run()
        return plan
    except ClaimError as exc:
        return (exc.message, exc.permanent)


@given(
    name=st.sampled_from(sorted(n for n, p in PROFILES.items() if p.device_count > 1)),
    data=st.data(),
)
def test_planning_from_the_slice_is_planning_from_the_inventory(
    name: str, data: st.DataObject
) -> None:
    inv = make_inventory(name, ultraserver=US_FULL if PROFILES[name].ultraserver_capable else None)
    published = published_for(inv)
    names = sorted(published)
    chosen = data.draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
    config = data.draw(
        st.lists(
            st.sampled_from(
                [opaque(lnc(1)), opaque(lnc(2)), opaque(us_mode(1)), opaque(us_mode(4))]
            ),
            max_size=2,
        )
    )
    claim = make_claim([result(d) for d in chosen], config)
    facts = published_facts(published)
    assert _outcome(lambda: plan(claim, inv, published)) == _outcome(
        lambda: plan_claim_on(claim, node_name=NODE, facts=lambda: facts, published=published)
    )
