"""UltraServer states from NeuronUltraServer objects (plain dicts, as the caches hold them).
Pure: no I/O. :mod:`.cache` keeps them current one object at a time; the planner decides on
them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from neuron_dra.common.ultraserver import read_allocations

from .units import NodeState, UltraServerState


def _link_down(entry: Mapping[str, Any]) -> bool:
    # "Unknown" is the default before anything is known and on platforms that do not report
    # links; treating it as down would make such clusters unallocatable.
    return "Down" in (entry.get("linkStatusHorizontal"), entry.get("linkStatusVertical"))


def allocation_records(nus: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(node, workloadRef) of every node an allocation entry of ``nus`` holds."""
    return [(node, entry.workload_ref) for entry in read_allocations(nus) for node in entry.nodes]


def members(nus: Mapping[str, Any]) -> list[str]:
    return [str(t.get("nodeName", "")) for t in (nus.get("spec") or {}).get("topology") or []]


def server_state(
    nus: Mapping[str, Any],
    holder: Callable[[str], str | None],
    healthy: Callable[[str], bool],
    in_use: Callable[[str], bool] = lambda _name: False,
) -> UltraServerState:
    spec = nus.get("spec") or {}
    nodes = []
    for entry in spec.get("topology") or []:
        name = str(entry.get("nodeName", ""))
        nodes.append(
            NodeState(
                name=name,
                node_id=int(entry.get("nodeId", -1)),
                healthy=healthy(name) and not _link_down(entry),
                reserved_by=holder(name),
                in_use=in_use(name),
            )
        )
    return UltraServerState(
        name=str((nus.get("metadata") or {}).get("name", "")),
        instance_type=str(spec.get("instanceType", "")),
        nodes=tuple(sorted(nodes, key=lambda n: (n.node_id, n.name))),
    )


def servers_from(
    nus_objects: Iterable[Mapping[str, Any]], *, node_health: Mapping[str, bool]
) -> list[UltraServerState]:
    """UltraServer states from NeuronUltraServer objects, sorted by name.

    Members come from ``spec.topology``; a node is healthy when ``node_health`` says so (a
    node missing from it is not: nothing vouches for it) and none of its NeuronLinks is
    reported ``Down``. ``reserved_by`` comes from ``status.allocations`` of *all* objects, so
    an entry in any phase (Reserved, Active, Releasing) holds its nodes until it is removed.
    """
    objects = list(nus_objects)
    holders: dict[str, set[str]] = {}
    for nus in objects:
        for node, ref in allocation_records(nus):
            holders.setdefault(node, set()).add(ref)

    def holder(name: str) -> str | None:
        # Two holders would be a double booking already on record; either way the node is
        # not free, and min() keeps the answer independent of list order.
        held = holders.get(name)
        return min(held) if held else None

    out = [
        server_state(nus, holder, lambda name: bool(node_health.get(name, False)))
        for nus in objects
    ]
    return sorted(out, key=lambda s: s.name)
