"""Grouping our driver's slices into UltraServers (pure, never raises on bad input).

Each kubelet plugin publishes its node's ResourceSlice with ``ultraserverId`` and
``ultraserverNodeId`` attributes; :func:`group_ultraservers` collects the member nodes of
each id with their health, and writes every inconsistency (duplicate or out-of-range node
ids, too many nodes, mixed instance types) down as a *problem* instead of raising: one
broken plugin must not stop discovery of every other UltraServer.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from neuron_dra.common.constants import (
    ATTR_HEALTHY,
    ATTR_INSTANCE_TYPE,
    ATTR_ULTRASERVER_ID,
    ATTR_ULTRASERVER_MODES,
    ATTR_ULTRASERVER_NODE_ID,
    NODE_DEVICE_NAME,
)
from neuron_dra.common.models.crds import ULTRASERVER_MAX_NODES
from neuron_dra.controller.caches import slice_node_name

from .fields import (
    NodeState,
    attribute,
    devices_of,
    first_value,
    int_attribute,
    is_neuron_slice,
    node_state,
    parse_modes,
    pool_generation,
    str_attribute,
)

LinkStatus = Literal["Up", "Down", "Unknown"]


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

        The slice's attributes (README) have no per-link one, so horizontal and vertical are the
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
        newest = max(pool_generation(s) for s in node_slices)
        out[node] = [s for s in node_slices if pool_generation(s) == newest]
    return out


def _member(
    node_name: str, devices: list[Mapping[str, Any]], node: Mapping[str, Any] | None
) -> MemberNode:
    unhealthy = sorted(
        str(d.get("name") or "?") for d in devices if attribute(d, ATTR_HEALTHY) is False
    )
    # neuronnode's health is the conjunction of its devices': list it only when it is the
    # sole witness, so a bad device is not reported twice.
    if len(unhealthy) > 1 and NODE_DEVICE_NAME in unhealthy:
        unhealthy.remove(NODE_DEVICE_NAME)
    return MemberNode(
        name=node_name,
        node_id=first_value(devices, lambda d: int_attribute(d, ATTR_ULTRASERVER_NODE_ID)),
        instance_type=first_value(devices, lambda d: str_attribute(d, ATTR_INSTANCE_TYPE)),
        state=node_state(node),
        unhealthy_devices=tuple(unhealthy),
        max_nodes=parse_modes(
            first_value(devices, lambda d: str_attribute(d, ATTR_ULTRASERVER_MODES))
        ),
    )


def member_sort_key(n: MemberNode) -> tuple[bool, int, str]:
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
        devices = [d for s in node_slices for d in devices_of(s)]
        ids = sorted({i for d in devices if (i := str_attribute(d, ATTR_ULTRASERVER_ID))})
        if not ids:
            continue
        us_id = first_value(devices, lambda d: str_attribute(d, ATTR_ULTRASERVER_ID))
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
        group.sort(key=member_sort_key)
        draft = DesiredUltraServer(us_id, tuple(group))
        problems = extra_problems[us_id] + _group_problems(group, draft.expected_nodes)
        out[us_id] = DesiredUltraServer(us_id, tuple(group), tuple(problems))
    return out
