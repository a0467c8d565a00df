"""The udev enumerator: real libudev on this machine, injected contexts, and every fallback."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from neuron_dra.nodeplugin.discovery import sysfs
from neuron_dra.nodeplugin.discovery.emulation import EmulatedPaths, write_emulated_tree
from neuron_dra.nodeplugin.discovery.udev import list_udev_devices, scan_udev

NO_NEURON_HERE = not Path("/sys/class/neuron_device").exists()


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> EmulatedPaths:
    # Read-only for every test in this module.
    return write_emulated_tree(tmp_path_factory.mktemp("udev"), "inf2.24xlarge", node_name="n")


@dataclass
class FakeDevice:
    sys_path: str
    sys_name: str
    device_node: str | None


class FakeContext:
    """What scan_udev uses of pyudev.Context, listing devices of an emulated tree."""

    def __init__(self, sys_path: Path, devices: list[FakeDevice], fail: bool = False) -> None:
        self.sys_path = str(sys_path)
        self.devices = devices
        self.fail = fail
        self.subsystems: list[str] = []

    def list_devices(self, *, subsystem: str) -> list[FakeDevice]:
        self.subsystems.append(subsystem)
        if self.fail:
            raise OSError(5, "Input/output error")
        return self.devices


def udev_view(paths: EmulatedPaths, count: int) -> list[FakeDevice]:
    # libudev reports the canonical /sys/devices/... path and DEVNAME-based nodes under /dev.
    base = paths.sysfs_root / "devices/virtual/neuron_device"
    return [FakeDevice(str(base / f"neuron{i}"), f"neuron{i}", f"/dev/neuron{i}") for i in
            reversed(range(count))]  # fmt: skip


def pure(paths: EmulatedPaths) -> Any:
    return sysfs.scan(paths.sysfs_root, paths.dev_root, node_name="n")


@pytest.mark.skipif(not NO_NEURON_HERE, reason="this machine has Neuron devices")
def test_real_libudev_lists_nothing_here(tmp_path: Path) -> None:
    pyudev = pytest.importorskip("pyudev")
    context = pyudev.Context()
    problems: list[str] = []
    assert list_udev_devices(context, Path("/dev"), problems) == []
    assert problems == []
    inv = scan_udev(node_name="here")
    assert inv.devices == ()
    assert inv.ultraserver is None
    assert any("the neuron driver is not loaded" in p for p in inv.problems)


def test_real_libudev_with_other_sysfs_falls_back(
    tree: EmulatedPaths, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("pyudev")
    caplog.set_level(logging.INFO)
    inv = scan_udev(tree.sysfs_root, tree.dev_root, node_name="n")
    # libudev can only read the real /sys, so the emulated tree is read by the scanner.
    assert inv == pure(tree)
    assert len(inv.devices) == 6
    assert f"libudev reads /sys, not {tree.sysfs_root}" in caplog.text


@pytest.mark.parametrize(
    "error", [ImportError("No library named udev"), OSError("libudev.so.1: cannot open")]
)
def test_missing_libudev_falls_back(
    tree: EmulatedPaths, caplog: pytest.LogCaptureFixture, error: Exception
) -> None:
    caplog.set_level(logging.INFO)

    def broken() -> Any:
        raise error

    inv = scan_udev(tree.sysfs_root, tree.dev_root, node_name="n", context_factory=broken)
    assert inv == pure(tree)
    assert f"libudev not usable: {error}" in caplog.text


def test_missing_pyudev_module_falls_back(
    tree: EmulatedPaths, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    monkeypatch.setitem(sys.modules, "pyudev", None)  # makes `import pyudev` raise ImportError
    inv = scan_udev(tree.sysfs_root, tree.dev_root, node_name="n")
    assert inv == pure(tree)
    assert "libudev not usable" in caplog.text


def test_enumeration_error_falls_back(
    tree: EmulatedPaths, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    ctx = FakeContext(tree.sysfs_root, [], fail=True)
    inv = scan_udev(tree.sysfs_root, tree.dev_root, node_name="n", context_factory=lambda: ctx)
    assert inv == pure(tree)
    assert "udev enumeration failed" in caplog.text


def test_udev_listing_gives_the_same_inventory(tree: EmulatedPaths) -> None:
    ctx = FakeContext(tree.sysfs_root, udev_view(tree, 6))
    inv = scan_udev(tree.sysfs_root, tree.dev_root, node_name="n", context_factory=lambda: ctx)
    assert ctx.subsystems == ["neuron_device"]
    expected = pure(tree)
    # Same values; only the sysfs path the attributes were read through differs.
    assert inv == expected
    assert [d.index for d in inv.devices] == list(range(6))


def test_udev_lists_only_what_it_knows(tree: EmulatedPaths) -> None:
    # udev is the authority on which devices exist: a device it does not list is not used
    # even if its sysfs directory exists.
    devices = udev_view(tree, 6)[2:]  # neuron3..neuron0
    devices.append(FakeDevice(str(tree.sysfs_root / "devices/virtual/x"), "neuron_ctl", None))
    ctx = FakeContext(tree.sysfs_root, devices)
    inv = scan_udev(tree.sysfs_root, tree.dev_root, node_name="n", context_factory=lambda: ctx)
    assert [d.index for d in inv.devices] == [0, 1, 2, 3]
    assert inv.problems == (
        f"{tree.sysfs_root / 'devices/virtual/x'}: udev neuron_device device 'neuron_ctl' ignored",
    )


def test_device_node_name_from_udev_under_dev_root(tree: EmulatedPaths) -> None:
    base = tree.sysfs_root / "devices/virtual/neuron_device"
    devices = [
        FakeDevice(str(base / "neuron0"), "neuron0", None),  # no DEVNAME: use the sys name
        FakeDevice(str(base / "neuron1"), "neuron1", "/somewhere/else/neuron1"),
    ]
    problems: list[str] = []
    entries = list_udev_devices(FakeContext(tree.sysfs_root, devices), Path("/d"), problems)
    assert [(e.index, e.dev_node) for e in entries] == [
        (0, Path("/d/neuron0")),
        (1, Path("/d/neuron1")),
    ]
    assert problems == []
