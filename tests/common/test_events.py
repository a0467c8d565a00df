"""Best-effort events.k8s.io/v1 Events from the kubelet plugin, against the fake API server."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone

import pytest_asyncio
from kubernetes_asyncio import client
from neuron_dra.common.events import (
    MAX_NOTE_BYTES,
    EventRecorder,
    EventType,
    ObjectRef,
    event_name,
    micro_time,
    truncate_utf8,
)
from neuron_dra.common.k8s.client import KubeClient
from neuron_dra.common.k8s.clock import FakeClock
from neuron_dra.sim.fakeapi.server import FakeAPIServer

NODE = "trn2-node-0"
CLAIM = ObjectRef.resource_claim("team-a", "pod0-neurons", "c1a1m-uid")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@pytest_asyncio.fixture
async def kube(kube_api_client: client.ApiClient) -> AsyncIterator[KubeClient]:
    yield KubeClient(kube_api_client)


def events(api: FakeAPIServer, namespace: str) -> list[dict]:  # type: ignore[type-arg]
    return api.list("events.k8s.io/v1", "Event", namespace)


def recorder(kube: KubeClient, clock: FakeClock, window: float = 60.0) -> EventRecorder:
    return EventRecorder(kube, reporting_instance=NODE, clock=clock, dedup_window=window)


async def test_event_fields(fake_apiserver: FakeAPIServer, kube: KubeClient) -> None:
    fake_apiserver.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
    clock = FakeClock(wall_start=datetime(2026, 5, 6, 7, 8, 9, 123456, tzinfo=UTC))
    written = await recorder(kube, clock).record(
        CLAIM,
        type_=EventType.WARNING,
        reason="PrepareFailed",
        note="bad config",
        action="Prepare",
    )
    assert written
    [ev] = events(fake_apiserver, "team-a")
    assert ev["metadata"]["name"].startswith("pod0-neurons.")
    assert ev["regarding"] == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "name": "pod0-neurons",
        "namespace": "team-a",
        "uid": "c1a1m-uid",
    }
    assert {k: ev[k] for k in ("reason", "note", "type", "action")} == {
        "reason": "PrepareFailed",
        "note": "bad config",
        "type": "Warning",
        "action": "Prepare",
    }
    assert ev["reportingController"] == "neuron.aws.com/kubelet-plugin"
    assert ev["reportingInstance"] == NODE
    assert ev["eventTime"] == "2026-05-06T07:08:09.123456Z"


async def test_node_events_go_to_default(fake_apiserver: FakeAPIServer, kube: KubeClient) -> None:
    rec = recorder(kube, FakeClock())
    await rec.record(
        ObjectRef.node(NODE, "node-uid"),
        type_=EventType.WARNING,
        reason="CheckpointReset",
        note="moved aside",
        action="Recover",
    )
    [ev] = events(fake_apiserver, "default")
    assert ev["regarding"] == {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "node-uid"}


async def test_duplicates_within_the_window_are_skipped(
    fake_apiserver: FakeAPIServer, kube: KubeClient
) -> None:
    clock = FakeClock()
    rec = recorder(kube, clock, window=60.0)
    node = ObjectRef.node(NODE)

    async def emit(note: str = "same", reason: str = "R") -> bool:
        return await rec.record(node, type_=EventType.WARNING, reason=reason, note=note, action="A")

    assert await emit()
    assert not await emit()  # kubelet retry of the same failure: no new Event
    assert await emit(note="different")
    assert await emit(reason="Other")
    await clock.advance(59.0)
    assert not await emit()
    await clock.advance(2.0)
    assert await emit()  # window over: the condition is still there, say so again
    assert len(events(fake_apiserver, "default")) == 4


async def test_api_failure_is_swallowed_and_not_remembered(
    fake_apiserver: FakeAPIServer, kube: KubeClient
) -> None:
    rec = recorder(kube, FakeClock())
    fake_apiserver.faults.fail_next(1, 500, verb="create", resource="events")
    args = dict(type_=EventType.NORMAL, reason="R", note="n", action="A")
    assert not await rec.record(ObjectRef.node(NODE), **args)  # type: ignore[arg-type]
    assert events(fake_apiserver, "default") == []
    # The lost event is not counted as sent: the next identical one is written.
    assert await rec.record(ObjectRef.node(NODE), **args)  # type: ignore[arg-type]
    assert len(events(fake_apiserver, "default")) == 1


async def test_missing_namespace_is_swallowed(kube: KubeClient) -> None:
    ref = ObjectRef.resource_claim("no-such-ns", "c", "u")
    assert not await recorder(kube, FakeClock()).record(
        ref, type_=EventType.WARNING, reason="R", note="n", action="A"
    )


async def test_long_note_is_truncated(fake_apiserver: FakeAPIServer, kube: KubeClient) -> None:
    note = "é" * 2000  # two bytes each
    await recorder(kube, FakeClock()).record(
        ObjectRef.node(NODE), type_=EventType.WARNING, reason="R", note=note, action="A"
    )
    [ev] = events(fake_apiserver, "default")
    assert len(ev["note"].encode()) <= MAX_NOTE_BYTES
    assert ev["note"].endswith("...")


def test_truncate_utf8_never_splits_a_character() -> None:
    assert truncate_utf8("short", 10) == "short"
    for n in range(4, 40):
        cut = truncate_utf8("ab€€€€€€€€€€€€€€", n)
        assert len(cut.encode()) <= n
        cut.encode().decode()


def test_event_name_is_a_valid_bounded_name() -> None:
    long = ObjectRef.node("a" * 250 + ".b")
    name = event_name(long, "0123456789abcdef")
    assert len(name) <= 253 and _DNS_SUBDOMAIN.fullmatch(name)
    assert event_name(ObjectRef.node("n1"), "ff") == "n1.ff"


def test_micro_time() -> None:
    ts = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    assert micro_time(ts) == "2026-01-02T01:04:05.000000Z"
