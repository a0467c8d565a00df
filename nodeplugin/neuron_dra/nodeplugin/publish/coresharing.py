"""Core sharing: several claims on the NeuronCores of one Neuron device, as the slice offers
it (pure).

Kubernetes' consumable capacity (KEP-5075, ``DRAConsumableCapacity``: beta and on by default
from 1.36) lets the scheduler hand one device to several claims, each consuming part of its
capacity. With the plugin's ``--core-sharing=true``, every ``neurondevice<N>`` (not ``neuronnode``)
is published with ``allowMultipleAllocations: true`` and a capacity ``logicalCores`` (the
device's logical NeuronCores at the node's default LNC) whose request policy

- defaults to all of them, so a claim that asks for no capacity (a whole-device claim, as
  written before) consumes the whole device: it can neither land beside core claims nor let
  one in;
- accepts the powers of two up to that count (the scheduler rounds a request up to the next),
  so that every share can be placed on an aligned block of cores;

and ``cores`` and ``memory`` get policies a core claim does not consume (default 0): the
scheduler keeps count of ``logicalCores`` only. A core claim asks
``exactly: {deviceClassName: neuron.aws.com, capacity: {requests: {logicalCores: "1"}}}``.

Why consumable capacity rather than partitionable devices (``sharedCounters``): the same
devices stay published (no partition devices per core count, which would pass the 64-device
limit of a slice with counters and which the whole-node device could not consume), and a
server without the feature (1.34, 1.35) drops ``allowMultipleAllocations`` and the policies,
leaving plain exclusive devices: safe. Dropped ``consumesCounters`` would leave partitions of
one device that the scheduler could hand out together.

Every allocation of such a device carries a ``shareID`` and its ``consumedCapacity``;
Prepare reads them from a claim's results (``prepare/shares.py``) and picks which cores a
share gets (``prepare/cores.py``), since the scheduler counts but does not place. This module
is the publishing side: the devices as a slice offers them for sharing, and what a server
without the feature keeps of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from neuron_dra.common.constants import CAPACITY_LOGICAL_CORES

#: The API server's limit on ``requestPolicy.validValues``.
MAX_VALID_VALUES: Final = 10


def share_sizes(logical_cores: int) -> list[int]:
    """The core counts a share may have: powers of two below ``logical_cores``, and it."""
    sizes = []
    size = 1
    while size < logical_cores:
        sizes.append(size)
        size *= 2
    return [*sizes, logical_cores][-MAX_VALID_VALUES:]


def sharable(device: Mapping[str, Any], logical_cores: int) -> dict[str, Any]:
    """``device`` (an entry of our slice) as a device several claims may share by its cores."""
    capacity = {
        name: {**value, "requestPolicy": {"default": "0"}}
        for name, value in (device.get("capacity") or {}).items()
    }
    capacity[CAPACITY_LOGICAL_CORES] = {
        "value": str(logical_cores),
        "requestPolicy": {
            "default": str(logical_cores),
            "validValues": [str(v) for v in share_sizes(logical_cores)],
        },
    }
    return {**device, "allowMultipleAllocations": True, "capacity": capacity}


def _devices(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(d.get("name")): d for d in (obj.get("spec") or {}).get("devices") or []}


def sharing_dropped(sent: Mapping[str, Any], returned: Mapping[str, Any]) -> bool:
    """Whether the API server dropped the sharing of a slice we wrote (its
    ``DRAConsumableCapacity`` feature is off): a device we sent sharable came back without."""
    back = _devices(returned)
    return any(
        d.get("allowMultipleAllocations") and not back.get(name, {}).get("allowMultipleAllocations")
        for name, d in _devices(sent).items()
    )


def without_sharing(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Slice ``obj`` as a server without the feature keeps it: no ``allowMultipleAllocations``,
    no request policies (the capacities themselves stay)."""
    spec = dict(obj.get("spec") or {})
    devices = []
    for d in spec.get("devices") or []:
        device = {k: v for k, v in d.items() if k != "allowMultipleAllocations"}
        if "capacity" in device:
            device["capacity"] = {
                name: {k: v for k, v in c.items() if k != "requestPolicy"}
                for name, c in device["capacity"].items()
            }
        devices.append(device)
    spec["devices"] = devices
    return {**obj, "spec": spec}
