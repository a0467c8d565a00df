"""The controller's protobuf path (``protoslim``, ``SlimListClient`` with a codec) against the
JSON path, on the fake API server and on the real kube-apiserver of every pinned minor.

On a real server, Nodes and ResourceSlices come in protobuf; decoded straight into the slim
form, every LIST page and every watch event must equal ``slim_*`` of the server's JSON for
the same object (the trimmed schema keeps the upstream field numbers; the converters follow
the JSON encoder's rules). The fake speaks JSON only: the same client must then take the JSON
path and give the same answer.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from neuron_dra.common.k8s.client import (
    JSON,
    NODES,
    PROTOBUF,
    RESOURCE_SLICES,
    ApiResource,
    FramedWatchStream,
    KubeClient,
    WatchEvent,
)
from neuron_dra.common.k8s.errors import NotFoundError
from neuron_dra.controller.caches import ACCEPT_PROTOBUF, SlimListClient, slim_node, slim_slice
from neuron_dra.controller.protoslim import NODE_CODEC, SLICE_CODEC, SlimCodec
from neuron_dra.sim.fakeapi.server import FakeAPIServer
from neuron_dra.sim.worlds import minor_of, real_control_plane, world_params
from pluginslices import trn2u_slices

T = 10  # per-call timeout, seconds
LABEL = "neuron-dra.test/protobuf"


@pytest.fixture(params=world_params())
def world(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def kube(world: str) -> AsyncIterator[KubeClient]:
    minor = minor_of(world)
    if minor is None:
        server = FakeAPIServer()
        async with server, k8s.ApiClient(server.client_configuration()) as client:
            yield KubeClient(client)
        return
    cp = real_control_plane(minor)
    async with k8s.ApiClient(cp.client_configuration()) as client:
        yield KubeClient(client)


@pytest.fixture
def run_id() -> str:
    return f"pb-{uuid.uuid4().hex[:8]}"


def node(name: str, run_id: str, *, exotic: bool = False) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {LABEL: run_id, "node.kubernetes.io/instance-type": "trn2u.48xlarge"},
            "annotations": {"note": "dropped by the slim form"},
        },
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasMemory"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"},
            ],
            "capacity": {"cpu": "192"},
        },
    }
    if exotic:
        obj["metadata"]["finalizers"] = ["neuron-dra.test/keep"]
        obj["spec"] = {
            "podCIDR": "10.1.0.0/24",
            "podCIDRs": ["10.1.0.0/24"],
            "providerID": f"aws:///us-west-2a/{name}",
            "unschedulable": True,
            "taints": [
                {"key": "a", "value": "b", "effect": "NoSchedule"},
                {"key": "c", "effect": "NoExecute", "timeAdded": "2026-11-25T10:00:00Z"},
            ],
        }
    return obj


def plugin_slices(node_name: str, node_uid: str, run_id: str) -> list[dict[str, Any]]:
    """The node plugin's own slices of a trn2u.48xlarge node of an UltraServer."""
    out = trn2u_slices(
        node_name, node_uid, node_id_4=1, unhealthy=(3,), workload_ids={"node": "wl-1"}
    )
    for s in out:
        s["metadata"].setdefault("labels", {})[LABEL] = run_id
    return out


def exotic_slices(run_id: str) -> list[dict[str, Any]]:
    """Slices with the fields our plugin never sets: per-device node selection, consumable
    capacity, a device without attributes, and (on a slice of their own, as 1.35+ requires)
    shared counters with no devices."""
    term = {"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]}
    pool = {"name": f"{run_id}-pool", "generation": 3, "resourceSliceCount": 2}
    meta = {"labels": {LABEL: run_id}}
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{run_id}-exotic", **meta},
            "spec": {
                "driver": "neuron.aws.com",
                "pool": pool,
                "perDeviceNodeSelection": True,
                "devices": [
                    {
                        "name": "a",
                        "attributes": {"instanceType": {"string": "x"}, "other": {"bool": True}},
                        "capacity": {"mem": {"value": "1Gi"}},
                        "nodeSelector": {"nodeSelectorTerms": [term]},
                        "allowMultipleAllocations": True,
                    },
                    {"name": "b", "allNodes": True, "capacity": {"mem": {"value": "1Gi"}}},
                    {
                        "name": "c",
                        "nodeName": "somewhere",
                        "attributes": {"v": {"version": "1.2.3"}, "healthy": {"bool": False}},
                    },
                ],
            },
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{run_id}-counters", **meta},
            "spec": {
                "driver": "neuron.aws.com",
                "pool": pool,
                "allNodes": True,
                "sharedCounters": [{"name": "cs", "counters": {"mem": {"value": "64Gi"}}}],
            },
        },
    ]


async def _create(kube: KubeClient, res: ApiResource, obj: dict[str, Any]) -> dict[str, Any]:
    return await kube.resource(res).create(obj, request_timeout=T)


async def _fleet(kube: KubeClient, run_id: str) -> dict[ApiResource, int]:
    """Two Nodes, the plugin's slices of one and an exotic slice: how many of each."""
    n1 = await _create(kube, NODES, node(f"{run_id}-n1", run_id))
    await _create(kube, NODES, node(f"{run_id}-n2", run_id, exotic=True))
    slices = plugin_slices(n1["metadata"]["name"], n1["metadata"]["uid"], run_id)
    for s in [*slices, *exotic_slices(run_id)]:
        await _create(kube, RESOURCE_SLICES, s)
    return {NODES: 2, RESOURCE_SLICES: len(slices) + 2}


async def _cleanup(kube: KubeClient, run_id: str) -> None:
    for res in (RESOURCE_SLICES, NODES):
        rc = kube.resource(res)
        for obj in (await rc.list_all(label_selector=f"{LABEL}={run_id}")).items:
            name = obj["metadata"]["name"]
            if obj["metadata"].get("finalizers"):
                await rc.merge_patch(name, {"metadata": {"finalizers": None}})
            await rc.delete(name, request_timeout=T)


CASES = [(RESOURCE_SLICES, SLICE_CODEC, slim_slice), (NODES, NODE_CODEC, slim_node)]


def _versions(page: dict[str, Any]) -> list[tuple[str, str]]:
    return [(o["metadata"]["name"], o["metadata"]["resourceVersion"]) for o in page["items"]]


@pytest.mark.parametrize(("res", "codec", "slim"), CASES, ids=["slices", "nodes"])
async def test_list_in_protobuf_equals_the_json_path(
    kube: KubeClient, world: str, run_id: str, res: ApiResource, codec: SlimCodec, slim: Any
) -> None:
    created = await _fleet(kube, run_id)
    try:
        selector = f"{LABEL}={run_id}"
        path, query = kube.resource(res).list_request(label_selector=selector)
        raw = await kube.request_raw(path, query=query, accept=ACCEPT_PROTOBUF)
        assert raw.content_type == (JSON if minor_of(world) is None else PROTOBUF)
        proto_client = SlimListClient(kube, res, slim, codec)
        for _ in range(20):  # the controller-manager may touch a Node between the two LISTs
            by_json = await kube.resource(res).list(label_selector=selector, request_timeout=T)
            by_proto = await proto_client.list(label_selector=selector, request_timeout=T)
            if _versions(by_json) == _versions(by_proto):
                break
        assert len(by_proto["items"]) == created[res]
        assert by_proto["items"] == [slim(o) for o in by_json["items"]]
        assert {k: by_proto[k] for k in ("apiVersion", "kind")} == {
            k: by_json[k] for k in ("apiVersion", "kind")
        }
        assert by_proto["metadata"].keys() == by_json["metadata"].keys()
        # Paged: the continue token and the pages come through too.
        all_items = await proto_client.list_all(label_selector=selector, page_size=2)
        assert sorted(o["metadata"]["name"] for o in all_items.items) == sorted(
            o["metadata"]["name"] for o in by_json["items"]
        )
    finally:
        await _cleanup(kube, run_id)


async def _events(stream: Any, until: str) -> list[WatchEvent]:
    """Events (bookmarks aside) until the DELETED event of ``until``."""
    out: list[WatchEvent] = []
    async with asyncio.timeout(30), stream:
        async for ev in stream:
            if ev.type == "BOOKMARK":
                continue
            out.append(ev)
            if ev.type == "DELETED" and ev.object["metadata"]["name"] == until:
                return out
    raise AssertionError(f"watch ended before {until} was deleted")


@pytest.mark.parametrize(("res", "codec", "slim"), CASES, ids=["slices", "nodes"])
async def test_watch_in_protobuf_equals_the_json_path(
    kube: KubeClient, world: str, run_id: str, res: ApiResource, codec: SlimCodec, slim: Any
) -> None:
    selector = f"{LABEL}={run_id}"
    rv = (await kube.resource(res).list(label_selector=selector))["metadata"]["resourceVersion"]
    json_watch = await kube.resource(res).watch(
        resource_version=rv, label_selector=selector, timeout_seconds=60
    )
    proto_watch = await SlimListClient(kube, res, slim, codec).watch(
        resource_version=rv, label_selector=selector, timeout_seconds=60
    )
    assert isinstance(proto_watch, FramedWatchStream) == (minor_of(world) is not None)
    await _fleet(kube, run_id)
    victim = f"{run_id}-n2" if res is NODES else f"{run_id}-exotic"
    rc = kube.resource(res)
    await rc.merge_patch(victim, {"metadata": {"labels": {"changed": "yes"}}})
    if res is NODES:
        await rc.merge_patch(victim, {"metadata": {"finalizers": None}})
    await rc.delete(victim, request_timeout=T)
    try:
        by_json, by_proto = await asyncio.gather(
            _events(json_watch, victim), _events(proto_watch, victim)
        )
        assert [e.type for e in by_proto] == [e.type for e in by_json]
        assert {"ADDED", "MODIFIED", "DELETED"} <= {e.type for e in by_proto}
        # A JSON answer (the fake) is slimmed by the store; a protobuf one arrives slim.
        real = minor_of(world) is not None
        assert [e.object if real else slim(e.object) for e in by_proto] == [
            slim(e.object) for e in by_json
        ]
        assert by_proto[0].object["kind"] == res.kind
        assert by_proto[0].object["apiVersion"] == res.api_version
    finally:
        await _cleanup(kube, run_id)


async def test_a_protobuf_error_is_typed_with_its_status(kube: KubeClient) -> None:
    path = RESOURCE_SLICES.path(None, "no-such-slice")
    with pytest.raises(NotFoundError) as err:
        await kube.request_raw(
            path, accept=ACCEPT_PROTOBUF, status_decoder=SLICE_CODEC.decode_status
        )
    assert err.value.reason == "NotFound"
    assert "no-such-slice" in str(err.value)
