"""The desired NeuronUltraServer object of a group: identity metadata and ``spec`` (pure).

:func:`plan_topology` turns a possibly inconsistent group into a topology the CRD schema
accepts (the rest is reported); :func:`desired_nus` builds the object to PUT from it.
Status is :mod:`.status`'s.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from neuron_dra.common.constants import CRD_API_VERSION, DRIVER_NAMESPACE, KIND_ULTRASERVER
from neuron_dra.common.models.crds import ULTRASERVER_MAX_NODES

from .fields import as_mapping
from .grouping import DesiredUltraServer, MemberNode, member_sort_key
from .naming import (
    ANNOTATION_ULTRASERVER_ID,
    LABEL_ULTRASERVER_ID,
    nus_name,
    ultraserver_label_value,
)

JsonDict = dict[str, Any]


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
    topology = as_mapping(as_mapping(existing).get("spec")).get("topology")
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
    instance_type, type_problems = _instance_type(group, existing)
    members, excluded = _assign_node_ids(group, instance_type, _existing_topology(existing))
    present = {n.node_id for n in members}
    return TopologyPlan(
        instance_type=instance_type,
        members=tuple(members),
        excluded=tuple(sorted(excluded, key=member_sort_key)),
        problems=group.problems + type_problems,
        missing_ids=tuple(i for i in range(group.expected_nodes) if i not in present),
    )


def _instance_type(
    group: DesiredUltraServer, existing: Mapping[str, Any] | None
) -> tuple[str | None, tuple[str, ...]]:
    """The object's instance type, and the problem of nodes whose type it cannot be."""
    existing_type = as_mapping(as_mapping(existing).get("spec")).get("instanceType")
    if isinstance(existing_type, str) and existing_type:
        other = sorted(n.name for n in group.nodes if n.instance_type not in (None, existing_type))
        if not other:
            return existing_type, ()
        return existing_type, (
            f"instanceType is immutable ({existing_type}); nodes of another type left out: "
            + ", ".join(other),
        )
    types = Counter(n.instance_type for n in group.nodes if n.instance_type)
    if not types:
        return None, ()
    # Most common first, ties broken by name so the choice is stable across reconciles.
    return sorted(types.items(), key=lambda kv: (-kv[1], kv[0]))[0][0], ()


def _assign_node_ids(
    group: DesiredUltraServer, instance_type: str | None, previous: Mapping[int, str]
) -> tuple[list[MemberNode], list[MemberNode]]:
    """(members sorted by node id, excluded): one node per valid id; the one ``previous``
    listed wins a shared id, else the first by name."""
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
    return members, excluded


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
        {**existing, "metadata": dict(as_mapping(existing.get("metadata")))} if existing else {}
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


def spec_view(obj: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """What a spec write changes: compared to decide whether a PUT is needed at all."""
    meta = as_mapping(obj.get("metadata"))
    return (
        obj.get("spec"),
        as_mapping(meta.get("labels")).get(LABEL_ULTRASERVER_ID),
        as_mapping(meta.get("annotations")).get(ANNOTATION_ULTRASERVER_ID),
    )
