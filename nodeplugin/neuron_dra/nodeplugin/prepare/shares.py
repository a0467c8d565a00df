"""What a claim holds of the Neuron devices it shares with other claims (pure).

With core sharing on (``publish/coresharing.py`` says how the devices are offered), each
allocation of a shared device carries a ``shareID`` and its ``consumedCapacity``; a result
consuming fewer ``logicalCores`` than the device publishes is a share of that device. This
module reads them from a claim's results; which cores a share gets is chosen under the node
lock (``cores.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from neuron_dra.common.constants import (
    ATTR_LOGICAL_CORE_COUNT,
    CAPACITY_LOGICAL_CORES,
    DRIVER_NAME,
    device_index,
    device_name,
)
from neuron_dra.common.profiles import InstanceProfile
from neuron_dra.common.quantity import parse_quantity

#: ``consumedCapacity`` keys naming our logical cores (1.38 also accepts qualified names).
_LOGICAL_CORE_KEYS: Final = (CAPACITY_LOGICAL_CORES, f"{DRIVER_NAME}/{CAPACITY_LOGICAL_CORES}")


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
