"""Store: keys, indexes, watch events and relist diffs."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from neuron_dra.common.k8s.cache import Store, label_index, namespace_index


def obj(name: str, rv: str, ns: str | None = None, node: str | None = None, **labels: str) -> Any:
    meta: dict[str, Any] = {"name": name, "resourceVersion": rv}
    if ns:
        meta["namespace"] = ns
    if labels:
        meta["labels"] = labels
    o: dict[str, Any] = {"metadata": meta, "spec": {}}
    if node:
        o["spec"]["nodeName"] = node
    return o


def by_node(o: dict[str, Any]) -> list[str]:
    n = o["spec"].get("nodeName")
    return [n] if n else []


def test_keys_namespaced_and_cluster_scoped() -> None:
    s = Store()
    s.apply_event("ADDED", obj("a", "1", ns="ns1"))
    s.apply_event("ADDED", obj("n1", "2"))
    assert sorted(s.keys()) == ["n1", "ns1/a"]
    assert s.get_by_name("a", "ns1") is s.get("ns1/a")
    assert s.get_by_name("n1") is not None
    assert s.resource_version == "2"


def test_events_produce_deltas_and_share_objects() -> None:
    s = Store()
    a1 = obj("a", "1")
    d = s.apply_event("ADDED", a1)
    assert d is not None and d.type == "add" and d.new is a1 and d.old is None
    assert s.get("a") is a1, "store keeps the object itself; no copies"
    assert s.apply_event("MODIFIED", obj("a", "1")) is None, "same RV: nothing changed"
    a2 = obj("a", "2")
    d = s.apply_event("MODIFIED", a2)
    assert d is not None and d.type == "update" and d.old is a1 and d.new is a2
    d = s.apply_event("ADDED", obj("a", "3"))
    assert d is not None and d.type == "update", "ADDED for a known key is an update"
    final = obj("a", "4")
    d = s.apply_event("DELETED", final)
    assert d is not None and d.type == "delete" and d.old is final and d.object is final
    assert s.apply_event("DELETED", obj("a", "5")) is None, "unknown object"
    assert s.resource_version == "5"
    d = s.apply_event("MODIFIED", obj("b", "6"))
    assert d is not None and d.type == "add", "MODIFIED for an unknown key is an add"


def test_bookmark_moves_rv_only() -> None:
    s = Store()
    s.apply_event("ADDED", obj("a", "1"))
    assert s.apply_event("BOOKMARK", {"metadata": {"resourceVersion": "9"}}) is None
    assert s.resource_version == "9" and len(s) == 1


def test_unknown_event_type() -> None:
    with pytest.raises(ValueError):
        Store().apply_event("ERROR", obj("a", "1"))


def test_indexes_follow_updates_and_deletes() -> None:
    s = Store()
    s.apply_event("ADDED", obj("s1", "1", node="n1"))
    s.add_index("node", by_node)  # indexes existing objects too
    s.add_index("ns", namespace_index)
    s.apply_event("ADDED", obj("s2", "2", node="n1"))
    s.apply_event("ADDED", obj("s3", "3", node="n2"))
    assert [o["metadata"]["name"] for o in s.by_index("node", "n1")] == ["s1", "s2"]
    s.apply_event("MODIFIED", obj("s2", "4", node="n2"))
    assert s.index_keys("node", "n1") == ["s1"]
    assert s.index_keys("node", "n2") == ["s2", "s3"]
    s.apply_event("DELETED", obj("s1", "5", node="n1"))
    assert s.by_index("node", "n1") == []
    assert s.index_values("node") == ["n2"], "empty index buckets are dropped"
    with pytest.raises(KeyError):
        s.by_index("nope", "x")
    with pytest.raises(ValueError):
        s.add_index("node", by_node)


def test_multi_valued_index_and_label_index() -> None:
    s = Store()
    s.add_index("tags", lambda o: o["spec"].get("tags", []))
    s.add_index("app", label_index("app"))
    o = obj("a", "1", app="x")
    o["spec"]["tags"] = ["t1", "t2", "t1"]
    s.apply_event("ADDED", o)
    assert s.index_keys("tags", "t1") == ["a"] and s.index_keys("tags", "t2") == ["a"]
    assert s.index_keys("app", "x") == ["a"]


def test_replace_reports_adds_updates_and_deletes_from_a_gap() -> None:
    s = Store()
    s.add_index("node", by_node)
    for o in [obj("keep", "1", node="n"), obj("change", "2", node="n"), obj("gone", "3")]:
        s.apply_event("ADDED", o)
    deltas = s.replace(
        [obj("keep", "1", node="n"), obj("change", "7", node="m"), obj("new", "8")], "9"
    )
    summary = sorted((d.type, d.key) for d in deltas)
    assert summary == [("add", "new"), ("delete", "gone"), ("update", "change")]
    assert s.resource_version == "9"
    assert s.index_keys("node", "m") == ["change"] and s.index_keys("node", "n") == ["keep"]
    assert "gone" not in s


def test_synced_flag() -> None:
    s = Store()
    assert not s.has_synced()
    s.replace([], "1")
    assert not s.has_synced(), "the reflector decides when a store is synced"
    s.mark_synced()
    assert s.has_synced()


names = st.sampled_from([f"o{i}" for i in range(8)])
snapshots = st.dictionaries(names, st.integers(1, 5), max_size=8)


@given(before=snapshots, after=snapshots)
def test_replace_diff_property(before: dict[str, int], after: dict[str, int]) -> None:
    """Applying the deltas of replace() to the old state yields the new state, and only
    objects whose RV changed are reported as updates."""
    s = Store()
    s.add_index("rv", lambda o: [o["metadata"]["resourceVersion"]])
    s.replace([obj(n, str(v)) for n, v in before.items()], "1")
    view = {n: str(v) for n, v in before.items()}
    for d in s.replace([obj(n, str(v)) for n, v in after.items()], "2"):
        if d.type == "delete":
            del view[d.key]
        else:
            assert d.new is not None
            if d.type == "update":
                assert view[d.key] != d.new["metadata"]["resourceVersion"]
            view[d.key] = d.new["metadata"]["resourceVersion"]
    assert view == {n: str(v) for n, v in after.items()}
    for n, v in after.items():
        assert n in s.index_keys("rv", str(v))
    assert sum(len(s.index_keys("rv", v)) for v in s.index_values("rv")) == len(after)
