"""The fields of consumable capacity (``DRAConsumableCapacity``, KEP-5075) that a 1.34 server,
which has the feature off (alpha), drops without an error, as kube-apiserver's registry
strategies drop them (``dropDisabledDRAConsumableCapacityFields`` of the ResourceSlice,
ResourceClaim and ResourceClaimTemplate strategies): unless the stored object already uses
the feature, a write loses

- of a ResourceSlice: every device's ``allowMultipleAllocations`` and every capacity's
  ``requestPolicy`` (the capacities stay);
- of a claim or a template's claim spec: the requests' ``capacity`` (``exactly`` and every
  ``firstAvailable`` entry) and the constraints' ``distinctAttribute``;
- of a claim's status: the allocation results' ``shareID`` and ``consumedCapacity`` and the
  ``status.devices`` entries' ``shareID``.

So a core claim (``capacity.requests.logicalCores``) becomes a claim for a whole device, and
the plugin's shared devices become exclusive ones, as on a real 1.34 cluster.
"""

from __future__ import annotations

from typing import Any

from neuron_dra.sim.fakeapi.validation.fields import get_dict, get_list


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _slice_in_use(obj: dict[str, Any]) -> bool:
    for device in _dicts(get_dict(obj, "spec").get("devices")):
        if device.get("allowMultipleAllocations") is not None:
            return True
        capacity = device.get("capacity")
        if isinstance(capacity, dict) and any(
            isinstance(c, dict) and c.get("requestPolicy") is not None for c in capacity.values()
        ):
            return True
    return False


def _claim_spec_in_use(spec: dict[str, Any]) -> bool:
    devices = get_dict(spec, "devices")
    if any(c.get("distinctAttribute") is not None for c in _dicts(devices.get("constraints"))):
        return True
    for request in _dicts(devices.get("requests")):
        exactly = request.get("exactly")
        if isinstance(exactly, dict) and exactly.get("capacity") is not None:
            return True
        if any(s.get("capacity") is not None for s in _dicts(request.get("firstAvailable"))):
            return True
    return False


def _claim_status_in_use(status: dict[str, Any]) -> bool:
    results = get_list(get_dict(get_dict(status, "allocation"), "devices"), "results")
    if any(
        r.get("shareID") is not None or r.get("consumedCapacity") is not None
        for r in _dicts(results)
    ):
        return True
    return any(d.get("shareID") is not None for d in _dicts(status.get("devices")))


def _drop_claim_spec(spec: dict[str, Any]) -> None:
    devices = get_dict(spec, "devices")
    for constraint in _dicts(devices.get("constraints")):
        constraint.pop("distinctAttribute", None)
    for request in _dicts(devices.get("requests")):
        exactly = request.get("exactly")
        if isinstance(exactly, dict):
            exactly.pop("capacity", None)
        for sub in _dicts(request.get("firstAvailable")):
            sub.pop("capacity", None)


def _drop_claim_status(status: dict[str, Any]) -> None:
    for result in _dicts(get_list(get_dict(get_dict(status, "allocation"), "devices"), "results")):
        result.pop("shareID", None)
        result.pop("consumedCapacity", None)
    for device in _dicts(status.get("devices")):
        device.pop("shareID", None)


def gate_consumable_capacity(plural: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    """In place: drop the feature's fields from ``obj`` (written over ``old``, None on create)
    unless ``old`` uses the feature, as a 1.34 server does."""
    if plural == "resourceslices":
        if old is not None and _slice_in_use(old):
            return
        for device in _dicts(get_dict(obj, "spec").get("devices")):
            device.pop("allowMultipleAllocations", None)
            capacity = device.get("capacity")
            if isinstance(capacity, dict):
                for value in capacity.values():
                    if isinstance(value, dict):
                        value.pop("requestPolicy", None)
    elif plural == "resourceclaims":
        if old is not None and (
            _claim_spec_in_use(get_dict(old, "spec"))
            or _claim_status_in_use(get_dict(old, "status"))
        ):
            return
        _drop_claim_spec(get_dict(obj, "spec"))
        _drop_claim_status(get_dict(obj, "status"))
    elif plural == "resourceclaimtemplates":
        if old is not None and _claim_spec_in_use(get_dict(get_dict(old, "spec"), "spec")):
            return
        _drop_claim_spec(get_dict(get_dict(obj, "spec"), "spec"))
