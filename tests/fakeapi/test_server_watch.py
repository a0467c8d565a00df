"""Watch semantics through kubernetes_asyncio's Watch helper.

Every wait is bounded by ``asyncio.timeout`` and driven by the stream itself; nothing
sleeps hoping an event has arrived.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client import ApiException
from neuron_dra.sim.fakeapi.server import FakeAPIServer

pytestmark = pytest.mark.asyncio

LIMIT = 10.0  # generous upper bound for any single wait; tests normally take milliseconds


def cm(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default", "labels": labels}}


async def collect(stream: Any, n: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(LIMIT):
        async for ev in stream:
            events.append(ev)
            if len(events) == n:
                break
    return events


def summary(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["raw_object"]["metadata"].get("name", "")) for e in events]


@pytest_asyncio.fixture
async def fast_bookmarks() -> AsyncIterator[FakeAPIServer]:
    async with FakeAPIServer(bookmark_interval=0.05) as server:
        yield server


async def test_resume_from_resource_version(
    kube_api_client: client.ApiClient, fake_apiserver: FakeAPIServer
) -> None:
    v1 = client.CoreV1Api(kube_api_client)
    fake_apiserver.create(cm("a"))
    rv = (await v1.list_namespaced_config_map("default")).metadata.resource_version
    fake_apiserver.create(cm("b"))
    fake_apiserver.patch("v1", "ConfigMap", "a", {"data": {"k": "v"}}, "default")
    fake_apiserver.delete("v1", "ConfigMap", "b", "default")
    async with watch.Watch() as w:
        events = await collect(
            w.stream(v1.list_namespaced_config_map, "default", resource_version=rv,
                     timeout_seconds=30), 3)
    assert summary(events) == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
    rvs = [int(e["raw_object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs) and rvs[0] > int(rv)


async def test_no_resource_version_replays_current_then_live(
    kube_api_client: client.ApiClient, fake_apiserver: FakeAPIServer
) -> None:
    v1 = client.CoreV1Api(kube_api_client)
    fake_apiserver.create(cm("a"))
    async with watch.Watch() as w:
        stream = w.stream(v1.list_namespaced_config_map, "default", timeout_seconds=30)
        first = await collect(stream, 1)
        assert summary(first) == [("ADDED", "a")]
        fake_apiserver.create(cm("b"))
        assert summary(await collect(stream, 1)) == [("ADDED", "b")]


async def test_bookmarks(kube_api_client: client.ApiClient,
                         fast_bookmarks: FakeAPIServer) -> None:
    async with client.ApiClient(fast_bookmarks.client_configuration()) as api:
        v1 = client.CoreV1Api(api)
        fast_bookmarks.create(cm("a"))
        async with watch.Watch() as w:
            events = await collect(
                w.stream(v1.list_namespaced_config_map, "default",
                         allow_watch_bookmarks=True, timeout_seconds=30), 3)
    assert events[0]["type"] == "ADDED"
    bookmarks = [e for e in events if e["type"] == "BOOKMARK"]
    assert bookmarks
    meta = bookmarks[0]["raw_object"]["metadata"]
    assert int(meta["resourceVersion"]) == fast_bookmarks.store.rv
    assert bookmarks[0]["raw_object"]["kind"] == "ConfigMap"


async def test_send_initial_events(kube_api_client: client.ApiClient,
                                   fake_apiserver: FakeAPIServer) -> None:
    v1 = client.CoreV1Api(kube_api_client)
    fake_apiserver.create(cm("a"))
    fake_apiserver.create(cm("b"))
    async with watch.Watch() as w:
        events = await collect(
            w.stream(v1.list_namespaced_config_map, "default", send_initial_events=True,
                     resource_version_match="NotOlderThan", allow_watch_bookmarks=True,
                     timeout_seconds=30), 3)
    assert summary(events[:2]) == [("ADDED", "a"), ("ADDED", "b")]
    end = events[2]
    assert end["type"] == "BOOKMARK"
    assert end["raw_object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


async def test_timeout_seconds_ends_stream(kube_api_client: client.ApiClient) -> None:
    v1 = client.CoreV1Api(kube_api_client)
    async with watch.Watch() as w, asyncio.timeout(LIMIT):
        events = [e async for e in w.stream(v1.list_namespaced_config_map, "default",
                                            timeout_seconds=1)]
    assert events == []


async def test_expired_resource_version_after_compaction(
    kube_api_client: client.ApiClient, fake_apiserver: FakeAPIServer
) -> None:
    v1 = client.CoreV1Api(kube_api_client)
    old_rv = (await v1.list_namespaced_config_map("default")).metadata.resource_version
    fake_apiserver.create(cm("a"))
    fake_apiserver.faults.compact()
    with pytest.raises(ApiException) as ei:
        async with watch.Watch() as w:
            await collect(w.stream(v1.list_namespaced_config_map, "default",
                                   resource_version=old_rv, timeout_seconds=30), 1)
    assert ei.value.status == 410
    # A fresh list gives a version that can be watched from again.
    new_rv = (await v1.list_namespaced_config_map("default")).metadata.resource_version
    fake_apiserver.create(cm("b"))
    async with watch.Watch() as w:
        events = await collect(w.stream(v1.list_namespaced_config_map, "default",
                                        resource_version=new_rv, timeout_seconds=30), 1)
    assert summary(events) == [("ADDED", "b")]


async def test_history_ring_buffer_expires_old_versions() -> None:
    async with FakeAPIServer(history_size=3) as server, client.ApiClient(
        server.client_configuration()
    ) as api:
        v1 = client.CoreV1Api(api)
        rv = (await v1.list_namespaced_config_map("default")).metadata.resource_version
        for i in range(4):
            server.create(cm(f"c{i}"))
        with pytest.raises(ApiException) as ei:
            async with watch.Watch() as w:
                await collect(w.stream(v1.list_namespaced_config_map, "default",
                                       resource_version=rv, timeout_seconds=30), 1)
        assert ei.value.status == 410


async def test_selector_transitions(kube_api_client: client.ApiClient,
                                    fake_apiserver: FakeAPIServer) -> None:
    v1 = client.CoreV1Api(kube_api_client)
    async with watch.Watch() as w:
        stream = w.stream(v1.list_namespaced_config_map, "default", label_selector="role=a",
                          timeout_seconds=30)
        fake_apiserver.create(cm("x", role="a"))
        fake_apiserver.create(cm("ignored", role="b"))
        assert summary(await collect(stream, 1)) == [("ADDED", "x")]
        fake_apiserver.patch("v1", "ConfigMap", "x", {"metadata": {"labels": {"role": "b"}}},
                             "default")
        assert summary(await collect(stream, 1)) == [("DELETED", "x")]
        fake_apiserver.patch("v1", "ConfigMap", "x", {"metadata": {"labels": {"role": "a"}}},
                             "default")
        assert summary(await collect(stream, 1)) == [("ADDED", "x")]
        fake_apiserver.delete("v1", "ConfigMap", "x", "default")
        assert summary(await collect(stream, 1)) == [("DELETED", "x")]


async def test_field_selector_watch_on_slices(kube_api_client: client.ApiClient,
                                              fake_apiserver: FakeAPIServer) -> None:
    res = client.ResourceV1Api(kube_api_client)

    def s(name: str, node: str) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": name},
                "spec": {"driver": "neuron.aws.com", "nodeName": node,
                         "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}}

    async with watch.Watch() as w:
        stream = w.stream(res.list_resource_slice, field_selector="spec.nodeName=n2",
                          timeout_seconds=30)
        fake_apiserver.create(s("s1", "n1"))
        fake_apiserver.create(s("s2", "n2"))
        events = await collect(stream, 1)
    assert summary(events) == [("ADDED", "s2")]
    assert events[0]["object"].spec.node_name == "n2"  # typed model deserialized


async def test_custom_object_watch(kube_api_client: client.ApiClient,
                                   fake_apiserver: FakeAPIServer) -> None:
    co = client.CustomObjectsApi(kube_api_client)
    async with watch.Watch() as w:
        stream = w.stream(co.list_namespaced_custom_object, "neuron.aws.com", "v1beta1",
                          "default", "neuronultraserverworkloads", timeout_seconds=30)
        fake_apiserver.create({
            "apiVersion": "neuron.aws.com/v1beta1", "kind": "NeuronUltraServerWorkload",
            "metadata": {"name": "w", "namespace": "default"},
            "spec": {"instanceType": "trn2u.48xlarge", "topologySize": 2, "serverCount": 1}})
        events = await collect(stream, 1)
    assert events[0]["type"] == "ADDED"
    assert events[0]["object"]["spec"]["allocationPolicy"]["failureStrategy"] == "NoOp"


async def _ends(stream: Any, trigger: Callable[[], Any]) -> list[dict[str, Any]]:
    """Consume ``stream`` to its end after ``trigger`` runs (once the stream is live)."""
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(LIMIT):
        async for ev in stream:
            events.append(ev)
            if len(events) == 1:
                trigger()
    return events


async def test_drop_watches_closes_streams(kube_api_client: client.ApiClient,
                                           fake_apiserver: FakeAPIServer) -> None:
    v1 = client.CoreV1Api(kube_api_client)
    fake_apiserver.create(cm("a"))
    async with watch.Watch() as w:
        events = await _ends(
            w.stream(v1.list_namespaced_config_map, "default", timeout_seconds=300),
            fake_apiserver.faults.drop_watches)
    assert summary(events) == [("ADDED", "a")]
    assert not list(fake_apiserver.store.watchers())


async def test_slow_watcher_is_closed_on_overflow() -> None:
    async with FakeAPIServer(watch_queue_size=5) as server, client.ApiClient(
        server.client_configuration()
    ) as api:
        v1 = client.CoreV1Api(api)
        server.create(cm("first"))

        def burst() -> None:
            # Synchronous writes: the watcher cannot drain in between, so its queue overflows.
            for i in range(20):
                server.create(cm(f"burst-{i}"))

        async with watch.Watch() as w:
            events = await _ends(
                w.stream(v1.list_namespaced_config_map, "default", timeout_seconds=300), burst)
        # The stream ended early instead of buffering without bound; the client resumes
        # from the last version it saw.
        assert len(events) < 21
