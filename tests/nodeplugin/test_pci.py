"""Pairing Neuron devices with their PCI devices (discovery/pci.py) and the emulated PCI
layout it reads (discovery/emulated_pci.py)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from unittest import mock

import pytest
from neuron_dra.common.profiles import PROFILES
from neuron_dra.nodeplugin.discovery import pci
from neuron_dra.nodeplugin.discovery.emulated_pci import pci_layout
from neuron_dra.nodeplugin.discovery.emulation import (
    EmulatedPaths,
    scan_emulated,
    write_emulated_tree,
)
from neuron_dra.nodeplugin.discovery.model import NodeInventory, PciLocation
from neuron_dra.nodeplugin.discovery.pci import PciSources, locate
from neuron_dra.nodeplugin.discovery.sysfs import scan
from neuron_dra.nodeplugin.plugin import KubeletPlugin, PluginConfig

ALL_TYPES = sorted(PROFILES)
#: neuron-ls on a trn2n.48xlarge (the Neuron documentation): device index -> PCI bus.
TRN2_DOCUMENTED = dict(
    enumerate(
        [
            "cc",
            "b5",
            "b6",
            "cb",
            "6f",
            "58",
            "59",
            "6e",
            "9b",
            "84",
            "85",
            "9a",
            "f8",
            "e1",
            "e2",
            "f7",
        ]
    )
)


def emulated(
    tmp_path: Path, instance_type: str = "trn2.48xlarge"
) -> tuple[EmulatedPaths, NodeInventory]:
    paths = write_emulated_tree(tmp_path / "node", instance_type, node_name="n-0")
    inv = scan(paths.sysfs_root, paths.dev_root, node_name="n-0", opt_root=paths.opt_root)
    assert inv.problems == ()
    return paths, inv


def sources(paths: EmulatedPaths, *, kmsg: bool = True, ls: bool = True) -> PciSources:
    return PciSources(
        kernel_log=paths.kernel_log if kmsg else None,
        neuron_ls_json=paths.neuron_ls_json if ls else None,
    )


def buses(inv: NodeInventory) -> dict[int, str | None]:
    return {d.index: d.pci.bus_id if d.pci else None for d in inv.devices}


# --- parsing -------------------------------------------------------------------------------------


def test_probe_lines_in_kmsg_and_dmesg_form() -> None:
    text = "\n".join(
        [
            "6,100,5001,-;pci 0000:00:1e.0: [1d0f:7364] type 00 class 0x120000",
            "3,101,5002,-;neuron:get_device_id_v3: ** BDF: cc:00.0 => nd[0] (routing id: 0)",
            "[    5.123456] neuron:get_device_id_v2: ** BDF: 0A:1F.3 => nd[12] (routing id: 8)",
            " SUBSYSTEM=pci",  # a /dev/kmsg continuation line
            "3,102,5003,-;neuron: ** BDF: zz:00.0 => nd[1]",  # not an address
        ]
    )
    assert pci.parse_probe_lines(text) == [("cc:00.0", 0), ("0a:1f.3", 12)]


def test_neuron_ls_json() -> None:
    text = json.dumps(
        [
            {"neuron_device": 0, "bdf": "cc:00.0", "numa_node": "1", "connected_to": [12, 3]},
            {"neuron_device": 1, "bdf": "0000:B5:00.0", "numa_node": "-1", "connected_to": None},
        ]
    )
    assert pci.parse_neuron_ls(text) == [("cc:00.0", 0), ("0000:b5:00.0", 1)]
    bad_entries = [
        {"neuron_device": "0", "bdf": "cc:00.0"},
        {"neuron_device": 0, "bdf": "cc:00"},
        {"neuron_device": True, "bdf": "cc:00.0"},
        {"neuron_device": 0},
    ]
    for bad in ["{", '{"neuron_device": 0}', *(json.dumps([e]) for e in bad_entries)]:
        with pytest.raises(ValueError):
            pci.parse_neuron_ls(bad)


def test_short_addresses_take_the_domain_of_the_one_bound_device() -> None:
    bound = frozenset({"0000:cc:00.0", "0000:b5:00.0", "0001:b5:00.0"})
    assert pci.full_address("cc:00.0", bound) == "0000:cc:00.0"
    assert pci.full_address("b5:00.0", bound) is None  # two domains have it
    assert pci.full_address("dd:00.0", bound) is None  # nothing bound there
    assert pci.full_address("0001:b5:00.0", bound) == "0001:b5:00.0"
    assert pci.full_address("0002:b5:00.0", bound) is None


def test_pairing_keeps_only_bound_devices_and_the_latest_report() -> None:
    bound = frozenset({"0000:aa:00.0", "0000:ab:00.0", "0000:ac:00.0", "0000:ad:00.0"})
    problems: list[str] = []
    pairs = [
        ("aa:00.0", 3),
        # The driver prints the line before it rejects a duplicate routing id: that device
        # is not bound, and its claim on nd[3] must not displace the bound one.
        ("bf:00.0", 3),
        ("ab:00.0", 7),
        ("ab:00.0", 4),  # a later load reports it as nd[4]: the latest wins
        ("ac:00.0", 9),
        ("ad:00.0", 9),  # two bound devices claim nd[9]: neither is trusted
    ]
    assert pci.pair_addresses(pairs, bound, "kmsg", problems) == {
        3: "0000:aa:00.0",
        4: "0000:ab:00.0",
    }
    assert problems == ["kmsg: neuron9 is named for 0000:ac:00.0, 0000:ad:00.0; its PCI address "
                        "is ambiguous"]  # fmt: skip


def test_sources_that_disagree_lose_that_device() -> None:
    problems: list[str] = []
    merged, disputed = pci.merge_sources(
        {
            "ls": {0: "0000:aa:00.0", 1: "0000:ab:00.0"},
            "kmsg": {0: "0000:aa:00.0", 1: "0000:ac:00.0", 2: "0000:ad:00.0"},
        },
        problems,
    )
    assert merged == {0: "0000:aa:00.0", 2: "0000:ad:00.0"} and disputed == {1}
    assert len(problems) == 1 and "neuron1" in problems[0]


@pytest.mark.parametrize(
    ("target", "root"),
    [
        ("../../../devices/pci0000:00/0000:00:01.0/0000:04:1f.0", "pci0000:00"),
        ("../../../devices/pci0000:57/0000:04:1f.0", "pci0000:57"),
        ("../../../devices/platform/foo/0000:04:1f.0", None),  # not under a PCI root
        ("../../../devices/pci0000:00/0000:00:01.0/0000:04:1f.1", None),  # another device
        ("/sys/devices/pci0000:00/0000:04:1f.0", None),  # absolute: not how sysfs links
    ],
)
def test_pcie_root_as_the_upstream_helper_takes_it(target: str, root: str | None) -> None:
    assert pci.pcie_root_of(target, "0000:04:1f.0") == root


# --- the kernel log ------------------------------------------------------------------------------


def test_kernel_log_read_ends_where_kmsg_has_no_more_records(tmp_path: Path) -> None:
    # A FIFO with its writer open behaves like /dev/kmsg: no EOF, EAGAIN once drained.
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    keep = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # lets the writer open without waiting
    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(writer, b"3,1,1,-;neuron:x: ** BDF: cc:00.0 => nd[0] (routing id: 0)\n")
        assert pci.parse_probe_lines(pci.read_kernel_log(fifo)) == [("cc:00.0", 0)]
    finally:
        os.close(writer)
        os.close(keep)


def test_the_hosts_kernel_log_reads_without_blocking() -> None:
    kmsg = Path("/dev/kmsg")
    if not os.access(kmsg, os.R_OK):
        pytest.skip("/dev/kmsg is not readable here")
    try:
        text = pci.read_kernel_log(kmsg)
    except PermissionError:
        pytest.skip("/dev/kmsg is not readable here")
    assert isinstance(text, str)  # it returned: the read stopped at the newest record


# --- locating the devices of an emulated node -----------------------------------------------------


@pytest.mark.parametrize("instance_type", ALL_TYPES)
def test_every_emulated_type_is_located_from_its_captures(
    tmp_path: Path, instance_type: str
) -> None:
    paths, inv = emulated(tmp_path, instance_type)
    located, pairing = locate(inv, paths.sysfs_root, sources(paths))
    layout = pci_layout(PROFILES[instance_type], with_efa=False)
    assert located.problems == ()
    assert pairing == {i: f.bus_id for i, f in enumerate(layout.neuron)}
    for d in located.devices:
        f = layout.neuron[d.index]
        numa = f.numa_node if f.numa_node >= 0 else None
        assert d.pci == PciLocation(f.bus_id, f.pcie_root, numa)
    assert scan_emulated(paths, node_name="n-0") == located
    # Several devices on one root complex (the kind of alignment users ask for), except where
    # the instance has a single device.
    roots = {d.pci.pcie_root for d in located.devices if d.pci}
    assert len(roots) <= max(1, len(inv.devices) // 2)


def test_trn2_follows_the_documented_buses_and_not_the_probe_order(tmp_path: Path) -> None:
    paths, inv = emulated(tmp_path)
    located, _ = locate(inv, paths.sysfs_root, sources(paths, ls=False))
    assert {i: b[5:7] if b else None for i, b in buses(located).items()} == TRN2_DOCUMENTED
    # Numbering the bound devices in address order would get 15 of the 16 wrong.
    bound = sorted(os.listdir(paths.sysfs_root / "bus/pci/drivers/neuron"))
    guessed = dict(enumerate(bound))
    assert sum(guessed[i] == b for i, b in buses(located).items()) <= 1
    d5 = located.device(5)
    assert d5 is not None and d5.pci == PciLocation("0000:58:00.0", "pci0000:57", 0)


def test_each_source_alone_is_enough(tmp_path: Path) -> None:
    paths, inv = emulated(tmp_path)
    both, _ = locate(inv, paths.sysfs_root, sources(paths))
    for only in (sources(paths, kmsg=False), sources(paths, ls=False)):
        alone, _ = locate(inv, paths.sysfs_root, only)
        assert alone == both


def test_inferentia1_has_no_probe_lines_but_neuron_ls(tmp_path: Path) -> None:
    paths, inv = emulated(tmp_path, "inf1.6xlarge")
    located, _ = locate(inv, paths.sysfs_root, sources(paths))
    assert all(d.pci for d in located.devices) and located.problems == ()
    kmsg_only, _ = locate(inv, paths.sysfs_root, sources(paths, ls=False))
    assert all(d.pci is None for d in kmsg_only.devices)
    (problem,) = kmsg_only.problems
    assert "neuron0, neuron1, neuron2, neuron3" in problem and "no probe line" in problem


def test_nothing_readable_means_no_attributes_and_a_problem(tmp_path: Path) -> None:
    paths, inv = emulated(tmp_path)
    paths.kernel_log.write_text("6,1,1,-;the probe lines rotated out\n")  # type: ignore[union-attr]
    located, pairing = locate(inv, paths.sysfs_root, sources(paths, ls=False))
    assert pairing == {} and all(d.pci is None for d in located.devices)
    (problem,) = located.problems
    assert problem.startswith("PCI address unknown for neuron0, neuron1,")
    assert "no pciBusID, pcieRoot or numaNode" in problem
    missing = PciSources(kernel_log=tmp_path / "absent", neuron_ls_json=tmp_path / "absent.json")
    (problem,) = locate(inv, paths.sysfs_root, missing)[0].problems
    assert (
        f"{tmp_path / 'absent.json'}: missing" in problem
        and f"{tmp_path / 'absent'}: missing" in problem
    )
    # No source configured (the chart's default) is a choice: no attributes, nothing logged.
    unconfigured, pairing = locate(inv, paths.sysfs_root, PciSources(None, None))
    assert pairing == {} and unconfigured.problems == inv.problems
    assert all(d.pci is None for d in unconfigured.devices)


def test_what_was_learned_survives_the_log_rotating(tmp_path: Path) -> None:
    paths, inv = emulated(tmp_path)
    first, known = locate(inv, paths.sysfs_root, sources(paths, ls=False))
    assert len(known) == 16
    # The ring buffer moved on: a restarted read finds nothing, the remembered pairing holds.
    paths.kernel_log.write_text("")  # type: ignore[union-attr]
    again, known_again = locate(inv, paths.sysfs_root, sources(paths, ls=False), known=known)
    assert again == first and known_again == known
    # The sources are not even read while everything is known.
    paths.kernel_log.chmod(0)  # type: ignore[union-attr]
    broken = PciSources(kernel_log=tmp_path / "nowhere", neuron_ls_json=None)
    assert locate(inv, paths.sysfs_root, broken, known=known)[0] == first


def test_a_remembered_address_no_longer_bound_is_dropped(tmp_path: Path) -> None:
    paths, inv = emulated(tmp_path)
    _, known = locate(inv, paths.sysfs_root, sources(paths))
    (paths.sysfs_root / "bus/pci/drivers/neuron/0000:58:00.0").unlink()  # unbound from neuron
    paths.kernel_log.write_text("")  # type: ignore[union-attr]
    located, pairing = locate(inv, paths.sysfs_root, sources(paths, ls=False), known=known)
    assert 5 not in pairing and len(pairing) == 15
    d5 = located.device(5)
    assert d5 is not None and d5.pci is None
    assert located.problems and "neuron5" in located.problems[0]


def test_a_capture_contradicting_the_log_costs_that_device(tmp_path: Path) -> None:
    paths, inv = emulated(tmp_path)
    assert paths.neuron_ls_json is not None
    data = json.loads(paths.neuron_ls_json.read_text())
    data[5]["bdf"], data[6]["bdf"] = data[6]["bdf"], data[5]["bdf"]
    paths.neuron_ls_json.write_text(json.dumps(data))
    located, pairing = locate(inv, paths.sysfs_root, sources(paths))
    assert set(pairing) == set(range(16)) - {5, 6}
    assert len(located.problems) == 2


def test_numa_node_minus_one_and_garbage(tmp_path: Path) -> None:
    paths, inv = emulated(tmp_path)
    device_dir = paths.sysfs_root / "bus/pci/devices/0000:58:00.0"
    (device_dir / "numa_node").write_text("-1\n")
    located, _ = locate(inv, paths.sysfs_root, sources(paths))
    d5 = located.device(5)
    assert d5 is not None and d5.pci == PciLocation("0000:58:00.0", "pci0000:57", None)
    assert located.problems == ()
    (device_dir / "numa_node").write_text("one\n")
    located, _ = locate(inv, paths.sysfs_root, sources(paths))
    d5 = located.device(5)
    assert d5 is not None and d5.pci is not None and d5.pci.numa_node is None
    assert located.problems == (
        f"{device_dir / 'numa_node'}: garbage: 'one' is not an integer; no numaNode",
    )


def test_no_neuron_driver_directory_means_nothing_can_be_checked(tmp_path: Path) -> None:
    paths, inv = emulated(tmp_path)
    os.rename(paths.sysfs_root / "bus/pci/drivers/neuron", tmp_path / "elsewhere")
    located, pairing = locate(inv, paths.sysfs_root, sources(paths))
    assert pairing == {} and all(d.pci is None for d in located.devices)
    assert "cannot be checked" in located.problems[0]


def test_empty_inventory_is_left_alone(tmp_path: Path) -> None:
    inv = NodeInventory(node_name="n", instance_type=None, driver_version=None, devices=())
    assert locate(inv, tmp_path, PciSources()) == (inv, {})


# --- the emulated layout -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "instance_type", ["trn2.48xlarge", "trn2u.48xlarge", "trn3.48xlarge", "trn1n.32xlarge"]
)
def test_each_efa_shares_the_root_complex_of_its_neuron_device(
    tmp_path: Path, instance_type: str
) -> None:
    paths = write_emulated_tree(tmp_path, instance_type, node_name="n-0", efa=True)
    assert paths.efa_map_path is not None
    efa = {int(k): v for k, v in json.loads(paths.efa_map_path.read_text()).items()}
    located = scan_emulated(paths, node_name="n-0")
    assert len(set(efa.values())) == 16
    for d in located.devices:
        assert d.pci is not None and d.efa_pci_address == efa[d.index]
        efa_link = os.readlink(paths.sysfs_root / "bus/pci/devices" / efa[d.index])
        assert pci.pcie_root_of(efa_link, efa[d.index]) == d.pci.pcie_root
        driver = os.readlink(paths.sysfs_root / "bus/pci/devices" / efa[d.index] / "driver")
        assert driver.endswith("bus/pci/drivers/efa")
    assert len({d.pci.pcie_root for d in located.devices if d.pci}) == 8


def test_numa_nodes_split_the_roots_in_halves() -> None:
    layout = pci_layout(PROFILES["trn2.48xlarge"], with_efa=False)
    by_numa = {
        n: sorted(i for i, f in enumerate(layout.neuron) if f.numa_node == n) for n in (0, 1)
    }
    assert by_numa == {0: list(range(4, 12)), 1: [0, 1, 2, 3, 12, 13, 14, 15]}
    single = pci_layout(PROFILES["trn1.2xlarge"], with_efa=False)
    assert [f.numa_node for f in single.neuron] == [-1]


def test_an_older_tree_is_rewritten_with_its_pci_side(tmp_path: Path) -> None:
    paths = write_emulated_tree(tmp_path, "trn2.48xlarge", node_name="n-0")
    params = tmp_path / "emulation.json"
    old = json.loads(params.read_text())
    params.write_text(json.dumps({**old, "format": 1}, sort_keys=True))
    (paths.sysfs_root / "bus").rename(tmp_path / "gone")
    again = write_emulated_tree(tmp_path, "trn2.48xlarge", node_name="n-0", reuse=True)
    assert (again.sysfs_root / "bus/pci/drivers/neuron").is_dir()
    assert dataclasses.replace(again) == paths


def test_the_plugin_outside_emulation_locates_and_remembers(tmp_path: Path) -> None:
    """The production path: the host's sysfs (here an emulated tree read as if it were one)
    and the configured sources; a later scan keeps what the rotated log no longer says."""
    paths = write_emulated_tree(tmp_path / "node", "trn2.48xlarge", node_name="n-0")
    assert paths.kernel_log is not None
    config = PluginConfig(
        node_name="n-0",
        cdi_root=tmp_path / "cdi",
        registrar_dir=tmp_path / "registry",
        plugins_dir=tmp_path / "plugins",
        sysfs_root=paths.sysfs_root,
        dev_root=paths.dev_root,
        opt_root=None,
        pci_sources=PciSources(kernel_log=paths.kernel_log),
    )
    plugin = KubeletPlugin(config, mock.MagicMock())  # the API is not used by a scan
    first = plugin._scan()
    d5 = first.device(5)
    assert d5 is not None and d5.pci == PciLocation("0000:58:00.0", "pci0000:57", 0)
    paths.kernel_log.write_text("")
    assert plugin._scan() == first
    fresh = KubeletPlugin(config, mock.MagicMock())  # a restart has only the log
    assert all(d.pci is None for d in fresh._scan().devices)
