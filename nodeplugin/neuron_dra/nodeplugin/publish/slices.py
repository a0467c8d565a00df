"""This node's ResourceSlices, as pure functions of the inventory.

Everything here is a contract with users (CEL selectors and ``matchAttribute`` constraints name
these attributes), with the EFA driver (connected-group ids must equal the ones DRANET publishes
for the paired EFA devices) and with the API server (its resource.k8s.io/v1 limits). The
names and values are in ``constants`` and the README; this module only assembles them.

No I/O: the caller passes the Node's name, uid and labels and publishes the result.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from neuron_dra.common.constants import (
    ATTR_CAPACITY_BLOCK_ID,
    ATTR_CORE_COUNT,
    ATTR_DEVICE_ID,
    ATTR_DRA_DRIVER_VERSION,
    ATTR_HEALTHY,
    ATTR_INSTANCE_TYPE,
    ATTR_LOGICAL_CORE_COUNT,
    ATTR_NEURON_DRIVER_VERSION,
    ATTR_NUMA_NODE,
    ATTR_PCI_BUS_ID,
    ATTR_PCIE_ROOT,
    ATTR_RESOURCE_TYPE,
    ATTR_TOPOLOGY4_ID,
    ATTR_TOPOLOGY8_ID,
    ATTR_TOPOLOGY_X,
    ATTR_TOPOLOGY_Y,
    ATTR_ULTRASERVER_ID,
    ATTR_ULTRASERVER_MODES,
    ATTR_ULTRASERVER_NODE_ID,
    ATTR_WORKLOAD_ID,
    CAPACITY_CORES,
    CAPACITY_MEMORY,
    DRIVER_NAME,
    LABEL_CAPACITY_BLOCK_ID,
    MAX_ATTRIBUTE_ID_LENGTH,
    MAX_ATTRIBUTE_VALUE_LENGTH,
    MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE,
    MAX_DEVICES_PER_SLICE,
    NETWORK_NODE_LAYER_ATTRIBUTES,
    NODE_DEVICE_NAME,
    RESOURCE_TYPE_DEVICE,
    RESOURCE_TYPE_NODE,
    device_group_attribute,
    device_name,
    format_ultraserver_modes,
)
from neuron_dra.common.names import C_IDENTIFIER_RE, DNS1123_LABEL_RE
from neuron_dra.common.profiles import (
    GIB,
    InstanceProfile,
    Topology,
    connected_groups,
    coordinates,
    group_sizes,
)
from neuron_dra.common.quantity import parse_quantity
from neuron_dra.nodeplugin.discovery.facts import (
    device_core_count,
    inventory_profile,
    node_default_lnc,
    ultraserver_node_counts,
)
from neuron_dra.nodeplugin.discovery.model import NeuronDevice, NodeInventory
from neuron_dra.nodeplugin.publish.coresharing import sharable
from neuron_dra.nodeplugin.publish.taints import (
    comparable_taints,
    device_taints,
    node_device_taints,
)

RESOURCE_API_VERSION: Final = "resource.k8s.io/v1"

#: ``workload_ids`` key that reserves the whole node (every device and ``neuronnode``).
WHOLE_NODE: Final = "node"

#: Length of the connected-group id (hex chars of a SHA-256), the AWS lookup library's choice.
GROUP_ID_HEX_CHARS: Final = 16

_MAX_OBJECT_NAME: Final = 253

# Formats the API server enforces (resource.k8s.io/v1 validation): the shared name formats, and
# the strict semver of version attributes (only slices publish one).
_C_IDENTIFIER = C_IDENTIFIER_RE
_DNS_LABEL = DNS1123_LABEL_RE
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-((0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(\+([0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*))?"
)


class SliceBuildError(RuntimeError):
    """We were about to publish something the API server would reject.

    Internal: it means a bug or an instance type whose attributes outgrew the API limits, not
    something a user can fix, so it names the device and the limit to make the report useful.
    """


# --- connected-group ids -----------------------------------------------------------------------


def efa_group_id(efa_addresses: Sequence[str]) -> str:
    """The AWS connected-group id for a group whose Neuron devices pair with these EFA devices.

    Must equal what the EFA driver publishes for the same EFA devices, so that one
    ``matchAttribute`` spans both drivers: de-duplicated (trn1 pairs two Neuron devices with one
    EFA), sorted, comma-joined, SHA-256, first 16 hex chars.
    """
    joined = ",".join(sorted(set(efa_addresses)))
    return hashlib.sha256(joined.encode()).hexdigest()[:GROUP_ID_HEX_CHARS]


def fallback_group_id(node_name: str, size: int, index: int) -> str:
    """Group id where the EFA pairing is unknown: stable across restarts, unique per node.

    Uniqueness across nodes keeps a ``matchAttribute`` from ever pairing devices of different
    nodes; the ``neuron/`` prefix keeps it out of the space of EFA address lists.
    """
    digest = hashlib.sha256(f"neuron/{node_name}/{size}/{index}".encode()).hexdigest()
    return digest[:GROUP_ID_HEX_CHARS]


def device_group_ids(
    inventory: NodeInventory, profile: InstanceProfile
) -> dict[int, dict[str, str]]:
    """device index -> {``resource.aws.com/devicegroup{N}_id``: id} for every published size.

    Size 1 is published only with an EFA address: without one it would be a per-device unique
    string that no constraint needs. Other sizes are the profile's aligned groups (torus rows,
    halves, all; ring/switch blocks whose size divides the device count).
    """
    by_index = {d.index: d for d in inventory.devices}
    out: dict[int, dict[str, str]] = {i: {} for i in by_index}
    for size in group_sizes(profile):
        for group_no, members in enumerate(connected_groups(profile, size)):
            present = [by_index[i] for i in members if i in by_index]
            if not present:
                continue
            addresses = [d.efa_pci_address for d in present]
            complete = len(present) == len(members) and all(addresses)
            if size == 1:
                if not complete:
                    continue
                group_id = str(addresses[0])
            elif complete:
                group_id = efa_group_id([str(a) for a in addresses])
            else:
                group_id = fallback_group_id(inventory.node_name, size, group_no)
            for d in present:
                out[d.index][device_group_attribute(size)] = group_id
    return out


# --- attributes --------------------------------------------------------------------------------


def _int(v: int) -> dict[str, Any]:
    return {"int": v}


def _str(v: str) -> dict[str, Any]:
    return {"string": v}


def _bool(v: bool) -> dict[str, Any]:
    return {"bool": v}


def _quantity(n_bytes: int) -> str:
    """Bytes as the shortest exact binary-suffixed quantity (``96Gi``), as users read them."""
    for suffix, unit in (("Ti", 1024 * GIB), ("Gi", GIB), ("Mi", 1024**2), ("Ki", 1024)):
        if n_bytes and n_bytes % unit == 0:
            return f"{n_bytes // unit}{suffix}"
    return str(n_bytes)


def _node_attributes(
    inventory: NodeInventory,
    profile: InstanceProfile,
    *,
    node_labels: Mapping[str, str],
    dra_driver_version: str,
) -> dict[str, dict[str, Any]]:
    """Attributes every device of the node carries (README: the attributes "on all")."""
    assert inventory.instance_type is not None  # inventory_profile checked it
    attrs: dict[str, dict[str, Any]] = {
        ATTR_INSTANCE_TYPE: _str(inventory.instance_type),
        ATTR_DRA_DRIVER_VERSION: {"version": dra_driver_version},
    }
    if inventory.driver_version:
        attrs[ATTR_NEURON_DRIVER_VERSION] = _str(inventory.driver_version)
    for label, attr in NETWORK_NODE_LAYER_ATTRIBUTES:
        if node_labels.get(label):
            attrs[attr] = _str(node_labels[label])
    counts = ultraserver_node_counts(inventory, profile)
    if counts:
        capacity_block = node_labels.get(LABEL_CAPACITY_BLOCK_ID) or None
        us = inventory.ultraserver
        server_id = (us.server_id_4 if us else None) or capacity_block
        if server_id:
            attrs[ATTR_ULTRASERVER_ID] = _str(server_id)
        if capacity_block:
            attrs[ATTR_CAPACITY_BLOCK_ID] = _str(capacity_block)
        if us is not None and us.node_id_4 is not None:
            attrs[ATTR_ULTRASERVER_NODE_ID] = _int(us.node_id_4)
        attrs[ATTR_ULTRASERVER_MODES] = _str(format_ultraserver_modes(counts))
    return attrs


def _device_entry(
    device: NeuronDevice,
    profile: InstanceProfile,
    *,
    common: Mapping[str, dict[str, Any]],
    groups: Mapping[str, str],
    lnc: int,
    workload_id: str | None,
    taint_effect: str | None,
    core_sharing: bool = False,
) -> dict[str, Any]:
    cores = device_core_count(device, profile)
    attrs: dict[str, dict[str, Any]] = {
        ATTR_DEVICE_ID: _int(device.index),
        ATTR_RESOURCE_TYPE: _str(RESOURCE_TYPE_DEVICE),
        **common,
        ATTR_CORE_COUNT: _int(cores),
        ATTR_LOGICAL_CORE_COUNT: _int(cores // lnc),
    }
    in_range = 0 <= device.index < profile.device_count
    if profile.topology is Topology.TORUS and in_range:
        x, y = coordinates(profile, device.index)
        attrs[ATTR_TOPOLOGY_X] = _int(x)
        attrs[ATTR_TOPOLOGY_Y] = _int(y)
        # Only where rows of 4 and halves of 8 are the instance's connected groups (the 4x4
        # types); a discovered odd-shaped torus gets coordinates but no ids that would lie.
        for size, attr in ((4, ATTR_TOPOLOGY4_ID), (8, ATTR_TOPOLOGY8_ID)):
            if connected_groups(profile, size):
                attrs[attr] = _int(device.index // size)
    for name, group_id in groups.items():
        attrs[name] = _str(group_id)
    if device.pci is not None:
        # Kubernetes' standard names: a claim aligns these with other drivers' devices.
        attrs[ATTR_PCI_BUS_ID] = _str(device.pci.bus_id)
        if device.pci.pcie_root is not None:
            attrs[ATTR_PCIE_ROOT] = _str(device.pci.pcie_root)
        if device.pci.numa_node is not None:
            attrs[ATTR_NUMA_NODE] = _int(device.pci.numa_node)
    if workload_id is not None:
        attrs[ATTR_WORKLOAD_ID] = _str(workload_id)
    attrs[ATTR_HEALTHY] = _bool(device.healthy)
    capacity = {CAPACITY_CORES: {"value": str(cores)}}
    if profile.device_memory_bytes:
        capacity[CAPACITY_MEMORY] = {"value": _quantity(profile.device_memory_bytes)}
    entry = {"name": device_name(device.index), "attributes": attrs, "capacity": capacity}
    if core_sharing:  # several claims on its cores (coresharing.py)
        entry = sharable(entry, cores // lnc)
    return _with_taints(entry, device_taints(device, taint_effect))


def _with_taints(entry: dict[str, Any], taints: list[dict[str, Any]]) -> dict[str, Any]:
    # Only when there are any: an empty list would differ from what the API server returns.
    if taints:
        entry["taints"] = taints
    return entry


def _node_device_entry(
    inventory: NodeInventory,
    profile: InstanceProfile,
    *,
    common: Mapping[str, dict[str, Any]],
    workload_id: str | None,
    taint_effect: str | None,
) -> dict[str, Any]:
    attrs: dict[str, dict[str, Any]] = {ATTR_RESOURCE_TYPE: _str(RESOURCE_TYPE_NODE), **common}
    if workload_id is not None:
        attrs[ATTR_WORKLOAD_ID] = _str(workload_id)
    attrs[ATTR_HEALTHY] = _bool(all(d.healthy for d in inventory.devices))
    cores = sum(device_core_count(d, profile) for d in inventory.devices)
    capacity = {CAPACITY_CORES: {"value": str(cores)}}
    if profile.device_memory_bytes:
        total = profile.device_memory_bytes * len(inventory.devices)
        capacity[CAPACITY_MEMORY] = {"value": _quantity(total)}
    entry = {"name": NODE_DEVICE_NAME, "attributes": attrs, "capacity": capacity}
    return _with_taints(entry, node_device_taints(inventory.devices, taint_effect))


def _node_workload_id(workload_ids: Mapping[int | str, str]) -> str | None:
    """Tag for ``neuronnode``: the node's reservation, else that of any reserved device.

    ``neuronnode`` overlaps every device, so it must not look free while any device is
    reserved. With devices reserved for different workloads no claim can use it; tagging it
    with one of them (the smallest, for determinism) still keeps it out of the default class,
    and Prepare checks every overlapped device anyway.
    """
    if WHOLE_NODE in workload_ids:
        return workload_ids[WHOLE_NODE]
    device_tags = sorted(v for k, v in workload_ids.items() if k != WHOLE_NODE)
    return device_tags[0] if device_tags else None


# --- limits --------------------------------------------------------------------------------------


def check_device_limits(device: Mapping[str, Any]) -> None:
    """Raise SliceBuildError if ``device`` breaks a ResourceSlice limit of the API server."""
    name = device.get("name", "")
    if not _DNS_LABEL.fullmatch(name) or len(name) > 63:
        raise SliceBuildError(f"device name {name!r} is not a DNS label")
    attrs: Mapping[str, Mapping[str, Any]] = device.get("attributes", {})
    capacity: Mapping[str, Any] = device.get("capacity", {})
    total = len(attrs) + len(capacity)
    if total > MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE:
        raise SliceBuildError(
            f"device {name} has {total} attributes and capacities "
            f"(limit {MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE}): {sorted([*attrs, *capacity])}"
        )
    for key in [*attrs, *capacity]:
        ident = key.rsplit("/", 1)[-1]
        if len(ident) > MAX_ATTRIBUTE_ID_LENGTH or not _C_IDENTIFIER.fullmatch(ident):
            raise SliceBuildError(
                f"device {name}: attribute name {key!r} is not a C identifier of at most "
                f"{MAX_ATTRIBUTE_ID_LENGTH} characters"
            )
    for key, value in attrs.items():
        if len(value) != 1:
            raise SliceBuildError(f"device {name}: attribute {key} must have exactly one value")
        ((kind, v),) = value.items()
        if kind in ("string", "version") and len(v) > MAX_ATTRIBUTE_VALUE_LENGTH:
            raise SliceBuildError(
                f"device {name}: attribute {key} value {v!r} is longer than "
                f"{MAX_ATTRIBUTE_VALUE_LENGTH} characters"
            )
        if kind == "version" and not _SEMVER.fullmatch(v):
            raise SliceBuildError(
                f"device {name}: attribute {key} value {v!r} is not strict semver "
                "(MAJOR.MINOR.PATCH[-pre][+build], no leading v)"
            )


# --- slices --------------------------------------------------------------------------------------


def slice_name(node_name: str, index: int) -> str:
    """Deterministic name of slice ``index`` of this node's pool.

    Deterministic (not generateName) so a restarted plugin finds and updates its own slices.
    Node names may use the full 253 characters; then the node part is shortened and a hash of
    the full name keeps the result unique.
    """
    suffix = f"-{DRIVER_NAME}-{index}"
    name = node_name + suffix
    if len(name) <= _MAX_OBJECT_NAME:
        return name
    digest = hashlib.sha256(node_name.encode()).hexdigest()[:10]
    keep = _MAX_OBJECT_NAME - len(suffix) - len(digest) - 1
    return f"{node_name[:keep].rstrip('.-')}-{digest}{suffix}"


def build_resource_slices(
    inventory: NodeInventory,
    *,
    node_name: str,
    node_uid: str,
    node_labels: Mapping[str, str],
    dra_driver_version: str,
    workload_ids: Mapping[int | str, str] | None = None,
    generation: int,
    taint_effect: str | None = None,
    core_sharing: bool = False,
) -> list[dict[str, Any]]:
    """The ResourceSlices (resource.k8s.io/v1) publishing this node's devices.

    ``workload_ids`` maps a device index, or ``"node"`` for the whole node, to the workload it
    is reserved for; a device-specific entry wins over ``"node"``. ``taint_effect`` is the
    effect of the taints on unhealthy devices (:mod:`.publish.taints`); None publishes none.
    ``core_sharing`` publishes the devices for claims on some of their cores (:mod:`.coresharing`).
    """
    if not node_uid:
        raise SliceBuildError(f"node {node_name}: uid required for the owner reference")
    if generation < 0:
        raise SliceBuildError(f"pool generation must be >= 0, got {generation}")
    if not _SEMVER.fullmatch(dra_driver_version):
        raise SliceBuildError(
            f"draDriverVersion {dra_driver_version!r} is not strict semver "
            "(MAJOR.MINOR.PATCH[-pre][+build], no leading v)"
        )
    workload_ids = workload_ids or {}
    devices: list[dict[str, Any]] = []
    if inventory.devices:
        profile = inventory_profile(inventory)
        common = _node_attributes(
            inventory, profile, node_labels=node_labels, dra_driver_version=dra_driver_version
        )
        groups = device_group_ids(inventory, profile)
        lnc = node_default_lnc(inventory, profile)
        node_tag = workload_ids.get(WHOLE_NODE)
        for dev in sorted(inventory.devices, key=lambda d: d.index):
            devices.append(
                _device_entry(
                    dev,
                    profile,
                    common=common,
                    groups=groups[dev.index],
                    lnc=lnc,
                    workload_id=workload_ids.get(dev.index, node_tag),
                    taint_effect=taint_effect,
                    core_sharing=core_sharing,
                )
            )
        if ultraserver_node_counts(inventory, profile):
            devices.append(
                _node_device_entry(
                    inventory,
                    profile,
                    common=common,
                    workload_id=_node_workload_id(workload_ids),
                    taint_effect=taint_effect,
                )
            )
    for device in devices:
        check_device_limits(device)

    chunks = [
        devices[i : i + MAX_DEVICES_PER_SLICE]
        for i in range(0, len(devices), MAX_DEVICES_PER_SLICE)
    ] or [[]]
    owner = {
        "apiVersion": "v1",
        "kind": "Node",
        "name": node_name,
        "uid": node_uid,
        # The Node is the only owner: deleting it garbage-collects the slices, which is what a
        # vanished node's devices need.
        "controller": True,
    }
    return [
        {
            "apiVersion": RESOURCE_API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name(node_name, i), "ownerReferences": [dict(owner)]},
            "spec": {
                "driver": DRIVER_NAME,
                "nodeName": node_name,
                "pool": {
                    "name": node_name,
                    "generation": generation,
                    "resourceSliceCount": len(chunks),
                },
                "devices": chunk,
            },
        }
        for i, chunk in enumerate(chunks)
    ]


def _normalized_spec(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a slice that consumers see, minus the generation, in a canonical form.

    Quantities are compared by value because the API server may re-serialise them; taints
    without the ``timeAdded`` the API server sets.
    """
    spec = obj.get("spec") or {}
    pool = spec.get("pool") or {}
    devices = {}
    for d in spec.get("devices") or []:
        entry = {k: v for k, v in d.items() if k not in ("name", "capacity")}
        entry["capacity"] = {
            k: {**c, "value": parse_quantity(str(c.get("value", "0")))}
            for k, c in (d.get("capacity") or {}).items()
        }
        entry.setdefault("attributes", {})
        entry["taints"] = comparable_taints(d.get("taints") or [])
        devices[d.get("name")] = entry
    return {
        "driver": spec.get("driver"),
        "nodeName": spec.get("nodeName"),
        "pool": {"name": pool.get("name"), "resourceSliceCount": pool.get("resourceSliceCount")},
        "devices": devices,
    }


def slice_content_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether publishing ``new`` over ``old`` changes what schedulers see (not metadata,
    not the pool generation: bumping it is the consequence of a change, not a change)."""
    return _normalized_spec(old) != _normalized_spec(new)


def _generation(obj: Mapping[str, Any]) -> int:
    value = ((obj.get("spec") or {}).get("pool") or {}).get("generation", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def next_generation(
    existing: Sequence[Mapping[str, Any]], desired: Sequence[Mapping[str, Any]]
) -> int:
    """The pool generation to publish ``desired`` with, given the slices now in the API.

    Unchanged content keeps the generation (no churn for schedulers on a plugin restart).
    Any change, a different set of slice names, or slices left at mixed generations by an
    interrupted update moves to one past the highest: consumers only trust the highest
    generation of a pool, so it must be strictly newer than anything they may have seen.
    """
    if not existing:
        return 0
    highest = max(_generation(s) for s in existing)
    old = {s.get("metadata", {}).get("name"): s for s in existing}
    new = {s.get("metadata", {}).get("name"): s for s in desired}
    mixed = any(_generation(s) != highest for s in existing)
    changed = old.keys() != new.keys() or any(
        slice_content_changed(old[name], new[name]) for name in new
    )
    return highest + 1 if changed or mixed else highest
