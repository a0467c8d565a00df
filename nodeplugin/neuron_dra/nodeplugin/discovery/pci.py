"""Where each Neuron device sits on the PCI bus: the standard attributes
``resource.kubernetes.io/pciBusID``, ``pcieRoot`` and ``numaNode``.

Two facts of the Neuron kernel driver shape this module:

- its ``neuron_device`` class devices are created without a parent, so
  ``/sys/class/neuron_device/neuron<N>`` does not link to the PCI device behind it;
- ``N`` is not the PCI probe order: the driver reads a routing id from the device's firmware
  and maps it to ``N`` (on trn2 through a torus table), so sorting the PCI addresses of the
  devices bound to the driver and numbering them would pair most devices with a neighbour's
  address.

So the pairing comes only from what the driver itself reported, from either source
(``PciSources``):

- its probe line in the kernel log, ``** BDF: bb:dd.f => nd[N] (routing id: R)`` (printed by
  the driver for Trainium1/Inferentia2, Trainium2 and Trainium3 devices, not Inferentia1),
  read from ``/dev/kmsg`` or from any capture of it such as ``dmesg`` output. The line has no
  PCI domain; it is taken from the one device bound to the neuron driver with that bus,
  device and function (none or two such devices: the line is not used);
- a capture of ``neuron-ls -j`` (its ``neuron_device`` and ``bdf`` per device).

An address counts only for a PCI device bound to the neuron driver now
(``bus/pci/drivers/neuron/<address>``): a line of a device whose probe failed (the driver
prints the line before it rejects a duplicate routing id) or of an earlier load names no
bound device. The latest line for an address wins. A device named by none of the sources,
or paired differently by the two, or an index two bound devices claim, gets no PCI
attributes and the inventory a problem saying so: nothing is guessed.

The root complex and the NUMA node are then read from sysfs the way the upstream helper
(k8s.io/dynamic-resource-allocation, package deviceattribute) does: the ``pci<domain>:<bus>``
component that the link ``bus/pci/devices/<address>`` points into, and ``numa_node`` (-1, no
NUMA affinity: no attribute, since -1 would match every other device without one).

The kernel log is a ring buffer: the probe lines of a node up for weeks may be gone. The
plugin therefore keeps what it learned (``locate(known=...)``) and reads the sources again
only while some device has no address; a remembered address is used only while it is still
bound to the neuron driver.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .model import NeuronDevice, NodeInventory, PciLocation

#: The devices bound to the Neuron kernel driver, one entry (a link) per PCI address.
NEURON_DRIVER_DIR = Path("bus/pci/drivers/neuron")
PCI_DEVICES_DIR = Path("bus/pci/devices")
DEFAULT_KERNEL_LOG = Path("/dev/kmsg")

#: The upstream helper's format check (lower-case hex, as sysfs names devices).
BUS_ID = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_SHORT_BUS_ID = re.compile(r"[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_PROBE_LINE = re.compile(r"\*\* BDF: ([0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]) => nd\[([0-9]+)\]")
_PCIE_ROOT = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")
#: /dev/kmsg returns one record per read, each at most a few KiB.
_READ_CHUNK = 65536
#: Stop reading a "log" that never ends (a misconfigured path such as /dev/zero).
_MAX_LOG_BYTES = 64 * 1024 * 1024
_NO_ADDRESSES: Mapping[int, str] = {}


@dataclass(frozen=True)
class PciSources:
    """Where the device index -> PCI address pairing may be read (None: not configured)."""

    #: ``/dev/kmsg`` on a node, or a file holding the kernel log (``dmesg`` output).
    kernel_log: Path | None = DEFAULT_KERNEL_LOG
    #: A file holding the output of ``neuron-ls -j``.
    neuron_ls_json: Path | None = None


# --- parsing (pure) ------------------------------------------------------------------------------


def parse_probe_lines(text: str) -> list[tuple[str, int]]:
    """(``bb:dd.f``, index) of every probe line of the Neuron driver, in log order."""
    return [
        (m.group(1).lower(), int(m.group(2)))
        for line in text.splitlines()
        if (m := _PROBE_LINE.search(line)) is not None
    ]


def parse_neuron_ls(text: str) -> list[tuple[str, int]]:
    """(address, index) from ``neuron-ls -j`` output; ValueError if it is not that.

    ``bdf`` is the short ``bb:dd.f`` in the releases documented so far; a full
    ``dddd:bb:dd.f`` is accepted too.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(data, list):
        raise ValueError("not a list of devices (neuron-ls -j prints a JSON array)")
    out = []
    for i, entry in enumerate(data):
        index = entry.get("neuron_device") if isinstance(entry, dict) else None
        bdf = entry.get("bdf") if isinstance(entry, dict) else None
        if (
            not isinstance(index, int)
            or isinstance(index, bool)
            or index < 0
            or not isinstance(bdf, str)
            or not (BUS_ID.fullmatch(bdf.lower()) or _SHORT_BUS_ID.fullmatch(bdf.lower()))
        ):
            raise ValueError(f"entry #{i} has no neuron_device index and bdf address")
        out.append((bdf.lower(), index))
    return out


def full_address(address: str, bound: frozenset[str]) -> str | None:
    """The bound device ``address`` names: itself when full, else the one bound device with
    that bus, device and function; None when there is none or more than one."""
    if BUS_ID.fullmatch(address):
        return address if address in bound else None
    matches = [b for b in bound if b[5:] == address]
    return matches[0] if len(matches) == 1 else None


def pair_addresses(
    pairs: list[tuple[str, int]], bound: frozenset[str], source: str, problems: list[str]
) -> dict[int, str]:
    """index -> bound PCI address from one source's (address, index) pairs, in order."""
    index_of: dict[str, int] = {}
    for address, index in pairs:
        full = full_address(address, bound)
        if full is not None:
            index_of[full] = index  # the latest report of an address wins
    claimed: dict[int, list[str]] = {}
    for address, index in index_of.items():
        claimed.setdefault(index, []).append(address)
    out = {}
    for index, addresses in sorted(claimed.items()):
        if len(addresses) == 1:
            out[index] = addresses[0]
        else:
            problems.append(
                f"{source}: neuron{index} is named for {', '.join(sorted(addresses))}; "
                "its PCI address is ambiguous"
            )
    return out


def merge_sources(
    found: Mapping[str, Mapping[int, str]], problems: list[str]
) -> tuple[dict[int, str], set[int]]:
    """One pairing from several sources' pairings, and the indices they disagree on (left
    out, each with a problem)."""
    merged: dict[int, str] = {}
    dropped: set[int] = set()
    for source, pairing in found.items():
        for index, address in pairing.items():
            if index in dropped:
                continue
            if merged.setdefault(index, address) != address:
                problems.append(
                    f"{source} pairs neuron{index} with {address}, another source with "
                    f"{merged[index]}; its PCI address is not used"
                )
                del merged[index]
                dropped.add(index)
    return merged, dropped


def pcie_root_of(link_target: str, bus_id: str) -> str | None:
    """The root complex component of the link ``bus/pci/devices/<bus_id>`` points to, as
    the upstream helper takes it: the target, resolved against ``bus/pci/devices``, must be
    ``devices/pci<domain>:<bus>/.../<bus_id>``."""
    resolved = os.path.normpath(os.path.join(str(PCI_DEVICES_DIR), link_target))
    parts = resolved.split(os.sep)
    if len(parts) < 3 or parts[0] != "devices" or parts[-1] != bus_id:
        return None
    return parts[1] if _PCIE_ROOT.fullmatch(parts[1]) else None


# --- reading -------------------------------------------------------------------------------------


def read_kernel_log(path: Path) -> str:
    """The text of a kernel log: ``/dev/kmsg`` record by record until it has no more (it
    never ends with EOF), or a regular file to its end. Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    chunks: list[bytes] = []
    total = 0
    try:
        while total < _MAX_LOG_BYTES:
            try:
                chunk = os.read(fd, _READ_CHUNK)
            except BlockingIOError:
                break  # /dev/kmsg: no newer record
            except OSError as e:
                if e.errno == errno.EPIPE:
                    continue  # /dev/kmsg: the record was overwritten meanwhile; next one
                raise
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", errors="replace")


def bound_addresses(sysfs_root: Path) -> frozenset[str]:
    """PCI addresses bound to the neuron driver; OSError if the directory is unreadable."""
    return frozenset(n for n in os.listdir(sysfs_root / NEURON_DRIVER_DIR) if BUS_ID.fullmatch(n))


def read_pairings(
    sysfs_root: Path, sources: PciSources, bound: frozenset[str], problems: list[str]
) -> tuple[dict[str, dict[int, str]], list[str]]:
    """Each readable source's pairing, and why the others could not be read."""
    found: dict[str, dict[int, str]] = {}
    unread: list[str] = []
    if sources.neuron_ls_json is not None:
        path = sources.neuron_ls_json
        try:
            pairs = parse_neuron_ls(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            unread.append(f"{path}: {_reason(e)}")
        else:
            found[str(path)] = pair_addresses(pairs, bound, str(path), problems)
    if sources.kernel_log is not None:
        path = sources.kernel_log
        try:
            pairs = parse_probe_lines(read_kernel_log(path))
        except OSError as e:
            unread.append(f"{path}: {_reason(e)}")
        else:
            if pairs:
                found[str(path)] = pair_addresses(pairs, bound, str(path), problems)
            else:
                unread.append(f"{path}: no probe line of the neuron driver (rotated out?)")
    return found, unread


def _reason(e: Exception) -> str:
    if isinstance(e, FileNotFoundError):
        return "missing"
    if isinstance(e, OSError):
        return f"unreadable: {e.strerror or e}"
    return f"unusable: {e}"


def read_location(sysfs_root: Path, bus_id: str, problems: list[str]) -> PciLocation:
    """Root complex and NUMA node of a PCI device, as far as sysfs shows them."""
    link = sysfs_root / PCI_DEVICES_DIR / bus_id
    root: str | None = None
    try:
        target = os.readlink(link)
    except OSError as e:
        problems.append(f"{link}: {_reason(e)}; no pcieRoot")
    else:
        root = pcie_root_of(target, bus_id)
        if root is None:
            problems.append(f"{link}: links to {target!r}, not into a PCI root; no pcieRoot")
    return PciLocation(bus_id=bus_id, pcie_root=root, numa_node=_numa_node(link, problems))


def _numa_node(device_dir: Path, problems: list[str]) -> int | None:
    path = device_dir / "numa_node"
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as e:
        problems.append(f"{path}: {_reason(e)}; no numaNode")
        return None
    try:
        value = int(text, 10)
    except ValueError:
        problems.append(f"{path}: garbage: {text[:40]!r} is not an integer; no numaNode")
        return None
    return value if value >= 0 else None


# --- the inventory -------------------------------------------------------------------------------


def locate(
    inventory: NodeInventory,
    sysfs_root: Path,
    sources: PciSources,
    *,
    known: Mapping[int, str] = _NO_ADDRESSES,
) -> tuple[NodeInventory, dict[int, str]]:
    """The inventory with each device's ``pci`` filled in where its address is known, and
    the index -> address pairing used (pass it back as ``known`` on the next scan).

    The sources are read only when ``known`` lacks a device or names an address no longer
    bound to the neuron driver.
    """
    if not inventory.devices or (sources.neuron_ls_json is None and sources.kernel_log is None):
        # No source configured is a choice (the chart's default: an unprivileged plugin can
        # read neither), not a problem to log on every rescan.
        return inventory, {}
    problems: list[str] = []
    try:
        bound = bound_addresses(sysfs_root)
    except OSError as e:
        problems.append(
            f"{sysfs_root / NEURON_DRIVER_DIR}: {_reason(e)}; the PCI addresses of the Neuron "
            "devices cannot be checked, so no pciBusID, pcieRoot or numaNode is published"
        )
        return _with(inventory, {}, problems), {}
    indices = {d.index for d in inventory.devices}
    still = {i: a for i, a in known.items() if i in indices and a in bound}
    pairing = still
    if not indices <= still.keys():
        found, unread = read_pairings(sysfs_root, sources, bound, problems)
        fresh, disputed = merge_sources(found, problems)
        taken = set(fresh.values())
        pairing = {**{i: a for i, a in still.items() if a not in taken}, **fresh}
        missing = sorted(indices - pairing.keys() - disputed)
        if missing:
            names = ", ".join(f"neuron{i}" for i in missing)
            why = "; ".join(unread) or "the sources do not name them"
            problems.append(
                f"PCI address unknown for {names} ({why}); no pciBusID, pcieRoot or numaNode "
                "for them"
            )
    pairing = {i: a for i, a in pairing.items() if i in indices}
    return _with(inventory, pairing, problems, sysfs_root), pairing


def _with(
    inventory: NodeInventory,
    pairing: Mapping[int, str],
    problems: list[str],
    sysfs_root: Path | None = None,
) -> NodeInventory:
    devices: list[NeuronDevice] = []
    for d in inventory.devices:
        address = pairing.get(d.index)
        pci = (
            read_location(sysfs_root, address, problems)
            if address is not None and sysfs_root is not None
            else None
        )
        devices.append(dataclasses.replace(d, pci=pci))
    return dataclasses.replace(
        inventory, devices=tuple(devices), problems=(*inventory.problems, *problems)
    )
