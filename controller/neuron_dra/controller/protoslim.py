"""ResourceSlices and Nodes read in the protobuf encoding, decoded straight into their slim
cache form (:func:`~.caches.slim_slice`, :func:`~.caches.slim_node`).

At fleet scale, decoding the JSON of every slice was the largest part of a restart (the
slices of 20,000 nodes are ~300 MB of JSON; docs/performance.md). The API server serves
built-in kinds in protobuf too; the schema here (``neuron_dra/proto/k8s/slim.proto``) holds
only the fields the slim caches keep, so the C decoder skips the rest (managedFields, device
capacities, a Node's status and annotations) without creating a Python object for them.

Wire format (checked against kube-apiserver 1.34, tests/contract/test_protobuf_contract.py):

- a body (a LIST page, an error's ``Status``) is the magic ``k8s\\0`` followed by a
  ``runtime.Unknown`` whose ``typeMeta`` names the kind and whose ``raw`` is the object;
- a watch (``Content-Type: application/vnd.kubernetes.protobuf;stream=watch``) is a sequence
  of frames, each a 4-byte big-endian length and a ``metav1.WatchEvent`` *without* envelope,
  whose ``object.raw`` is an enveloped object as above (so it names its own kind).

Every converter yields exactly the dict that ``json.loads`` of the server's JSON followed by
the slim function yields (a test compares both on a real server's objects): the JSON
encoder's rules are followed field by field: ``omitempty`` strings, numbers and lists are left
out when empty, pointer fields when unset, non-pointer ``metav1.Time`` is ``null`` when zero,
non-``omitempty`` lists are ``null`` when empty (a slice's ``devices`` excepted: 1.35 made it
``omitempty``, and the slim form leaves it out either way).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from typing import Any, Final, NamedTuple

from google.protobuf.message import DecodeError
from neuron_dra.proto.k8s import slim_pb2 as pb

from .caches import ABSENT, SLICE_ATTRIBUTES_READ, SlimDevice, slim_attributes

JsonDict = dict[str, Any]

#: What every protobuf-encoded Kubernetes object starts with.
MAGIC: Final = b"k8s\x00"


class ProtobufDecodeError(ValueError):
    """A protobuf body or frame that is not what the API server sends."""


class Envelope(NamedTuple):
    api_version: str
    kind: str
    raw: bytes


def unwrap(body: bytes) -> Envelope:
    """The kind and the encoded object of an enveloped body (``k8s\\0`` + ``Unknown``)."""
    if not body.startswith(MAGIC):
        raise ProtobufDecodeError(f"no protobuf magic: {body[:16]!r}")
    unknown = pb.Unknown()
    try:
        unknown.ParseFromString(body[len(MAGIC) :])
    except DecodeError as exc:
        raise ProtobufDecodeError(f"corrupt protobuf envelope: {exc}") from exc
    if unknown.contentEncoding:
        raise ProtobufDecodeError(f"unsupported content encoding {unknown.contentEncoding!r}")
    return Envelope(unknown.typeMeta.apiVersion, unknown.typeMeta.kind, unknown.raw)


def _parse(message: Any, raw: bytes, what: str) -> Any:
    try:
        message.ParseFromString(raw)
    except DecodeError as exc:
        raise ProtobufDecodeError(f"corrupt {what}: {exc}") from exc
    return message


# --- the JSON encoder's rules ------------------------------------------------------------------


#: Recent times' text: objects made in the same second (a fleet's slices, its Nodes) share
#: one string. Bounded: emptied when full.
_TIMES: dict[int, str] = {}
_TIMES_MAX: Final = 4096


def _time(t: Any) -> str | None:
    """A ``metav1.Time`` as JSON writes it: RFC 3339 in UTC, whole seconds; ``None`` (JSON
    ``null``) for the zero time, which protobuf sends as an empty message."""
    if not t.HasField("seconds"):
        return None
    seconds = t.seconds
    text = _TIMES.get(seconds)
    if text is None:
        if len(_TIMES) >= _TIMES_MAX:
            _TIMES.clear()
        text = _TIMES[seconds] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
    return text


def _owner_reference(o: Any) -> JsonDict:
    # The owner of our slices is their Node: its name is interned, one string with the
    # slice's nodeName and pool name and the cached Node's name.
    out: JsonDict = {
        "apiVersion": sys.intern(o.apiVersion),
        "kind": sys.intern(o.kind),
        "name": sys.intern(o.name),
        "uid": o.uid,
    }
    if o.HasField("controller"):
        out["controller"] = o.controller
    if o.HasField("blockOwnerDeletion"):
        out["blockOwnerDeletion"] = o.blockOwnerDeletion
    return out


def _object_meta(m: Any, *, annotations: bool) -> JsonDict:
    """ObjectMeta without managedFields (and without annotations unless ``annotations``)."""
    out: JsonDict = {}
    for name in ("name", "generateName", "namespace", "selfLink", "uid", "resourceVersion"):
        value = getattr(m, name)
        if value:
            out[name] = value
    if m.generation:
        out["generation"] = m.generation
    out["creationTimestamp"] = _time(m.creationTimestamp)
    if m.HasField("deletionTimestamp"):
        out["deletionTimestamp"] = _time(m.deletionTimestamp)
    if m.HasField("deletionGracePeriodSeconds"):
        out["deletionGracePeriodSeconds"] = m.deletionGracePeriodSeconds
    if m.labels:
        # Interned: label keys and most values (instance type, zone) repeat on every node.
        out["labels"] = {sys.intern(k): sys.intern(v) for k, v in m.labels.items()}
    if annotations and m.annotations:
        out["annotations"] = dict(m.annotations)
    if m.ownerReferences:
        out["ownerReferences"] = [_owner_reference(o) for o in m.ownerReferences]
    if m.finalizers:
        out["finalizers"] = list(m.finalizers)
    return out


def _list_meta(m: Any) -> JsonDict:
    out: JsonDict = {}
    for name in ("selfLink", "resourceVersion", "continue"):
        value = getattr(m, name)
        if value:
            out[name] = value
    if m.HasField("remainingItemCount"):
        out["remainingItemCount"] = m.remainingItemCount
    return out


def _requirement(r: Any) -> JsonDict:
    out: JsonDict = {"key": r.key, "operator": r.operator}
    if r.values:
        out["values"] = list(r.values)
    return out


def _node_selector(s: Any) -> JsonDict:
    terms: list[JsonDict] = []
    for t in s.nodeSelectorTerms:
        term: JsonDict = {}
        if t.matchExpressions:
            term["matchExpressions"] = [_requirement(r) for r in t.matchExpressions]
        if t.matchFields:
            term["matchFields"] = [_requirement(r) for r in t.matchFields]
        terms.append(term)
    return {"nodeSelectorTerms": terms or None}


def _taint(t: Any) -> JsonDict:
    """A ``core/v1`` Taint or a ``resource/v1`` DeviceTaint (the same four fields)."""
    out: JsonDict = {"key": t.key}
    if t.value:
        out["value"] = t.value
    out["effect"] = t.effect
    if t.HasField("timeAdded"):
        out["timeAdded"] = _time(t.timeAdded)
    return out


def _counters(counters: Any) -> JsonDict:
    return {name: {"value": c.value.string} for name, c in counters.items()}


# --- ResourceSlice -----------------------------------------------------------------------------


def _attribute(a: Any) -> JsonDict:
    out: JsonDict = {}
    if a.HasField("int"):
        out["int"] = a.int
    if a.HasField("bool"):
        out["bool"] = a.bool
    if a.HasField("string"):
        out["string"] = a.string
    if a.HasField("version"):
        out["version"] = a.version
    return out


#: Each distinct set of read attribute entries (their bytes, in wire order) -> its shared
#: slim map, while one LIST page or watch event is decoded (the devices of a node, and of
#: an UltraServer's nodes, mostly share one). Emptied after each: held for longer, its keys
#: would cost ~0.5 KiB per node; the maps themselves stay shared by ``slim_attributes``.
_MAPS: dict[tuple[bytes, ...], Any] = {}

#: The names read, as the bytes an attribute map entry starts with after its tag and length.
_READ_KEYS: Final = frozenset(k.encode() for k in SLICE_ATTRIBUTES_READ)


def _entry(raw: bytes) -> tuple[str, JsonDict]:
    e = _parse(pb.DeviceAttributeEntry(), raw, "device attribute")
    return e.key, _attribute(e.value)


def _attributes(entries: Iterable[bytes]) -> dict[str, Any]:
    """The slim attribute map of a device's attribute entries, shared. Go writes a map's
    entries sorted by key, the order of the JSON encoder's keys: the map made here equals,
    and is keyed as, the JSON path's."""
    # Go writes an entry as the key's tag (0x0a), its length and the key, then the value. A
    # key's length takes one byte below 128, and every name we read is shorter; a longer key
    # (a longer length byte) slices to something that is not a name we read, as it should.
    read = tuple(
        [
            e
            for e in entries
            if (
                e[2 : 2 + e[1]] in _READ_KEYS
                if e[:1] == b"\n"
                else _entry(e)[0] in SLICE_ATTRIBUTES_READ
            )
        ]
    )
    shared = _MAPS.get(read)
    if shared is None:
        shared = _MAPS[read] = slim_attributes(dict(_entry(e) for e in read))
    return shared


def _consumes(value: Iterable[Any]) -> list[JsonDict]:
    return [
        {"counterSet": c.counterSet} | ({"counters": _counters(c.counters)} if c.counters else {})
        for c in value
    ]


def _same(value: Any) -> Any:
    return value


#: Device fields other than name (1) and attributes (2), by number: the JSON form of each.
#: Only fields present on the wire are visited (``ListFields``): a device carries few.
_DEVICE_FIELDS: Final[dict[int, Any]] = {
    4: _consumes,
    5: _same,  # nodeName
    6: _node_selector,
    7: _same,  # allNodes
    8: lambda taints: [_taint(t) for t in taints],
    9: _same,  # bindsToNode
    10: list,  # bindingConditions
    11: list,  # bindingFailureConditions
    12: _same,  # allowMultipleAllocations
}


def _device(d: Any) -> SlimDevice:
    """A device as :func:`~.caches.slim_slice` keeps it: no capacity, only the attributes
    read (one shared map), the name interned."""
    attributes: Any = ABSENT
    rest: JsonDict = {}
    for field, value in d.ListFields():
        number = field.number
        if number == 2:
            attributes = _attributes(value)
        elif number != 1:
            rest[field.name] = _DEVICE_FIELDS[number](value)
    return SlimDevice(sys.intern(d.name), attributes, rest)


def _slice_spec(s: Any) -> JsonDict:
    pool = s.pool
    out: JsonDict = {
        "driver": sys.intern(s.driver),
        "pool": {
            "name": sys.intern(pool.name),
            "generation": pool.generation,
            "resourceSliceCount": pool.resourceSliceCount,
        },
    }
    if s.HasField("nodeName"):
        out["nodeName"] = sys.intern(s.nodeName)
    if s.HasField("nodeSelector"):
        out["nodeSelector"] = _node_selector(s.nodeSelector)
    if s.HasField("allNodes"):
        out["allNodes"] = s.allNodes
    if s.devices:  # none: left out (as slim_slice does with 1.34's null)
        out["devices"] = [_device(d) for d in s.devices]
    if s.HasField("perDeviceNodeSelection"):
        out["perDeviceNodeSelection"] = s.perDeviceNodeSelection
    if s.sharedCounters:
        out["sharedCounters"] = [
            {"name": c.name} | ({"counters": _counters(c.counters)} if c.counters else {})
            for c in s.sharedCounters
        ]
    return out


def slim_slice_of(msg: Any) -> JsonDict:
    """A decoded ``ResourceSlice`` message as :func:`~.caches.slim_slice` of its JSON
    (without ``apiVersion``/``kind``, as a LIST item)."""
    return {"metadata": _object_meta(msg.metadata, annotations=True), "spec": _slice_spec(msg.spec)}


# --- Node --------------------------------------------------------------------------------------


def _node_spec(s: Any) -> JsonDict:
    out: JsonDict = {}
    if s.podCIDR:
        out["podCIDR"] = s.podCIDR
    if s.podCIDRs:
        out["podCIDRs"] = list(s.podCIDRs)
    if s.providerID:
        out["providerID"] = s.providerID
    if s.unschedulable:
        out["unschedulable"] = True
    if s.taints:
        out["taints"] = [_taint(t) for t in s.taints]
    if s.externalID:
        out["externalID"] = s.externalID
    return out


def _ready_conditions(conditions: Iterable[Any]) -> list[JsonDict]:
    ready: list[JsonDict] = []
    for c in conditions:
        if c.type != "Ready":
            continue
        out: JsonDict = {
            "type": sys.intern(c.type),
            "status": sys.intern(c.status),
            "lastHeartbeatTime": _time(c.lastHeartbeatTime),
            "lastTransitionTime": _time(c.lastTransitionTime),
        }
        # The same few on every Ready node ("KubeletReady", "kubelet is posting ...").
        if c.reason:
            out["reason"] = sys.intern(c.reason)
        if c.message:
            out["message"] = sys.intern(c.message)
        ready.append(out)
    return ready


def slim_node_of(msg: Any) -> JsonDict:
    """A decoded ``Node`` message as :func:`~.caches.slim_node` of its JSON (without
    ``apiVersion``/``kind``, as a LIST item)."""
    meta = _object_meta(msg.metadata, annotations=False)
    if "name" in meta:
        meta["name"] = sys.intern(meta["name"])
    return {
        "metadata": meta,
        "spec": _node_spec(msg.spec),
        "status": {"conditions": _ready_conditions(msg.status.conditions)},
    }


# --- codecs: one per kind ----------------------------------------------------------------------


def decode_status(body: bytes) -> JsonDict:
    """An enveloped ``metav1.Status`` (an error response, a watch ``ERROR`` event's object) as
    the fields the typed errors read."""
    env = unwrap(body)
    return _status_of(env)


def _status_of(env: Envelope) -> JsonDict:
    s = _parse(pb.Status(), env.raw, "Status")
    out: JsonDict = {"kind": env.kind or "Status", "apiVersion": env.api_version or "v1"}
    for name in ("status", "message", "reason"):
        value = getattr(s, name)
        if value:
            out[name] = value
    if s.code:
        out["code"] = s.code
    if s.details.retryAfterSeconds:
        out["details"] = {"retryAfterSeconds": s.details.retryAfterSeconds}
    return out


class SlimCodec:
    """Decodes one kind's LIST pages and watch frames into slim dicts."""

    def __init__(self, message: type[Any], list_message: type[Any], slim: Any) -> None:
        self._message = message
        self._list_message = list_message
        self._slim = slim

    def decode_list(self, body: bytes) -> JsonDict:
        """A LIST page (``k8s\\0`` + ``Unknown`` of a ``…List``) as its JSON form with slim
        items."""
        env = unwrap(body)
        page = _parse(self._list_message(), env.raw, env.kind or "list")
        try:
            items = [self._slim(item) for item in page.items]
        finally:
            _MAPS.clear()
        return {
            "apiVersion": env.api_version,
            "kind": env.kind,
            "metadata": _list_meta(page.metadata),
            "items": items,
        }

    def decode_event(self, frame: bytes) -> tuple[str, JsonDict]:
        """One watch frame: the event type and its object (slim; a ``Status`` dict for
        ``ERROR``), with ``apiVersion`` and ``kind`` as in a JSON watch."""
        event = _parse(pb.WatchEvent(), frame, "watch event")
        env = unwrap(event.object.raw)
        if event.type == "ERROR":
            return event.type, _status_of(env)
        try:
            obj = self._slim(_parse(self._message(), env.raw, env.kind or "object"))
        finally:
            _MAPS.clear()
        return event.type, {"kind": env.kind, "apiVersion": env.api_version} | obj

    def decode_status(self, body: bytes) -> JsonDict:
        return decode_status(body)


SLICE_CODEC: Final = SlimCodec(pb.ResourceSlice, pb.ResourceSliceList, slim_slice_of)
NODE_CODEC: Final = SlimCodec(pb.Node, pb.NodeList, slim_node_of)
