"""The device taints of this node's ResourceSlice: pure functions of the devices' health.

A device whose health signals fail gets one taint per failure class (keys in ``constants``,
documented in docs/configuration.md, "Device health and taints"): the scheduler then gives it
to no claim that does not tolerate the taint, and with the ``NoExecute`` effect (opt-in) the
controller-manager evicts the pods using it. The taint goes as soon as discovery sees the
device healthy again. The ``healthy`` attribute stays beside it for selectors and for clusters
that do not serve taints.

Two API server behaviours shape this module:

- ``timeAdded`` is defaulted to "now" on every write that leaves it empty, so a republish of
  an unchanged taint must carry the time the API server gave it (:func:`carry_time_added`),
  and comparisons ignore it (:func:`comparable_taints`); otherwise every republish would
  restart a toleration's ``tolerationSeconds``.
- A server without the ``DRADeviceTaints`` feature (off by default before 1.36) drops the
  field silently. :func:`taints_dropped` notices it on a write's response, so the publisher
  stops sending taints instead of republishing forever.

No I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from neuron_dra.common.constants import (
    TAINT_KEY_UNCORRECTED_ECC,
    TAINT_KEY_UNHEALTHY,
    TAINT_KEY_UNHEALTHY_COMPONENT,
)
from neuron_dra.nodeplugin.discovery.model import FailureClass, HealthFault, NeuronDevice

_KEYS: Final[Mapping[FailureClass, str]] = {
    FailureClass.COMPONENT: TAINT_KEY_UNHEALTHY_COMPONENT,
    FailureClass.UNCORRECTED_ECC: TAINT_KEY_UNCORRECTED_ECC,
}
_LABEL_VALUE_MAX: Final = 63
_NOT_IN_LABEL_VALUE: Final = re.compile(r"[^A-Za-z0-9_.-]")
_EDGE: Final = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")


def _what_failed(fault: HealthFault) -> str:
    """The short name a taint value lists: the component, or the memory of an ECC counter
    (``mem_ecc_uncorrected`` -> ``mem``, ``mem_ecc_repairable_uncorrected`` ->
    ``mem_repairable``), so that all three counters fit in one label value."""
    if fault.kind is FailureClass.UNCORRECTED_ECC:
        return fault.item.removesuffix("_uncorrected").replace("_ecc", "")
    return fault.item


def taint_value(items: Iterable[str]) -> str:
    """``items`` as one label value: sorted, ``.``-joined, invalid characters replaced and cut
    to 63 characters (the driver's component names are not a published format)."""
    joined = ".".join(sorted(set(items)))
    value = _NOT_IN_LABEL_VALUE.sub("_", joined)[:_LABEL_VALUE_MAX]
    return _EDGE.sub("", value)


def _taints(faults: Iterable[HealthFault], effect: str) -> list[dict[str, Any]]:
    by_key: dict[str, list[str]] = {}
    for fault in faults:
        by_key.setdefault(_KEYS[fault.kind], []).append(_what_failed(fault))
    if not by_key:
        by_key[TAINT_KEY_UNHEALTHY] = []
    out: list[dict[str, Any]] = []
    for key in sorted(by_key):
        taint: dict[str, Any] = {"key": key, "effect": effect}
        value = taint_value(by_key[key])
        if value:
            taint["value"] = value
        out.append(taint)
    return out


def device_taints(device: NeuronDevice, effect: str | None) -> list[dict[str, Any]]:
    """The taints ``device`` carries; none when it is healthy or ``effect`` is None (off)."""
    if effect is None or device.healthy:
        return []
    return _taints(device.faults, effect)


def node_device_taints(devices: Sequence[NeuronDevice], effect: str | None) -> list[dict[str, Any]]:
    """The taints of the whole-node device, which overlaps every device: those of all of
    them, so a claim for the whole node does not get a node with a failing device."""
    sick = [d for d in devices if not d.healthy]
    if effect is None or not sick:
        return []
    return _taints((f for d in sick for f in d.faults), effect)


def _identity(taint: Mapping[str, Any]) -> tuple[str, str, str]:
    return (str(taint.get("key")), str(taint.get("value") or ""), str(taint.get("effect")))


def comparable_taints(taints: Iterable[Mapping[str, Any]]) -> list[tuple[str, str, str]]:
    """``taints`` without ``timeAdded`` (the API server's to set), in a canonical order."""
    return sorted(_identity(t) for t in taints)


def _devices(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(d.get("name")): d for d in (obj.get("spec") or {}).get("devices") or []}


def carry_time_added(have: Mapping[str, Any], want: dict[str, Any]) -> None:
    """Give ``want``'s taints (a slice about to be written over ``have``) the ``timeAdded``
    the API server set on the same taint of the same device, in place."""
    had = _devices(have)
    for name, device in _devices(want).items():
        times = {
            _identity(t): t["timeAdded"]
            for t in had.get(name, {}).get("taints") or []
            if t.get("timeAdded")
        }
        for taint in device.get("taints") or []:
            if "timeAdded" not in taint and _identity(taint) in times:
                taint["timeAdded"] = times[_identity(taint)]


def taints_dropped(sent: Mapping[str, Any], returned: Mapping[str, Any]) -> bool:
    """Whether the API server dropped the taints of a slice we wrote (its ``DRADeviceTaints``
    feature is off): a device we sent with taints came back without any."""
    back = _devices(returned)
    return any(
        d.get("taints") and not back.get(name, {}).get("taints")
        for name, d in _devices(sent).items()
    )


def without_taints(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Slice ``obj`` as a server without the feature keeps it: no device taints."""
    spec = dict(obj.get("spec") or {})
    spec["devices"] = [
        {k: v for k, v in d.items() if k != "taints"} for d in spec.get("devices") or []
    ]
    return {**obj, "spec": spec}
