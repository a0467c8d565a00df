"""The incremental free-unit index (unitindex), and what feeds it: ServerCache (NUS objects →
states) and StoreChanges (which cached objects changed). Pure: no I/O."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from neuron_dra.common.k8s.cache import Store
from neuron_dra.controller.allocation.cache import ServerCache
from neuron_dra.controller.allocation.planner import (
    Request,
    plan,
    plan_on,
    plan_replacement,
    plan_replacement_on,
)
from neuron_dra.controller.allocation.servers import servers_from
from neuron_dra.controller.allocation.unitindex import Inventory, UnitIndex
from neuron_dra.controller.allocation.units import (
    UNIT_SIZES,
    NodeState,
    UltraServerState,
    capacity,
    keyed_candidates,
)
from neuron_dra.controller.storechanges import StoreChanges

T1, T2 = "trn2u.48xlarge", "trn3pds.48xlarge"
NAMES = ("a", "b", "c", "d", "e")
REFS = (None, None, None, "ns/w1", "ns/w2")

# --------------------------------------------------------------------------------------------
# A from-scratch reference, written as plainly as possible


def reference_states(raw: list[UltraServerState]) -> dict[str, UltraServerState]:
    """The states a plan must see: a node listed twice anywhere is unusable, and a
    reservation recorded under any listing holds the node everywhere (min of the refs)."""
    listed = Counter(n.name for s in raw for n in s.nodes)
    holders: dict[str, set[str]] = {}
    for s in raw:
        for n in s.nodes:
            if n.reserved_by is not None:
                holders.setdefault(n.name, set()).add(n.reserved_by)
    out = {}
    for s in raw:
        nodes = tuple(
            replace(
                n,
                healthy=n.healthy and listed[n.name] == 1,
                reserved_by=min(holders[n.name]) if n.name in holders else None,
            )
            for n in s.nodes
        )
        out[s.name] = replace(s, nodes=nodes)
    return out


def check_against_reference(index: UnitIndex, raw: dict[str, UltraServerState]) -> None:
    snap = index.snapshot()
    states = reference_states(list(raw.values()))
    assert snap.raw == dict(sorted(raw.items()))
    assert snap.states == dict(sorted(states.items()))
    types = sorted({s.instance_type for s in raw.values()})
    for itype in types:
        of_type = [s for s in states.values() if s.instance_type == itype]
        assert index.inventory(itype) == Inventory(
            len(of_type),
            sum(1 for s in of_type if any(n.reserved_by is not None for n in s.nodes)),
            sum(1 for s in of_type if any(not n.healthy for n in s.nodes)),
        )
        for size in UNIT_SIZES:
            assert index.capacity(itype, size) == sum(capacity(s, size) for s in of_type)
            offers = [keyed_candidates(s, size) for s in of_type]
            heads = sorted(o[0][0] for o in offers if o)
            assert snap.heads.get((itype, size), []) == heads
            best = index.best(itype, size)
            if not heads:
                assert best is None
            else:
                name = heads[0][2]
                assert best == (name, keyed_candidates(states[name], size)[0][1])
            assert sorted(index.hosts(itype, size)) == sorted(
                s.name for s, o in zip(of_type, offers, strict=True) for _ in o
            )
    assert index.instance_types() == types
    assert len(index) == len(raw)


# --------------------------------------------------------------------------------------------
# Strategies


@st.composite
def node_states(draw: st.DrawFn, server: str) -> NodeState:
    # Mostly the server's own nodes; sometimes one of a few shared names, so that nodes
    # listed twice (and reservations recorded elsewhere) come up.
    name = draw(
        st.one_of(
            st.sampled_from([f"{server}-n{i}" for i in range(4)]),
            st.sampled_from(["x0", "x1"]),
        )
    )
    return NodeState(
        name=name,
        node_id=draw(st.sampled_from((0, 1, 2, 3, 0, 1, 2, 3, -1, 4))),
        healthy=draw(st.booleans() | st.just(True)),
        reserved_by=draw(st.sampled_from(REFS)),
    )


@st.composite
def server_states(draw: st.DrawFn) -> UltraServerState:
    name = draw(st.sampled_from(NAMES))
    if draw(st.booleans()):
        # A well-formed UltraServer: ids 0..3 once each.
        nodes = [
            NodeState(
                f"{name}-n{i}",
                i,
                draw(st.booleans() | st.just(True)),
                draw(st.sampled_from(REFS)),
            )
            for i in range(4)
        ]
    else:
        nodes = draw(st.lists(node_states(name), max_size=5))
    return UltraServerState(name, draw(st.sampled_from((T1, T1, T2))), tuple(nodes))


Op = tuple[Any, ...]


def ops() -> st.SearchStrategy[list[Op]]:
    leaf = st.one_of(
        st.tuples(st.just("set"), server_states()),
        st.tuples(st.just("remove"), st.sampled_from(NAMES)),
        st.tuples(
            st.just("book"),
            st.sampled_from(NAMES),
            st.sets(st.sampled_from(["n0", "n1", "n2", "n3", "x0"])),
            st.sampled_from(("ns/w1", "ns/w3")),
        ),
    )
    return st.lists(
        st.one_of(leaf, st.tuples(st.just("tentative"), st.lists(leaf, max_size=6))),
        max_size=25,
    )


def apply(index: UnitIndex, raw: dict[str, UltraServerState], op: Op) -> None:
    kind = op[0]
    if kind == "set":
        index.set(op[1])
        raw[op[1].name] = op[1]
    elif kind == "remove":
        index.remove(op[1])
        raw.pop(op[1], None)
    elif kind == "book":
        name, suffixes, ref = op[1:]
        if name not in raw:
            return
        nodes = {s if s.startswith("x") else f"{name}-{s}" for s in suffixes}
        index.book(name, nodes, ref)
        server = raw[name]
        raw[name] = replace(
            server,
            nodes=tuple(
                replace(n, reserved_by=ref) if n.name in nodes else n for n in server.nodes
            ),
        )
    else:
        before = index.snapshot()
        with index.tentative():
            scratch = dict(raw)
            for inner in op[1]:
                apply(index, scratch, inner)
            check_against_reference(index, scratch)
        assert index.snapshot() == before


# --------------------------------------------------------------------------------------------
# UnitIndex


@settings(max_examples=300, deadline=None)
@given(ops())
def test_incremental_index_equals_a_from_scratch_one_after_any_changes(sequence: list[Op]) -> None:
    index = UnitIndex()
    raw: dict[str, UltraServerState] = {}
    for op in sequence:
        apply(index, raw, op)
        check_against_reference(index, raw)
    # The same fleet indexed at once holds exactly the same (raw states and all the counts
    # and orders derived from them, down to which node is listed where and held by whom).
    assert index.snapshot() == UnitIndex(raw.values()).snapshot()


def test_unchanged_states_keep_their_objects_and_rankings() -> None:
    a = UltraServerState("a", T1, tuple(NodeState(f"a{i}", i, True, None) for i in range(4)))
    b = UltraServerState("b", T1, tuple(NodeState(f"b{i}", i, True, None) for i in range(4)))
    index = UnitIndex([a, b])
    assert index.state("a") is a  # nothing to fix: planned with the given object
    ranked = keyed_candidates(a, 1)
    index.set(replace(b, nodes=(*b.nodes[:3], replace(b.nodes[3], reserved_by="ns/w"))))
    assert index.state("a") is a and keyed_candidates(a, 1) is ranked
    assert index.best(T1, 1) == ("b", (b.nodes[2],))  # finish the partly used one first


def test_a_node_listed_twice_is_unusable_until_one_listing_goes() -> None:
    a = UltraServerState("a", T1, tuple(NodeState(f"n{i}", i, True, None) for i in range(4)))
    b = UltraServerState("b", T1, (NodeState("n3", 0, True, "ns/w"),))
    index = UnitIndex([a])
    assert index.capacity(T1, 4) == 1
    index.set(b)
    planned = index.state("a")
    assert planned is not None and not planned.nodes[3].healthy
    assert planned.nodes[3].reserved_by == "ns/w"  # held everywhere it is listed
    assert index.capacity(T1, 4) == 0 and index.inventory(T1) == Inventory(2, 2, 2)
    index.remove("b")
    assert index.state("a") is a and index.capacity(T1, 4) == 1


def test_tentative_changes_are_undone_and_savepoints_undo_part_of_them() -> None:
    a = UltraServerState("a", T1, tuple(NodeState(f"a{i}", i, True, None) for i in range(4)))
    index = UnitIndex([a])
    before = index.snapshot()
    with index.tentative():
        index.book("a", ["a0"], "ns/w")
        point = index.savepoint()
        index.book("a", ["a1"], "ns/w")
        index.remove("a")
        index.undo_to(point)
        planned = index.state("a")
        assert planned is not None
        assert [n.reserved_by for n in planned.nodes] == ["ns/w", None, None, None]
        with index.tentative():
            index.set(replace(a, name="z"))
        assert index.state("z") is None
    assert index.snapshot() == before and index.state("a") is a
    with pytest.raises(RuntimeError):
        index.savepoint()


# --------------------------------------------------------------------------------------------
# Planning on a kept index decides as planning from scratch


@st.composite
def requests(draw: st.DrawFn) -> list[Request]:
    out = []
    for i in range(draw(st.integers(0, 5))):
        out.append(
            Request(
                f"ns/r{i}",
                draw(st.sampled_from((T1, T2))),
                draw(st.sampled_from((1, 2, 4, 4, 3))),
                draw(st.integers(0, 4)),
                (f"2026-01-01T00:00:0{draw(st.integers(0, 9))}Z", f"ns/r{i}"),
            )
        )
    return out


@settings(max_examples=200, deadline=None)
@given(ops(), st.lists(requests(), min_size=1, max_size=3))
def test_plan_on_a_kept_index_decides_as_plan_and_leaves_it_unchanged(
    sequence: list[Op], rounds: list[list[Request]]
) -> None:
    index = UnitIndex()
    raw: dict[str, UltraServerState] = {}
    for op in sequence:
        apply(index, raw, op)
    for reqs in rounds:
        before = index.snapshot()
        full = plan(list(raw.values()), reqs)
        assert plan_on(index, reqs) == full
        assert index.snapshot() == before
        # Stopping at a request gives the same decisions up to it (FIFO: later requests
        # cannot change earlier decisions).
        for at, decision in enumerate(full):
            assert plan_on(index, reqs, until=decision.workload_ref) == full[: at + 1]
        assert index.snapshot() == before


@settings(max_examples=100, deadline=None)
@given(ops(), st.sampled_from((1, 2, 4)), st.integers(1, 3))
def test_plan_replacement_on_a_kept_index_matches_and_leaves_it_unchanged(
    sequence: list[Op], size: int, count: int
) -> None:
    index = UnitIndex()
    raw: dict[str, UltraServerState] = {}
    for op in sequence:
        apply(index, raw, op)
    request = Request("ns/w1", T1, size, count, ("", "ns/w1"))
    [first] = plan(list(raw.values()), [replace(request, server_count=1)])
    if first.units is None:
        return
    unit = replace(first.units[0], index=0)
    before = index.snapshot()
    servers = list(raw.values())
    for keep, failed in (([unit], []), ([], [unit])):
        assert plan_replacement_on(index, request, keep, failed) == plan_replacement(
            servers, request, keep, failed
        )
        assert index.snapshot() == before


# --------------------------------------------------------------------------------------------
# ServerCache: NUS objects → states, one object at a time


def nus_object(name: str, nodes: list[tuple[str, int, str]], allocs: list[Any]) -> Any:
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {
            "instanceType": T1,
            "topology": [
                {"nodeName": n, "nodeId": i, "linkStatusHorizontal": link} for n, i, link in nodes
            ],
        },
        "status": {"allocations": allocs},
    }


@st.composite
def nus_objects(draw: st.DrawFn) -> tuple[str, Any]:
    name = draw(st.sampled_from(NAMES[:3]))
    pool = [f"{name}-n{i}" for i in range(4)] + ["x0"]
    nodes = [
        (n, i, draw(st.sampled_from(("Up", "Up", "Down"))))
        for i, n in enumerate(draw(st.lists(st.sampled_from(pool), max_size=5, unique=True)))
    ]
    allocs = [
        {"workloadRef": draw(st.sampled_from(("ns/w1", "ns/w2"))), "allocatedNodes": held}
        for held in draw(st.lists(st.lists(st.sampled_from([*pool, "a-n0"]), max_size=3)))
    ]
    return name, nus_object(name, nodes, allocs)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("put"), nus_objects()),
            st.tuples(st.just("gone"), st.sampled_from(NAMES[:3])),
            st.tuples(st.just("sick"), st.sampled_from(["a-n0", "b-n1", "x0", "c-n3"])),
        ),
        max_size=20,
    )
)
def test_server_cache_follows_servers_from_and_reports_exactly_what_changed(
    sequence: list[tuple[str, Any]],
) -> None:
    health: dict[str, bool] = {}
    objects: dict[str, Any] = {}
    cache = ServerCache(lambda n: health.get(n, True))
    index = UnitIndex()
    for kind, arg in sequence:
        if kind == "put":
            name, obj = arg
            objects[name] = obj
            cache.put(name, obj)
        elif kind == "gone":
            objects.pop(arg, None)
            cache.put(arg, None)
        else:
            health[arg] = not health.get(arg, True)
            cache.node_changed(arg)
        before = {s.name: s for s in cache.servers()}
        changes = cache.changes()
        after = {s.name: s for s in cache.servers()}
        # Reported: exactly the states that differ (by value), and only those objects moved.
        assert dict(changes) == {
            n: after.get(n) for n in before.keys() | after.keys() if before.get(n) != after.get(n)
        }
        assert all(after[n] is before[n] for n in after if n in before and n not in dict(changes))
        everyone = {n: health.get(n, True) for o in objects.values() for n in _members(o)}
        assert cache.servers() == servers_from(objects.values(), node_health=everyone)
        for name, state in changes:
            if state is None:
                index.remove(name)
            else:
                index.set(state)
        assert index.snapshot() == UnitIndex(cache.servers()).snapshot()


def _members(obj: Any) -> list[str]:
    return [t["nodeName"] for t in obj["spec"]["topology"]]


# --------------------------------------------------------------------------------------------
# StoreChanges


def _obj(name: str, rv: str, node: str | None = None, ns: str | None = None) -> Any:
    meta: dict[str, Any] = {"name": name, "resourceVersion": rv}
    if ns:
        meta["namespace"] = ns
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}}


def test_store_changes_sees_adds_updates_relists_and_removals() -> None:
    store = Store()
    store.apply_event("ADDED", _obj("early", "1", ns="x"))
    changes = StoreChanges(store)
    assert changes.drain() == {"x/early"}  # what is there when it starts counts as changed
    assert changes.drain() == set()
    store.apply_event("ADDED", _obj("a", "2", ns="x"))
    store.apply_event("MODIFIED", _obj("early", "3", ns="x"))
    store.apply_event("MODIFIED", _obj("early", "3", ns="x"))  # same rv: not stored again
    assert changes.drain() == {"x/a", "x/early"}
    store.apply_event("DELETED", _obj("a", "4", ns="x"))
    store.apply_event("ADDED", _obj("b", "5", ns="x"))  # same size as before: still found
    assert changes.drain() == {"x/a", "x/b"}
    store.replace([_obj("b", "5", ns="x"), _obj("c", "6", ns="x")], "6")  # relist
    assert changes.drain() == {"x/early", "x/c"}
    assert changes.drain() == set()


def test_store_changes_projects_slices_to_their_nodes() -> None:
    store = Store()
    changes = StoreChanges(store, lambda o: (o.get("spec") or {}).get("nodeName"))
    store.apply_event("ADDED", _obj("s1", "1", node="n1"))
    store.apply_event("ADDED", _obj("s2", "2"))  # no node: nothing to report
    assert changes.drain() == {"n1"}
    store.apply_event("MODIFIED", _obj("s1", "3", node="n2"))  # moved: both nodes affected
    assert changes.drain() == {"n1", "n2"}
    store.apply_event("DELETED", _obj("s1", "4", node="n2"))
    assert changes.drain() == {"n2"}
