"""Emulation mode: write a realistic fake sysfs/dev/opt tree for an instance type.

``--emulation-mode <type>`` (env ``NEURON_DRA_DRIVER_EMULATION_MODE``) calls
``write_emulated_tree`` and then runs the *same* scanner (``sysfs.scan``, via
``scan_emulated``) over the result, so
emulation exercises the production discovery code instead of bypassing it. The tree follows
the driver's layout and file formats (driver 2.24/2.25) and the instance type's
profile (``neuron_dra.common.profiles``):

``<root>/sys``
    ``devices/virtual/neuron_device/neuron<N>/`` with ``core_count`` (no trailing newline, as
    the driver prints it), ``connected_devices``, ``info/architecture/*``,
    ``info/serial_number``, ``stats/hardware/*`` and ``neuron_core<k>/info/architecture/
    arch_type`` per physical core;
    ``class/neuron_device/neuron<N>`` as relative symlinks to those directories, plus the
    class-level UltraServer files; ``module/neuron/version``; DMI ``product_name`` (under
    ``devices/virtual/dmi/id`` with ``class/dmi/id`` linking to it); and the marker
    ``sysfs.EMULATION_MARKER``.
``<root>/dev/neuron<N>``
    Empty regular files standing in for the character devices. The scanner accepts regular
    files only in a tree carrying the marker, so this cannot leak into a real node.
``<root>/opt/aws/neuron/logical_nc_config``
    Only when ``lnc`` is given.
``<root>/sys/devices/pci<domain>:<bus>/...``, ``<root>/sys/bus/pci/{devices,drivers}``
    The PCI devices behind the Neuron devices (and the EFA devices paired with them, where
    the type has one per Neuron device) under several root complexes, bound to the
    ``neuron`` (``efa``) driver (``emulated_pci.py`` says what the layout follows).
``<root>/kmsg``, ``<root>/neuron-ls.json``
    What ``discovery/pci.py`` pairs device indices with PCI addresses from: a capture of the
    kernel log with the driver's probe lines (none for Inferentia, whose driver prints none)
    and of ``neuron-ls -j``.
``<root>/efa-map.json``
    Only when ``efa`` is true; load it with ``sysfs.load_efa_map``.

Everything is a pure function of the arguments: the same inputs give byte-identical trees.

UltraServer identity (UltraServer-capable types only), when not given explicitly, is derived
from the node name so that the nodes of a simulated cluster group themselves without extra
configuration. Write the name as ``<prefix><n>`` (trailing decimal digits ``n``):

- node id = ``n % 4``;
- UltraServer id = ``<prefix><n // 4>``, so nodes ``trn-0..3`` form one UltraServer
  (``trn-0``) and ``trn-4..7`` the next (``trn-1``);
- a name without trailing digits is node 0 of an UltraServer named after the node.

The UltraServer id becomes ``server_id_4``, which is what discovery reports as the
UltraServer id (docs/configuration.md, ``--emulated-ultraserver-id``): a 16-hex-digit id is
used as is (lower-cased), so emulated ``ultraserverId`` can be chosen exactly; any other
string is hashed (the first 16 hex digits of its SHA-256). ``server_id_2`` follows the
driver's X2V rule: nodes 0 and 1 share ``server_id_4``'s value S, nodes 2 and 3 get S - 1.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from neuron_dra.common.profiles import PROFILES, InstanceProfile, Topology, UltraServerMode

from .emulated_pci import kernel_log, neuron_ls_json, pci_layout, write_pci_tree
from .model import NO_SERVER_ID, NodeInventory
from .pci import PciSources, locate
from .sysfs import (
    CLASS_DIR,
    DMI_PRODUCT_NAME_FILES,
    EMULATION_MARKER,
    LOGICAL_NC_CONFIG_FILE,
    MODULE_VERSION_FILE,
    UNCORRECTED_ECC_COUNTERS,
    UNHEALTHY_COMPONENTS_FILE,
    VIRTUAL_DIR,
    load_efa_map,
    scan,
)

DEFAULT_DRIVER_VERSION = "2.24.7.0"
EFA_MAP_FILE = "efa-map.json"
KERNEL_LOG_FILE = "kmsg"
NEURON_LS_FILE = "neuron-ls.json"
_NO_LABELS: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class _Chip:
    arch_type: str  # device-level info/architecture/arch_type
    core_arch: str  # neuron_core<k>/info/architecture/arch_type
    family: str  # info/architecture/instance_type
    has_serial: bool  # Inf1 (v1) devices report no serial number
    has_health_status: bool  # health_status/ exists on Trn2/Trn3 only


# Keyed by the profile's device_name (= sysfs device_name). Suffixes as the driver reports them:
# note Inferentia2 is NDv3 at device level but has NeuronCore-v2 cores.
_CHIPS: dict[str, _Chip] = {
    "Inferentia": _Chip("NDv1", "NCv1", "Inf1", has_serial=False, has_health_status=False),
    "Trainium1": _Chip("NDv2", "NCv2", "Trn1", has_serial=True, has_health_status=False),
    "Inferentia2": _Chip("NDv3", "NCv2", "Inf2", has_serial=True, has_health_status=False),
    "Trainium2": _Chip("NDv3", "NCv3", "Trn2", has_serial=True, has_health_status=True),
    "Trainium3": _Chip("NDv4", "NCv4", "Trn3", has_serial=True, has_health_status=True),
}

#: Types with one EFA per Neuron device (AWS's instance specifications). trn1.32xlarge has 8 EFAs
#: for 16 devices and its pairing is not documented, so emulating it would invent facts.
_EFA_FAMILIES = ("trn1n", "trn2", "trn2n", "trn2u", "trn3", "trn3p", "trn3s")
_EFA_ONE_PER_DEVICE = frozenset(
    name for name, p in PROFILES.items() if p.device_count == 16 and p.family in _EFA_FAMILIES
)

#: Modes a Trn2-style UltraServer platform reports: 4 nodes, 2 nodes over vertical links,
#: single node (the value observed on trn2u, "1,3,4").
_ULTRASERVER_MODES = (UltraServerMode.X4, UltraServerMode.X2V, UltraServerMode.X1)


@dataclass(frozen=True)
class EmulatedPaths:
    sysfs_root: Path
    dev_root: Path
    opt_root: Path
    efa_map_path: Path | None = None
    #: The kernel log and neuron-ls captures (None: a tree written before they existed).
    kernel_log: Path | None = None
    neuron_ls_json: Path | None = None


def known_types() -> list[str]:
    return sorted(PROFILES)


def _profile(instance_type: str) -> InstanceProfile:
    profile = PROFILES.get(instance_type)
    if profile is None:
        raise ValueError(
            f"cannot emulate unknown instance type {instance_type!r}; known types: "
            + ", ".join(known_types())
        )
    return profile


# --- derived values (pure) -------------------------------------------------------------------


def neighbours(profile: InstanceProfile, index: int) -> tuple[int, ...]:
    """``connected_devices`` for a device, in the driver's order.

    Torus: up, left, down, right with wrap-around (device 0 of a 4x4 torus: 12, 3, 4, 1, as
    neuron-ls shows on trn2). Ring: previous, next. Single device: none. Switch (Trn3):
    none either; every device reaches every other through the switch, and the driver's
    20-byte buffer could not list 15 neighbours anyway (what the real driver prints there is
    not published).
    """
    n = profile.device_count
    match profile.topology:
        case Topology.TORUS:
            assert profile.torus_dims is not None
            rows, cols = profile.torus_dims
            r, c = divmod(index, cols)
            order = [
                ((r - 1) % rows) * cols + c,
                r * cols + (c - 1) % cols,
                ((r + 1) % rows) * cols + c,
                r * cols + (c + 1) % cols,
            ]
        case Topology.RING:
            order = [(index - 1) % n, (index + 1) % n]
        case Topology.SINGLE | Topology.SWITCH:
            order = []
    # Tiny rings/tori would list a neighbour twice or the device itself.
    return tuple(dict.fromkeys(d for d in order if d != index))


def serial_number(node_name: str, index: int) -> str:
    return hashlib.sha256(f"serial/{node_name}/{index}".encode()).hexdigest()[:16]


def server_id(ultraserver_id: str) -> str:
    """The 16-hex ``server_id_4`` for an UltraServer id (see the module docstring)."""
    if re.fullmatch(r"[0-9a-fA-F]{16}", ultraserver_id):
        sid = ultraserver_id.lower()
    else:
        sid = hashlib.sha256(ultraserver_id.encode()).hexdigest()[:16]
    if sid == NO_SERVER_ID:
        raise ValueError(f"UltraServer id {ultraserver_id!r} maps to the 'no server' value")
    return sid


def server_id_2(sid4: str, node_id: int) -> str:
    """X2V pairing: nodes {0,1} keep S, nodes {2,3} get S - 1 (mod 2**64, as 16 hex)."""
    value = int(sid4, 16) if node_id < 2 else (int(sid4, 16) - 1) % 2**64
    return f"{value:016x}"


def derive_ultraserver(node_name: str) -> tuple[str, int]:
    """(UltraServer id, node id) from a node name (see the module docstring)."""
    m = re.fullmatch(r"(.*?)([0-9]+)", node_name)
    if m is None:
        return node_name, 0
    n = int(m.group(2))
    return f"{m.group(1)}{n // 4}", n % 4


# --- writing --------------------------------------------------------------------------------


class _Writer:
    """Writes files, creating each parent directory once.

    A trn2 tree has ~460 files in ~600 directories and links, written at every plugin start
    (it is part of the start-up time to the first publish): directories already made are
    remembered, and files are written with plain ``os`` calls (a text-mode ``open`` per file
    costs more than the write).
    """

    def __init__(self, root: Path | None = None) -> None:
        #: Directories known to exist: made here, or ``root`` (an existing directory).
        self._made: set[Path] = {root} if root is not None else set()

    def _parent(self, path: Path) -> None:
        if path.parent in self._made:
            return
        missing = []
        known = path.parent
        while known not in self._made and known != known.parent:
            missing.append(known)
            known = known.parent
        if known not in self._made:  # nothing known above: let mkdir find out
            path.parent.mkdir(parents=True, exist_ok=True)
            self._made.update(path.parents)
            return
        # Top down from the nearest known directory: one mkdir per new directory (mkdir with
        # parents=True first fails for each missing level, then retries).
        for directory in reversed(missing):
            with contextlib.suppress(FileExistsError):
                directory.mkdir()
            self._made.add(directory)

    def write(self, path: Path, text: str) -> None:
        self._parent(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, text.encode("ascii"))
        finally:
            os.close(fd)

    def symlink(self, link: Path, target: str) -> None:
        self._parent(link)
        link.symlink_to(target)


def _write(path: Path, text: str) -> None:
    _Writer().write(path, text)


#: The parameters a tree was written with, written once it is complete (``reuse``).
PARAMS_FILE = "emulation.json"


def _prepare_root(root: Path) -> None:
    """Clear a previous emulated tree at ``root``; refuse to touch anything else."""
    if not root.exists():
        root.mkdir(parents=True)
        return
    if not any(root.iterdir()):
        return
    if not (root / "sys" / EMULATION_MARKER).is_file():
        raise ValueError(f"{root} is not empty and holds no emulated tree; refusing to overwrite")
    for name in ("sys", "dev", "opt", EFA_MAP_FILE, KERNEL_LOG_FILE, NEURON_LS_FILE):
        path = root / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def write_emulated_tree(
    root: Path,
    instance_type: str,
    *,
    node_name: str,
    ultraserver_id: str | None = None,
    ultraserver_node_id: int | None = None,
    driver_version: str = DEFAULT_DRIVER_VERSION,
    lnc: int | None = None,
    efa: bool = False,
    reuse: bool = False,
) -> EmulatedPaths:
    """Write the tree for ``instance_type`` under ``root`` (replacing an earlier emulated
    tree there) and return where the scanner should look.

    With ``reuse``, a complete tree written earlier with the same parameters is kept as it is
    (what a node's devices do across a plugin restart): a second plugin instance of a rolling
    update must not wipe the tree the first one is scanning, and state written into it (a
    device marked unhealthy) survives the restart.

    Raises ValueError for an unknown type, UltraServer values on a type that is not
    UltraServer-capable, an out-of-range node id, an LNC the type does not allow, or EFA on a
    type whose EFA pairing is not known.
    """
    profile = _profile(instance_type)
    if ultraserver_node_id is not None and not 0 <= ultraserver_node_id <= 3:
        raise ValueError(f"UltraServer node id must be 0..3, got {ultraserver_node_id}")
    if not profile.ultraserver_capable and (
        ultraserver_id is not None or ultraserver_node_id is not None
    ):
        raise ValueError(f"{instance_type} is not UltraServer-capable; no UltraServer id/node id")
    if lnc is not None and lnc not in profile.allowed_lnc:
        allowed = ", ".join(str(v) for v in sorted(profile.allowed_lnc))
        raise ValueError(f"LNC {lnc} is not supported on {instance_type} (allowed: {allowed})")
    if efa and instance_type not in _EFA_ONE_PER_DEVICE:
        raise ValueError(
            f"EFA emulation needs one EFA per device; {instance_type} is not one of "
            + ", ".join(sorted(_EFA_ONE_PER_DEVICE))
        )
    if not re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z.+~-]*", driver_version):
        # It becomes a one-line sysfs value and then a ResourceSlice attribute.
        raise ValueError(f"driver version {driver_version!r} is not a version string")
    chip = _CHIPS[profile.device_name]

    paths = EmulatedPaths(
        sysfs_root=root / "sys",
        dev_root=root / "dev",
        opt_root=root / "opt",
        efa_map_path=root / EFA_MAP_FILE if efa else None,
        kernel_log=root / KERNEL_LOG_FILE,
        neuron_ls_json=root / NEURON_LS_FILE,
    )
    params = json.dumps(
        {
            # 2: with the PCI tree and its captures (a format-1 tree is rewritten).
            "format": 2,
            "instanceType": instance_type,
            "nodeName": node_name,
            "ultraserverId": ultraserver_id,
            "ultraserverNodeId": ultraserver_node_id,
            "driverVersion": driver_version,
            "lnc": lnc,
            "efa": efa,
        },
        sort_keys=True,
    )
    written = root / PARAMS_FILE
    if reuse and written.is_file() and written.read_text() == params:
        return paths
    written.unlink(missing_ok=True)  # a tree being rewritten is not complete
    _prepare_root(root)
    sysfs, dev = paths.sysfs_root, paths.dev_root
    w = _Writer(root)
    w.write(sysfs / EMULATION_MARKER, f"{instance_type}\n")
    dev.mkdir(parents=True)
    paths.opt_root.mkdir(parents=True)

    for index in range(profile.device_count):
        _write_device(w, sysfs / VIRTUAL_DIR / f"neuron{index}", profile, chip, node_name, index)
        # Relative like the kernel's, so the tree stays valid if it is moved or mounted.
        w.symlink(sysfs / CLASS_DIR / f"neuron{index}", f"../../{VIRTUAL_DIR}/neuron{index}")
        (dev / f"neuron{index}").touch()

    layout = pci_layout(profile, with_efa=instance_type in _EFA_ONE_PER_DEVICE)
    write_pci_tree(w, sysfs, layout)
    w.write(root / KERNEL_LOG_FILE, kernel_log(profile, layout))
    linked = [list(neighbours(profile, i)) for i in range(profile.device_count)]
    w.write(root / NEURON_LS_FILE, neuron_ls_json(profile, layout, linked))
    _write_ultraserver_files(w, sysfs, profile, node_name, ultraserver_id, ultraserver_node_id)
    w.write(sysfs / MODULE_VERSION_FILE, f"{driver_version}\n")
    class_dmi, virtual_dmi = DMI_PRODUCT_NAME_FILES
    w.write(sysfs / virtual_dmi, f"{instance_type}\n")
    w.symlink(sysfs / class_dmi.parent, f"../../{virtual_dmi.parent}")

    if lnc is not None:
        w.write(paths.opt_root / LOGICAL_NC_CONFIG_FILE, f"NEURON_LOGICAL_NC_CONFIG={lnc}\n")
    if paths.efa_map_path is not None:
        mapping = {str(i): f.bus_id for i, f in enumerate(layout.efa)}
        w.write(paths.efa_map_path, json.dumps(mapping, indent=2) + "\n")
    # Last: only a complete tree is ever reused.
    written.write_text(params)
    return paths


def _write_device(
    w: _Writer, d: Path, profile: InstanceProfile, chip: _Chip, node_name: str, index: int
) -> None:
    w.write(d / "core_count", str(profile.cores_per_device))
    w.write(d / "connected_devices", ", ".join(map(str, neighbours(profile, index))) + "\n")
    w.write(d / "reset", "0\n")
    w.write(d / "info" / "notify_delay", "-1\n")
    arch = d / "info" / "architecture"
    w.write(arch / "arch_type", f"{chip.arch_type}\n")
    w.write(arch / "device_name", f"{profile.device_name}\n")
    w.write(arch / "instance_type", f"{chip.family}\n")
    if chip.has_serial:
        w.write(d / "info" / "serial_number", f"{serial_number(node_name, index)}\n")
    hw = d / "stats" / "hardware"
    for counter in UNCORRECTED_ECC_COUNTERS:
        w.write(hw / counter, "0\n")
    if chip.has_health_status:
        w.write(d / UNHEALTHY_COMPONENTS_FILE, "\n")
    # One file per physical core is enough to show the per-core layout; the scanner does not
    # read these, and a full counter tree would be thousands of directories per node.
    for core in range(profile.cores_per_device):
        w.write(d / f"neuron_core{core}" / "info" / "architecture" / "arch_type",
                f"{chip.core_arch}\n")  # fmt: skip


def _write_ultraserver_files(
    w: _Writer,
    sysfs: Path,
    profile: InstanceProfile,
    node_name: str,
    ultraserver_id: str | None,
    node_id: int | None,
) -> None:
    base = sysfs / CLASS_DIR
    if not profile.ultraserver_capable:
        # What the driver shows on platforms without UltraServer support.
        files = {"ultraserver_mode": "", "server_id_2": NO_SERVER_ID,
                 "server_id_4": NO_SERVER_ID, "node_id_2": "-1", "node_id_4": "-1"}  # fmt: skip
    else:
        derived_id, derived_node = derive_ultraserver(node_name)
        node_id = derived_node if node_id is None else node_id
        sid4 = server_id(derived_id if ultraserver_id is None else ultraserver_id)
        files = {
            "ultraserver_mode": ",".join(str(int(m)) for m in _ULTRASERVER_MODES),
            "server_id_2": server_id_2(sid4, node_id),
            "server_id_4": sid4,
            "node_id_2": str(node_id % 2),
            "node_id_4": str(node_id),
        }
    for name, value in files.items():
        w.write(base / name, f"{value}\n")


def scan_emulated(
    paths: EmulatedPaths, *, node_name: str, node_labels: Mapping[str, str] = _NO_LABELS
) -> NodeInventory:
    """Run the production scanner over an emulated tree, with its LNC file and EFA map,
    and pair its devices with their PCI addresses from its captures."""
    inventory = scan(
        paths.sysfs_root,
        paths.dev_root,
        node_name=node_name,
        node_labels=node_labels,
        opt_root=paths.opt_root,
        efa_map=load_efa_map(paths.efa_map_path) if paths.efa_map_path is not None else None,
    )
    sources = PciSources(kernel_log=paths.kernel_log, neuron_ls_json=paths.neuron_ls_json)
    return locate(inventory, paths.sysfs_root, sources)[0]


# --- test helpers: change a written tree ----------------------------------------------------


def _device_dir(paths: EmulatedPaths, device_index: int) -> Path:
    d = paths.sysfs_root / VIRTUAL_DIR / f"neuron{device_index}"
    if not d.is_dir():
        raise ValueError(f"no emulated device {device_index} under {paths.sysfs_root}")
    return d


def mark_unhealthy(paths: EmulatedPaths, device_index: int, components: Iterable[str]) -> None:
    """Report ``components`` (e.g. ``hbm``, ``link_efa``) as unhealthy on one device, the
    way driver 2.30+ does in ``stats/hardware/health_status/unhealthy_components``. An empty
    list marks the device healthy again."""
    names = list(components)
    bad = [n for n in names if not re.fullmatch(r"[a-z0-9_]+", n)]
    if bad:
        raise ValueError(f"component names must be lower-case identifiers, got {bad}")
    _write(_device_dir(paths, device_index) / UNHEALTHY_COMPONENTS_FILE, ",".join(names) + "\n")


def set_election_busy(paths: EmulatedPaths) -> None:
    """Make the class-level files look like an UltraServer election still running."""
    base = paths.sysfs_root / CLASS_DIR
    for name, value in (
        ("ultraserver_mode", "busy"),
        ("server_id_2", NO_SERVER_ID),
        ("server_id_4", NO_SERVER_ID),
        ("node_id_2", "busy"),
        ("node_id_4", "busy"),
    ):
        _write(base / name, f"{value}\n")
