"""What a container would get: the container runtime's CDI injection, simulated.

The simulated kubelet records, per container, the CDI device ids the plugin returned
(:data:`~neuron_dra.sim.controlplane.CDI_DEVICES_ANNOTATION`). A CDI-enabled runtime
resolves each id ``<kind>=<name>`` against the spec files in the node's CDI directory and
applies the spec's ``containerEdits`` once plus each named device's edits. :func:`resolve`
does the same from the files the plugin wrote, so what the sim shows is what a runtime would
inject, not what the plugin meant to write.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class CdiResolutionError(Exception):
    """An id names no device of any spec in the directory (the runtime would refuse to start
    the container)."""


@dataclass
class ContainerDevices:
    env: dict[str, str] = field(default_factory=dict)
    device_nodes: list[str] = field(default_factory=list)
    #: Files mounted from the host (the claims' device metadata files): path in the
    #: container -> content.
    files: dict[str, str] = field(default_factory=dict)


def load_specs(cdi_root: Path) -> list[dict[str, Any]]:
    """Every ``*.json`` spec in ``cdi_root`` (hidden temporary files are skipped, as CDI does)."""
    specs: list[dict[str, Any]] = []
    if not cdi_root.is_dir():
        return specs
    for path in sorted(cdi_root.glob("*.json")):
        if path.name.startswith("."):
            continue
        specs.append(json.loads(path.read_text()))
    return specs


def _apply(edits: Mapping[str, Any], out: ContainerDevices) -> None:
    for entry in edits.get("env") or []:
        key, _, value = str(entry).partition("=")
        out.env[key] = value  # CDI: the last value of a name wins
    for node in edits.get("deviceNodes") or []:
        path = str(node.get("path"))
        if path not in out.device_nodes:
            out.device_nodes.append(path)
    for mount in edits.get("mounts") or []:
        # What the runtime's bind mount shows: the host file as it is now. A missing source
        # would fail the container's creation; here the file is just absent.
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            host = Path(str(mount.get("hostPath")))
            out.files[str(mount.get("containerPath"))] = host.read_text()


def resolve(specs: Iterable[Mapping[str, Any]], cdi_ids: Iterable[str]) -> ContainerDevices:
    """Resolve fully-qualified CDI device ids against ``specs``."""
    by_id: dict[str, tuple[int, Mapping[str, Any]]] = {}
    spec_list = list(specs)
    for i, spec in enumerate(spec_list):
        for dev in spec.get("devices") or []:
            by_id[f"{spec.get('kind')}={dev.get('name')}"] = (i, dev)
    out = ContainerDevices()
    applied: set[int] = set()
    for cdi_id in cdi_ids:
        try:
            i, dev = by_id[cdi_id]
        except KeyError:
            raise CdiResolutionError(f"unresolvable CDI device {cdi_id}") from None
        if i not in applied:
            _apply(spec_list[i].get("containerEdits") or {}, out)
            applied.add(i)
        _apply(dev.get("containerEdits") or {}, out)
    return out
