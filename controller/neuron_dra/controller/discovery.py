"""UltraServer discovery: ResourceSlices and Nodes -> NeuronUltraServer objects (DESIGN §3.6-3.7).

Each kubelet plugin publishes its node's ResourceSlice with ``ultraserverId`` and
``ultraserverNodeId`` attributes; this reconciler groups the nodes by UltraServer id and keeps
one ``NeuronUltraServer`` (NUS) per id in the driver namespace.

Ownership, because two reconcilers write the same objects:

- this module owns ``spec`` (instance type, topology) and the discovery fields of ``status``:
  ``state``, ``nodeCount``, ``allocatedNodeCount``, the ``Ready``/``Degraded`` conditions and
  ``observedGeneration``;
- ``status.allocations`` belongs to the workload reconciler. We read it (state and deletion
  depend on it) but never write it: every status write starts from the object we read and is
  guarded by its resourceVersion, so an allocation written meanwhile makes our write fail with
  409 and we recompute from the fresh object instead of overwriting it.

The module is split into pure decisions (grouping, naming, desired spec and status, condition
transitions) and :class:`UltraServerDiscovery`, which reads the caches and does the I/O. Pure
code never raises on malformed slices or Nodes: bad input becomes a *problem* that ends up in
the ``Degraded`` condition, because one broken plugin must not stop discovery of every other
UltraServer.

Write discipline (reference/anchors.md §6: status-write storms, stuck deletions): nothing is
written when the desired object equals the cached one, ``lastTransitionTime`` only moves when a
condition's status flips, and NUS objects carry no finalizer, so deleting one never hangs.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import re
import sys
import weakref
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final, Literal

from neuron_dra.common.constants import (
    ATTR_HEALTHY,
    ATTR_INSTANCE_TYPE,
    ATTR_ULTRASERVER_ID,
    ATTR_ULTRASERVER_MODES,
    ATTR_ULTRASERVER_NODE_ID,
    ATTR_WORKLOAD_ID,
    ATTRIBUTE_DOMAIN,
    CRD_API_VERSION,
    DRIVER_NAME,
    DRIVER_NAMESPACE,
    KIND_ULTRASERVER,
    NODE_DEVICE_NAME,
)
from neuron_dra.common.events import EventType, ObjectRef
from neuron_dra.common.k8s.cache import Delta, Store
from neuron_dra.common.k8s.client import (
    NEURON_ULTRASERVERS,
    ApiResource,
    KubeClient,
    ResourceClient,
)
from neuron_dra.common.k8s.errors import (
    AlreadyExistsError,
    ConflictError,
    NotFoundError,
    PermanentError,
)
from neuron_dra.common.k8s.writes import update_with_retry
from neuron_dra.common.models.crds import ULTRASERVER_MAX_NODES
from neuron_dra.common.names import DNS1123_SUBDOMAIN_RE

from .context import ControllerContext

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]
LinkStatus = Literal["Up", "Down", "Unknown"]

#: The raw UltraServer id of a NUS. Needed because the object name is a sanitized form when the
#: id is not a valid object name; the annotation is the authoritative copy, the label (a valid
#: label value derived from the id) lets clients select a NUS by id.
ANNOTATION_ULTRASERVER_ID: Final = "neuron.aws.com/ultraserver-id"
LABEL_ULTRASERVER_ID: Final = "neuron.aws.com/ultraserver-id"

#: Secondary indexes this reconciler adds to ``ctx.slices`` (if the manager has not already):
#: without them every reconcile and every Node event would scan all slices of the cluster.
SLICE_INDEX_ULTRASERVER: Final = "discovery.neuron.aws.com/ultraserverId"
SLICE_INDEX_NODE: Final = "discovery.neuron.aws.com/nodeName"

CONDITION_READY: Final = "Ready"
CONDITION_DEGRADED: Final = "Degraded"

#: Longest condition message / event note we build; the list of nodes is cut beyond this.
_MAX_MESSAGE: Final = 1000
_HASH_CHARS: Final = 8
_DNS_SUBDOMAIN = DNS1123_SUBDOMAIN_RE
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_MAX_NAME: Final = 253
_MAX_LABEL: Final = 63


class Reason(StrEnum):
    """Condition reasons, in priority order for ``Degraded`` (the first issue found wins)."""

    NODES_GONE = "NodesGone"
    INCONSISTENT_TOPOLOGY = "InconsistentTopology"
    NODE_MISSING = "NodeMissing"
    NODE_NOT_READY = "NodeNotReady"
    DEVICE_UNHEALTHY = "DeviceUnhealthy"
    ALL_NODES_READY = "AllNodesReady"
    AS_EXPECTED = "AsExpected"


_PRIORITY: Final = {r: i for i, r in enumerate(Reason)}


# ---------------------------------------------------------------------------------------------
# Naming
# ---------------------------------------------------------------------------------------------


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:_HASH_CHARS]


def nus_name(ultraserver_id: str) -> str:
    """The NUS object name for an UltraServer id.

    The id itself when it is a valid DNS subdomain (the usual case: 16 hex chars from the
    driver's election, or a capacity block id). Otherwise a sanitized form plus a hash of the
    raw id, so two ids that sanitize alike ("A_1" and "a-1") still get different objects.
    """
    if len(ultraserver_id) <= _MAX_NAME and _DNS_SUBDOMAIN.fullmatch(ultraserver_id):
        return ultraserver_id
    base = re.sub(r"[^a-z0-9.-]", "-", ultraserver_id.lower())
    # Dots only separate labels: collapse runs and drop those next to a dash.
    base = re.sub(r"\.{2,}", ".", base)
    base = re.sub(r"-*\.-*", ".", base).strip(".-")
    suffix = _short_hash(ultraserver_id)
    base = base[: _MAX_NAME - len(suffix) - 1].rstrip(".-")
    return f"{base}-{suffix}" if base else f"us-{suffix}"


def ultraserver_label_value(ultraserver_id: str) -> str:
    """A label value standing for the id: the id itself when it is one, else a hashed form."""
    if len(ultraserver_id) <= _MAX_LABEL and _LABEL_VALUE.fullmatch(ultraserver_id):
        return ultraserver_id
    suffix = _short_hash(ultraserver_id)
    base = re.sub(r"[^A-Za-z0-9_.-]", "-", ultraserver_id)
    base = base[: _MAX_LABEL - len(suffix) - 1].strip("-_.")
    return f"{base}-{suffix}" if base else f"us-{suffix}"


def ultraserver_id_of(nus: Mapping[str, Any]) -> str | None:
    """The raw UltraServer id of a NUS object (annotation, else its name for old objects)."""
    meta = nus.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    annotations = meta.get("annotations")
    if isinstance(annotations, Mapping):
        raw = annotations.get(ANNOTATION_ULTRASERVER_ID)
        if isinstance(raw, str) and raw:
            return raw
    name = meta.get("name")
    return name if isinstance(name, str) and name else None


# ---------------------------------------------------------------------------------------------
# Reading slices and Nodes (defensively: any field may be missing or of the wrong type)
# ---------------------------------------------------------------------------------------------


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _devices(slice_: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    devices = _mapping(slice_.get("spec")).get("devices")
    if not isinstance(devices, list):
        return []
    return [d for d in devices if isinstance(d, Mapping)]


def _attribute(device: Mapping[str, Any], name: str) -> Any:
    """The value of an attribute (unqualified or qualified with our domain), or None."""
    attrs = _mapping(device.get("attributes"))
    value = attrs.get(name)
    if value is None:
        value = attrs.get(f"{ATTRIBUTE_DOMAIN}/{name}")
    if isinstance(value, Mapping) and len(value) == 1:
        return next(iter(value.values()))
    return None


def _str_attribute(device: Mapping[str, Any], name: str) -> str | None:
    value = _attribute(device, name)
    return value if isinstance(value, str) and value else None


def _int_attribute(device: Mapping[str, Any], name: str) -> int | None:
    value = _attribute(device, name)
    # bool is an int subclass; a {"bool": true} node id is garbage, not 1.
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _node_device_first(devices: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    # The neuronnode device speaks for the whole node, so its values win (DESIGN §3.1).
    return sorted(devices, key=lambda d: d.get("name") != NODE_DEVICE_NAME)


def _first(devices: list[Mapping[str, Any]], read: Callable[[Mapping[str, Any]], Any]) -> Any:
    for device in _node_device_first(devices):
        value = read(device)
        if value is not None:
            return value
    return None


def is_neuron_slice(slice_: Mapping[str, Any]) -> bool:
    return _mapping(slice_.get("spec")).get("driver") == DRIVER_NAME


def slice_node_name(slice_: Mapping[str, Any]) -> str | None:
    spec = _mapping(slice_.get("spec"))
    name = spec.get("nodeName")
    if not isinstance(name, str) or not name:
        # Pool name = node name is our publishing contract (DESIGN §3.1).
        name = _mapping(spec.get("pool")).get("name")
    return name if isinstance(name, str) and name else None


def slice_ultraserver_id(slice_: Mapping[str, Any]) -> str | None:
    """The ``ultraserverId`` a slice of our driver carries (neuronnode first), or None."""
    if not isinstance(slice_, Mapping) or not is_neuron_slice(slice_):
        return None
    value = _first(_devices(slice_), lambda d: _str_attribute(d, ATTR_ULTRASERVER_ID))
    return value if isinstance(value, str) else None


def _pool_generation(slice_: Mapping[str, Any]) -> int:
    gen = _mapping(_mapping(slice_.get("spec")).get("pool")).get("generation")
    return gen if isinstance(gen, int) and not isinstance(gen, bool) else 0


def _parse_modes(value: str | None) -> int | None:
    """Largest node count in ``ultraserverModes`` (``1_2_4`` -> 4); None if absent/garbage."""
    if not value:
        return None
    counts = [int(p) for p in value.split("_") if p.isdigit()]
    return max(counts) if counts else None


NodeState = Literal["Ready", "NotReady", "Missing"]


def node_state(node: Mapping[str, Any] | None) -> NodeState:
    """``Ready`` only when the Node exists and its Ready condition is True.

    ``Unknown`` (the node controller's verdict for a silent kubelet) counts as not ready: we
    cannot vouch for a node nobody has heard from.
    """
    if node is None:
        return "Missing"
    conditions = _mapping(node.get("status")).get("conditions")
    if isinstance(conditions, list):
        for cond in conditions:
            if isinstance(cond, Mapping) and cond.get("type") == "Ready":
                return "Ready" if cond.get("status") == "True" else "NotReady"
    return "NotReady"


# ---------------------------------------------------------------------------------------------
# Grouping (pure)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemberNode:
    """One node that names an UltraServer in its ResourceSlice."""

    name: str
    node_id: int | None
    instance_type: str | None
    state: NodeState
    #: Devices publishing ``healthy: false`` (a missing attribute counts as healthy: the
    #: plugin always publishes it, and an old plugin must not mark the fleet unhealthy).
    unhealthy_devices: tuple[str, ...] = ()
    #: Largest UltraServer size the node's driver currently supports (``ultraserverModes``).
    max_nodes: int | None = None

    @property
    def healthy(self) -> bool:
        return self.state == "Ready" and not self.unhealthy_devices

    @property
    def link_status(self) -> LinkStatus:
        """NeuronLink state as far as the slice tells it, for both directions.

        The slice contract (§3.2) has no per-link attribute, so horizontal and vertical are the
        same: ``Up`` when the node and all its devices are healthy and its driver still offers
        multi-node modes; ``Down`` when a healthy node's driver offers only single-node mode
        (its mode list reflects the link state: it cannot reach its peers); ``Unknown`` when
        the node or a device is unhealthy, since we cannot tell whether links are the cause.
        """
        if not self.healthy:
            return "Unknown"
        if self.max_nodes is not None and self.max_nodes <= 1:
            return "Down"
        return "Up"


@dataclass(frozen=True)
class DesiredUltraServer:
    """Everything the slices say about one UltraServer, inconsistencies included."""

    ultraserver_id: str
    #: Sorted by (node id, name); nodes without a node id last.
    nodes: tuple[MemberNode, ...]
    #: Human-readable inconsistencies (duplicate or out-of-range node ids, too many nodes,
    #: mixed instance types...). Never raised: they end up in the Degraded condition.
    problems: tuple[str, ...] = ()

    @property
    def expected_nodes(self) -> int:
        """How many nodes the UltraServer should have: the largest mode its nodes report.

        A node offering only single-node mode says its links are down, not that the
        UltraServer has one node, so such lists do not count.
        """
        sizes = [n.max_nodes for n in self.nodes if n.max_nodes and n.max_nodes > 1]
        return min(max(sizes), ULTRASERVER_MAX_NODES) if sizes else ULTRASERVER_MAX_NODES

    def node(self, name: str) -> MemberNode | None:
        return next((n for n in self.nodes if n.name == name), None)


def _current_slices(slices: Iterable[Any]) -> dict[str, list[Mapping[str, Any]]]:
    """Our driver's slices per node, only those of the newest pool generation.

    During a republish a pool briefly has slices of two generations; consumers must ignore the
    older ones (that is what the generation is for), or a node would flap between UltraServers.
    """
    by_node: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for s in slices:
        if not isinstance(s, Mapping) or not is_neuron_slice(s):
            continue
        node = slice_node_name(s)
        if node is not None:
            by_node[node].append(s)
    out: dict[str, list[Mapping[str, Any]]] = {}
    for node, node_slices in by_node.items():
        newest = max(_pool_generation(s) for s in node_slices)
        out[node] = [s for s in node_slices if _pool_generation(s) == newest]
    return out


def _member(
    node_name: str, devices: list[Mapping[str, Any]], node: Mapping[str, Any] | None
) -> MemberNode:
    unhealthy = sorted(
        str(d.get("name") or "?") for d in devices if _attribute(d, ATTR_HEALTHY) is False
    )
    # neuronnode's health is the conjunction of its devices': list it only when it is the
    # sole witness, so a bad device is not reported twice.
    if len(unhealthy) > 1 and NODE_DEVICE_NAME in unhealthy:
        unhealthy.remove(NODE_DEVICE_NAME)
    return MemberNode(
        name=node_name,
        node_id=_first(devices, lambda d: _int_attribute(d, ATTR_ULTRASERVER_NODE_ID)),
        instance_type=_first(devices, lambda d: _str_attribute(d, ATTR_INSTANCE_TYPE)),
        state=node_state(node),
        unhealthy_devices=tuple(unhealthy),
        max_nodes=_parse_modes(
            _first(devices, lambda d: _str_attribute(d, ATTR_ULTRASERVER_MODES))
        ),
    )


def _sort_key(n: MemberNode) -> tuple[bool, int, str]:
    return (n.node_id is None, n.node_id if n.node_id is not None else 0, n.name)


def _group_problems(nodes: list[MemberNode], expected: int) -> list[str]:
    problems: list[str] = []
    if len(nodes) > expected:
        problems.append(
            f"{len(nodes)} nodes claim this UltraServer, at most {expected} expected: "
            + ", ".join(n.name for n in nodes)
        )
    ids: dict[int, list[str]] = defaultdict(list)
    for n in nodes:
        if n.node_id is None:
            problems.append(f"node {n.name} publishes no {ATTR_ULTRASERVER_NODE_ID}")
        elif not 0 <= n.node_id < ULTRASERVER_MAX_NODES:
            problems.append(
                f"node {n.name} has {ATTR_ULTRASERVER_NODE_ID} {n.node_id}, "
                f"outside 0..{ULTRASERVER_MAX_NODES - 1}"
            )
        else:
            ids[n.node_id].append(n.name)
    for node_id, names in sorted(ids.items()):
        if len(names) > 1:
            problems.append(f"nodes {', '.join(sorted(names))} share node id {node_id}")
    types = Counter(n.instance_type for n in nodes if n.instance_type)
    if len(types) > 1:
        problems.append(
            "mixed instance types: "
            + ", ".join(
                f"{t} ({', '.join(n.name for n in nodes if n.instance_type == t)})"
                for t in sorted(types)
            )
        )
    return problems


def group_ultraservers(
    slices: Iterable[Any], nodes: Mapping[str, Any]
) -> dict[str, DesiredUltraServer]:
    """Group our driver's slices by ``ultraserverId`` (pure, never raises on bad input).

    Slices without the attribute (nodes that are not UltraServer members) are ignored. ``nodes``
    maps node names to Node objects; a node absent from it is reported as ``Missing``.
    """
    members: dict[str, list[MemberNode]] = defaultdict(list)
    extra_problems: dict[str, list[str]] = defaultdict(list)
    for node_name, node_slices in sorted(_current_slices(slices).items()):
        devices = [d for s in node_slices for d in _devices(s)]
        ids = sorted({i for d in devices if (i := _str_attribute(d, ATTR_ULTRASERVER_ID))})
        if not ids:
            continue
        us_id = _first(devices, lambda d: _str_attribute(d, ATTR_ULTRASERVER_ID))
        assert isinstance(us_id, str)
        if len(ids) > 1:
            extra_problems[us_id].append(
                f"node {node_name} publishes several {ATTR_ULTRASERVER_ID} values {ids}; "
                f"using {us_id}"
            )
        node = nodes.get(node_name)
        members[us_id].append(
            _member(node_name, devices, node if isinstance(node, Mapping) else None)
        )
    out: dict[str, DesiredUltraServer] = {}
    for us_id, group in members.items():
        group.sort(key=_sort_key)
        draft = DesiredUltraServer(us_id, tuple(group))
        problems = extra_problems[us_id] + _group_problems(group, draft.expected_nodes)
        out[us_id] = DesiredUltraServer(us_id, tuple(group), tuple(problems))
    return out


# ---------------------------------------------------------------------------------------------
# Desired spec (pure)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopologyPlan:
    """Which nodes go into ``spec.topology`` and what had to be left out, and why."""

    instance_type: str | None
    #: Unique node ids in 0..3, matching instance type; sorted by node id.
    members: tuple[MemberNode, ...]
    excluded: tuple[MemberNode, ...] = ()
    problems: tuple[str, ...] = ()
    #: Node ids 0..expected-1 that no member holds.
    missing_ids: tuple[int, ...] = ()


def _existing_topology(existing: Mapping[str, Any] | None) -> dict[int, str]:
    topology = _mapping(_mapping(existing).get("spec")).get("topology")
    out: dict[int, str] = {}
    if isinstance(topology, list):
        for entry in topology:
            if isinstance(entry, Mapping):
                node_id, name = entry.get("nodeId"), entry.get("nodeName")
                if isinstance(node_id, int) and isinstance(name, str):
                    out[node_id] = name
    return out


def plan_topology(group: DesiredUltraServer, existing: Mapping[str, Any] | None) -> TopologyPlan:
    """Decide the topology the schema will accept from a possibly inconsistent group.

    The CRD rejects duplicate or out-of-range node ids and more than four entries, so such
    nodes are left out (and reported) rather than failing the whole write. For a duplicate id
    the node already listed keeps its place: topology must not flip between two claimants.
    ``instanceType`` is immutable: an existing object keeps its type, and nodes of another type
    are left out; a new object takes the most common type among its nodes.
    """
    problems = list(group.problems)
    existing_type = _mapping(_mapping(existing).get("spec")).get("instanceType")
    types = Counter(n.instance_type for n in group.nodes if n.instance_type)
    instance_type: str | None
    if isinstance(existing_type, str) and existing_type:
        instance_type = existing_type
        other = sorted(n.name for n in group.nodes if n.instance_type not in (None, instance_type))
        if other:
            problems.append(
                f"instanceType is immutable ({instance_type}); nodes of another type left out: "
                + ", ".join(other)
            )
    elif types:
        # Most common first, ties broken by name so the choice is stable across reconciles.
        instance_type = sorted(types.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    else:
        instance_type = None
    previous = _existing_topology(existing)
    by_id: dict[int, list[MemberNode]] = defaultdict(list)
    excluded: list[MemberNode] = []
    for n in group.nodes:
        fits_type = n.instance_type is None or n.instance_type == instance_type
        if n.node_id is not None and 0 <= n.node_id < ULTRASERVER_MAX_NODES and fits_type:
            by_id[n.node_id].append(n)
        else:
            excluded.append(n)
    members: list[MemberNode] = []
    for node_id in sorted(by_id):
        claimants = sorted(by_id[node_id], key=lambda n: (n.name != previous.get(node_id), n.name))
        members.append(claimants[0])
        excluded.extend(claimants[1:])
    present = {n.node_id for n in members}
    missing = tuple(i for i in range(group.expected_nodes) if i not in present)
    return TopologyPlan(
        instance_type=instance_type,
        members=tuple(members),
        excluded=tuple(sorted(excluded, key=_sort_key)),
        problems=tuple(problems),
        missing_ids=missing,
    )


def desired_topology(plan: TopologyPlan) -> list[JsonDict]:
    return [
        {
            "nodeName": n.name,
            "nodeId": n.node_id,
            "linkStatusHorizontal": n.link_status,
            "linkStatusVertical": n.link_status,
        }
        for n in plan.members
    ]


def desired_nus(
    us_id: str,
    group: DesiredUltraServer,
    existing: Mapping[str, Any] | None,
    *,
    namespace: str = DRIVER_NAMESPACE,
) -> JsonDict:
    """The NUS object as it should be (spec and identity metadata; status is separate).

    Starts from ``existing`` so its uid, resourceVersion and anything others put in metadata
    survive a PUT: a copy of its top level and its metadata, which is all this changes (the
    spec is replaced whole; ``existing`` may be a cached object and is never modified). When
    a node type conflicts with the immutable ``instanceType`` the existing value is kept;
    :func:`plan_topology` reports the problem.
    """
    plan = plan_topology(group, existing)
    obj: JsonDict = (
        {**existing, "metadata": dict(_mapping(existing.get("metadata")))} if existing else {}
    )
    obj["apiVersion"] = CRD_API_VERSION
    obj["kind"] = KIND_ULTRASERVER
    meta = obj.setdefault("metadata", {})
    if not existing:
        meta["name"] = nus_name(us_id)
        meta["namespace"] = namespace
    meta["labels"] = {
        **(meta.get("labels") or {}),
        LABEL_ULTRASERVER_ID: ultraserver_label_value(us_id),
    }
    meta["annotations"] = {**(meta.get("annotations") or {}), ANNOTATION_ULTRASERVER_ID: us_id}
    spec: JsonDict = {"instanceType": plan.instance_type, "topology": desired_topology(plan)}
    obj["spec"] = spec
    return obj


def _spec_view(obj: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """What a spec write changes: compared to decide whether a PUT is needed at all."""
    meta = _mapping(obj.get("metadata"))
    return (
        obj.get("spec"),
        _mapping(meta.get("labels")).get(LABEL_ULTRASERVER_ID),
        _mapping(meta.get("annotations")).get(ANNOTATION_ULTRASERVER_ID),
    )


# ---------------------------------------------------------------------------------------------
# Desired status (pure)
# ---------------------------------------------------------------------------------------------


def _join(items: Iterable[str], limit: int = 16) -> str:
    listed = list(items)
    head = ", ".join(listed[:limit])
    return head + (f" and {len(listed) - limit} more" if len(listed) > limit else "")


def allocated_nodes(nus: Mapping[str, Any]) -> set[str]:
    """Node names held by any allocation (the workload reconciler's record)."""
    out: set[str] = set()
    allocations = _mapping(nus.get("status")).get("allocations")
    if isinstance(allocations, list):
        for entry in allocations:
            names = _mapping(entry).get("allocatedNodes")
            if isinstance(names, list):
                out.update(n for n in names if isinstance(n, str))
    return out


def allocation_refs(nus: Mapping[str, Any]) -> list[str]:
    allocations = _mapping(nus.get("status")).get("allocations")
    if not isinstance(allocations, list):
        return []
    return sorted({str(_mapping(a).get("workloadRef") or "?") for a in allocations})


def has_allocations(nus: Mapping[str, Any]) -> bool:
    allocations = _mapping(nus.get("status")).get("allocations")
    return isinstance(allocations, list) and len(allocations) > 0


@dataclass(frozen=True)
class Health:
    """The verdict behind the Ready and Degraded conditions."""

    issues: tuple[tuple[Reason, str], ...] = ()
    ready_message: str = ""

    @property
    def degraded(self) -> bool:
        return bool(self.issues)

    @property
    def reason(self) -> Reason:
        if not self.issues:
            return Reason.AS_EXPECTED
        return min((r for r, _ in self.issues), key=lambda r: _PRIORITY[r])

    @property
    def message(self) -> str:
        text = "; ".join(msg for _, msg in self.issues)
        return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def assess(us_id: str, plan: TopologyPlan | None, nus: Mapping[str, Any]) -> Health:
    """Why the UltraServer is (not) fully usable; ``plan`` None means no node is left."""
    if plan is None:
        refs = allocation_refs(nus)
        return Health(
            (
                (
                    Reason.NODES_GONE,
                    f"no node of UltraServer {us_id} publishes a ResourceSlice any more; "
                    f"kept for {len(refs)} allocation(s): {_join(refs)}",
                ),
            )
        )
    issues: list[tuple[Reason, str]] = []
    if plan.problems:
        issues.append((Reason.INCONSISTENT_TOPOLOGY, "; ".join(plan.problems)))
    if plan.missing_ids:
        listed = {n.name for n in plan.members}
        # Names of absent nodes are only known where an allocation still holds them.
        held = sorted(allocated_nodes(nus) - listed)
        text = (
            f"{len(plan.members)} of {len(plan.members) + len(plan.missing_ids)} nodes present; "
            f"missing node ids {', '.join(map(str, plan.missing_ids))}"
        )
        if held:
            text += f"; allocated nodes without a ResourceSlice: {_join(held)}"
        issues.append((Reason.NODE_MISSING, text))
    not_ready = [
        f"{n.name} (nodeId {n.node_id}, {'no Node object' if n.state == 'Missing' else 'NotReady'})"
        for n in plan.members
        if n.state != "Ready"
    ]
    if not_ready:
        issues.append((Reason.NODE_NOT_READY, f"nodes not Ready: {_join(not_ready)}"))
    bad_devices = [
        f"{n.name}: {_join(n.unhealthy_devices, 8)}" for n in plan.members if n.unhealthy_devices
    ]
    if bad_devices:
        issues.append((Reason.DEVICE_UNHEALTHY, f"unhealthy devices on {_join(bad_devices)}"))
    return Health(
        tuple(issues),
        ready_message=f"{len(plan.members)} of {len(plan.members)} "
        "nodes Ready with healthy devices",
    )


def format_time(ts: datetime) -> str:
    """metav1.Time: RFC 3339, whole seconds, UTC."""
    if ts.tzinfo is not None:
        ts = ts.astimezone(UTC)
    return ts.strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: list[JsonDict],
    type_: str,
    status: str,
    reason: str,
    message: str,
    *,
    observed_generation: int | None,
    now: datetime,
) -> list[JsonDict]:
    """``conditions`` with ``type_`` set; ``lastTransitionTime`` only moves when status flips.

    Other condition types (another writer's) are kept as they are, in place.
    """
    out: list[JsonDict] = []
    found = False
    for cond in conditions:
        if not isinstance(cond, Mapping) or cond.get("type") != type_:
            out.append(cond)
            continue
        found = True
        same = cond.get("status") == status and isinstance(cond.get("lastTransitionTime"), str)
        out.append(
            _condition(
                type_,
                status,
                reason,
                message,
                observed_generation,
                str(cond["lastTransitionTime"]) if same else format_time(now),
            )
        )
    if not found:
        out.append(
            _condition(type_, status, reason, message, observed_generation, format_time(now))
        )
    return out


def _condition(
    type_: str, status: str, reason: str, message: str, generation: int | None, ltt: str
) -> JsonDict:
    cond: JsonDict = {"type": type_, "status": status}
    if generation is not None:
        cond["observedGeneration"] = generation
    cond.update(lastTransitionTime=ltt, reason=reason, message=message)
    return cond


def get_condition(nus: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    conditions = _mapping(nus.get("status")).get("conditions")
    if isinstance(conditions, list):
        for cond in conditions:
            if isinstance(cond, Mapping) and cond.get("type") == type_:
                return cond
    return None


def desired_state(plan: TopologyPlan | None, nus: Mapping[str, Any]) -> str:
    """Available / PartiallyAllocated / FullyAllocated, by what is left to allocate.

    Health does not enter: a node going NotReady does not free or fill anything, and the
    allocator reads the conditions for health.
    """
    if not has_allocations(nus):
        return "Available"
    members = {n.name for n in plan.members} if plan is not None else set()
    return "PartiallyAllocated" if members - allocated_nodes(nus) else "FullyAllocated"


def desired_status(
    us_id: str,
    plan: TopologyPlan | None,
    nus: Mapping[str, Any],
    *,
    now: datetime,
) -> JsonDict:
    """``nus.status`` with this reconciler's fields recomputed and everything else untouched.

    ``nus`` must be the object the status write will be guarded by (its allocations decide the
    state); ``status.allocations`` and conditions of other types pass through unchanged.
    """
    status: JsonDict = copy.deepcopy(dict(_mapping(nus.get("status"))))
    generation = _mapping(nus.get("metadata")).get("generation")
    gen = generation if isinstance(generation, int) and not isinstance(generation, bool) else None
    health = assess(us_id, plan, nus)
    conditions = status.get("conditions")
    conds: list[JsonDict] = list(conditions) if isinstance(conditions, list) else []
    if health.degraded:
        conds = set_condition(
            conds,
            CONDITION_READY,
            "False",
            health.reason,
            health.message,
            observed_generation=gen,
            now=now,
        )
        conds = set_condition(
            conds,
            CONDITION_DEGRADED,
            "True",
            health.reason,
            health.message,
            observed_generation=gen,
            now=now,
        )
    else:
        conds = set_condition(
            conds,
            CONDITION_READY,
            "True",
            Reason.ALL_NODES_READY,
            health.ready_message,
            observed_generation=gen,
            now=now,
        )
        conds = set_condition(
            conds,
            CONDITION_DEGRADED,
            "False",
            Reason.AS_EXPECTED,
            "",
            observed_generation=gen,
            now=now,
        )
    status["state"] = desired_state(plan, nus)
    status["nodeCount"] = len(plan.members) if plan is not None else 0
    status["allocatedNodeCount"] = len(allocated_nodes(nus))
    status["conditions"] = conds
    if gen is not None:
        status["observedGeneration"] = gen
    return status


# ---------------------------------------------------------------------------------------------
# Requeue keys (which UltraServers an event concerns)
# ---------------------------------------------------------------------------------------------


def keys_for_slice(slice_: Any, old: Any = None) -> set[str]:
    """UltraServer ids to reconcile after a ResourceSlice event.

    Pass the previous object on updates: a slice whose ``ultraserverId`` changed must requeue
    the UltraServer it left as well as the one it joined.
    """
    keys: set[str] = set()
    for obj in (slice_, old):
        if isinstance(obj, Mapping):
            us_id = slice_ultraserver_id(obj)
            if us_id:
                keys.add(us_id)
    return keys


def keys_for_node(node: Any, ctx: ControllerContext) -> set[str]:
    """UltraServer ids whose member is this Node (Ready flips change their health)."""
    name = _mapping(_mapping(node).get("metadata")).get("name")
    if not isinstance(name, str) or not name:
        return set()
    ensure_slice_indexes(ctx.slices)
    return {
        us_id
        for s in ctx.slices.by_index(SLICE_INDEX_NODE, name)
        if (us_id := slice_ultraserver_id(s))
    }


def keys_for_ultraserver(nus: Any) -> set[str]:
    """The UltraServer id of a NUS event (so objects whose nodes vanished get reconciled)."""
    us_id = ultraserver_id_of(nus) if isinstance(nus, Mapping) else None
    return {us_id} if us_id else set()


def _index_ultraserver(obj: JsonDict) -> list[str]:
    us_id = slice_ultraserver_id(obj)
    return [us_id] if us_id else []


def _index_node(obj: JsonDict) -> list[str]:
    if not is_neuron_slice(obj):
        return []
    node = slice_node_name(obj)
    return [node] if node else []


def ensure_slice_indexes(store: Store) -> None:
    names = store.index_names()
    if SLICE_INDEX_ULTRASERVER not in names:
        store.add_index(SLICE_INDEX_ULTRASERVER, _index_ultraserver)
    if SLICE_INDEX_NODE not in names:
        store.add_index(SLICE_INDEX_NODE, _index_node)


# ---------------------------------------------------------------------------------------------
# The slice cache: only what the controller reads
# ---------------------------------------------------------------------------------------------

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


def _slim_attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
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


def _already_slim(devices: list[Any], meta: Any) -> bool:
    if isinstance(meta, dict) and "managedFields" in meta:
        return False
    return all(
        isinstance(d, dict) and isinstance(d.get("attributes"), _SharedAttributes) for d in devices
    )


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
    if not isinstance(spec, dict) or not isinstance(spec.get("devices"), list):
        return obj
    if _already_slim(spec["devices"], meta):
        return obj  # the LIST pages are slimmed as they arrive; the store gets them again
    devices: list[Any] = []
    for device in spec["devices"]:
        if not isinstance(device, dict) or not isinstance(device.get("attributes"), dict):
            devices.append(device)
            continue
        slim = {k: v for k, v in device.items() if k not in ("attributes", "capacity")}
        if isinstance(slim.get("name"), str):
            slim["name"] = sys.intern(slim["name"])
        slim["attributes"] = _slim_attributes(device["attributes"])
        devices.append(slim)
    out = dict(obj)
    out["spec"] = {**spec, "devices": devices}
    if isinstance(meta, dict) and "managedFields" in meta:
        out["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
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


class SlimListClient(ResourceClient):
    """A client whose LIST pages come back cut down by ``slim``, so a relist of the fleet
    never holds more than one page of full objects (the store slims too, but only once the
    whole list has arrived)."""

    def __init__(self, kube: KubeClient, resource: ApiResource, slim: Slim) -> None:
        super().__init__(kube, resource)
        self._slim = slim

    async def list(self, *args: Any, **kwargs: Any) -> JsonDict:
        page = await super().list(*args, **kwargs)
        items = page.get("items")
        if isinstance(items, list):
            page["items"] = [self._slim(o) if isinstance(o, dict) else o for o in items]
        return page


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


class SliceStore(SlimStore):
    """The controller's ResourceSlice cache (``slim_slice``)."""

    def __init__(self) -> None:
        super().__init__(slim_slice)


class NodeStore(SlimStore):
    """The controller's Node cache (``slim_node``)."""

    def __init__(self) -> None:
        super().__init__(slim_node)


# ---------------------------------------------------------------------------------------------
# The reconciler (I/O)
# ---------------------------------------------------------------------------------------------


class UltraServerDiscovery:
    """Level-triggered reconciler: ``reconcile(ultraserver_id)`` converges one NUS.

    Reads only the context's caches; writes go through ``ctx.kube`` guarded by the
    resourceVersion of the object they are based on. API errors propagate (the work queue
    retries with backoff); malformed input never raises.
    """

    def __init__(self, ctx: ControllerContext) -> None:
        self.ctx = ctx
        self.api: ResourceClient = ctx.kube.resource(NEURON_ULTRASERVERS)
        ensure_slice_indexes(ctx.slices)

    # --- cache reads ---------------------------------------------------------------------

    def _group(self, us_id: str) -> DesiredUltraServer | None:
        """The group for ``us_id`` from the cache.

        All current slices of every node that names ``us_id`` take part, not only the slices
        naming it: a node whose newest generation moved to another UltraServer must drop out
        here even while a stale slice of it still names ``us_id``.
        """
        store = self.ctx.slices
        node_names = {
            n for s in store.by_index(SLICE_INDEX_ULTRASERVER, us_id) if (n := slice_node_name(s))
        }
        slices = [s for n in sorted(node_names) for s in store.by_index(SLICE_INDEX_NODE, n)]
        nodes = {n: self.ctx.nodes.get(n) for n in node_names}
        return group_ultraservers(slices, nodes).get(us_id)

    def _cached(self, us_id: str) -> JsonDict | None:
        """The cached NUS of ``us_id``; an object by that name standing for another id is
        not it (``us_id`` may be the sanitized name of another id: never act on that one)."""
        nus = self.ctx.ultraservers.get_by_name(nus_name(us_id), self.ctx.namespace)
        return nus if nus is not None and ultraserver_id_of(nus) == us_id else None

    async def _wait_synced(self) -> None:
        # Acting on an empty cache would delete every NUS at start-up; the manager starts
        # workers after sync, so this normally returns at once.
        for store in (self.ctx.slices, self.ctx.nodes, self.ctx.ultraservers):
            await store.wait_synced()

    # --- reconcile -----------------------------------------------------------------------

    def _resolve(self, key: str) -> str:
        """The UltraServer id for a queue key: an id, or the name of a NUS object.

        NUS events can only name the object; for a sanitized name the raw id is in its
        annotation. A key that is itself a known id wins.
        """
        if self.ctx.slices.index_keys(SLICE_INDEX_ULTRASERVER, key) or self._cached(key):
            return key
        nus = self.ctx.ultraservers.get_by_name(key, self.ctx.namespace)
        raw = ultraserver_id_of(nus) if nus is not None else None
        return raw or key

    async def reconcile(self, key: str) -> None:
        """Converge the NUS of UltraServer ``key`` (an UltraServer id or a NUS name)."""
        await self._wait_synced()
        if not isinstance(key, str) or not key:
            log.warning("ignoring empty UltraServer key", extra={"ultraserver": repr(key)})
            return
        us_id = self._resolve(key)
        keys = {"ultraserver": us_id, "nus": f"{self.ctx.namespace}/{nus_name(us_id)}"}
        group = self._group(us_id)
        cached = self._cached(us_id)
        if group is None:
            if cached is not None:
                await self._nodes_gone(us_id, cached, keys)
            return
        if cached is None:
            plan = plan_topology(group, None)
            if plan.instance_type is None:
                log.warning(
                    "cannot create NeuronUltraServer: no node reports an instance type", extra=keys
                )
                return
            obj = await self._create(us_id, group, keys)
        else:
            obj = await self._ensure_spec(us_id, group, cached, keys)
        await self._ensure_status(us_id, group, obj, keys)

    async def _create(
        self, us_id: str, group: DesiredUltraServer, keys: Mapping[str, str]
    ) -> JsonDict:
        body = desired_nus(us_id, group, None, namespace=self.ctx.namespace)
        try:
            created = await self.api.create(body, self.ctx.namespace)
        except AlreadyExistsError:
            # Our cache had not seen it yet: continue from the live object.
            log.debug("NeuronUltraServer already exists", extra=keys)
            live = await self.api.get(body["metadata"]["name"], self.ctx.namespace)
            if ultraserver_id_of(live) != us_id:
                # Two ids mapping to one name needs a hash collision; refuse to mix them.
                raise PermanentError(
                    f"NeuronUltraServer {body['metadata']['name']} belongs to UltraServer "
                    f"{ultraserver_id_of(live)!r}, not {us_id!r}"
                ) from None
            return await self._ensure_spec(us_id, group, live, keys)
        plan = plan_topology(group, None)
        log.info("created NeuronUltraServer with %d nodes", len(plan.members), extra=keys)
        await self.ctx.events.record(
            ObjectRef.of(created),
            type_=EventType.NORMAL,
            reason="Discovered",
            note=f"UltraServer {us_id} ({plan.instance_type}) discovered with "
            f"{len(plan.members)} node(s): {_join(n.name for n in plan.members)}",
            action="Discover",
        )
        return created

    async def _ensure_spec(
        self, us_id: str, group: DesiredUltraServer, current: JsonDict, keys: Mapping[str, str]
    ) -> JsonDict:
        if _spec_view(desired_nus(us_id, group, current)) == _spec_view(current):
            return current

        def mutate(obj: JsonDict) -> JsonDict | None:
            want = desired_nus(us_id, group, obj)
            return want if _spec_view(want) != _spec_view(obj) else None

        updated = await self._guarded_write(current, mutate, status=False)
        log.info("updated NeuronUltraServer spec", extra=keys)
        return updated

    async def _ensure_status(
        self,
        us_id: str,
        group: DesiredUltraServer | None,
        current: JsonDict,
        keys: Mapping[str, str],
    ) -> None:
        now = self.ctx.clock.wall()
        # Filled by the last mutate call, i.e. the one whose result was written (if any).
        last: dict[str, Any] = {}

        def mutate(obj: JsonDict) -> JsonDict | None:
            # Recomputed from whatever object the write is guarded by, so allocations written
            # by the workload reconciler since our last read are both kept and counted.
            plan = plan_topology(group, obj) if group is not None else None
            status = desired_status(us_id, plan, obj, now=now)
            last["degraded"] = get_condition(obj, CONDITION_DEGRADED)
            last["changed"] = status != obj.get("status")
            if not last["changed"]:
                return None
            obj["status"] = status
            return obj

        result = await self._guarded_write(current, mutate, status=True)
        if not last.get("changed"):
            return
        log.info(
            "updated NeuronUltraServer status",
            extra={**keys, "state": _mapping(result.get("status")).get("state")},
        )
        await self._record_health_events(us_id, last.get("degraded"), result)

    async def _record_health_events(
        self, us_id: str, old: Mapping[str, Any] | None, nus: Mapping[str, Any]
    ) -> None:
        new = get_condition(nus, CONDITION_DEGRADED)
        if new is None:
            return
        was = old.get("status") if old else None
        changed = old is None or any(
            old.get(k) != new.get(k) for k in ("status", "reason", "message")
        )
        if new.get("status") == "True" and changed:
            await self.ctx.events.record(
                ObjectRef.of(nus),
                type_=EventType.WARNING,
                reason=str(new.get("reason") or "Degraded"),
                note=f"UltraServer {us_id} degraded: {new.get('message') or ''}",
                action="Reconcile",
            )
        elif new.get("status") == "False" and was == "True":
            ready = _mapping(get_condition(nus, CONDITION_READY))
            await self.ctx.events.record(
                ObjectRef.of(nus),
                type_=EventType.NORMAL,
                reason="Recovered",
                note=f"UltraServer {us_id}: {ready.get('message') or 'all nodes Ready'}",
                action="Reconcile",
            )

    async def _nodes_gone(self, us_id: str, cached: JsonDict, keys: Mapping[str, str]) -> None:
        """No node names this UltraServer any more: delete it, unless allocations remain."""
        current = cached
        for _ in range(3):
            if has_allocations(current):
                # Deleting would strand the workload's record of its nodes; keep the object
                # and say why, the workload reconciler applies its failure strategy.
                await self._ensure_status(us_id, None, current, keys)
                return
            try:
                # Preconditioned on what we checked: an allocation added meanwhile makes the
                # delete fail instead of silently discarding it.
                await self.api.delete(
                    current["metadata"]["name"],
                    self.ctx.namespace,
                    uid=current["metadata"].get("uid"),
                    resource_version=current["metadata"].get("resourceVersion"),
                )
            except NotFoundError:
                return
            except ConflictError:
                try:
                    current = await self.api.get(current["metadata"]["name"], self.ctx.namespace)
                except NotFoundError:
                    return
                continue
            log.info("deleted NeuronUltraServer: none of its nodes remains", extra=keys)
            return
        raise ConflictError(f"NeuronUltraServer for {us_id} keeps changing; retrying later")

    async def _guarded_write(
        self, current: JsonDict, mutate: Callable[[JsonDict], JsonDict | None], *, status: bool
    ) -> JsonDict:
        """Write ``mutate(copy of current)`` guarded by ``current``'s resourceVersion.

        The first attempt uses the object we already have (usually the cache's: no extra GET
        per reconcile); a 409 means someone wrote in between, so retries re-read the object
        and re-apply ``mutate`` to it.
        """
        # ``mutate`` replaces whole top-level fields (spec, status) and never edits nested
        # ones in place, so a copy of the top level and the metadata (whose resourceVersion
        # is set below) keeps the cached ``current`` intact. A deep copy of every NUS on each
        # pass was a fifth of a restarted controller's start-up at 5,000 nodes.
        draft = mutate({**current, "metadata": dict(current["metadata"])})
        if draft is None:
            return current
        meta = current["metadata"]
        draft["metadata"]["resourceVersion"] = meta["resourceVersion"]
        try:
            return await self.api.replace(draft, subresource="status" if status else None)
        except ConflictError:
            log.debug("conflict writing NeuronUltraServer %s; re-reading", meta.get("name"))
        return await update_with_retry(
            self.api,
            meta["name"],
            meta.get("namespace"),
            mutate,
            status=status,
            clock=self.ctx.clock,
        )
