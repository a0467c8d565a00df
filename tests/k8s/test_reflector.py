"""Reflector against the fake API server: real HTTP lists and watches, injected faults.

Time for backoff and the staleness watchdog comes from a FakeClock, so nothing here waits on
wall-clock timers; waits are on the reflector's own progress (wait_until / wait_for) with a
generous safety timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from neuron_dra.common.k8s.cache import Store
from neuron_dra.common.k8s.client import CONFIG_MAPS, RESOURCE_SLICES, KubeClient
from neuron_dra.common.k8s.clock import FakeClock
from neuron_dra.common.k8s.reflector import Reflector, ReflectorMetrics
from neuron_dra.sim.fakeapi.faults import RequestInfo
from neuron_dra.sim.fakeapi.server import FakeAPIServer
from prometheus_client import CollectorRegistry

from .conftest import configmap, resource_slice

NS = "default"
SEL = "app=reflector-test"
WAIT = 10.0  # safety net only; every wait below is on an event


def cm(name: str, **data: str) -> dict[str, Any]:
    o = configmap(name, NS, **data)
    o["metadata"]["labels"] = {"app": "reflector-test"}
    return o


class Recorder:
    """Handler calls, in order, as (kind, name, data) tuples."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def add(self, obj: dict[str, Any]) -> None:
        self.calls.append(("add", obj["metadata"]["name"], obj.get("data")))

    async def update(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        await asyncio.sleep(0)  # async handlers are awaited in order too
        self.calls.append(("update", new["metadata"]["name"], (old.get("data"), new.get("data"))))

    def delete(self, obj: dict[str, Any]) -> None:
        self.calls.append(("delete", obj["metadata"]["name"], obj.get("data")))

    def names(self, kind: str) -> list[str]:
        return [n for k, n, _ in self.calls if k == kind]


class Harness:
    def __init__(self, server: FakeAPIServer, kube: KubeClient) -> None:
        self.server = server
        self.kube = kube
        self.clock = FakeClock()
        self.registry = CollectorRegistry()
        self.metrics = ReflectorMetrics(self.registry)
        self.rec = Recorder()
        self.reflectors: list[Reflector] = []

    def reflector(self, **kw: Any) -> Reflector:
        kw.setdefault("namespace", NS)
        kw.setdefault("label_selector", SEL)
        kw.setdefault("min_watch_duration", 0.0)
        r = Reflector(
            self.kube.resource(kw.pop("resource", CONFIG_MAPS)),
            name="cms",
            clock=self.clock,
            metrics=self.metrics,
            **kw,
        )
        r.add_handler(on_add=self.rec.add, on_update=self.rec.update, on_delete=self.rec.delete)
        self.reflectors.append(r)
        return r

    def metric(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, {"name": "cms", **labels})
        return value or 0.0

    async def until(self, r: Reflector, pred: Callable[[], bool]) -> None:
        await asyncio.wait_for(r.wait_until(pred), WAIT)


@pytest_asyncio.fixture
async def h(fake_apiserver: FakeAPIServer, kube: KubeClient) -> AsyncIterator[Harness]:
    harness = Harness(fake_apiserver, kube)
    yield harness
    for r in harness.reflectors:
        await r.stop()


async def started(r: Reflector) -> Reflector:
    r.start()
    await asyncio.wait_for(r.wait_for(lists=1, watches=1), WAIT)
    return r


async def test_paged_initial_list_and_sync(h: Harness) -> None:
    cms = h.kube.resource(CONFIG_MAPS)
    for i in range(7):
        await cms.create(cm(f"c{i}"))
    await cms.create(configmap("unlabelled", NS))
    lists_before = h.server.request_counts[("list", "configmaps")]
    r = h.reflector(page_size=3)
    assert not r.has_synced()
    r.start()
    await asyncio.wait_for(r.wait_synced(), WAIT)
    assert sorted(r.store.keys()) == [f"{NS}/c{i}" for i in range(7)]
    assert sorted(h.rec.names("add")) == [f"c{i}" for i in range(7)], "adds delivered by sync"
    assert h.server.request_counts[("list", "configmaps")] - lists_before == 3, "3 pages"
    assert h.metric("neuron_dra_reflector_lists_total") == 1


async def test_watch_add_update_delete_in_order(h: Harness) -> None:
    r = await started(h.reflector())
    cms = h.kube.resource(CONFIG_MAPS)
    await cms.create(cm("a", v="1"))
    await cms.merge_patch("a", {"data": {"v": "2"}}, NS)
    await cms.delete("a", NS)
    await cms.create(configmap("other", NS))  # filtered out by the label selector
    await cms.create(cm("b"))
    await h.until(r, lambda: "b" in h.rec.names("add"))
    assert h.rec.calls == [
        ("add", "a", {"v": "1"}),
        ("update", "a", ({"v": "1"}, {"v": "2"})),
        ("delete", "a", {"v": "2"}),
        ("add", "b", {}),
    ]
    assert list(r.store.keys()) == [f"{NS}/b"]
    assert h.metric("neuron_dra_reflector_lists_total") == 1, "no relist needed"


async def test_bookmarks_advance_rv_without_handler_calls() -> None:
    async with (
        FakeAPIServer(bookmark_interval=0.02) as server,
        client.ApiClient(server.client_configuration()) as api,
    ):
        h = Harness(server, KubeClient(api))
        r = await started(h.reflector())
        rv0 = int(r.store.resource_version)
        # A write to another kind moves the global RV; only a bookmark can tell us.
        await h.kube.resource(RESOURCE_SLICES).create(resource_slice("n1"))
        await h.until(r, lambda: int(r.store.resource_version) > rv0)
        assert h.rec.calls == []
        assert h.metric("neuron_dra_reflector_events_total", type="BOOKMARK") >= 1
        # The next watch resumes from the bookmarked RV.
        seen = server.request_counts[("list", "configmaps")]
        server.faults.drop_watches()
        await asyncio.wait_for(r.wait_for(watches=2), WAIT)
        assert server.request_counts[("list", "configmaps")] == seen
        await r.stop()


async def test_watch_drop_resumes_from_last_rv(h: Harness) -> None:
    r = await started(h.reflector())
    cms = h.kube.resource(CONFIG_MAPS)
    await cms.create(cm("before"))
    await h.until(r, lambda: "before" in h.rec.names("add"))
    h.server.faults.drop_watches()
    await cms.create(cm("after"))
    await h.until(r, lambda: "after" in h.rec.names("add"))
    await asyncio.wait_for(r.wait_for(watches=2), WAIT)
    assert h.rec.names("add") == ["before", "after"], "no duplicates, nothing lost"
    assert h.metric("neuron_dra_reflector_lists_total") == 1, "resumed, not relisted"
    assert h.metric("neuron_dra_reflector_watch_restarts_total", reason="end") >= 1


async def test_relist_after_410_reports_changes_made_during_gap(h: Harness) -> None:
    cms = h.kube.resource(CONFIG_MAPS)
    for name in ("keep", "change", "remove"):
        await cms.create(cm(name, v="1"))
    r = await started(h.reflector())
    assert len(r.store) == 3
    h.rec.calls.clear()

    # Synchronously (no await, so the reflector cannot run in between): cut the watch, change
    # things while nobody watches, and forget history so the resume RV is expired.
    h.server.faults.drop_watches()
    h.server.delete("v1", "ConfigMap", "remove", NS)
    changed = h.server.get("v1", "ConfigMap", "change", NS)
    assert changed is not None
    changed["data"] = {"v": "2"}
    h.server.update(changed)
    h.server.create(cm("new", v="1"))
    h.server.faults.compact()

    await h.until(r, lambda: r.lists_done >= 2 and r.watches_started >= 2)
    assert sorted((k, n) for k, n, _ in h.rec.calls) == [
        ("add", "new"),
        ("delete", "remove"),
        ("update", "change"),
    ]
    assert ("update", "change", ({"v": "1"}, {"v": "2"})) in h.rec.calls
    assert sorted(r.store.keys()) == [f"{NS}/change", f"{NS}/keep", f"{NS}/new"]
    assert h.metric("neuron_dra_reflector_relists_total", reason="gone") == 1

    # And the new watch works.
    await cms.create(cm("later"))
    await h.until(r, lambda: "later" in h.rec.names("add"))


async def test_expired_continue_token_restarts_list(h: Harness) -> None:
    cms = h.kube.resource(CONFIG_MAPS)
    for i in range(6):
        await cms.create(cm(f"p{i}"))
    seen: list[RequestInfo] = []

    def expire_token_before_page_2(req: RequestInfo) -> bool:
        if req.verb == "list" and req.resource == "configmaps":
            seen.append(req)
            if len(seen) == 2:
                # Just before page 2 is served (faults are consulted first), a write plus
                # compaction expires page 1's continue token.
                h.server.create(cm("late"))
                h.server.faults.compact()
        return False  # never fail the request itself

    h.server.faults.fail_next(1, 500, predicate=expire_token_before_page_2)
    # list_all is what the reflector lists with; called directly there is no watch that
    # could deliver "late" and hide a missing restart.
    result = await cms.list_all(NS, label_selector=SEL, page_size=2)
    h.server.faults.clear()
    names = sorted(o["metadata"]["name"] for o in result.items)
    assert names == sorted([f"p{i}" for i in range(6)] + ["late"])
    assert len(seen) == 3, "page 1, the expired page 2, then one unpaged list"
    assert int(result.resource_version) >= h.server.store.rv


async def test_staleness_watchdog_rewatches(h: Harness) -> None:
    # The shared fixture's server sends bookmarks every second of *wall* time, but the
    # watchdog runs on the fake clock, which only moves when we say so.
    r = await started(h.reflector(stale_after=60.0))
    await asyncio.wait_for(h.clock.wait_for_sleepers(1), WAIT)  # the watchdog is armed
    await h.clock.advance(61)
    await asyncio.wait_for(r.wait_for(watches=2), WAIT)
    assert h.metric("neuron_dra_reflector_watch_restarts_total", reason="stale") == 1
    assert h.metric("neuron_dra_reflector_lists_total") == 1, "re-watch, not relist"
    await h.kube.resource(CONFIG_MAPS).create(cm("fresh"))
    await h.until(r, lambda: "fresh" in h.rec.names("add"))


async def test_list_errors_back_off_on_the_clock(h: Harness) -> None:
    h.server.faults.fail_next(2, 500, verb="list", resource="configmaps")
    r = h.reflector()
    r.start()
    await asyncio.wait_for(h.clock.wait_for_sleepers(1), WAIT)
    first = h.clock.next_deadline()
    assert first is not None and not r.has_synced()
    d1 = first - h.clock.now()
    await h.clock.advance(d1)
    await asyncio.wait_for(h.clock.wait_for_sleepers(1), WAIT)
    second = h.clock.next_deadline()
    assert second is not None
    d2 = second - h.clock.now()
    assert 0.8 <= d1 <= 1.2 and 1.6 <= d2 <= 2.4, "exponential backoff with jitter"
    await h.clock.advance(d2)
    await asyncio.wait_for(r.wait_synced(), WAIT)


async def test_short_empty_watches_back_off(h: Harness) -> None:
    r = h.reflector(min_watch_duration=1.0, stale_after=None)  # only backoff sleeps
    await started(r)
    # Each watch now ends at once without events (dropped); the clock does not move, so
    # every one is "short" and the reflector must back off instead of spinning.
    h.server.faults.drop_watches()
    await asyncio.wait_for(h.clock.wait_for_sleepers(1), WAIT)
    assert r.watches_started == 1
    await h.clock.advance(5)
    await asyncio.wait_for(r.wait_for(watches=2), WAIT)


async def test_watch_429_honours_retry_after(h: Harness) -> None:
    r = await started(h.reflector(stale_after=None))  # only backoff sleeps on the clock
    h.server.faults.fail_next(1, 429, verb="watch", resource="configmaps")
    h.server.faults.drop_watches()
    await asyncio.wait_for(h.clock.wait_for_sleepers(1), WAIT)
    deadline = h.clock.next_deadline()
    assert deadline is not None and deadline - h.clock.now() >= 1.0
    await h.clock.advance(deadline - h.clock.now())
    await asyncio.wait_for(r.wait_for(watches=2), WAIT)
    assert h.metric("neuron_dra_reflector_watch_restarts_total", reason="error") == 1


async def test_handler_errors_are_contained(h: Harness) -> None:
    r = h.reflector()
    boom: list[str] = []

    def bad(obj: dict[str, Any]) -> None:
        boom.append(obj["metadata"]["name"])
        raise RuntimeError("handler bug")

    r.add_handler(on_add=bad)
    await started(r)
    cms = h.kube.resource(CONFIG_MAPS)
    await cms.create(cm("x"))
    await cms.create(cm("y"))
    await h.until(r, lambda: h.rec.names("add") == ["x", "y"])
    assert boom == ["x", "y"]
    assert h.metric("neuron_dra_reflector_handler_errors_total") == 2


async def test_indexed_store_cluster_scoped(h: Harness) -> None:
    store = Store()
    store.add_index("node", lambda o: [o["spec"]["nodeName"]])
    r = h.reflector(resource=RESOURCE_SLICES, namespace=None, label_selector=None, store=store)
    await started(r)
    slices = h.kube.resource(RESOURCE_SLICES)
    await slices.create(resource_slice("n1", devices=128))
    await slices.create(resource_slice("n2"))
    await h.until(r, lambda: len(store) == 2)
    assert [o["metadata"]["name"] for o in store.by_index("node", "n1")] == ["n1-neuron.aws.com"]
    await slices.delete("n1-neuron.aws.com")
    await h.until(r, lambda: len(store) == 1)
    assert store.by_index("node", "n1") == []


async def test_stop_is_prompt_and_final(h: Harness) -> None:
    r = await started(h.reflector())
    task = r._task
    assert task is not None
    await asyncio.wait_for(r.stop(), WAIT)
    assert task.done()
    await h.kube.resource(CONFIG_MAPS).create(cm("after-stop"))
    assert "after-stop" not in h.rec.names("add")


@pytest.mark.parametrize("bad", [(0, 5), (10, 5)])
def test_rejects_bad_watch_timeouts(h: Harness, bad: tuple[int, int]) -> None:
    with pytest.raises(ValueError):
        h.reflector(watch_timeout_range=bad)


async def test_http_410_on_watch_request_relists(h: Harness) -> None:
    r = await started(h.reflector(stale_after=None))
    h.server.faults.fail_next(1, 410, verb="watch", resource="configmaps")
    h.server.faults.drop_watches()
    await h.until(r, lambda: r.lists_done >= 2 and r.watches_started >= 2)
    assert h.metric("neuron_dra_reflector_relists_total", reason="gone") == 1
    assert h.clock.sleepers == 0, "a 410 is answered by relisting, not by backing off"
