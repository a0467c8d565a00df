"""Core sharing: several claims on the NeuronCores of one Neuron device (pure).

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

Every allocation of such a device carries a ``shareID`` and its ``consumedCapacity``. This
module reads them from a claim's results (:func:`read_shares`); which cores a share gets is
the preparer's choice (``prepare/cores.py``), since the scheduler counts but does not place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from neuron_dra.common.constants import (
    ATTR_LOGICAL_CORE_COUNT,
    CAPACITY_LOGICAL_CORES,
    DRIVER_NAME,
    device_name,
)
from neuron_dra.common.profiles import InstanceProfile
from neuron_dra.common.quantity import parse_quantity

#: ``consumedCapacity`` keys naming our logical cores (1.38 also accepts qualified names).
_LOGICAL_CORE_KEYS: Final = (CAPACITY_LOGICAL_CORES, f"{DRIVER_NAME}/{CAPACITY_LOGICAL_CORES}")

#: The API server's limit on ``requestPolicy.validValues``.
MAX_VALID_VALUES: Final = 10


# --- publishing ---------------------------------------------------------------------------------


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


# --- reading an allocation ----------------------------------------------------------------------


class ShareError(ValueError):
    """A claim's shares this node cannot give it (permanent: the claim must change)."""


@dataclass(frozen=True)
class ShareRequest:
    """What a claim holds of a device it shares with others: ``cores`` of the device's
    ``device_cores`` logical cores (at the node's default LNC). Which ones: the preparer's
    choice, recorded in the checkpoint."""

    device: int
    cores: int
    device_cores: int
    share_id: str


def _logical_cores(result: Mapping[str, Any]) -> int | None:
    consumed = result.get("consumedCapacity")
    if not isinstance(consumed, Mapping):
        return None
    for key in _LOGICAL_CORE_KEYS:
        if key in consumed:
            try:
                return int(parse_quantity(str(consumed[key])))
            except ValueError:
                return None
    return None


def _published_cores(attrs: Mapping[str, Any] | None) -> int | None:
    value = (attrs or {}).get(ATTR_LOGICAL_CORE_COUNT)
    number = value.get("int") if isinstance(value, Mapping) else None
    return number if isinstance(number, int) and number > 0 else None


def read_shares(
    results: Sequence[Mapping[str, Any]],
    published: Mapping[str, Mapping[str, Any]],
    device_index: Callable[[str], int | None],
    *,
    profile: InstanceProfile,
    lnc: int | None,
    admin: bool,
) -> tuple[tuple[tuple[str, str], ...], ShareRequest | None]:
    """The shareIDs of a claim's results (ours, by device name) and the one core share the
    claim holds, if any: a result consuming fewer ``logicalCores`` than the device has (as
    the slice publishes them). ``lnc`` is the claim's configured LNC (None: the node's).

    Raises :class:`ShareError` for shares no container can use: cores of several devices or
    a share beside whole devices (the runtime takes one contiguous range of cores), or a
    share at another LNC than the one the scheduler counted its cores in.
    """
    share_ids = tuple(
        sorted({(str(r.get("device")), str(r["shareID"])) for r in results if r.get("shareID")})
    )
    shares: list[ShareRequest] = []
    for r in results:
        device = str(r.get("device") or "")
        consumed = _logical_cores(r)
        total = _published_cores(published.get(device))
        index = device_index(device)
        if consumed is None or total is None or index is None or consumed >= total:
            continue  # the whole device (without a published count: whole, which is safe)
        shares.append(ShareRequest(index, max(consumed, 1), total, str(r.get("shareID") or "")))
    if admin or not shares:
        # Watching devices holds none of their cores.
        return share_ids, None
    devices = sorted({str(r.get("device")) for r in results})
    what = ", ".join(f"{s.cores} of {device_name(s.device)}" for s in shares)
    if len(shares) > 1 or len(devices) > 1:
        raise ShareError(
            f"it holds cores of a shared device ({what}) together with other devices "
            f"({', '.join(devices)}); the Neuron runtime takes one contiguous range of cores, "
            "so a claim may hold cores of one device only: ask for the cores in one request "
            "(capacity requests logicalCores), or for whole devices"
        )
    (share,) = shares
    if lnc is not None and profile.cores_per_device // lnc != share.device_cores:
        raise ShareError(
            f"it holds {what} logical cores counted at the node's default LNC "
            f"({profile.cores_per_device // share.device_cores}), but its NeuronConfig asks "
            f"logicalNeuronCore {lnc}; a share of a device runs at the node's LNC: remove the "
            "NeuronConfig, or ask for a whole device"
        )
    return share_ids, share
