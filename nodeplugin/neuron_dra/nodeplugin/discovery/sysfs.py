"""The pure sysfs/dev scanner: turns a Neuron driver's sysfs tree into a ``NodeInventory``.

Every path is under roots the caller passes (``sysfs_root``, ``dev_root``, ``opt_root``), so
the same code reads the host's ``/sys`` in production, an emulated tree in emulation mode
(``emulation.py``) and hand-made trees in tests. The udev enumerator (``udev.py``) only
replaces the listing step and reuses everything else here.

Reading is tolerant by design: sysfs files appear and disappear with driver versions and
while the driver (un)loads, so a value that is missing, unreadable or malformed becomes
``None`` plus an entry in ``NodeInventory.problems`` naming the path and the reason. Nothing
here raises for bad hardware data; the plugin logs the problems and rescans later.

File formats are those of the Neuron kernel driver 2.24+ (its source and AWS's sysfs user guide).
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from neuron_dra.common.constants import LABEL_INSTANCE_TYPE
from neuron_dra.common.profiles import UltraServerMode

from .model import (
    NO_SERVER_ID,
    FailureClass,
    HealthFault,
    NeuronDevice,
    NodeInventory,
    UltraServerInfo,
)

#: Where the driver's ``neuron_device`` class lists its devices (symlinks) and keeps the
#: class-level UltraServer attributes.
CLASS_DIR = Path("class/neuron_device")
#: Where the device directories really live (the class entries point here).
VIRTUAL_DIR = Path("devices/virtual/neuron_device")
MODULE_VERSION_FILE = Path("module/neuron/version")
DMI_PRODUCT_NAME_FILES = (
    Path("class/dmi/id/product_name"),
    Path("devices/virtual/dmi/id/product_name"),
)
#: Relative to ``opt_root`` (which stands for the host's ``/opt``).
LOGICAL_NC_CONFIG_FILE = Path("aws/neuron/logical_nc_config")
#: A file with this name at the *sysfs root* marks an emulated tree. Only then are regular
#: files accepted as device nodes. A real sysfs cannot contain it (sysfs does not allow
#: creating files), so a stray regular file named ``/dev/neuron3`` on a real node is never
#: mistaken for a device that could be handed to a container.
EMULATION_MARKER = ".neuron-dra-emulated"

#: ECC counters whose non-zero value means memory returned bad data the hardware could not
#: fix. The runtime treats all three as fatal for the workload.
UNCORRECTED_ECC_COUNTERS = (
    "sram_ecc_uncorrected",
    "mem_ecc_uncorrected",
    "mem_ecc_repairable_uncorrected",
)
UNHEALTHY_COMPONENTS_FILE = Path("stats/hardware/health_status/unhealthy_components")

_DEVICE_DIR_NAME = re.compile(r"neuron(0|[1-9][0-9]*)")
_HEX16 = re.compile(r"[0-9a-fA-F]{16}")
_PCI_ADDRESS = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")
#: sysfs attributes are at most one page; anything longer is not a sysfs value.
_MAX_ATTR_BYTES = 4096
_BUSY = "busy"
_NO_LABELS: Mapping[str, str] = MappingProxyType({})


# --- reading one attribute ---------------------------------------------------------------------


def read_attr(path: Path, problems: list[str], *, required: bool = True) -> str | None:
    """The stripped text of a sysfs attribute, or None (with a problem recorded).

    A missing *optional* attribute is not a problem: it only means an older driver or a chip
    that lacks it (e.g. ``health_status`` before driver 2.30, ``serial_number`` on Inf1).
    """
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_ATTR_BYTES + 1)
    except FileNotFoundError:
        if required:
            problems.append(f"{path}: missing")
        return None
    except IsADirectoryError:
        problems.append(f"{path}: unreadable: is a directory")
        return None
    except OSError as e:
        problems.append(f"{path}: unreadable: {e.strerror or e}")
        return None
    if len(data) > _MAX_ATTR_BYTES:
        problems.append(f"{path}: garbage: longer than {_MAX_ATTR_BYTES} bytes")
        return None
    try:
        return data.decode("ascii").strip()
    except UnicodeDecodeError:
        problems.append(f"{path}: garbage: not ASCII text")
        return None


def _garbage(path: Path, value: str, expected: str, problems: list[str]) -> None:
    # repr() keeps control characters and empty values visible in logs.
    problems.append(f"{path}: garbage: {value[:40]!r} is not {expected}")


def read_int(
    path: Path, problems: list[str], *, required: bool = True, minimum: int = 0
) -> int | None:
    text = read_attr(path, problems, required=required)
    if text is None:
        return None
    try:
        value = int(text, 10)
    except ValueError:
        _garbage(path, text, "an integer", problems)
        return None
    if value < minimum:
        _garbage(path, text, f"an integer >= {minimum}", problems)
        return None
    return value


def parse_int_list(text: str) -> tuple[int, ...] | None:
    """``"12, 3, 4, 1"`` -> (12, 3, 4, 1); empty -> (); None if any item is not an index."""
    items = [item.strip() for item in text.split(",")]
    if items == [""]:
        return ()
    if not all(item.isdigit() for item in items):
        return None
    return tuple(int(item) for item in items)


# --- one device ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceEntry:
    """A device found by a lister: where its sysfs directory and its device node should be."""

    index: int
    sys_dir: Path
    #: The device node as this process sees it (under ``dev_root``).
    dev_node: Path


def device_index(name: str) -> int | None:
    """``neuron12`` -> 12; None for anything else (class-level files, other devices)."""
    m = _DEVICE_DIR_NAME.fullmatch(name)
    return int(m.group(1)) if m else None


def is_emulated(sysfs_root: Path) -> bool:
    return (sysfs_root / EMULATION_MARKER).is_file()


def _check_dev_node(path: Path, *, emulated: bool) -> str | None:
    """Why ``path`` cannot be given to a container, or None if it can."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "device node missing"
    except OSError as e:
        return f"device node unusable: {e.strerror or e}"
    if stat.S_ISCHR(mode):
        return None
    if emulated and stat.S_ISREG(mode):
        return None
    return "not a character device"


def read_device(
    entry: DeviceEntry,
    problems: list[str],
    *,
    emulated: bool,
    dev_path: str,
    efa_pci_address: str | None = None,
) -> NeuronDevice | None:
    """Read one device's attributes; None (with a problem) if it cannot be used at all."""
    sys_dir = entry.sys_dir
    if not sys_dir.is_dir():
        # The class entry was listed but its target is gone: the driver is unloading or the
        # device was removed between listing and reading.
        problems.append(f"{sys_dir}: device directory vanished during the scan; skipped")
        return None
    reason = _check_dev_node(entry.dev_node, emulated=emulated)
    if reason is not None:
        problems.append(f"{entry.dev_node}: {reason}; neuron{entry.index} skipped")
        return None

    # Collect this device's problems separately: if the directory vanishes while we read,
    # its "missing" attributes are one consequence, not separate findings.
    own: list[str] = []
    core_count = read_int(sys_dir / "core_count", own, minimum=1)
    connected: tuple[int, ...] = ()
    text = read_attr(sys_dir / "connected_devices", own)
    if text is not None:
        parsed = parse_int_list(text)
        if parsed is None:
            # Half a neighbour list would describe a wrong topology; drop it all.
            _garbage(sys_dir / "connected_devices", text, "a list of device indices", own)
        else:
            connected = parsed
    arch = sys_dir / "info" / "architecture"
    arch_type = read_attr(arch / "arch_type", own) or None
    device_name = read_attr(arch / "device_name", own) or None
    family = read_attr(arch / "instance_type", own) or None
    serial = read_attr(sys_dir / "info" / "serial_number", own, required=False)
    if serial is not None and serial != "" and not _HEX16.fullmatch(serial):
        _garbage(sys_dir / "info" / "serial_number", serial, "16 hex digits", own)
        serial = None
    faults = health_faults(sys_dir, own)

    if not sys_dir.is_dir():
        problems.append(f"{sys_dir}: device directory vanished during the scan; skipped")
        return None
    problems.extend(own)
    return NeuronDevice(
        index=entry.index,
        dev_path=dev_path,
        core_count=core_count,
        connected=connected,
        arch_type=arch_type,
        device_name=device_name,
        arch_instance_family=family,
        serial_number=serial.lower() if serial else None,
        efa_pci_address=efa_pci_address,
        emulated=emulated,
        healthy=not faults,
        faults=faults,
    )


def health_faults(sys_dir: Path, problems: list[str]) -> tuple[HealthFault, ...]:
    """Why the device is unhealthy according to its own counters; () if it is not.

    An unreadable counter is a problem, not a reason: we do not take a device away because
    a file is missing on an older driver.
    """
    faults: list[HealthFault] = []
    components = read_attr(sys_dir / UNHEALTHY_COMPONENTS_FILE, problems, required=False)
    if components:
        # The driver documents a comma-separated list; the exact format is not published,
        # so whitespace is accepted as a separator too.
        for name in re.split(r"[,\s]+", components):
            if name:
                faults.append(
                    HealthFault(FailureClass.COMPONENT, name, f"unhealthy component: {name}")
                )
    hw = sys_dir / "stats" / "hardware"
    for counter in UNCORRECTED_ECC_COUNTERS:
        value = read_int(hw / counter, problems, required=False)
        if value:
            faults.append(
                HealthFault(FailureClass.UNCORRECTED_ECC, counter, f"{counter} = {value}")
            )
    return tuple(faults)


# --- node-wide values -----------------------------------------------------------------------------


def read_ultraserver(sysfs_root: Path, problems: list[str]) -> UltraServerInfo | None:
    """The class-level UltraServer election results.

    None when the driver publishes none of the files (older drivers, non-v3 chips). When
    they exist, an all-empty ``UltraServerInfo`` means "not an UltraServer platform". A
    ``busy`` election yields the fields read so far as None/empty and one problem: the
    results are not final, and the plugin rescans later.
    """
    base = sysfs_root / CLASS_DIR
    names = ("ultraserver_mode", "server_id_2", "server_id_4", "node_id_2", "node_id_4")
    if not any((base / name).exists() for name in names):
        return None
    # Each file is read exactly once: the election can finish between two reads, and mixing
    # values from before and after it would pair ids from different states.
    raw = {name: read_attr(base / name, problems, required=False) for name in names}
    info = UltraServerInfo(
        modes=_parse_modes(base / "ultraserver_mode", raw["ultraserver_mode"], problems),
        server_id_2=_parse_server_id(base / "server_id_2", raw["server_id_2"], problems),
        server_id_4=_parse_server_id(base / "server_id_4", raw["server_id_4"], problems),
        node_id_2=_parse_node_id(base / "node_id_2", raw["node_id_2"], 2, problems),
        node_id_4=_parse_node_id(base / "node_id_4", raw["node_id_4"], 4, problems),
    )
    busy = [name for name in names if raw[name] == _BUSY]
    if busy:
        problems.append(
            f"{base}: UltraServer election in progress ({', '.join(busy)} read 'busy'); "
            "UltraServer values are incomplete until a later rescan"
        )
    return info


def _parse_modes(path: Path, text: str | None, problems: list[str]) -> tuple[UltraServerMode, ...]:
    if not text or text == _BUSY:
        return ()
    modes: list[UltraServerMode] = []
    for item in text.split(","):
        try:
            modes.append(UltraServerMode(int(item.strip(), 10)))
        except ValueError:
            # Keep the modes we understand: an unknown mode from a newer driver should not
            # hide the ones this code can use.
            _garbage(path, item.strip(), "an UltraServer mode (1-4)", problems)
    return tuple(sorted(set(modes)))


def _parse_server_id(path: Path, text: str | None, problems: list[str]) -> str | None:
    if text is None or text == _BUSY or text == "":
        return None
    if not _HEX16.fullmatch(text):
        _garbage(path, text, "16 hex digits", problems)
        return None
    text = text.lower()
    return None if text == NO_SERVER_ID else text


def _parse_node_id(path: Path, text: str | None, size: int, problems: list[str]) -> int | None:
    if text is None or text in (_BUSY, "-1", ""):
        return None
    if text == "invalid":
        problems.append(f"{path}: driver reports 'invalid' (unexpected UltraServer size)")
        return None
    try:
        value = int(text, 10)
    except ValueError:
        _garbage(path, text, "a node id", problems)
        return None
    if not 0 <= value < size:
        _garbage(path, text, f"a node id in 0..{size - 1}", problems)
        return None
    return value


def read_driver_version(sysfs_root: Path, problems: list[str]) -> str | None:
    path = sysfs_root / MODULE_VERSION_FILE
    version = read_attr(path, [], required=False)
    if not version:
        problems.append(f"{path}: missing or empty; is the neuron kernel module loaded?")
        return None
    return version


def read_instance_type(
    sysfs_root: Path, node_labels: Mapping[str, str], problems: list[str]
) -> str | None:
    """DMI ``product_name`` first (what the hardware says), else the Node label."""
    label = node_labels.get(LABEL_INSTANCE_TYPE) or None
    for rel in DMI_PRODUCT_NAME_FILES:
        dmi = read_attr(sysfs_root / rel, problems, required=False)
        if dmi:
            if label is not None and label != dmi:
                problems.append(
                    f"{sysfs_root / rel}: instance type {dmi!r} differs from Node label "
                    f"{LABEL_INSTANCE_TYPE}={label!r}; using DMI"
                )
            return dmi
    if label is None:
        problems.append(
            f"{sysfs_root / DMI_PRODUCT_NAME_FILES[0]}: no DMI product name and no Node label "
            f"{LABEL_INSTANCE_TYPE}; instance type unknown"
        )
    return label


def read_lnc_default(opt_root: Path, problems: list[str]) -> int | None:
    """``NEURON_LOGICAL_NC_CONFIG=<n>`` from the node-wide file EKS launch templates write.

    Shell-style lines: blank lines and ``#`` comments are ignored, ``export`` and quotes
    tolerated, the last assignment wins (as when the file is sourced).
    """
    path = opt_root / LOGICAL_NC_CONFIG_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        problems.append(f"{path}: unreadable: {e}")
        return None
    value: str | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ").strip()
        key, sep, val = line.partition("=")
        if sep and key.strip() == "NEURON_LOGICAL_NC_CONFIG":
            value = val.strip().strip("'\"")
    if value is None:
        problems.append(f"{path}: no NEURON_LOGICAL_NC_CONFIG=<1|2> line")
        return None
    if value not in ("1", "2"):
        _garbage(path, value, "a logical NeuronCore config of 1 or 2", problems)
        return None
    return int(value)


def load_efa_map(path: Path) -> dict[int, str]:
    """Load the device-index -> EFA PCI address map for ``scan(efa_map=...)``.

    The file is a JSON object whose keys are Neuron device indices (as strings, since JSON
    keys are strings) and whose values are the PCI addresses of the paired EFA devices::

        {"0": "0000:10:1b.0", "1": "0000:10:1c.0"}

    It is operator configuration (sysfs does not link Neuron devices to PCI devices), so
    unlike hardware data a malformed file raises ValueError.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot load EFA map: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: EFA map must be a JSON object of index -> PCI address")
    result: dict[int, str] = {}
    for key, value in data.items():
        index = device_index(f"neuron{key}") if isinstance(key, str) else None
        if index is None or not isinstance(value, str) or not _PCI_ADDRESS.fullmatch(value):
            raise ValueError(
                f'{path}: bad entry {key!r}: {value!r} (want "<index>": "DDDD:BB:DD.F")'
            )
        result[index] = value.lower()
    return result


# --- listing and assembling -----------------------------------------------------------------------


def list_devices(sysfs_root: Path, dev_root: Path, problems: list[str]) -> list[DeviceEntry]:
    """Devices named in the class directory or the virtual devices directory, by index.

    Entries are listed without checking that they are usable: a class symlink whose target
    is gone must be reported by ``read_device``, not silently dropped.
    """
    found: dict[int, Path] = {}
    listed_any = False
    # The class directory first: it is the documented interface; the virtual directory
    # catches a tree where only the real directories exist (e.g. a copied sysfs).
    for rel in (CLASS_DIR, VIRTUAL_DIR):
        base = sysfs_root / rel
        try:
            names = sorted(os.listdir(base))
        except FileNotFoundError:
            continue
        except OSError as e:
            problems.append(f"{base}: unreadable: {e.strerror or e}")
            continue
        listed_any = True
        for name in names:
            index = device_index(name)
            if index is not None:
                found.setdefault(index, base / name)
    if not listed_any:
        problems.append(
            f"{sysfs_root / CLASS_DIR}: missing; the neuron driver is not loaded "
            "(or sysfs is not mounted)"
        )
    return [
        DeviceEntry(index=i, sys_dir=found[i], dev_node=dev_root / f"neuron{i}")
        for i in sorted(found)
    ]


def build_inventory(
    entries: Iterable[DeviceEntry],
    sysfs_root: Path,
    *,
    node_name: str,
    node_labels: Mapping[str, str] = _NO_LABELS,
    opt_root: Path | None = None,
    efa_map: Mapping[int, str] | None = None,
    host_dev_root: Path | None = None,
    problems: Iterable[str] = (),
) -> NodeInventory:
    """Read the listed devices and the node-wide values into a ``NodeInventory``.

    ``host_dev_root``: where the device nodes are on the *host*, which is what CDI specs must
    name; defaults to the parent directory of each entry's ``dev_node`` (right when the
    plugin mounts the host's ``/dev`` at ``/dev``).
    """
    found: list[str] = list(problems)
    emulated = is_emulated(sysfs_root)
    efa = dict(efa_map or {})
    devices: list[NeuronDevice] = []
    for entry in sorted(entries, key=lambda e: e.index):
        host_dir = host_dev_root if host_dev_root is not None else entry.dev_node.parent
        device = read_device(
            entry,
            found,
            emulated=emulated,
            dev_path=str(host_dir / entry.dev_node.name),
            efa_pci_address=efa.pop(entry.index, None),
        )
        if device is not None:
            devices.append(device)
    if efa:
        found.append(f"EFA map names devices {sorted(efa)} that were not found; ignored")
    return NodeInventory(
        node_name=node_name,
        instance_type=read_instance_type(sysfs_root, node_labels, found),
        driver_version=read_driver_version(sysfs_root, found),
        devices=tuple(devices),
        ultraserver=read_ultraserver(sysfs_root, found),
        lnc_default=read_lnc_default(opt_root, found) if opt_root is not None else None,
        problems=tuple(found),
    )


def scan(
    sysfs_root: Path,
    dev_root: Path,
    *,
    node_name: str,
    node_labels: Mapping[str, str] = _NO_LABELS,
    opt_root: Path | None = None,
    efa_map: Mapping[int, str] | None = None,
    host_dev_root: Path | None = None,
) -> NodeInventory:
    """Scan ``sysfs_root`` (the host's ``/sys``) and ``dev_root`` (its ``/dev``).

    ``node_labels`` supplies the instance type when DMI is not readable. ``opt_root`` stands
    for the host's ``/opt`` (the node-wide LNC file); None skips it. ``efa_map`` pairs
    device indices with EFA PCI addresses (see ``load_efa_map``).
    """
    problems: list[str] = []
    entries = list_devices(sysfs_root, dev_root, problems)
    return build_inventory(
        entries,
        sysfs_root,
        node_name=node_name,
        node_labels=node_labels,
        opt_root=opt_root,
        efa_map=efa_map,
        host_dev_root=host_dev_root,
        problems=problems,
    )
