"""Reservation records shared by the controller and the plugin."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from neuron_dra.common.ultraserver import (
    PHASE_BOUND,
    PHASE_PENDING,
    AllocationEntry,
    global_topo_id,
    node_reservations,
    read_allocations,
    reservations,
    workload_id,
)

LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DNS_NAME = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,250}[a-z0-9])?", fullmatch=True)


def test_workload_id_starts_with_the_name_and_differs_per_uid() -> None:
    a = workload_id("my-training-job", "uid-1")
    b = workload_id("my-training-job", "uid-2")
    assert a.startswith("my-training-job-") and b.startswith("my-training-job-")
    assert a != b
    assert workload_id("my-training-job", "uid-1") == a  # stable


@given(DNS_NAME, st.uuids())
def test_workload_id_is_always_a_label_value(name: str, uid: object) -> None:
    wid = workload_id(name, str(uid))
    assert len(wid) <= 63
    assert LABEL_VALUE.match(wid)
    assert wid.startswith(name[: min(len(name), 10)].rstrip("-."))


def test_ranks_follow_unit_and_node_order() -> None:
    assert [global_topo_id(u, 4, n) for u in range(2) for n in range(4)] == list(range(8))
    assert global_topo_id(3, 2, 1) == 7


def nus(name: str, *entries: dict[str, object]) -> dict[str, object]:
    return {"metadata": {"name": name}, "status": {"allocations": list(entries)}}


def test_reservations_of_a_node() -> None:
    objs = [
        nus(
            "us-0",
            {
                "workloadRef": "ml/job",
                "workloadId": "job-1",
                "ultraserverIndex": 1,
                "nodeCount": 2,
                "allocatedNodes": ["n2", "n3"],
                "leaderNodeName": "n8",
            },
        ),
        nus(
            "us-1",
            {
                "workloadRef": "ml/job",
                "workloadId": "job-1",
                "ultraserverIndex": 0,
                "nodeCount": 2,
                "allocatedNodes": ["n8", "n9"],
                "leaderNodeName": "n8",
            },
        ),
    ]
    (r,) = node_reservations(objs, "n3")
    assert (r.ultraserver, r.unit_index, r.node_index, r.rank) == ("us-0", 1, 1, 3)
    assert r.leader_node_name == "n8" and r.workload_id == "job-1"
    assert node_reservations(objs, "n7") == []
    assert [x.rank for x in reservations(objs[1])] == [0, 1]


def test_read_allocations_types_each_entry() -> None:
    raw = {
        "workloadRef": "ml/job",
        "workloadId": "job-1",
        "allocatedNodes": ["n2", "n3"],
        "nodeCount": 2,
        "ultraserverIndex": 1,
        "leaderNodeName": "n0",
        "phase": "Active",
        "allocatedAt": "2026-01-01T09:00:00Z",
        "future": "kept",
    }
    (entry,) = read_allocations({"status": {"allocations": [raw]}})
    assert entry == AllocationEntry(
        workload_ref="ml/job",
        workload_id="job-1",
        unit_index=1,
        nodes=("n2", "n3"),
        topology_size=2,
        leader_node_name="n0",
        phase=PHASE_BOUND,
        allocated_at=datetime(2026, 1, 1, 9, tzinfo=UTC),
        raw=raw,
    )
    assert entry.identity == ("ml/job", 1, "job-1")
    assert entry.raw["future"] == "kept"


@pytest.mark.parametrize(
    "nus",
    [
        {},
        {"status": None},
        {"status": {"allocations": "x"}},
        {"status": {"allocations": [None, 3]}},
    ],
)
def test_read_allocations_reads_a_malformed_record_as_empty(nus: dict[str, Any]) -> None:
    assert read_allocations(nus) == ()


def test_read_allocations_defaults() -> None:
    (entry,) = read_allocations(
        {"status": {"allocations": [{"allocatedNodes": ["a", 5], "ultraserverIndex": "x"}]}}
    )
    assert (entry.nodes, entry.topology_size, entry.unit_index, entry.phase) == (
        ("a",),
        1,
        0,
        PHASE_PENDING,
    )
    assert (entry.leader_node_name, entry.allocated_at, entry.workload_ref) == (None, None, "")
