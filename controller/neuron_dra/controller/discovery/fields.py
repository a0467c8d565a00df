"""Defensive reads of ResourceSlices and Nodes: any field may be missing or of the wrong type.

Slices come from every node's plugin, old and new versions alike; a reader here never raises
on what it finds, it answers None (or empty) and lets the grouping report the problem.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from neuron_dra.common.constants import (
    ATTR_ULTRASERVER_ID,
    ATTRIBUTE_DOMAIN,
    DRIVER_NAME,
    NODE_DEVICE_NAME,
    parse_ultraserver_modes,
)


def as_mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def devices_of(slice_: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    devices = as_mapping(slice_.get("spec")).get("devices")
    if not isinstance(devices, list):
        return []
    return [d for d in devices if isinstance(d, Mapping)]


def attribute(device: Mapping[str, Any], name: str) -> Any:
    """The value of an attribute (unqualified or qualified with our domain), or None."""
    attrs = as_mapping(device.get("attributes"))
    value = attrs.get(name)
    if value is None:
        value = attrs.get(f"{ATTRIBUTE_DOMAIN}/{name}")
    if isinstance(value, Mapping) and len(value) == 1:
        return next(iter(value.values()))
    return None


def str_attribute(device: Mapping[str, Any], name: str) -> str | None:
    value = attribute(device, name)
    return value if isinstance(value, str) and value else None


def int_attribute(device: Mapping[str, Any], name: str) -> int | None:
    value = attribute(device, name)
    # bool is an int subclass; a {"bool": true} node id is garbage, not 1.
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _node_device_first(devices: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    # The neuronnode device speaks for the whole node, so its values win.
    return sorted(devices, key=lambda d: d.get("name") != NODE_DEVICE_NAME)


def first_value(devices: list[Mapping[str, Any]], read: Callable[[Mapping[str, Any]], Any]) -> Any:
    for device in _node_device_first(devices):
        value = read(device)
        if value is not None:
            return value
    return None


def is_neuron_slice(slice_: Mapping[str, Any]) -> bool:
    return as_mapping(slice_.get("spec")).get("driver") == DRIVER_NAME


def slice_ultraserver_id(slice_: Mapping[str, Any]) -> str | None:
    """The ``ultraserverId`` a slice of our driver carries (neuronnode first), or None."""
    if not isinstance(slice_, Mapping) or not is_neuron_slice(slice_):
        return None
    value = first_value(devices_of(slice_), lambda d: str_attribute(d, ATTR_ULTRASERVER_ID))
    return value if isinstance(value, str) else None


def pool_generation(slice_: Mapping[str, Any]) -> int:
    gen = as_mapping(as_mapping(slice_.get("spec")).get("pool")).get("generation")
    return gen if isinstance(gen, int) and not isinstance(gen, bool) else 0


def parse_modes(value: str | None) -> int | None:
    """Largest node count in ``ultraserverModes`` (``1_2_4`` -> 4); None if absent/garbage."""
    return max(parse_ultraserver_modes(value), default=None)


NodeState = Literal["Ready", "NotReady", "Missing"]


def node_state(node: Mapping[str, Any] | None) -> NodeState:
    """``Ready`` only when the Node exists and its Ready condition is True.

    ``Unknown`` (the node controller's verdict for a silent kubelet) counts as not ready: we
    cannot vouch for a node nobody has heard from.
    """
    if node is None:
        return "Missing"
    conditions = as_mapping(node.get("status")).get("conditions")
    if isinstance(conditions, list):
        for cond in conditions:
            if isinstance(cond, Mapping) and cond.get("type") == "Ready":
                return "Ready" if cond.get("status") == "True" else "NotReady"
    return "NotReady"
