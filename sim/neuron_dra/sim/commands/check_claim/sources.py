"""Where check-claim's devices come from: a live cluster (``--kubeconfig``), a file of
ResourceSlices (``--slices``) or freshly emulated nodes (``--emulate``), each read into a
:class:`Cluster`."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_dra.common.deviceclasses import default_classes_by_name
from neuron_dra.sim.allocation import DeviceKey
from neuron_dra.sim.commands.check_claim.inputs import (
    RESOURCE_GROUP,
    InputError,
    as_dict,
    as_list,
    classes_of,
    is_kind,
    read_objects,
)


@dataclass
class Cluster:
    """Devices, classes and devices in use, from one of the sources."""

    slices: list[dict[str, Any]]
    classes: dict[str, dict[str, Any]]
    allocated: set[DeviceKey] = field(default_factory=set)
    source: str = ""


def allocated_devices(claims: Iterable[Mapping[str, Any]]) -> set[DeviceKey]:
    """Devices held by allocated claims (admin-access results do not block others)."""
    out: set[DeviceKey] = set()
    for claim in claims:
        devices = as_dict(as_dict(as_dict(claim.get("status")).get("allocation")).get("devices"))
        for result in as_list(devices.get("results")):
            r = as_dict(result)
            if r.get("adminAccess"):
                continue
            out.add((str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", ""))))
    return out


def from_slices_file(path: str) -> Cluster:
    objects = read_objects(path, "--slices")
    slices = [dict(o) for o in objects if is_kind(o, "ResourceSlice")]
    if not slices:
        raise InputError(f"--slices {path}: no ResourceSlice in it")
    claims = [o for o in objects if is_kind(o, "ResourceClaim")]
    classes = {**default_classes_by_name(), **classes_of(objects)}
    return Cluster(slices, classes, allocated_devices(claims), source=f"slices from {path}")


def emulated_node_names(types: Sequence[str]) -> list[str]:
    """A type's name as the node name; ``<type>-<i>`` when it is emulated more than once."""
    totals = Counter(types)
    seen: Counter[str] = Counter()
    names = []
    for t in types:
        names.append(t if totals[t] == 1 else f"{t}-{seen[t]}")
        seen[t] += 1
    return names


def from_emulation(types: Sequence[str]) -> Cluster:
    """Slices of freshly emulated nodes, built by the kubelet plugin's own code.

    UltraServer-capable types get UltraServer ids: the k-th node of a type is node ``k % 4``
    of UltraServer ``k // 4`` of that type.
    """
    from neuron_dra.common.profiles import PROFILES
    from neuron_dra.nodeplugin.discovery.emulation import (
        known_types,
        scan_emulated,
        write_emulated_tree,
    )
    from neuron_dra.nodeplugin.plugin import dra_driver_version
    from neuron_dra.nodeplugin.publish.slices import build_resource_slices

    unknown = [t for t in types if t not in known_types()]
    if unknown:
        raise InputError(
            f"--emulate {unknown[0]}: unknown instance type; known types: "
            + ", ".join(known_types())
        )
    version = dra_driver_version()
    slices: list[dict[str, Any]] = []
    index: Counter[str] = Counter()
    with tempfile.TemporaryDirectory(prefix="neuron-dra-check-claim-") as tmp:
        for n, (instance_type, node) in enumerate(
            zip(types, emulated_node_names(types), strict=True)
        ):
            k = index[instance_type]
            index[instance_type] += 1
            us_capable = PROFILES[instance_type].ultraserver_capable
            paths = write_emulated_tree(
                Path(tmp) / f"node{n}",
                instance_type,
                node_name=node,
                ultraserver_id=f"emulated-{instance_type}-{k // 4}" if us_capable else None,
                ultraserver_node_id=k % 4 if us_capable else None,
            )
            inventory = scan_emulated(paths, node_name=node)
            slices += build_resource_slices(
                inventory,
                node_name=node,
                node_uid=str(uuid.uuid5(uuid.NAMESPACE_DNS, node)),
                node_labels={},
                dra_driver_version=version,
                generation=0,
            )
    return Cluster(
        slices, default_classes_by_name(), source="emulated " + ", ".join(sorted(set(types)))
    )


async def _read_cluster(kubeconfig: str) -> Cluster:
    from neuron_dra.common.k8s.client import (
        DEVICE_CLASSES,
        RESOURCE_CLAIMS,
        RESOURCE_SLICES,
        connect,
    )

    async with await connect(kubeconfig) as kube:
        slices = (await kube.resource(RESOURCE_SLICES).list_all()).items
        classes = (await kube.resource(DEVICE_CLASSES).list_all()).items
        claims = (await kube.resource(RESOURCE_CLAIMS).list_all()).items
    return Cluster(
        [dict(s) for s in slices],
        classes_of(
            {**c, "apiVersion": f"{RESOURCE_GROUP}/v1", "kind": "DeviceClass"} for c in classes
        ),
        allocated_devices(claims),
        source=f"cluster of {kubeconfig}",
    )


def from_cluster(kubeconfig: str) -> Cluster:
    from neuron_dra.common.k8s.errors import KubeError

    if not Path(kubeconfig).is_file():
        raise InputError(f"--kubeconfig {kubeconfig}: file not found")
    try:
        return asyncio.run(_read_cluster(kubeconfig))
    except (KubeError, OSError) as exc:
        raise InputError(f"--kubeconfig {kubeconfig}: cannot read the cluster: {exc}") from None
