"""Which cores of a shared device a core claim gets (prepare/cores.py), how the checkpoint
records them, and that no sequence of claims ever puts two of them on one core."""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from neuron_dra.nodeplugin.kubeletapi import ClaimRef
from neuron_dra.nodeplugin.prepare import checkpoint as ckpt
from neuron_dra.nodeplugin.prepare import cores
from neuron_dra.nodeplugin.prepare.budget import PrepareFailure
from neuron_dra.nodeplugin.prepare.cdi import ENV_VISIBLE_CORES
from neuron_dra.nodeplugin.prepare.claimfiles import ClaimContent
from neuron_dra.nodeplugin.prepare.claims import ClaimPlan
from neuron_dra.nodeplugin.prepare.shares import ShareRequest

NODE = "trn2-node-0"
SPEC: dict[str, Any] = {
    "cdiVersion": "0.5.0",
    "kind": "k8s.neuron.aws.com/claim",
    "devices": [{"name": "x-neurondevice3", "containerEdits": {"deviceNodes": []}}],
    "containerEdits": {"env": [f"{ENV_VISIBLE_CORES}=12-15", "NEURON_LOGICAL_NC_CONFIG=2"]},
}


def entry(uid: str, device: int, share: tuple[int, int] | None, total: int = 4) -> ckpt.ClaimEntry:
    return ckpt.ClaimEntry(
        uid=uid,
        namespace="default",
        name=f"claim-{uid}",
        devices=(ckpt.DeviceRecord(("r",), NODE, f"neurondevice{device}", (f"k={uid}",)),),
        device_indices=(device,),
        cdi_spec=SPEC,
        prepared_at="2026-01-01T00:00:00Z",
        share=None if share is None else ckpt.CoreShare(device, share[0], share[1], total),
    )


def holding(*entries: ckpt.ClaimEntry) -> ckpt.Checkpoint:
    return ckpt.Checkpoint(boot_id="b", claims=MappingProxyType({e.uid: e for e in entries}))


def plan(uid: str, device: int, size: int | None, total: int = 4) -> ClaimPlan:
    return ClaimPlan(
        claim_uid=uid,
        namespace="default",
        name=f"claim-{uid}",
        devices=((("r",), f"neurondevice{device}"),),
        device_indices=(device,),
        lnc=None,
        ultraserver_mode_nodes=None,
        workload_id=None,
        share_ids=((f"neurondevice{device}", f"share-{uid}"),),
        share=None if size is None else ShareRequest(device, size, total, f"share-{uid}"),
    )


# --- placement --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("used", "size", "total", "first"),
    [
        (set(), 1, 4, 0),
        ({0}, 1, 4, 1),  # beside the other share: the free pair 2-3 stays whole
        ({1}, 1, 4, 0),
        ({0, 1}, 2, 4, 2),
        ({0}, 2, 4, 2),  # aligned: never 1-2
        ({1}, 2, 4, 2),  # every core of the block free
        ({3}, 4, 8, 4),
        ({2}, 1, 4, 3),  # the half with a share first (best fit), not core 0
        ({0, 2}, 2, 4, None),  # 1 and 3 are free but apart: fragmented
        ({0, 1, 2, 3}, 1, 4, None),
        ({4}, 4, 8, 0),
        ({0, 4}, 1, 8, 1),
        (set(), 6, 6, 0),
    ],
)
def test_buddy_placement(used: set[int], size: int, total: int, first: int | None) -> None:
    assert cores.pick_cores(used, size, total) == first


def test_a_share_goes_beside_the_shares_of_its_device() -> None:
    placed = cores.place(
        holding(entry("a", 3, (0, 1)), entry("b", 4, (0, 1))), "c", plan("c", 3, 1).share
    )  # type: ignore[arg-type]
    assert placed == ckpt.CoreShare(3, 1, 1, 4)
    assert cores.visible_cores(placed) == "13"
    assert cores.visible_cores(ckpt.CoreShare(3, 2, 2, 4)) == "14-15"


def test_a_device_held_whole_has_no_cores_to_share() -> None:
    refused = cores.place(holding(entry("w", 3, None)), "c", ShareRequest(3, 1, 4, "s"))
    assert isinstance(refused, PrepareFailure) and not refused.permanent
    assert refused.reason == "DeviceInUse" and "claim-w" in refused.message


def test_fragmented_cores_make_the_claim_wait_and_say_why() -> None:
    checkpoint = holding(entry("a", 3, (0, 1)), entry("b", 3, (2, 1)))
    refused = cores.place(checkpoint, "c", ShareRequest(3, 2, 4, "s"))
    assert isinstance(refused, PrepareFailure) and not refused.permanent and refused.event
    assert refused.reason == "CoresFragmented"
    assert "fragmented" in refused.message and "waits" in refused.message
    assert "default/claim-a: core 0" in refused.message
    assert "default/claim-b: core 2" in refused.message


def test_more_cores_than_free_make_the_claim_wait() -> None:
    checkpoint = holding(entry("a", 3, (0, 2)), entry("b", 3, (2, 1)))
    refused = cores.place(checkpoint, "c", ShareRequest(3, 2, 4, "s"))
    assert isinstance(refused, PrepareFailure) and refused.reason == "DeviceInUse"
    assert "1 free logical cores" in refused.message


def test_the_spec_gets_the_shares_cores() -> None:
    out = cores.with_visible_cores(SPEC, ckpt.CoreShare(3, 2, 2, 4))
    assert out["containerEdits"]["env"] == [
        f"{ENV_VISIBLE_CORES}=14-15",
        "NEURON_LOGICAL_NC_CONFIG=2",
    ]
    assert SPEC["containerEdits"]["env"][0] == f"{ENV_VISIBLE_CORES}=12-15"  # not in place


def admit(checkpoint: ckpt.Checkpoint, p: ClaimPlan) -> ckpt.ClaimEntry | PrepareFailure:
    ref = ClaimRef("default", p.claim_uid, p.name)
    return cores.admit(
        checkpoint, ref, p, ClaimContent(dict(SPEC), {}), pool=NODE,
        cdi_kind="k8s.neuron.aws.com/claim", prepared_at="2026-01-01T00:00:00Z",
    )  # fmt: skip


def test_whole_device_and_core_claims_exclude_each_other() -> None:
    with_share = holding(entry("a", 3, (0, 1)))
    refused = admit(with_share, plan("w", 3, None))
    assert isinstance(refused, PrepareFailure) and refused.reason == "DeviceInUse"
    assert "has cores prepared for ResourceClaim default/claim-a" in refused.message
    # Another device is free to have whole.
    assert isinstance(admit(with_share, plan("w", 4, None)), ckpt.ClaimEntry)
    whole = holding(entry("w", 3, None))
    refused = admit(whole, plan("c", 3, 1))
    assert isinstance(refused, PrepareFailure) and "claim-w" in refused.message


def test_an_admitted_share_records_its_cores_and_share_id() -> None:
    got = admit(holding(entry("a", 3, (0, 1))), plan("c", 3, 2))
    assert isinstance(got, ckpt.ClaimEntry)
    assert got.share == ckpt.CoreShare(3, 2, 2, 4)
    assert got.device_indices == (3,)
    assert got.devices[0].share_id == "share-c"
    assert f"{ENV_VISIBLE_CORES}=14-15" in got.cdi_spec["containerEdits"]["env"]


def test_blockers_are_the_claims_to_read_before_refusing() -> None:
    a, b = entry("a", 3, (0, 1)), entry("b", 3, (1, 1))
    # Room on the device: no share stands in the way.
    assert cores.blockers(holding(a, b), "c", plan("c", 3, 2)) == []
    # No room: any share of the device may have ended meanwhile.
    full = holding(a, b, entry("d", 3, (2, 2)))
    assert {e.uid for e in cores.blockers(full, "c", plan("c", 3, 1))} == {"a", "b", "d"}
    # A whole holder.
    assert [e.uid for e in cores.blockers(holding(entry("w", 3, None)), "c", plan("c", 3, 1))] == [
        "w"
    ]
    # A whole-device claim: every claim on the device.
    assert {e.uid for e in cores.blockers(holding(a, b), "w", plan("w", 3, None))} == {"a", "b"}


# --- never two claims on one core ---------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "remove"]),
            st.sampled_from([None, 1, 1, 2, 4]),
            st.integers(0, 1),
        ),
        max_size=40,
    )
)
def test_no_core_is_ever_given_twice(ops: list[tuple[str, int | None, int]]) -> None:
    """Claims come (a share of 1, 2 or 4 cores, or the device whole) and go on two devices in
    any order: what the checkpoint admits never overlaps, never leaves a device's cores, and a
    share is always aligned to its size."""
    checkpoint = holding()
    n = 0
    for op, size, device in ops:
        if op == "remove":
            if checkpoint.claims:
                checkpoint = checkpoint.without_claim(sorted(checkpoint.claims)[0])
            continue
        n += 1
        uid = f"c{n}"
        got = admit(checkpoint, plan(uid, device, None if size == 4 else size))
        if isinstance(got, ckpt.ClaimEntry):
            checkpoint = checkpoint.with_claim(got)
    for device in (0, 1):
        held = [e for e in checkpoint.claims.values() if device in e.device_indices]
        if any(e.share is None for e in held):
            assert len(held) == 1, "a whole device is held by one claim alone"
            continue
        taken: list[int] = []
        for e in held:
            assert e.share is not None
            assert e.share.first % e.share.count == 0
            taken += range(e.share.first, e.share.first + e.share.count)
        assert len(taken) == len(set(taken)) and all(0 <= c < 4 for c in taken)


# --- the checkpoint --------------------------------------------------------------------------


def test_the_checkpoint_keeps_shares(tmp_path: Any) -> None:
    cp = holding(entry("a", 3, (2, 2)), entry("w", 4, None))
    a = cp.claims["a"]
    cp = cp.with_claim(
        ckpt.ClaimEntry(
            **{
                **a.__dict__,
                "devices": (ckpt.DeviceRecord(("r",), NODE, "neurondevice3", ("k",), "sid"),),
            }
        )
    )
    back = ckpt.decode(ckpt.encode(cp))
    assert back == cp
    assert back.claims["a"].share == ckpt.CoreShare(3, 2, 2, 4)
    assert back.claims["a"].devices[0].share_id == "sid"
    assert back.claims["w"].share is None and back.claims["w"].devices[0].share_id is None
    raw = json.loads(ckpt.encode(cp))
    assert raw["data"]["claims"]["a"]["coreShare"] == {
        "device": 3,
        "first": 2,
        "count": 2,
        "deviceCores": 4,
    }
    assert "coreShare" not in raw["data"]["claims"]["w"]
    assert "shareId" not in raw["data"]["claims"]["w"]["devices"][0]


def test_a_checkpoint_written_before_core_sharing_loads() -> None:
    """A file of the previous version (no shareId, no coreShare) still verifies and loads:
    its claims hold their devices whole."""
    data = {
        "bootId": "b",
        "claims": {
            "u1": {
                "namespace": "default",
                "name": "old",
                "devices": [
                    {"requestNames": ["r"], "poolName": NODE, "deviceName": "neurondevice3",
                     "cdiDeviceIds": ["k8s.neuron.aws.com/claim=u1-neurondevice3"]}
                ],
                "deviceIndices": [3],
                "cdiSpec": SPEC,
                "preparedAt": "2026-01-01T00:00:00Z",
            }
        },
    }  # fmt: skip
    raw = json.dumps({"version": 1, "checksum": ckpt.checksum(data), "data": data}).encode()
    old = ckpt.decode(raw).claims["u1"]
    assert old.share is None and old.devices[0].share_id is None
    assert ckpt.find_conflict(ckpt.decode(raw), "new", [3], ckpt.CoreShare(3, 0, 1, 4))


@pytest.mark.parametrize(
    "bad",
    [{"device": 3, "first": 3, "count": 2, "deviceCores": 4}, {"device": 3, "first": 0}, "x"],
)
def test_a_share_outside_its_device_is_corrupt(bad: Any) -> None:
    data = json.loads(ckpt.encode(holding(entry("a", 3, (0, 1)))))["data"]
    data["claims"]["a"]["coreShare"] = bad
    raw = json.dumps({"version": 1, "checksum": ckpt.checksum(data), "data": data}).encode()
    with pytest.raises(ckpt.CheckpointCorrupt, match="coreShare"):
        ckpt.decode(raw)
