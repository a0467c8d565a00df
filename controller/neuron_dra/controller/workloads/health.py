"""Whether a node can serve its workload, read from its Node and ResourceSlices: Ready,
devices healthy, NeuronLinks up, and whether its slices publish a workload's id tag. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from neuron_dra.common.constants import (
    ATTR_HEALTHY,
    ATTR_ULTRASERVER_MODES,
    ATTR_WORKLOAD_ID,
    parse_ultraserver_modes,
)
from neuron_dra.controller.discovery.fields import attribute as attr
from neuron_dra.controller.discovery.fields import devices_of, node_state

# The defensive readers of slices and Nodes are discovery's (discovery/fields.py): one reading
# of "attribute", "devices" and "Ready" for the whole controller.


def devices(slices: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [d for s in slices for d in devices_of(s)]


def node_ready(node: Mapping[str, Any] | None) -> bool:
    """Ready condition True. Unknown (kubelet silent) is not ready: nobody vouches for it."""
    return node_state(node) == "Ready"


def node_problem(node: Mapping[str, Any] | None, slices: Sequence[Mapping[str, Any]]) -> str | None:
    """Why an allocated node cannot serve its workload, or None when it can."""
    if node is None:
        return "Node object is gone"
    if not node_ready(node):
        return "Node is NotReady"
    if not slices:
        return "its ResourceSlice is gone"
    sick = sorted(str(d.get("name")) for d in devices(slices) if attr(d, ATTR_HEALTHY) is False)
    if sick:
        return f"unhealthy devices: {', '.join(sick)}"
    return None


def link_problem(member: Mapping[str, Any]) -> str | None:
    """Which NeuronLinks of a NeuronUltraServer topology member are down, or None."""
    down = [
        side
        for side, key in (
            ("horizontal", "linkStatusHorizontal"),
            ("vertical", "linkStatusVertical"),
        )
        if member.get(key) == "Down"
    ]
    return f"NeuronLink {' and '.join(down)} Down" if down else None


def carries_tag(slices: Iterable[Mapping[str, Any]], wid: str) -> bool:
    """Whether a node's slices publish workloadId ``wid`` (its plugin reserved it for ``wid``)."""
    return any(attr(d, ATTR_WORKLOAD_ID) == wid for d in devices(slices))


def published_modes(slices: Iterable[Mapping[str, Any]]) -> set[int]:
    """Unit sizes a node's devices publish in ``ultraserverModes`` (``"1_2_4"``)."""
    out: set[int] = set()
    for device in devices(slices):
        out |= parse_modes(attr(device, ATTR_ULTRASERVER_MODES))
    return out


def parse_modes(value: Any) -> set[int]:
    return set(parse_ultraserver_modes(value))
