"""CDI specs for prepared claims (content: docs/configuration.md; format: the CDI spec 0.3-1.1).

The pure part computes the spec (device nodes and the Neuron runtime's environment) from a
ClaimPlan; the edge writes, removes and lists the per-claim spec files in the CDI directory
that the container runtime reads when the kubelet hands it our CDI device ids.

Where the environment goes: in the spec-level ``containerEdits``. The runtime applies those
once for a container that gets *any* device of the spec, so a container given all of the
claim's CDI ids gets each variable exactly once. (Repeating identical values on every device
would also work, as CDI keeps the last value per name, but the spec-level edit says what we
mean.) Per-device edits carry only that device's ``/dev/neuron<N>`` nodes.

A claim's environment describes the Neuron devices of the containers that use it, which is
not always the claim's own set: a container naming two claims needs the cores of both in
each claim's spec (the runtime keeps the last value of a variable), and a container naming
one request of a two-request claim only that request's cores. The preparer works out that
set from the claims' consumer pods (prepare/containers.py) and passes it as ``env_indices``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from neuron_dra.common.constants import NODE_DEVICE_NAME, device_index
from neuron_dra.common.profiles import UltraServerMode
from neuron_dra.common.ultraserver import UltraServerPeers
from neuron_dra.nodeplugin.prepare.atomicfile import fsync_dir, replace_file
from neuron_dra.nodeplugin.prepare.claims import ClaimPlan
from neuron_dra.nodeplugin.prepare.node import PrepareNode

CDI_KIND: Final = "k8s.neuron.aws.com/claim"

ENV_VISIBLE_CORES: Final = "NEURON_RT_VISIBLE_CORES"
ENV_LNC: Final = "NEURON_LOGICAL_NC_CONFIG"
ENV_US_MODE: Final = "NEURON_RT_ULTRASERVER_MODE"
ENV_US_SERVER_ID: Final = "NEURON_RT_ULTRASERVER_SERVER_ID"
ENV_US_NODE_ID: Final = "NEURON_RT_ULTRASERVER_NODE_ID"
ENV_GLOBAL_TOPOID: Final = "NEURON_GLOBAL_TOPOID"
ENV_GLOBAL_TOPOID0_HOST: Final = "NEURON_GLOBAL_TOPOID0_HOST"

_CDI_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")


class CdiError(RuntimeError):
    """The plan cannot be expressed as a CDI spec. Internal: plan_claim should have refused it."""


# --- pure: spec content --------------------------------------------------------------------------


def runtime_ultraserver_mode(node_count: int, *, supports_x2v: bool) -> UltraServerMode:
    """The driver enum the runtime expects for a group of ``node_count`` nodes.

    Two nodes prefer the vertical links where the node supports them: on a fully elected
    4-node UltraServer the driver offers 2-node mode only as X2V (pairs {0,1} and {2,3}).
    """
    match node_count:
        case 4:
            return UltraServerMode.X4
        case 2:
            return UltraServerMode.X2V if supports_x2v else UltraServerMode.X2H
        case 1:
            return UltraServerMode.X1
    raise CdiError(f"no UltraServer mode for {node_count} nodes (1, 2 or 4)")


def visible_cores(device_indices: Iterable[int], logical_cores_per_device: int) -> str:
    """``NEURON_RT_VISIBLE_CORES`` for these devices: global logical core ids as one range.

    Global id = device index x logical cores per device + local id, so consecutive devices
    give one contiguous range, the only form the runtime accepts.
    """
    indices = sorted(set(device_indices))
    if not indices or logical_cores_per_device < 1:
        raise CdiError(f"no cores for devices {indices} at {logical_cores_per_device} per device")
    if indices[-1] - indices[0] + 1 != len(indices):
        raise CdiError(f"devices {indices} are not consecutive: no contiguous core range")
    first = indices[0] * logical_cores_per_device
    last = (indices[-1] + 1) * logical_cores_per_device - 1
    return str(first) if first == last else f"{first}-{last}"


def cdi_device_name(plan: ClaimPlan, device: str) -> str:
    return f"{plan.claim_uid}-{device}"


def cdi_device_ids(plan: ClaimPlan, *, cdi_kind: str = CDI_KIND) -> list[str]:
    """Fully-qualified CDI ids (``vendor/class=name``), one per allocated device, in
    ``plan.devices`` order (the kubelet gets them per device with the request names)."""
    return [f"{cdi_kind}={cdi_device_name(plan, device)}" for _, device in plan.devices]


def claim_env(
    plan: ClaimPlan, node: PrepareNode, *, topology: UltraServerPeers | None = None
) -> dict[str, str]:
    """The Neuron runtime environment for a container using the claim's devices."""
    profile = node.profile
    lnc = plan.lnc if plan.lnc is not None else node.default_lnc
    env = {ENV_VISIBLE_CORES: visible_cores(plan.device_indices, profile.cores_per_device // lnc)}
    # Only where LNC is a setting at all (Trn2/Trn3). Besides a configured value, also when the
    # node's default differs from the type's: the runtime in the container cannot read the
    # node's /opt/aws/neuron file, and the core ids above assume the node's value.
    if len(profile.allowed_lnc) > 1 and (plan.lnc is not None or lnc != profile.default_lnc):
        env[ENV_LNC] = str(lnc)

    node_count = plan.ultraserver_mode_nodes
    if node_count is None and topology is not None:
        node_count = topology.topology_size
    if node_count is not None:
        mode = runtime_ultraserver_mode(node_count, supports_x2v=node.supports_x2v)
        env[ENV_US_MODE] = str(int(mode))
        if node_count > 1:
            # server_id_<n>/node_id_<n> exist for the 2- and 4-node groupings only; a single
            # node has no peers to identify.
            ids = node.ultraserver_ids(node_count)
            if ids is None:
                raise CdiError(
                    f"node {node.name}: no {node_count}-node UltraServer id "
                    "(plan_claim should have refused the claim)"
                )
            env[ENV_US_SERVER_ID] = str(ids.server_id)
            env[ENV_US_NODE_ID] = str(ids.node_id)
    if topology is not None:
        env[ENV_GLOBAL_TOPOID] = str(topology.global_topo_id)
        env[ENV_GLOBAL_TOPOID0_HOST] = topology.leader_host
    return env


#: Under emulation the container gets a character device with /dev/null's numbers at each
#: /dev/neuron<N>: present and harmless. The emulated host "device" is a regular file, which a
#: CDI runtime refuses to stat as a device node, but a node given with its type and a major
#: number is complete and the runtime does not look at the host (CDI's fillMissingInfo).
EMULATED_DEVICE_NUMBERS: Final = (1, 3)


def _device_nodes(indices: Iterable[int], node: PrepareNode) -> list[dict[str, Any]]:
    nodes = []
    for index in sorted(indices):
        path = f"/dev/neuron{index}"
        device = node.device(index)
        entry: dict[str, Any] = {"path": path}
        if device is not None and device.emulated:
            major, minor = EMULATED_DEVICE_NUMBERS
            nodes.append({**entry, "type": "c", "major": major, "minor": minor})
            continue
        # With the host's /dev mounted elsewhere in the plugin the host path differs; usually the
        # paths are equal and leaving hostPath out keeps the spec loadable by older CDI versions.
        if device is not None and device.host_path and device.host_path != path:
            entry["hostPath"] = device.host_path
        nodes.append(entry)
    return nodes


def minimum_cdi_version(spec: Mapping[str, Any]) -> str:
    """The oldest CDI spec version that can carry ``spec``'s content.

    Runtimes with an older CDI library reject newer version strings, so we declare the least.
    """
    version = (0, 3, 0)
    edits = [spec.get("containerEdits") or {}]
    edits += [d.get("containerEdits") or {} for d in spec.get("devices", [])]
    if spec.get("annotations") or any(d.get("annotations") for d in spec.get("devices", [])):
        version = max(version, (0, 6, 0))
    for e in edits:
        if any("type" in m for m in e.get("mounts") or []):
            version = max(version, (0, 4, 0))
        if any("hostPath" in n for n in e.get("deviceNodes") or []):
            version = max(version, (0, 5, 0))
        if e.get("intelRdt") is not None or e.get("additionalGids"):
            version = max(version, (0, 7, 0))
        if e.get("netDevices"):
            version = max(version, (1, 1, 0))
    if any(d["name"][:1].isdigit() for d in spec.get("devices", [])):
        version = max(version, (0, 5, 0))  # claim UIDs often start with a digit
    return ".".join(str(p) for p in version)


def cdi_spec_for(
    plan: ClaimPlan,
    node: PrepareNode,
    *,
    cdi_kind: str = CDI_KIND,
    topology: UltraServerPeers | None = None,
    env_indices: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The CDI spec (JSON-ready dict) for one prepared claim. Its environment describes
    ``env_indices`` when given: the Neuron devices of the containers that use the claim
    (prepare/containers.py), else the claim's own."""
    devices = []
    for _, device in plan.devices:
        indices = plan.device_indices if device == NODE_DEVICE_NAME else _own_index(device)
        name = cdi_device_name(plan, device)
        if not _CDI_NAME.fullmatch(name):
            raise CdiError(f"{name!r} is not a valid CDI device name")
        devices.append(
            {"name": name, "containerEdits": {"deviceNodes": _device_nodes(indices, node)}}
        )
    if not devices:
        raise CdiError(f"claim {plan.key}: no devices")
    scope = plan if env_indices is None else replace(plan, device_indices=tuple(env_indices))
    # An admin-access claim watches devices other claims use: their device nodes only, none
    # of the runtime's settings (cores, LNC, ranks belong to the claims that use them).
    env = {} if plan.admin_access else claim_env(scope, node, topology=topology)
    spec: dict[str, Any] = {
        "cdiVersion": "",
        "kind": cdi_kind,
        "devices": devices,
        "containerEdits": {"env": [f"{k}={v}" for k, v in env.items()]},
    }
    spec["cdiVersion"] = minimum_cdi_version(spec)
    return spec


def _own_index(device: str) -> tuple[int, ...]:
    index = device_index(device)
    if index is None:
        raise CdiError(f"unexpected device name {device!r}")
    return (index,)


# --- edge: spec files ----------------------------------------------------------------------------


def spec_file_name(claim_uid: str, *, cdi_kind: str = CDI_KIND) -> str:
    """Transient spec name per the CDI convention: ``<vendor>-<class>_<id>.json``."""
    vendor, _, cls = cdi_kind.partition("/")
    return f"{vendor}-{cls}_{claim_uid.replace('/', '_')}.json"


def write_cdi_spec(
    cdi_root: Path, spec: Mapping[str, Any], claim_uid: str, *, cdi_kind: str = CDI_KIND
) -> Path:
    """Write ``spec`` atomically: the runtime sees the old file or the complete new one.

    The temporary file sits in the same directory (rename is atomic only within a file
    system) and is named so CDI ignores it (hidden, not ``.json``). File and directory are
    fsynced so a prepared claim's spec survives a crash right after Prepare returns.
    """
    target = cdi_root / spec_file_name(claim_uid, cdi_kind=cdi_kind)
    # Compact: the C encoder (``indent`` takes the pure-Python one, ~4x the time on the
    # Prepare path); ``jq .`` shows it to humans.
    raw = json.dumps(spec, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    # 0644: runtimes may read it as a different user.
    replace_file(target, raw, mode=0o644)
    return target


def remove_cdi_spec(cdi_root: Path, claim_uid: str, *, cdi_kind: str = CDI_KIND) -> None:
    """Remove the claim's spec; already gone is fine (Unprepare is retried)."""
    with contextlib.suppress(FileNotFoundError):
        (cdi_root / spec_file_name(claim_uid, cdi_kind=cdi_kind)).unlink()
        fsync_dir(cdi_root)


def list_cdi_specs(cdi_root: Path, *, cdi_kind: str = CDI_KIND) -> set[str]:
    """Claim UIDs with a spec file of our kind in ``cdi_root`` (for cleanup after restarts)."""
    prefix = spec_file_name("", cdi_kind=cdi_kind).removesuffix(".json")
    try:
        names = os.listdir(cdi_root)
    except FileNotFoundError:
        return set()
    return {
        n[len(prefix) : -len(".json")]
        for n in names
        if n.startswith(prefix) and n.endswith(".json") and len(n) > len(prefix) + len(".json")
    }
