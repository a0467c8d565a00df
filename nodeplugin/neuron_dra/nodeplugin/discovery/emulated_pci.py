"""The PCI side of an emulated node: where its Neuron (and EFA) devices sit on the PCI bus,
written as sysfs writes it, plus the two records ``pci.py`` pairs device indices with PCI
addresses from (the driver's probe lines in a kernel log, a ``neuron-ls -j`` capture).

What the layout follows (everything else is a plausible stand-in, chosen so that tests see
the properties that matter: several root complexes, index order != PCI probe order):

- Trainium2 with 16 devices: the PCI buses of each device index as ``neuron-ls`` shows them
  on a trn2n.48xlarge in the Neuron documentation (device 0 on bus ``cc``, device 5 on
  ``58`` ...). Adjacent buses (``58``/``59``, ``6e``/``6f`` ...) are taken to be two root
  ports of one root complex: 8 roots, 2 devices each, the lower four on NUMA node 0.
- trn1.32xlarge: ``00:04.0`` ... ``00:13.0`` in index order (the trn1.32xlarge example of an
  older ``neuron-ls`` page): one root complex for all 16; inf1.6xlarge: ``00:1c.0`` ...
  ``00:1f.0`` likewise.
- single-device types: NUMA node -1 (``neuron-ls`` showed -1 on a trn1.2xlarge).
- anything else: two devices per root complex, device ``i`` at probe position ``5i mod N``.
- where the instance has one EFA per Neuron device, each EFA sits on the root bus of the
  Neuron device it is paired with (slot ``1b`` or ``1c``), bound to the ``efa`` driver: what
  lets a claim align the two by ``resource.kubernetes.io/pcieRoot``.

The routing ids in the probe lines follow the driver's routing-id tables where its source has
them (Trainium1, Trainium2; Inferentia2 uses the index itself).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from neuron_dra.common.profiles import InstanceProfile, Topology

from .pci import NEURON_DRIVER_DIR, PCI_DEVICES_DIR

AMAZON_VENDOR_ID = 0x1D0F
#: PCI device ids of the chips (the driver's id table); EFA: an EFA device id.
_DEVICE_IDS = {
    "Inferentia": 0x7064,
    "Inferentia2": 0x7264,
    "Trainium1": 0x7164,
    "Trainium2": 0x7364,
    "Trainium3": 0x7564,
}
EFA_DEVICE_ID = 0xEFA1
#: The hardware abstraction layer whose probe prints the line; Inferentia (v1) prints none.
_PROBE_HAL = {"Inferentia2": "v2", "Trainium1": "v2", "Trainium2": "v3", "Trainium3": "v4"}
#: neuron-ls on a trn2n.48xlarge: the PCI bus of device 0, 1, ... 15.
_TRN2_BUSES = (0xCC, 0xB5, 0xB6, 0xCB, 0x6F, 0x58, 0x59, 0x6E,
               0x9B, 0x84, 0x85, 0x9A, 0xF8, 0xE1, 0xE2, 0xF7)  # fmt: skip
#: The driver's routing id -> device index tables (routing id r gives table[r % 16] + r//16*16).
_ROUTING_TABLES = {
    "Trainium1": (0, 4, 1, 5, 3, 7, 2, 6, 12, 8, 13, 9, 15, 11, 14, 10),
    "Trainium2": (0, 3, 4, 7, 12, 15, 8, 11, 1, 2, 5, 6, 13, 14, 9, 10),
}
_EFA_SLOTS = (0x1B, 0x1C)


@dataclass(frozen=True)
class PciFunction:
    """One emulated PCI device."""

    bus_id: str  # 0000:58:00.0
    root_bus: int  # its root complex is pci0000:<root_bus>
    #: The root port (a bridge on the root bus) it hangs under; None: on the root bus itself.
    port: str | None
    numa_node: int
    device_id: int
    driver: str

    @property
    def pcie_root(self) -> str:
        return f"pci0000:{self.root_bus:02x}"

    @property
    def path(self) -> Path:
        """Its directory, relative to the sysfs root."""
        return Path("devices", self.pcie_root, *([self.port] if self.port else []), self.bus_id)


@dataclass(frozen=True)
class PciLayout:
    #: By device index.
    neuron: tuple[PciFunction, ...]
    #: The EFA paired with each device index; () where none is emulated.
    efa: tuple[PciFunction, ...] = ()

    def probe_order(self) -> list[int]:
        """Device indices in PCI address order: the order the kernel probes them in."""
        return sorted(range(len(self.neuron)), key=lambda i: self.neuron[i].bus_id)


_Placed = list[tuple[int, PciFunction]]


def _on_root(index_at: list[int], bus: int, slots: list[int], numa: int, chip: str) -> _Placed:
    """(index, function) for devices directly on root bus ``bus`` (no root port)."""
    device_id = _DEVICE_IDS[chip]
    return [
        (i, PciFunction(f"0000:{bus:02x}:{slot:02x}.0", bus, None, numa, device_id, "neuron"))
        for i, slot in zip(index_at, slots, strict=True)
    ]


def _paired(buses: list[tuple[int, int]], index_at: list[int], chip: str) -> _Placed:
    """(index, function) for devices two per root complex, the ``k``-th root's devices on
    buses ``buses[k]`` behind root ports 01.0 and 02.0 of root bus ``buses[k][0] - 1``."""
    out: _Placed = []
    positions = iter(index_at)
    for k, pair in enumerate(buses):
        root = pair[0] - 1
        numa = 0 if k < (len(buses) + 1) // 2 else 1
        for port_no, bus in enumerate(pair, start=1):
            out.append(
                (
                    next(positions),
                    PciFunction(
                        f"0000:{bus:02x}:00.0", root, f"0000:{root:02x}:{port_no:02x}.0",
                        numa, _DEVICE_IDS[chip], "neuron",
                    ),
                )
            )  # fmt: skip
    return out


def pci_layout(profile: InstanceProfile, *, with_efa: bool) -> PciLayout:
    """Where the devices of ``profile`` sit (see the module docstring); with ``with_efa``, one
    EFA per device on the device's root bus."""
    n, chip = profile.device_count, profile.device_name
    placed: _Placed
    if n == 1:
        placed = _on_root([0], 0x00, [0x1E], -1, chip)
    elif profile.name == "trn1.32xlarge":
        placed = _on_root(list(range(n)), 0x00, list(range(0x04, 0x04 + n)), 0, chip)
    elif profile.name == "inf1.6xlarge":
        placed = _on_root(list(range(n)), 0x00, list(range(0x1C, 0x20)), 0, chip)
    elif chip == "Trainium2" and n == len(_TRN2_BUSES):
        by_bus = sorted(range(n), key=lambda i: _TRN2_BUSES[i])
        buses = sorted(_TRN2_BUSES)
        placed = _paired([(buses[k], buses[k + 1]) for k in range(0, n, 2)], by_bus, chip)
    else:
        step = next(k for k in (5, 7, 11, 13, 1) if math.gcd(k, n) == 1)
        by_position = sorted(range(n), key=lambda i: (step * i) % n)
        roots = [(0x10 + 0x20 * k + 1, 0x10 + 0x20 * k + 2) for k in range(n // 2)]
        placed = _paired(roots, by_position[: 2 * len(roots)], chip)
        if n % 2:  # an odd count: the last one alone on a root of its own
            bus = 0x10 + 0x20 * len(roots)
            placed += _on_root(by_position[-1:], bus, [0x04], 1, chip)
    neuron = tuple(f for _, f in sorted(placed, key=lambda p: p[0]))
    efa: dict[int, PciFunction] = {}
    if with_efa:
        taken: dict[int, int] = {}  # EFAs already on each root bus
        for i in sorted(range(n), key=lambda i: neuron[i].bus_id):
            f = neuron[i]
            slot = _EFA_SLOTS[taken.get(f.root_bus, 0)]
            taken[f.root_bus] = taken.get(f.root_bus, 0) + 1
            bus_id = f"0000:{f.root_bus:02x}:{slot:02x}.0"
            efa[i] = PciFunction(bus_id, f.root_bus, None, f.numa_node, EFA_DEVICE_ID, "efa")
    return PciLayout(neuron=neuron, efa=tuple(efa[i] for i in sorted(efa)))


# --- writing -------------------------------------------------------------------------------------


class Writer(Protocol):
    def write(self, path: Path, text: str) -> None: ...

    def symlink(self, link: Path, target: str) -> None: ...


def _up(path: Path) -> str:
    """The relative path from inside ``path`` (relative to the sysfs root) back to the root."""
    return "../" * len(path.parts)


def write_pci_tree(w: Writer, sysfs: Path, layout: PciLayout) -> None:
    """Each device as sysfs shows it: its directory under its root complex (and root port),
    ``vendor``, ``device``, ``numa_node``, the ``driver`` link, and the links of
    ``bus/pci/devices`` and ``bus/pci/drivers/<driver>`` pointing at it (relative, as the
    kernel makes them)."""
    ports = sorted({(f.root_bus, f.port) for f in (*layout.neuron, *layout.efa) if f.port})
    for root_bus, port in ports:
        assert port is not None
        port_dir = Path("devices", f"pci0000:{root_bus:02x}", port)
        w.write(sysfs / port_dir / "class", "0x060400\n")  # a PCI-to-PCI bridge
        w.symlink(sysfs / PCI_DEVICES_DIR / port, _up(PCI_DEVICES_DIR) + str(port_dir))
    drivers = {"neuron": NEURON_DRIVER_DIR, "efa": Path("bus/pci/drivers/efa")}
    for f in (*layout.neuron, *layout.efa):
        d = sysfs / f.path
        w.write(d / "vendor", f"0x{AMAZON_VENDOR_ID:04x}\n")
        w.write(d / "device", f"0x{f.device_id:04x}\n")
        w.write(d / "numa_node", f"{f.numa_node}\n")
        w.symlink(d / "driver", _up(f.path) + str(drivers[f.driver]))
        w.symlink(sysfs / PCI_DEVICES_DIR / f.bus_id, _up(PCI_DEVICES_DIR) + str(f.path))
        w.symlink(sysfs / drivers[f.driver] / f.bus_id, _up(drivers[f.driver]) + str(f.path))


def routing_id(chip: str, index: int) -> int:
    table = _ROUTING_TABLES.get(chip)
    if table is None:
        return index
    return table.index(index % 16) + index // 16 * 16


def kernel_log(profile: InstanceProfile, layout: PciLayout) -> str:
    """A ``/dev/kmsg`` capture (``prio,seq,usec,flags;message`` records) of the driver's load:
    one probe line per device in probe order, among other kernel messages."""
    chip = profile.device_name
    records = ["Linux version 6.1.0 (emulated)", "pci 0000:00:00.0: [8086:1237] type 00"]
    hal = _PROBE_HAL.get(chip)
    for i in layout.probe_order() if hal else []:
        short = layout.neuron[i].bus_id[5:]
        records.append(
            f"neuron:neuron_pci_get_device_id_{hal}: ** BDF: {short} => nd[{i}] "
            f"(routing id: {routing_id(chip, i)})"
        )
    records.append("neuron: module loaded")
    return "".join(
        f"{3 if 'BDF' in text else 6},{seq},{5_000_000 + 1000 * seq},-;{text}\n"
        for seq, text in enumerate(records, start=1)
    )


def neuron_ls_json(profile: InstanceProfile, layout: PciLayout, neighbours: list[list[int]]) -> str:
    """What ``neuron-ls -j`` prints for the node (its documented fields)."""
    devices = [
        {
            "neuron_device": i,
            "bdf": f.bus_id[5:],
            "numa_node": str(f.numa_node),
            "connected_to": neighbours[i] if profile.topology is not Topology.SINGLE else None,
            "nc_count": profile.logical_cores_per_device(),
            "logical_neuroncore_config": profile.default_lnc,
            "memory_size": profile.device_memory_bytes,
            "neuron_processes": [],
        }
        for i, f in enumerate(layout.neuron)
    ]
    return json.dumps(devices, indent=2) + "\n"
