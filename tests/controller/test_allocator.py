"""Allocation decisions: units, best fit, FIFO, all-or-nothing, replacement."""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from neuron_dra.controller.allocation.cache import ServerCache
from neuron_dra.controller.allocation.planner import (
    Decision,
    Request,
    Unit,
    plan,
    plan_replacement,
    request_from,
)
from neuron_dra.controller.allocation.servers import servers_from
from neuron_dra.controller.allocation.units import NodeState, UltraServerState, unit_candidates

TRN2U = "trn2u.48xlarge"
TRN3 = "trn3pds.48xlarge"


def server(
    name: str,
    *,
    itype: str = TRN2U,
    reserved: dict[int, str] | None = None,
    unhealthy: Iterable[int] = (),
    ids: Iterable[int] = range(4),
) -> UltraServerState:
    reserved = reserved or {}
    bad = set(unhealthy)
    return UltraServerState(
        name=name,
        instance_type=itype,
        nodes=tuple(
            NodeState(f"{name}-n{i}", i, healthy=i not in bad, reserved_by=reserved.get(i))
            for i in ids
        ),
    )


def request(
    ref: str,
    size: int,
    count: int,
    *,
    itype: str = TRN2U,
    at: str = "2025-01-15T10:00:00Z",
) -> Request:
    return Request(ref, itype, size, count, (at, ref))


def granted(decision: Decision) -> list[tuple[str, tuple[str, ...], int]]:
    assert decision.units is not None, decision.reason
    return [(u.ultraserver, u.nodes, u.index) for u in decision.units]


def node_ids(unit: tuple[NodeState, ...]) -> list[int]:
    return [n.node_id for n in unit]


# --- the seed example ------------------------------------------------------------------------


def test_seed_example_two_whole_ultraservers() -> None:
    cluster = [server(f"us-id-{i}") for i in range(4)]
    [decision] = plan(cluster, [request("default/my-training-job", 4, 2)])
    assert granted(decision) == [
        ("us-id-0", tuple(f"us-id-0-n{i}" for i in range(4)), 0),
        ("us-id-1", tuple(f"us-id-1-n{i}" for i in range(4)), 1),
    ]
    assert sum(len(u.nodes) for u in decision.units or ()) == 8


# --- units of one UltraServer ----------------------------------------------------------------


def test_unit_candidates_follow_the_hardware_shapes() -> None:
    whole = server("a")
    assert [node_ids(u) for u in unit_candidates(whole, 4)] == [[0, 1, 2, 3]]
    assert [node_ids(u) for u in unit_candidates(whole, 2)] == [[0, 1], [2, 3]]
    assert [node_ids(u) for u in unit_candidates(whole, 1)] == [[0], [1], [2], [3]]
    # Node 1 taken: no whole server, no {0,1} pair; node 0 (broken pair) comes first.
    broken = server("a", reserved={1: "ns/x"})
    assert unit_candidates(broken, 4) == []
    assert [node_ids(u) for u in unit_candidates(broken, 2)] == [[2, 3]]
    assert [node_ids(u) for u in unit_candidates(broken, 1)] == [[0], [2], [3]]
    # Pair {0,1} used: pair {2,3} is first (its sibling is in use).
    half = server("a", reserved={0: "ns/x", 1: "ns/x"})
    assert [node_ids(u) for u in unit_candidates(half, 2)] == [[2, 3]]
    with pytest.raises(ValueError, match="unit size"):
        unit_candidates(whole, 3)


def test_unit_candidates_skip_unhealthy_missing_and_ambiguous_nodes() -> None:
    assert unit_candidates(server("a", unhealthy=[3]), 4) == []
    assert [node_ids(u) for u in unit_candidates(server("a", unhealthy=[3]), 2)] == [[0, 1]]
    three = server("a", ids=[0, 1, 2])
    assert unit_candidates(three, 4) == []
    assert [node_ids(u) for u in unit_candidates(three, 2)] == [[0, 1]]
    # Two nodes claiming id 1: neither is used, so neither pair {0,1} nor the whole server.
    dup = UltraServerState(
        "a",
        TRN2U,
        (*server("a").nodes, NodeState("a-extra", 1, healthy=True, reserved_by=None)),
    )
    assert unit_candidates(dup, 4) == []
    assert [node_ids(u) for u in unit_candidates(dup, 1)] == [[0], [2], [3]]


# --- best fit --------------------------------------------------------------------------------


def test_single_node_lands_on_a_partly_used_ultraserver() -> None:
    cluster = [server("a"), server("b", reserved={0: "ns/old", 1: "ns/old"}), server("c")]
    [decision] = plan(cluster, [request("ns/one", 1, 1)])
    # b has 2 free nodes; a and c stay whole.
    assert granted(decision) == [("b", ("b-n2",), 0)]


def test_single_node_prefers_the_already_broken_pair() -> None:
    # Both have 2 free nodes; on "b" they are the halves of two broken pairs.
    cluster = [
        server("a", reserved={2: "ns/o", 3: "ns/o"}),
        server("b", reserved={0: "ns/o", 3: "ns/o"}),
    ]
    [decision] = plan(cluster, [request("ns/one", 1, 1)])
    assert granted(decision) == [("b", ("b-n1",), 0)]


def test_single_node_keeps_free_pairs_intact_before_counting_free_nodes() -> None:
    # "a" has 3 free nodes (node 1 is half of a broken pair), "b" 2 (an intact pair). Taking
    # a-n1 leaves two free pairs; taking from "b" would leave one.
    cluster = [server("a", reserved={0: "ns/o"}), server("b", reserved={2: "ns/o", 3: "ns/o"})]
    [decision] = plan(cluster, [request("ns/one", 1, 1)])
    assert granted(decision) == [("a", ("a-n1",), 0)]


def test_two_pair_requests_fill_one_ultraserver_before_breaking_another() -> None:
    cluster = [server("a"), server("b")]
    first, second = plan(
        cluster,
        [
            request("ns/p1", 2, 1, at="2025-01-01T00:00:00Z"),
            request("ns/p2", 2, 1, at="2025-01-01T00:00:01Z"),
        ],
    )
    assert granted(first) == [("a", ("a-n0", "a-n1"), 0)]
    assert granted(second) == [("a", ("a-n2", "a-n3"), 0)]
    # "b" is still whole, so a 4-node request fits.
    [whole] = plan(
        [server("a", reserved={i: "ns/p" for i in range(4)}), server("b")],
        [request("ns/w", 4, 1)],
    )
    assert granted(whole) == [("b", tuple(f"b-n{i}" for i in range(4)), 0)]


def test_pair_prefers_a_server_whose_other_pair_is_taken() -> None:
    cluster = [server("a"), server("b", reserved={0: "ns/o"})]
    [decision] = plan(cluster, [request("ns/p", 2, 1)])
    assert granted(decision) == [("b", ("b-n2", "b-n3"), 0)]


def test_single_nodes_of_one_request_pack_together() -> None:
    [decision] = plan([server("a"), server("b")], [request("ns/s", 1, 3)])
    assert granted(decision) == [
        ("a", ("a-n0",), 0),
        ("a", ("a-n1",), 1),
        ("a", ("a-n2",), 2),
    ]


def test_whole_ultraservers_are_taken_in_name_order_and_indexed_by_name() -> None:
    cluster = [server("us-c"), server("us-a", reserved={0: "ns/x"}), server("us-b"), server("us-d")]
    [decision] = plan(cluster, [request("ns/w", 4, 2)])
    assert [(u.ultraserver, u.index) for u in decision.units or ()] == [("us-b", 0), ("us-c", 1)]


# --- capacity, FIFO, all-or-nothing ----------------------------------------------------------


def test_insufficient_capacity_names_what_is_missing_then_fits_once_added() -> None:
    cluster = [
        server("us-a"),
        server("us-b", reserved={0: "ns/other"}),
        server("us-c", reserved={2: "ns/other", 3: "ns/other"}),
    ]
    [decision] = plan(cluster, [request("ns/job", 4, 2)])
    assert decision.units is None
    assert decision.reason == (
        f"needs 2 free 4-node units of {TRN2U}; 1 available (us-a); "
        "3 UltraServers of that type exist, 2 are busy"
    )
    [later] = plan([*cluster, server("us-d")], [request("ns/job", 4, 2)])
    assert [u.ultraserver for u in later.units or ()] == ["us-a", "us-d"]


def test_all_or_nothing_books_nothing_for_a_denied_request() -> None:
    # ns/big (first) waits for 5 nodes (4 free), ns/small queues behind it; nothing is
    # booked, so a later plan with the nodes released grants both.
    cluster = [server("a"), server("b", reserved=dict.fromkeys(range(4), "ns/x"))]
    reqs = [
        request("ns/big", 1, 5, at="2025-01-01T00:00:00Z"),
        request("ns/small", 1, 1, at="2025-01-02T00:00:00Z"),
    ]
    big, small = plan(cluster, reqs)
    assert big.units is None and small.units is None
    assert big.reason == (
        f"needs 5 free nodes of {TRN2U}; 4 available (a); "
        "2 UltraServers of that type exist, 1 is busy"
    )
    assert small.reason.startswith("queued behind ns/big")
    big, small = plan([server("a"), server("b")], reqs)
    assert big.units is not None and small.units is not None


def test_fifo_waiting_request_blocks_later_ones_of_its_type_only() -> None:
    cluster = [
        server("a", reserved={0: "ns/old"}),
        server("b"),
        server("x", itype=TRN3),
    ]
    reqs = [
        request("ns/gang", 4, 2, at="2025-01-01T00:00:00Z"),  # fits 2 in all, 1 free: waits
        request("ns/tiny", 1, 1, at="2025-01-01T00:00:05Z"),  # would fit, but queues behind
        request("ns/other-type", 4, 1, itype=TRN3, at="2025-01-01T00:00:09Z"),
    ]
    gang, tiny, other = plan(cluster, list(reversed(reqs)))  # FIFO by order, not list order
    assert gang.workload_ref == "ns/gang" and gang.units is None
    assert "needs 2 free 4-node units" in gang.reason
    assert tiny.units is None
    assert tiny.reason == (
        f"queued behind ns/gang, which came first and waits for 2 4-node units of {TRN2U} "
        "to be released"
    )
    assert granted(other) == [("x", tuple(f"x-n{i}" for i in range(4)), 0)]


def test_request_that_can_never_fit_does_not_block() -> None:
    cluster = [server("a"), server("b", unhealthy=[1])]
    huge, small = plan(
        cluster,
        [
            request("ns/huge", 4, 3, at="2025-01-01T00:00:00Z"),
            request("ns/small", 2, 1, at="2025-01-01T00:01:00Z"),
        ],
    )
    assert huge.units is None
    assert "more than the type can offer (1 healthy in all" in huge.reason
    assert "does not hold up other workloads" in huge.reason
    # Best fit: b cannot be whole anyway, so its healthy pair is used.
    assert granted(small) == [("b", ("b-n2", "b-n3"), 0)]


def test_no_ultraservers_of_the_type() -> None:
    [decision] = plan([server("a")], [request("ns/j", 2, 1, itype=TRN3)])
    assert decision.units is None
    assert "no UltraServers of that type exist" in decision.reason


def test_invalid_requests_do_not_block_and_duplicates_are_refused() -> None:
    reqs = [
        request("ns/bad", 3, 1, at="2025-01-01T00:00:00Z"),
        request("ns/zero", 4, 0, at="2025-01-01T00:00:01Z"),
        request("ns/ok", 4, 1, at="2025-01-01T00:00:02Z"),
    ]
    bad, zero, ok = plan([server("a"), server("b")], reqs)
    assert bad.units is None and "topologySize must be 1, 2 or 4" in bad.reason
    assert zero.units is None and "serverCount must be at least 1" in zero.reason
    assert granted(ok) == [("a", tuple(f"a-n{i}" for i in range(4)), 0)]
    with pytest.raises(ValueError, match="more than one request for ns/ok"):
        plan([server("a")], [*reqs, request("ns/ok", 1, 1)])


def test_unhealthy_and_reserved_nodes_are_skipped() -> None:
    cluster = [
        server("a", unhealthy=[2]),
        server("b", reserved={3: "ns/x"}),
        server("c", unhealthy=[0], reserved={1: "ns/x"}),
    ]
    [pairs] = plan(cluster, [request("ns/p", 2, 4)])
    assert pairs.units is None
    assert "needs 4 free 2-node units" in pairs.reason
    assert "3 available (a, b, c)" in pairs.reason
    assert "3 UltraServers of that type exist, 2 are busy, 2 have unhealthy" in pairs.reason
    [pairs] = plan(cluster, [request("ns/p", 2, 3)])
    used = {n for u in pairs.units or () for n in u.nodes}
    assert not used & {"a-n2", "a-n3", "b-n2", "b-n3", "c-n0", "c-n1"}


def test_pairs_count_exactly() -> None:
    cluster = [
        server("a", unhealthy=[2]),
        server("b", reserved={3: "ns/x"}),
        server("c", unhealthy=[0]),
    ]
    [decision] = plan(cluster, [request("ns/p", 2, 3)])
    assert sorted((u.ultraserver, u.nodes) for u in decision.units or ()) == [
        ("a", ("a-n0", "a-n1")),
        ("b", ("b-n0", "b-n1")),
        ("c", ("c-n2", "c-n3")),
    ]


def test_mixed_instance_types_are_isolated() -> None:
    cluster = [server("a", itype=TRN3), server("b")]
    [decision] = plan(cluster, [request("ns/j", 4, 2)])
    assert decision.units is None
    assert "1 UltraServer of that type exists" in decision.reason
    [decision] = plan(cluster, [request("ns/j", 1, 4, itype=TRN3)])
    assert {u.ultraserver for u in decision.units or ()} == {"a"}


def test_one_plan_never_books_a_node_twice() -> None:
    reqs = [request(f"ns/s{i}", 1, 1, at=f"2025-01-01T00:00:0{i}Z") for i in range(5)]
    decisions = plan([server("a")], reqs)
    assert [d.units is not None for d in decisions] == [True] * 4 + [False]
    nodes = [n for d in decisions for u in d.units or () for n in u.nodes]
    assert sorted(nodes) == [f"a-n{i}" for i in range(4)]


def test_a_node_listed_twice_or_reserved_elsewhere_is_not_used() -> None:
    a = server("a")
    # "a-n0" also listed (reserved) under "b": reserved everywhere.
    b = UltraServerState("b", TRN2U, (NodeState("a-n0", 0, True, "ns/x"),))
    [decision] = plan([a, b], [request("ns/w", 4, 1)])
    assert decision.units is None
    with pytest.raises(ValueError, match="appears twice"):
        plan([a, a], [])


# --- replacement -----------------------------------------------------------------------------


def test_replacement_keeps_indexes_and_swaps_the_failed_unit() -> None:
    ref = "ns/job"
    req = request(ref, 4, 3)
    owned = {i: ref for i in range(4)}
    cluster = [
        server("a", reserved=owned),
        server("b", reserved=owned, unhealthy=[2]),
        server("c", reserved=owned),
        server("d"),
        server("e"),
    ]
    keep = [
        Unit("a", tuple(f"a-n{i}" for i in range(4)), 0),
        Unit("c", tuple(f"c-n{i}" for i in range(4)), 2),
    ]
    failed = [Unit("b", tuple(f"b-n{i}" for i in range(4)), 1)]
    units = plan_replacement(cluster, req, keep, failed)
    assert units is not None
    assert [(u.ultraserver, u.index) for u in units] == [("a", 0), ("d", 1), ("c", 2)]
    assert units[0] == keep[0] and units[2] == keep[1]


def test_replacement_never_reuses_the_failed_nodes_and_is_all_or_nothing() -> None:
    ref = "ns/job"
    req = request(ref, 2, 2)
    # The failed pair looks healthy and free again (released already): still not reused.
    cluster = [server("a", reserved={0: ref, 1: ref})]
    keep = [Unit("a", ("a-n0", "a-n1"), 0)]
    assert plan_replacement(cluster, req, keep, [Unit("a", ("a-n2", "a-n3"), 1)]) is None
    # Two units lost, room for two.
    cluster = [server("a"), server("b", reserved={0: "ns/x", 1: "ns/x", 2: "ns/x"})]
    lost = [Unit("z", ("z-n0", "z-n1"), 0), Unit("z", ("z-n2", "z-n3"), 1)]
    assert plan_replacement(cluster, request(ref, 2, 2), [], lost) is not None
    # With a third index (lost earlier) to fill there is no room: nothing at all.
    assert plan_replacement(cluster, request(ref, 2, 3), [], lost) is None


def test_replacement_fills_indexes_lost_earlier_and_checks_its_input() -> None:
    ref = "ns/job"
    req = request(ref, 1, 3)
    cluster = [server("a", reserved={0: ref})]
    keep = [Unit("a", ("a-n0",), 0)]
    units = plan_replacement(cluster, req, keep, [])
    assert units is not None and [u.index for u in units] == [0, 1, 2]
    # The pair partner of the kept node (a-n1, broken pair) is taken first.
    assert [u.nodes for u in units] == [("a-n0",), ("a-n1",), ("a-n2",)]
    with pytest.raises(ValueError, match="overlap"):
        plan_replacement(cluster, req, keep, [Unit("a", ("a-n1",), 0)])
    with pytest.raises(ValueError, match="distinct"):
        plan_replacement(cluster, req, [*keep, Unit("a", ("a-n1",), 0)], [])
    with pytest.raises(ValueError, match="topologySize"):
        plan_replacement(cluster, request(ref, 3, 1), [], [])


# --- from API objects ------------------------------------------------------------------------


def nus(
    name: str, itype: str, nodes: list[dict[str, object]], *allocs: dict[str, object]
) -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "neuron-dra-driver"},
        "spec": {"instanceType": itype, "topology": nodes},
        "status": {"allocations": list(allocs)},
    }


def test_servers_from_reads_topology_allocations_and_health() -> None:
    objs = [
        nus(
            "us-b",
            TRN2U,
            [
                {"nodeName": "b3", "nodeId": 3},
                {"nodeName": "b0", "nodeId": 0, "linkStatusHorizontal": "Down"},
                {"nodeName": "b1", "nodeId": 1, "linkStatusVertical": "Unknown"},
                {"nodeName": "b2", "nodeId": 2},
            ],
            {
                "workloadRef": "ml/job",
                "workloadId": "job-1",
                "allocatedNodes": ["b2", "b3"],
                "nodeCount": 2,
                "ultraserverIndex": 0,
                "phase": "Releasing",
            },
        ),
        nus("us-a", TRN3, [{"nodeName": "a0", "nodeId": 0}]),
    ]
    health = {"b0": True, "b1": True, "b2": True, "b3": False}
    a, b = servers_from(objs, node_health=health)
    assert a == UltraServerState("us-a", TRN3, (NodeState("a0", 0, False, None),))  # no health
    assert b.name == "us-b" and b.instance_type == TRN2U
    assert b.nodes == (
        NodeState("b0", 0, False, None),  # link down
        NodeState("b1", 1, True, None),  # Unknown is not down
        NodeState("b2", 2, True, "ml/job"),  # Releasing still holds the node
        NodeState("b3", 3, False, "ml/job"),
    )


def test_request_from_a_workload_object() -> None:
    obj = {
        "apiVersion": "neuron.aws.com/v1beta1",
        "kind": "NeuronUltraServerWorkload",
        "metadata": {
            "name": "my-training-job",
            "namespace": "ml",
            "creationTimestamp": "2025-01-15T10:30:00Z",
        },
        "spec": {"instanceType": TRN2U, "topologySize": 4, "serverCount": 2},
    }
    assert request_from(obj) == Request(
        "ml/my-training-job", TRN2U, 4, 2, ("2025-01-15T10:30:00Z", "ml/my-training-job")
    )


# --- properties ------------------------------------------------------------------------------

TYPES = (TRN2U, TRN3)
REFS = tuple(f"ns/w{i}" for i in range(8))


@st.composite
def clusters(draw: st.DrawFn) -> list[UltraServerState]:
    out = []
    for i in range(draw(st.integers(0, 10))):
        name = f"us-{draw(st.sampled_from('abcdefgh'))}{i}"
        ids = draw(st.sets(st.integers(0, 3), min_size=1)) if draw(st.booleans()) else set(range(4))
        nodes = tuple(
            NodeState(
                f"{name}-n{n}",
                n,
                healthy=draw(st.integers(0, 9)) > 0,
                reserved_by=draw(
                    st.one_of(st.none(), st.none(), st.sampled_from(("ns/old", "ns/x")))
                ),
            )
            for n in sorted(ids)
        )
        out.append(UltraServerState(name, draw(st.sampled_from(TYPES)), nodes))
    return out


@st.composite
def request_lists(draw: st.DrawFn) -> list[Request]:
    refs = draw(st.lists(st.sampled_from(REFS), unique=True, max_size=8))
    return [
        Request(
            ref,
            draw(st.sampled_from(TYPES)),
            draw(st.sampled_from((1, 2, 4))),
            draw(st.sampled_from((1, 1, 1, 2, 2, 3, 5))),
            (f"2025-01-01T00:00:{draw(st.integers(0, 5)):02d}Z", ref),
        )
        for ref in refs
    ]


def capacity(cluster: list[UltraServerState], itype: str, size: int, *, free_only: bool) -> int:
    """Independent oracle: units of ``size`` formable from healthy (and free) nodes."""
    total = 0
    for s in cluster:
        if s.instance_type != itype:
            continue
        ok = {n.node_id for n in s.nodes if n.healthy and (n.reserved_by is None or not free_only)}
        groups: dict[int, list[set[int]]] = {
            4: [{0, 1, 2, 3}],
            2: [{0, 1}, {2, 3}],
            1: [{i} for i in range(4)],
        }
        total += sum(1 for g in groups[size] if g <= ok)
    return total


@settings(max_examples=300, deadline=None)
@given(clusters(), request_lists())
def test_plan_invariants(cluster: list[UltraServerState], reqs: list[Request]) -> None:
    decisions = plan(cluster, reqs)
    assert sorted(d.workload_ref for d in decisions) == sorted(r.workload_ref for r in reqs)
    by_ref = {r.workload_ref: r for r in reqs}
    nodes = {(s.name, n.name): (s, n) for s in cluster for n in s.nodes}
    used: list[str] = []
    for d in decisions:
        if d.units is None:
            assert d.reason
            continue
        req = by_ref[d.workload_ref]
        assert len(d.units) == req.server_count
        assert [u.index for u in d.units] == list(range(req.server_count))
        assert sorted(d.units, key=lambda u: (u.ultraserver, u.nodes)) == list(d.units)
        for unit in d.units:
            assert len(unit.nodes) == req.topology_size
            members = [nodes[(unit.ultraserver, n)] for n in unit.nodes]
            assert all(s.instance_type == req.instance_type for s, _ in members)
            assert all(n.healthy and n.reserved_by is None for _, n in members)
            ids = [n.node_id for _, n in members]
            assert ids == sorted(ids)
            if req.topology_size == 4:
                assert ids == [0, 1, 2, 3]
            elif req.topology_size == 2:
                assert ids in ([0, 1], [2, 3])
            used.extend(unit.nodes)
    assert len(used) == len(set(used))


@settings(max_examples=300, deadline=None)
@given(clusters(), request_lists())
def test_plan_is_fifo_per_instance_type(
    cluster: list[UltraServerState], reqs: list[Request]
) -> None:
    """Among requests that could ever fit, the granted ones are a FIFO prefix per type, and
    the first one denied really lacked free units."""
    decisions = plan(cluster, reqs)
    assert [d.workload_ref for d in decisions] == [
        r.workload_ref for r in sorted(reqs, key=lambda r: r.order)
    ]
    by_ref = {r.workload_ref: r for r in reqs}
    booked: set[str] = set()
    blocked: set[str] = set()
    for d in decisions:
        req = by_ref[d.workload_ref]
        fits_ever = req.server_count <= capacity(
            cluster, req.instance_type, req.topology_size, free_only=False
        )
        if not fits_ever:
            assert d.units is None and "more than the type can offer" in d.reason
            continue
        if req.instance_type in blocked:
            assert d.units is None and d.reason.startswith("queued behind")
            continue
        remaining = [
            UltraServerState(
                s.name,
                s.instance_type,
                tuple(
                    NodeState(
                        n.name,
                        n.node_id,
                        n.healthy,
                        "booked" if n.name in booked else n.reserved_by,
                    )
                    for n in s.nodes
                ),
            )
            for s in cluster
        ]
        free_units = capacity(remaining, req.instance_type, req.topology_size, free_only=True)
        if d.units is None:
            assert free_units < req.server_count
            blocked.add(req.instance_type)
        else:
            booked.update(n for u in d.units for n in u.nodes)


@settings(max_examples=200, deadline=None)
@given(clusters(), request_lists(), st.randoms(use_true_random=False))
def test_plan_is_deterministic(
    cluster: list[UltraServerState], reqs: list[Request], rnd: random.Random
) -> None:
    expected = plan(cluster, reqs)
    assert plan(cluster, reqs) == expected
    shuffled = [
        UltraServerState(s.name, s.instance_type, tuple(rnd.sample(s.nodes, len(s.nodes))))
        for s in cluster
    ]
    rnd.shuffle(shuffled)
    assert plan(shuffled, rnd.sample(reqs, len(reqs))) == expected


@settings(max_examples=200, deadline=None)
@given(clusters(), st.sampled_from((1, 2, 4)), st.integers(1, 4), st.data())
def test_replacement_invariants(
    cluster: list[UltraServerState], size: int, count: int, data: st.DataObject
) -> None:
    ref = "ns/job"
    [first] = plan(cluster, [request(ref, size, count)])
    if first.units is None:
        return
    failed_idx = data.draw(st.sets(st.integers(0, count - 1), min_size=1))
    keep = [u for u in first.units if u.index not in failed_idx]
    failed = [u for u in first.units if u.index in failed_idx]
    held = {n: ref for u in first.units for n in u.nodes}
    recorded = [
        UltraServerState(
            s.name,
            s.instance_type,
            tuple(
                NodeState(n.name, n.node_id, n.healthy, held.get(n.name, n.reserved_by))
                for n in s.nodes
            ),
        )
        for s in cluster
    ]
    units = plan_replacement(recorded, request(ref, size, count), keep, failed)
    if units is None:
        return
    assert [u.index for u in units] == list(range(count))
    assert [u for u in units if u.index not in failed_idx] == keep
    new = [n for u in units if u.index in failed_idx for n in u.nodes]
    old = {n for u in first.units for n in u.nodes}
    assert not set(new) & old
    assert len(new) == len(set(new)) == size * len(failed_idx)
    free = {
        n.name
        for s in cluster
        for n in s.nodes
        if n.healthy and n.reserved_by is None and s.instance_type == TRN2U
    }
    assert set(new) <= free


def whole_free(cluster: list[UltraServerState], itype: str, taken: set[str]) -> set[str]:
    return {
        s.name
        for s in cluster
        if s.instance_type == itype
        and sorted(n.node_id for n in s.nodes) == [0, 1, 2, 3]
        and all(n.healthy and n.reserved_by is None and n.name not in taken for n in s.nodes)
    }


@settings(max_examples=300, deadline=None)
@given(clusters(), st.sampled_from((1, 2)), st.integers(1, 9))
def test_small_units_break_as_few_whole_ultraservers_as_possible(
    cluster: list[UltraServerState], size: int, count: int
) -> None:
    """Best fit: whole free UltraServers are broken only for what the rest cannot hold."""
    [decision] = plan(cluster, [request("ns/s", size, count)])
    if decision.units is None:
        return
    before = whole_free(cluster, TRN2U, set())
    elsewhere = sum(
        len(unit_candidates(s, size))
        for s in cluster
        if s.instance_type == TRN2U and s.name not in before
    )
    per_server = 4 // size
    needed = max(0, count - elsewhere)
    broken = -(-needed // per_server)  # ceil
    after = whole_free(cluster, TRN2U, {n for u in decision.units for n in u.nodes})
    assert len(before) - len(after) == broken


def test_server_cache_matches_servers_from_as_objects_change() -> None:
    def nus(name: str, nodes: list[str], allocations: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "metadata": {"name": name},
            "spec": {
                "instanceType": "trn2u.48xlarge",
                "topology": [{"nodeName": n, "nodeId": i} for i, n in enumerate(nodes)],
            },
            "status": {"allocations": allocations},
        }

    a = nus("a", ["a0", "a1", "a2", "a3"], [])
    b = nus("b", ["b0", "b1", "b2", "b3"], [])
    health = {n: True for n in ("a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3")}
    cache = ServerCache(lambda n: health.get(n, False))
    cache.put("a", a)
    cache.put("b", b)
    first = cache.changes()
    assert [name for name, _ in first] == ["a", "b"]
    assert cache.servers() == servers_from([a, b], node_health=health)
    # An allocation recorded on b (a new object), one naming a node of a (inconsistent
    # record): a's state changes too, though its object did not.
    b2 = nus("b", ["b0", "b1", "b2", "b3"], [{"workloadRef": "ns/w", "allocatedNodes": ["a1"]}])
    cache.put("b", b2)
    assert [name for name, _ in cache.changes()] == ["a"]  # b's own state is unchanged
    second = cache.servers()
    assert second == servers_from([a, b2], node_health=health)
    assert second[0].nodes[1].reserved_by == "ns/w"
    # Nothing changed: no changes, and the very same state objects (what was derived stays).
    cache.put("b", b2)
    assert cache.changes() == []
    assert cache.servers()[1] is second[1]
    health["b3"] = False
    cache.node_changed("b3")
    assert [name for name, _ in cache.changes()] == ["b"]
    third = cache.servers()
    assert third == servers_from([a, b2], node_health=health)
    assert not third[1].nodes[3].healthy
    assert third[0] is second[0]
    cache.put("b", None)
    assert cache.changes() == [("a", cache.servers()[0]), ("b", None)]
    assert cache.servers() == servers_from([a], node_health=health)
