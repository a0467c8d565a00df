"""The protobuf decoders of the controller's slim caches (``protoslim``) and the framed watch
stream, without a server: frames and bodies are built with the trimmed schema itself (same
field numbers as upstream). Real servers' output is compared with the JSON path in
tests/contract/test_protobuf_contract.py."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import aiohttp
import pytest
from neuron_dra.common.k8s.client import FramedWatchStream
from neuron_dra.common.k8s.errors import GoneError, NetworkError
from neuron_dra.controller.caches import slim_node, slim_slice
from neuron_dra.controller.protoslim import (
    MAGIC,
    NODE_CODEC,
    SLICE_CODEC,
    ProtobufDecodeError,
    decode_status,
)
from neuron_dra.proto.k8s import slim_pb2 as pb

T0 = 1_764_000_000  # 2025-11-24T16:00:00Z
T0_JSON = "2025-11-24T16:00:00Z"


def envelope(kind: str, api_version: str, raw: bytes) -> bytes:
    unknown = pb.Unknown(typeMeta=pb.TypeMeta(apiVersion=api_version, kind=kind), raw=raw)
    return MAGIC + unknown.SerializeToString()


def entry(key: str, **value: Any) -> bytes:
    return pb.DeviceAttributeEntry(key=key, value=pb.DeviceAttribute(**value)).SerializeToString()


def value_first_entry(key: str, **value: Any) -> bytes:
    """An entry with its value before its key: valid protobuf, not what Go writes."""
    v = pb.DeviceAttributeEntry(value=pb.DeviceAttribute(**value)).SerializeToString()
    return v + pb.DeviceAttributeEntry(key=key).SerializeToString()


def exotic_slice() -> pb.ResourceSlice:
    req = pb.NodeSelectorRequirement(key="k", operator="In", values=["v"])
    field = pb.NodeSelectorRequirement(key="metadata.name", operator="In", values=["n"])
    return pb.ResourceSlice(
        metadata=pb.ObjectMeta(
            name="s",
            uid="u",
            resourceVersion="7",
            generation=2,
            creationTimestamp=pb.Time(seconds=T0),
            labels={"a": "b"},
            annotations={"c": "d"},
            ownerReferences=[
                pb.OwnerReference(apiVersion="v1", kind="Node", name="n", uid="nu", controller=True)
            ],
        ),
        spec=pb.ResourceSliceSpec(
            driver="neuron.aws.com",
            pool=pb.ResourcePool(name="p", generation=0, resourceSliceCount=1),
            perDeviceNodeSelection=True,
            sharedCounters=[
                pb.CounterSet(
                    name="cs", counters={"mem": pb.Counter(value=pb.Quantity(string="1Gi"))}
                )
            ],
            devices=[
                pb.Device(
                    name="d0",
                    attributes=[
                        entry("deviceId", int=0),  # not read
                        entry("healthy", bool=True),
                        value_first_entry("instanceType", string="trn2u.48xlarge"),
                        entry("neuron.aws.com/workloadId", string="w"),
                    ],
                    consumesCounters=[
                        pb.DeviceCounterConsumption(
                            counterSet="cs",
                            counters={"mem": pb.Counter(value=pb.Quantity(string="512Mi"))},
                        )
                    ],
                    nodeSelector=pb.NodeSelector(
                        nodeSelectorTerms=[
                            pb.NodeSelectorTerm(matchExpressions=[req], matchFields=[field])
                        ]
                    ),
                    taints=[
                        pb.DeviceTaint(key="t", effect="NoSchedule", timeAdded=pb.Time(seconds=T0)),
                        pb.DeviceTaint(key="u", value="x", effect="NoExecute"),
                    ],
                    bindsToNode=False,
                    bindingConditions=["ready"],
                    bindingFailureConditions=["failed"],
                    allowMultipleAllocations=True,
                ),
                pb.Device(name="d1", allNodes=True),
            ],
        ),
    )


#: exotic_slice() as kube-apiserver's JSON writes it (capacity and unread attributes aside).
EXOTIC_JSON: dict[str, Any] = {
    "metadata": {
        "name": "s",
        "uid": "u",
        "resourceVersion": "7",
        "generation": 2,
        "creationTimestamp": T0_JSON,
        "labels": {"a": "b"},
        "annotations": {"c": "d"},
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "nu", "controller": True}
        ],
        "managedFields": [{"manager": "x"}],
    },
    "spec": {
        "driver": "neuron.aws.com",
        "pool": {"name": "p", "generation": 0, "resourceSliceCount": 1},
        "perDeviceNodeSelection": True,
        "sharedCounters": [{"name": "cs", "counters": {"mem": {"value": "1Gi"}}}],
        "devices": [
            {
                "name": "d0",
                "attributes": {
                    "deviceId": {"int": 0},
                    "healthy": {"bool": True},
                    "instanceType": {"string": "trn2u.48xlarge"},
                    "neuron.aws.com/workloadId": {"string": "w"},
                },
                "capacity": {"mem": {"value": "1Gi"}},
                "consumesCounters": [{"counterSet": "cs", "counters": {"mem": {"value": "512Mi"}}}],
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}],
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": ["n"]}
                            ],
                        }
                    ]
                },
                "taints": [
                    {"key": "t", "effect": "NoSchedule", "timeAdded": T0_JSON},
                    {"key": "u", "value": "x", "effect": "NoExecute"},
                ],
                "bindsToNode": False,
                "bindingConditions": ["ready"],
                "bindingFailureConditions": ["failed"],
                "allowMultipleAllocations": True,
            },
            {"name": "d1", "allNodes": True, "capacity": {"mem": {"value": "1Gi"}}},
        ],
    },
}


def test_a_slice_list_decodes_to_the_slim_form_of_its_json() -> None:
    page = pb.ResourceSliceList(
        metadata=pb.ListMeta(resourceVersion="9", remainingItemCount=3),
        items=[exotic_slice()],
    )
    out = SLICE_CODEC.decode_list(
        envelope("ResourceSliceList", "resource.k8s.io/v1", page.SerializeToString())
    )
    assert out["kind"] == "ResourceSliceList"
    assert out["metadata"] == {"resourceVersion": "9", "remainingItemCount": 3}
    assert out["items"] == [slim_slice(EXOTIC_JSON)]
    # Shared with the JSON path's maps: one map per distinct set of attributes read.
    assert (
        out["items"][0]["spec"]["devices"][0]["attributes"]
        is slim_slice(EXOTIC_JSON)["spec"]["devices"][0]["attributes"]
    )


def test_zero_time_empty_lists_and_unset_pointers_follow_the_json_encoder() -> None:
    msg = pb.ResourceSlice(
        metadata=pb.ObjectMeta(name="s", creationTimestamp=pb.Time()),
        spec=pb.ResourceSliceSpec(driver="d", pool=pb.ResourcePool(name="p")),
    )
    event = pb.WatchEvent(
        type="ADDED",
        object=pb.RawExtension(
            raw=envelope("ResourceSlice", "resource.k8s.io/v1", msg.SerializeToString())
        ),
    )
    ev_type, obj = SLICE_CODEC.decode_event(event.SerializeToString())
    assert ev_type == "ADDED"
    assert obj == {
        "kind": "ResourceSlice",
        "apiVersion": "resource.k8s.io/v1",
        "metadata": {"name": "s", "creationTimestamp": None},
        "spec": {"driver": "d", "pool": {"name": "p", "generation": 0, "resourceSliceCount": 0}},
    }
    # 1.34's JSON says "devices": null, 1.35+ leaves it out: the slim form leaves it out.
    assert slim_slice({**obj, "spec": {**obj["spec"], "devices": None}}) == obj


def test_a_node_decodes_to_the_slim_form_of_its_json() -> None:
    node = pb.Node(
        metadata=pb.NodeObjectMeta(
            name="n", resourceVersion="3", creationTimestamp=pb.Time(seconds=T0)
        ),
        spec=pb.NodeSpec(
            podCIDR="10.0.0.0/24",
            podCIDRs=["10.0.0.0/24"],
            providerID="aws:///x",
            unschedulable=True,
            taints=[pb.Taint(key="k", effect="NoExecute", timeAdded=pb.Time(seconds=T0))],
            externalID="e",
        ),
        status=pb.NodeStatus(
            conditions=[
                pb.NodeCondition(type="MemoryPressure", status="False"),
                pb.NodeCondition(
                    type="Ready",
                    status="True",
                    lastHeartbeatTime=pb.Time(),
                    lastTransitionTime=pb.Time(seconds=T0),
                    reason="KubeletReady",
                ),
            ]
        ),
    )
    page = pb.NodeList(metadata=pb.ListMeta(resourceVersion="5", **{"continue": "c"}), items=[node])
    out = NODE_CODEC.decode_list(envelope("NodeList", "v1", page.SerializeToString()))
    as_json = {
        "metadata": {
            "name": "n",
            "resourceVersion": "3",
            "creationTimestamp": T0_JSON,
            "annotations": {"big": "x"},
        },
        "spec": {
            "podCIDR": "10.0.0.0/24",
            "podCIDRs": ["10.0.0.0/24"],
            "providerID": "aws:///x",
            "unschedulable": True,
            "taints": [{"key": "k", "effect": "NoExecute", "timeAdded": T0_JSON}],
            "externalID": "e",
        },
        "status": {
            "capacity": {"cpu": "1"},
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "lastHeartbeatTime": None},
                {
                    "type": "Ready",
                    "status": "True",
                    "lastHeartbeatTime": None,
                    "lastTransitionTime": T0_JSON,
                    "reason": "KubeletReady",
                },
            ],
        },
    }
    assert out["metadata"] == {"resourceVersion": "5", "continue": "c"}
    assert out["items"] == [slim_node(as_json)]


def test_bad_bodies_are_decode_errors() -> None:
    with pytest.raises(ProtobufDecodeError, match="magic"):
        SLICE_CODEC.decode_list(b'{"kind": "ResourceSliceList"}')
    with pytest.raises(ProtobufDecodeError, match="corrupt"):
        SLICE_CODEC.decode_list(MAGIC + b"\xff\xff\xff")
    gz = pb.Unknown(raw=b"x", contentEncoding="gzip").SerializeToString()
    with pytest.raises(ProtobufDecodeError, match="encoding"):
        SLICE_CODEC.decode_list(MAGIC + gz)


def status(code: int, reason: str, message: str, retry: int = 0) -> bytes:
    details = pb.StatusDetails(retryAfterSeconds=retry) if retry else None
    s = pb.Status(status="Failure", code=code, reason=reason, message=message, details=details)
    return envelope("Status", "v1", s.SerializeToString())


def test_a_status_decodes_to_what_the_typed_errors_read() -> None:
    assert decode_status(status(429, "TooManyRequests", "slow down", retry=3)) == {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": "slow down",
        "reason": "TooManyRequests",
        "code": 429,
        "details": {"retryAfterSeconds": 3},
    }


# --- the framed watch stream --------------------------------------------------------------


class _Content:
    def __init__(self, data: bytes) -> None:
        self.data = data

    async def readexactly(self, n: int) -> bytes:
        if len(self.data) < n:
            partial, self.data = self.data, b""
            raise asyncio.IncompleteReadError(partial, n)
        out, self.data = self.data[:n], self.data[n:]
        return out


class _Response:
    def __init__(self, data: bytes) -> None:
        self.content = _Content(data)
        self.closed = False

    def close(self) -> None:
        self.closed = True


def frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def event_frame(ev_type: str, kind: str, raw: bytes) -> bytes:
    obj = envelope(kind, "resource.k8s.io/v1" if kind != "Status" else "v1", raw)
    return frame(pb.WatchEvent(type=ev_type, object=pb.RawExtension(raw=obj)).SerializeToString())


def stream(data: bytes, max_frame: int = 1 << 20) -> tuple[FramedWatchStream, _Response]:
    resp = _Response(data)
    return (
        FramedWatchStream(cast(aiohttp.ClientResponse, resp), max_frame, SLICE_CODEC.decode_event),
        resp,
    )


async def test_frames_become_events_until_a_clean_end() -> None:
    raw = exotic_slice().SerializeToString()
    s, resp = stream(
        event_frame("ADDED", "ResourceSlice", raw) + event_frame("DELETED", "ResourceSlice", raw)
    )
    events = [ev async for ev in s]
    assert [e.type for e in events] == ["ADDED", "DELETED"]
    assert events[0].object == {
        "kind": "ResourceSlice",
        "apiVersion": "resource.k8s.io/v1",
        **slim_slice(EXOTIC_JSON),
    }
    assert resp.closed


async def test_an_error_event_raises_its_typed_error() -> None:
    gone = pb.Status(code=410, reason="Expired", message="too old resource version")
    s, _ = stream(event_frame("ERROR", "Status", gone.SerializeToString()))
    with pytest.raises(GoneError, match="too old"):
        await anext(s)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x00\x00", "StreamError"),  # a cut length
        (frame(b"abc")[:5], "StreamError"),  # a cut frame
        (frame(b"\xff" * 10), "MalformedEvent"),
        (frame(b"x" * 100), "LineTooLong"),
    ],
    ids=["cut-length", "cut-frame", "garbage", "too-large"],
)
async def test_a_broken_stream_is_a_network_error(data: bytes, reason: str) -> None:
    s, _ = stream(data, max_frame=64)
    with pytest.raises(NetworkError) as err:
        await anext(s)
    assert err.value.reason == reason
