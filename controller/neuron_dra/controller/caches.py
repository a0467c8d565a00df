"""The controller's slim caches of ResourceSlices and Nodes: only what it reads, shared.

At fleet scale the slices and Nodes are most of the controller's memory (docs/performance.md,
"controller at scale"): a full trn2u.48xlarge slice parses to ~90 KiB and a real Node's
status and annotations dwarf the little the controller reads. So every slice is cut down to
its devices' names and the attributes in :data:`SLICE_ATTRIBUTES_READ` (equal attribute maps
and values shared between devices and nodes, device names interned), every Node to its
metadata, spec and Ready condition, and LIST pages are slimmed as they arrive so a relist
never holds more than one page of full objects. Cached objects are never modified in place,
which is what makes the sharing safe.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Final, Protocol

from neuron_dra.common.constants import (
    ATTR_HEALTHY,
    ATTR_INSTANCE_TYPE,
    ATTR_ULTRASERVER_ID,
    ATTR_ULTRASERVER_MODES,
    ATTR_ULTRASERVER_NODE_ID,
    ATTR_WORKLOAD_ID,
    ATTRIBUTE_DOMAIN,
    DRIVER_NAME,
    LABEL_WORKLOAD_ID,
)
from neuron_dra.common.k8s.cache import Delta, Store
from neuron_dra.common.k8s.client import (
    JSON,
    PROTOBUF,
    ApiResource,
    KubeClient,
    ResourceClient,
    WatchStream,
    decode_json,
)
from neuron_dra.common.k8s.errors import NetworkError

JsonDict = dict[str, Any]

#: Device attributes the controller reads (discovery and the workload reconciler), under
#: either spelling. Everything else a slice carries (capacity, topology and group ids, versions)
#: is the scheduler's business.
SLICE_ATTRIBUTES_READ: Final = frozenset(
    name
    for attr in (
        ATTR_INSTANCE_TYPE,
        ATTR_ULTRASERVER_ID,
        ATTR_ULTRASERVER_NODE_ID,
        ATTR_ULTRASERVER_MODES,
        ATTR_HEALTHY,
        ATTR_WORKLOAD_ID,
    )
    for name in (attr, f"{ATTRIBUTE_DOMAIN}/{attr}")
)


class _SharedAttributes(dict[str, Any]):
    """An attribute map that every cached device with the same one shares (weakly held, so
    a map no cached device uses any more is freed)."""

    __slots__ = ("__weakref__",)


#: Every distinct slim attribute map in the cache, once. The 16 devices of a node carry the
#: same five attributes, so a fleet of 20,000 nodes holds a few tens of thousands of maps
#: instead of 340,000. Cached objects are never modified in place, which makes sharing safe.
_SHARED_ATTRIBUTES: weakref.WeakValueDictionary[tuple[Any, ...], _SharedAttributes] = (
    weakref.WeakValueDictionary()
)
_SHARED_VALUES: weakref.WeakValueDictionary[tuple[Any, ...], _SharedAttributes] = (
    weakref.WeakValueDictionary()
)


def _shared(
    cache: weakref.WeakValueDictionary[Any, _SharedAttributes], key: Any, value: Any
) -> Any:
    """The one ``_SharedAttributes`` equal to ``value`` (a dict), keyed by ``key``."""
    shared = cache.get(key)
    if shared is None:
        shared = _SharedAttributes(value)
        cache[key] = shared
    return shared


def slim_attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes of ``SLICE_ATTRIBUTES_READ`` in ``attributes``, as the one shared map
    equal to them (values shared too)."""
    kept: dict[str, Any] = {}
    parts: list[tuple[str, Any]] = []
    try:
        for k, v in attributes.items():
            if k in SLICE_ATTRIBUTES_READ:
                if isinstance(v, dict):
                    # The typed value ({"string": "trn2u.48xlarge"}, {"int": 0}) is shared
                    # too: most are equal on every node of the fleet.
                    vkey = tuple(v.items())
                    v = _shared(_SHARED_VALUES, vkey, v)
                    parts.append((k, vkey))
                else:
                    parts.append((k, v))
                kept[k] = v
        # Keyed in the order received: plugins publish a stable order, and another order
        # only costs a second map.
        return _shared(_SHARED_ATTRIBUTES, tuple(parts), kept)  # type: ignore[no-any-return]
    except TypeError:  # an unhashable (malformed) value: keep this map to itself
        return {k: v for k, v in attributes.items() if k in SLICE_ATTRIBUTES_READ}


#: A slot of :class:`SlimDevice` whose field the device does not have.
ABSENT: Final[Any] = object()


class SlimDevice(Mapping[str, Any]):
    """A cached device: its name and shared attribute map in two slots instead of a dict.

    A fleet of 20,000 nodes caches 340,000 devices; as two-key dicts they took ~65 MiB of
    the controller (184 bytes each, plus the collector's header), as slotted objects (56
    bytes) ~25 MiB. It reads as the JSON dict it stands for (a read-only ``Mapping``, equal to that
    dict), so the readers need not know. Other fields a device may carry (``nodeName``,
    ``taints``...) are kept in ``rest``, in the wire order after the name and attributes.
    """

    __slots__ = ("_attributes", "_name", "_rest")

    def __init__(
        self, name: Any = ABSENT, attributes: Any = ABSENT, rest: dict[str, Any] | None = None
    ) -> None:
        self._name = name
        self._attributes = attributes
        self._rest = rest or None

    def get(self, key: str, default: Any = None) -> Any:
        if key == "name":
            value = self._name
        elif key == "attributes":
            value = self._attributes
        else:
            return self._rest.get(key, default) if self._rest else default
        return default if value is ABSENT else value

    def __getitem__(self, key: str) -> Any:
        value = self.get(key, ABSENT)
        if value is ABSENT:
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[str]:
        if self._name is not ABSENT:
            yield "name"
        if self._attributes is not ABSENT:
            yield "attributes"
        if self._rest:
            yield from self._rest

    def __len__(self) -> int:
        return (
            (self._name is not ABSENT)
            + (self._attributes is not ABSENT)
            + (len(self._rest) if self._rest else 0)
        )

    def __repr__(self) -> str:
        return f"SlimDevice({dict(self)!r})"


def without_managed_fields(obj: JsonDict) -> JsonDict:
    """``obj`` without ``metadata.managedFields``: a NeuronUltraServer's are most of it (the
    field sets of its spec and status writes: 1,250 cached took 14.4 MiB with them, 5.6
    without, measured at 5,000 nodes), and the controller never reads them. A
    write of such an object keeps the server's managedFields (an update without any keeps
    the live object's)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def _already_slim(devices: list[Any], meta: Any) -> bool:
    if isinstance(meta, dict) and "managedFields" in meta:
        return False
    return all(isinstance(d, SlimDevice) for d in devices)


def slim_slice(obj: JsonDict) -> JsonDict:
    """``obj`` with each device cut down to its name and the attributes in
    ``SLICE_ATTRIBUTES_READ``, and without ``managedFields``.

    A trn2u.48xlarge slice has 17 devices of ~20 attributes and 2 capacities each; parsed, a
    full one takes ~90 KiB. Slim, with device names interned and equal attribute maps and
    values shared between devices (and nodes), it takes ~8 KiB. Malformed parts are passed
    through as they are (the readers are defensive about them).
    """
    spec = obj.get("spec")
    meta = obj.get("metadata")
    spec_devices = spec.get("devices") if isinstance(spec, dict) else None
    if isinstance(spec_devices, list) and _already_slim(spec_devices, meta):
        return obj  # the LIST pages are slimmed as they arrive; the store gets them again
    # Also of a slice without devices (one of shared counters only).
    out = dict(without_managed_fields(obj))
    if isinstance(spec, dict) and "devices" in spec and spec_devices is None:
        # No devices: ``null`` from a 1.34 server, left out by 1.35+ (``omitempty``); the
        # slim form leaves it out for both.
        out["spec"] = {k: v for k, v in spec.items() if k != "devices"}
    if not isinstance(spec, dict) or not isinstance(spec_devices, list):
        return out
    devices: list[Any] = []
    for device in spec_devices:
        attributes = device.get("attributes") if isinstance(device, dict) else None
        if not isinstance(device, dict) or (
            attributes is not None and not isinstance(attributes, dict)
        ):
            devices.append(device)
            continue
        # A device without attributes loses its capacity too (the protobuf path never
        # decodes capacities).
        name = device.get("name", ABSENT)
        devices.append(
            SlimDevice(
                sys.intern(name) if isinstance(name, str) else name,
                slim_attributes(attributes) if isinstance(attributes, dict) else ABSENT,
                {k: v for k, v in device.items() if k not in ("name", "attributes", "capacity")},
            )
        )
    out["spec"] = {**spec, "devices": devices}
    return out


def slim_node(obj: JsonDict) -> JsonDict:
    """A Node cut down to what the controller reads: its metadata (without ``managedFields``
    and annotations), spec, and the Ready condition. A real node's status (images, node
    info, addresses, capacity) and annotations are most of its size; at 20,000 nodes they
    would be most of the controller's memory."""
    meta = obj.get("metadata")
    status = obj.get("status")
    out = dict(obj)
    if isinstance(meta, dict):
        out["metadata"] = {
            k: v for k, v in meta.items() if k not in ("managedFields", "annotations")
        }
    if isinstance(status, dict):
        conditions = status.get("conditions")
        ready = (
            [c for c in conditions if isinstance(c, Mapping) and c.get("type") == "Ready"]
            if isinstance(conditions, list)
            else []
        )
        out["status"] = {"conditions": ready}
    return out


Slim = Callable[[JsonDict], JsonDict]


class SlimCodec(Protocol):
    """Decodes one kind's protobuf LIST pages and watch frames straight into the slim form
    (``neuron_dra.controller.protoslim``)."""

    def decode_list(self, body: bytes) -> JsonDict: ...

    def decode_event(self, frame: bytes) -> tuple[str, JsonDict]: ...

    def decode_status(self, body: bytes) -> JsonDict: ...


#: What the protobuf path asks for: protobuf, else JSON (the fake API server speaks only
#: JSON; a server answers CRDs in JSON). Every answer is decoded by its Content-Type.
ACCEPT_PROTOBUF: Final = f"{PROTOBUF}, {JSON}"


class SlimListClient(ResourceClient):
    """A client whose LIST pages come back cut down by ``slim``, so a relist of the fleet
    never holds more than one page of full objects (the store slims too, but only once the
    whole list has arrived).

    With ``codec``, LIST and WATCH ask for protobuf and a protobuf answer is decoded by it
    straight into the slim form, never into full dicts; a JSON answer takes the JSON path.
    """

    def __init__(
        self, kube: KubeClient, resource: ApiResource, slim: Slim, codec: SlimCodec | None = None
    ) -> None:
        super().__init__(kube, resource)
        self._slim = slim
        self._codec = codec

    async def list(
        self,
        namespace: str | None = None,
        *,
        request_timeout: float | None = None,
        **kwargs: Any,
    ) -> JsonDict:
        codec = self._codec
        if codec is None:
            page = await super().list(namespace, request_timeout=request_timeout, **kwargs)
        else:
            path, query = self.list_request(namespace, **kwargs)
            raw = await self.kube.request_raw(
                path,
                query=query,
                accept=ACCEPT_PROTOBUF,
                status_decoder=codec.decode_status,
                request_timeout=request_timeout,
            )
            if raw.content_type == PROTOBUF:
                try:
                    return codec.decode_list(raw.body)
                except ValueError as exc:
                    raise NetworkError(
                        f"GET {path}: bad protobuf: {exc}", reason="MalformedBody"
                    ) from exc
            page = decode_json(
                raw.body, f"GET {path}: {raw.content_type or 'response'}", reason="MalformedBody"
            )
        items = page.get("items")
        if isinstance(items, list):
            page["items"] = [self._slim(o) if isinstance(o, dict) else o for o in items]
        return page

    async def watch(
        self, namespace: str | None = None, *, timeout_seconds: int = 300, **kwargs: Any
    ) -> WatchStream:
        codec = self._codec
        if codec is None:
            return await super().watch(namespace, timeout_seconds=timeout_seconds, **kwargs)
        path, query = self.watch_request(namespace, timeout_seconds=timeout_seconds, **kwargs)
        return await self.kube.stream(
            path,
            query=query,
            server_timeout_seconds=float(timeout_seconds),
            accept=ACCEPT_PROTOBUF,
            frame_decoder=codec.decode_event,
            status_decoder=codec.decode_status,
        )


class SlimStore(Store):
    """A cache that stores ``slim(obj)`` of every object, so its size does not grow with
    fields the controller never reads. Handlers see the slim objects too."""

    def __init__(self, slim: Slim) -> None:
        super().__init__()
        self._slim = slim

    def apply_event(self, event_type: str, obj: JsonDict) -> Delta | None:
        if event_type in ("ADDED", "MODIFIED", "DELETED"):
            obj = self._slim(obj)
        return super().apply_event(event_type, obj)

    def replace(self, objs: Iterable[JsonDict], rv: str) -> list[Delta]:
        return super().replace((self._slim(o) for o in objs), rv)


def slim_claim(obj: JsonDict) -> JsonDict:
    """A ResourceClaim cut down to what tells the allocator a node is in use: its identity,
    its workload label, and ``neuronNodes``: the nodes where it holds devices of our driver
    (admin-access results hold none). The claim's spec and status go."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    assert isinstance(meta, dict)
    if "neuronNodes" in obj:
        return obj  # slimmed as its LIST page arrived
    labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
    assert isinstance(labels, dict)
    allocation = ((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}
    nodes = sorted(
        {
            sys.intern(str(r.get("pool")))
            for r in allocation.get("results") or []
            if isinstance(r, dict) and r.get("driver") == DRIVER_NAME and not r.get("adminAccess")
        }
    )
    kept_labels = {k: v for k, v in labels.items() if k == LABEL_WORKLOAD_ID}
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {
            k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta
        }
        | ({"labels": kept_labels} if kept_labels else {}),
        "neuronNodes": nodes,
    }


def claim_nodes_in_use(claim: Mapping[str, Any]) -> list[str]:
    """The nodes a (slim) claim keeps from UltraServer workloads: those where a claim of no
    workload holds our devices. A workload's own claims use the nodes it reserved."""
    labels = (claim.get("metadata") or {}).get("labels") or {}
    if labels.get(LABEL_WORKLOAD_ID):
        return []
    return [str(n) for n in claim.get("neuronNodes") or []]


class DeviceClaimStore(SlimStore):
    """Every ResourceClaim, as ``slim_claim``: where our devices are in use."""

    def __init__(self) -> None:
        super().__init__(slim_claim)


class UltraServerStore(SlimStore):
    """The controller's NeuronUltraServer cache (``without_managed_fields``)."""

    def __init__(self) -> None:
        super().__init__(without_managed_fields)


class SliceStore(SlimStore):
    """The controller's ResourceSlice cache (``slim_slice``)."""

    def __init__(self) -> None:
        super().__init__(slim_slice)


class NodeStore(SlimStore):
    """The controller's Node cache (``slim_node``)."""

    def __init__(self) -> None:
        super().__init__(slim_node)


# --- the slice cache's node index (discovery and the workload fleet both ask it) -------------

#: Index of ``ctx.slices``: node name -> our slices of that node.
SLICES_BY_NODE: Final = "slices/by-node"


def slice_node_name(slice_: Mapping[str, Any]) -> str | None:
    """The node a ResourceSlice of ours describes: its ``nodeName``, else its pool's name (pool
    name = node name is our publishing contract; README, "Devices and attributes")."""
    spec = slice_.get("spec") or {}
    name = spec.get("nodeName")
    if not isinstance(name, str) or not name:
        name = (spec.get("pool") or {}).get("name")
    return name if isinstance(name, str) and name else None


def _slice_nodes(obj: Mapping[str, Any]) -> list[str]:
    if (obj.get("spec") or {}).get("driver") != DRIVER_NAME:
        return []
    node = slice_node_name(obj)
    return [node] if node else []


def ensure_slices_by_node(store: Store) -> None:
    """Add :data:`SLICES_BY_NODE` to the slice cache unless it has it."""
    if SLICES_BY_NODE not in store.index_names():
        store.add_index(SLICES_BY_NODE, _slice_nodes)
