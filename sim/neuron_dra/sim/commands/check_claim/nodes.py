"""The devices of check-claim's cluster split by node: each node's slices (with the
slices shared by all nodes) and our devices on it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from neuron_dra.common.constants import ATTR_INSTANCE_TYPE, DRIVER_NAME
from neuron_dra.sim.allocation import DeviceKey
from neuron_dra.sim.commands.check_claim.inputs import as_dict, as_list

_MAX_NAMED: Final = 6


def attr_value(attrs: Mapping[str, Any], name: str) -> Any:
    """The value of one of our attributes (unqualified or qualified with the driver)."""
    typed = as_dict(attrs.get(name) or attrs.get(f"{DRIVER_NAME}/{name}"))
    for kind in ("int", "bool", "string", "version"):
        if kind in typed:
            return typed[kind]
    return None


def names_list(names: Sequence[str], limit: int = _MAX_NAMED) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", +{len(names) - limit}" if len(names) > limit else "")


@dataclass(frozen=True)
class NodeDevices:
    """One node's slices and our devices on it, by (driver, pool, device)."""

    name: str
    slices: list[dict[str, Any]]
    devices: dict[DeviceKey, dict[str, Any]]

    @property
    def instance_type(self) -> str | None:
        for (driver, _, _), dev in self.devices.items():
            value = attr_value(as_dict(dev.get("attributes")), ATTR_INSTANCE_TYPE)
            if driver == DRIVER_NAME and isinstance(value, str):
                return value
        return None


def split_by_node(slices: Sequence[Mapping[str, Any]]) -> list[NodeDevices]:
    """Per node (name order): its own slices plus the slices not bound to one node."""
    local: dict[str, list[dict[str, Any]]] = {}
    shared: list[dict[str, Any]] = []
    for s in slices:
        spec = as_dict(s.get("spec"))
        node = spec.get("nodeName")
        if node:
            local.setdefault(str(node), []).append(dict(s))
            continue
        shared.append(dict(s))
        if spec.get("perDeviceNodeSelection"):
            for dev in as_list(spec.get("devices")):
                if as_dict(dev).get("nodeName"):
                    local.setdefault(str(dev["nodeName"]), [])
    out = []
    for name in sorted(local):
        members = local[name] + shared
        devices: dict[DeviceKey, dict[str, Any]] = {}
        for s in members:
            spec = as_dict(s.get("spec"))
            driver, pool = (
                str(spec.get("driver", "")),
                str(as_dict(spec.get("pool")).get("name", "")),
            )
            for dev in as_list(spec.get("devices")):
                d = as_dict(dev)
                devices[(driver, pool, str(d.get("name", "")))] = d
        out.append(NodeDevices(name, members, devices))
    return out
