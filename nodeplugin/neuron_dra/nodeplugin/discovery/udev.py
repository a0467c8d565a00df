"""Production enumerator: list Neuron devices through libudev (pyudev), read them like sysfs.

libudev is what the rest of the system (udev rules, the container runtime's device handling)
uses to name devices, so it is the authority on which ``neuron_device`` devices exist and
what their device node is called. Only the *listing* comes from udev; every attribute is then
read by the pure readers of ``sysfs.py``, so both paths report identical inventories and
share one set of tolerance rules.

Fallbacks to the pure scanner, each logged with its reason:

- pyudev cannot be imported or libudev cannot be loaded (distroless/Alpine images without
  ``libudev.so.1``: ImportError/OSError);
- libudev looks at a different sysfs than the one we were asked to scan (modern libudev
  hard-codes ``/sys``, so an emulated or test tree can only be read by the scanner);
- enumeration itself fails with an OSError.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from . import sysfs
from .model import NodeInventory

log = logging.getLogger(__name__)

SUBSYSTEM = "neuron_device"
_NO_LABELS: Mapping[str, str] = MappingProxyType({})


def _default_context() -> Any:
    import pyudev  # local: a missing pyudev/libudev must only disable this backend

    return pyudev.Context()


def list_udev_devices(context: Any, dev_root: Path, problems: list[str]) -> list[sysfs.DeviceEntry]:
    """Device entries for every ``neuron_device`` udev knows, sorted by index.

    The device node name comes from udev (``DEVNAME``) but is looked up under ``dev_root``,
    because the plugin may see the host's ``/dev`` at another path.
    """
    entries: dict[int, sysfs.DeviceEntry] = {}
    for device in context.list_devices(subsystem=SUBSYSTEM):
        name = str(device.sys_name)
        index = sysfs.device_index(name)
        if index is None:
            problems.append(f"{device.sys_path}: udev {SUBSYSTEM} device {name!r} ignored")
            continue
        node = device.device_node
        node_name = Path(str(node)).name if node else name
        entries[index] = sysfs.DeviceEntry(
            index=index, sys_dir=Path(str(device.sys_path)), dev_node=dev_root / node_name
        )
    return [entries[i] for i in sorted(entries)]


def scan_udev(
    sysfs_root: Path = Path("/sys"),
    dev_root: Path = Path("/dev"),
    *,
    node_name: str,
    node_labels: Mapping[str, str] = _NO_LABELS,
    opt_root: Path | None = None,
    efa_map: Mapping[int, str] | None = None,
    host_dev_root: Path | None = None,
    context_factory: Callable[[], Any] = _default_context,
) -> NodeInventory:
    """Like ``sysfs.scan`` but lists devices through udev; falls back to ``sysfs.scan``.

    ``context_factory`` returns a ``pyudev.Context`` (or anything with ``sys_path`` and
    ``list_devices(subsystem=...)``); tests inject one.
    """

    def fallback(reason: str) -> NodeInventory:
        log.info("udev enumeration unavailable (%s); using the sysfs scanner", reason)
        return sysfs.scan(
            sysfs_root,
            dev_root,
            node_name=node_name,
            node_labels=node_labels,
            opt_root=opt_root,
            efa_map=efa_map,
            host_dev_root=host_dev_root,
        )

    try:
        context = context_factory()
    except (ImportError, OSError) as e:
        return fallback(f"libudev not usable: {e}")
    udev_sys = Path(str(context.sys_path))
    if udev_sys.resolve() != sysfs_root.resolve():
        return fallback(f"libudev reads {udev_sys}, not {sysfs_root}")
    problems: list[str] = []
    try:
        entries = list_udev_devices(context, dev_root, problems)
    except OSError as e:
        return fallback(f"udev enumeration failed: {e}")
    if not entries and not (sysfs_root / sysfs.CLASS_DIR).is_dir():
        problems.append(f"{sysfs_root / sysfs.CLASS_DIR}: missing; the neuron driver is not loaded")
    return sysfs.build_inventory(
        entries,
        sysfs_root,
        node_name=node_name,
        node_labels=node_labels,
        opt_root=opt_root,
        efa_map=efa_map,
        host_dev_root=host_dev_root,
        problems=problems,
    )
