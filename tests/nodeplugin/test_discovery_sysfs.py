"""The pure sysfs scanner's tolerance rules, on emulated trees damaged in specific ways."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from neuron_dra.common.profiles import UltraServerMode
from neuron_dra.nodeplugin.discovery import sysfs
from neuron_dra.nodeplugin.discovery.emulation import EmulatedPaths, write_emulated_tree
from neuron_dra.nodeplugin.discovery.model import HealthFault, NodeInventory
from neuron_dra.nodeplugin.discovery.sysfs import load_efa_map, scan

LABEL = "node.kubernetes.io/instance-type"


@pytest.fixture
def node(tmp_path: Path) -> EmulatedPaths:
    """A small node (6 devices in a ring, 2 cores each) that each test may damage freely.

    Small because creating files is the cost of these tests; per-type correctness of the
    emulated trees is covered in test_emulation.py.
    """
    return write_emulated_tree(tmp_path / "t", "inf2.24xlarge", node_name="n")


US_FILES = ("ultraserver_mode", "server_id_2", "server_id_4", "node_id_2", "node_id_4")


@pytest.fixture(scope="module")
def _trn2u_tree(tmp_path_factory: pytest.TempPathFactory) -> EmulatedPaths:
    return write_emulated_tree(tmp_path_factory.mktemp("u"), "trn2u.48xlarge", node_name="n-1")


@pytest.fixture
def trn2u(_trn2u_tree: EmulatedPaths) -> Iterator[EmulatedPaths]:
    """One shared UltraServer tree; the class-level files tests change are restored after."""
    saved = {name: class_file(_trn2u_tree, name).read_bytes() for name in US_FILES}
    yield _trn2u_tree
    for name, data in saved.items():
        class_file(_trn2u_tree, name).write_bytes(data)


def rescan(paths: EmulatedPaths, **kw: object) -> NodeInventory:
    return scan(paths.sysfs_root, paths.dev_root, node_name="n", **kw)  # type: ignore[arg-type]


def dev_dir(paths: EmulatedPaths, index: int) -> Path:
    """The device directory as the scanner names it (through the class symlink)."""
    return paths.sysfs_root / "class/neuron_device" / f"neuron{index}"


def class_file(paths: EmulatedPaths, name: str) -> Path:
    return paths.sysfs_root / "class/neuron_device" / name


def only_problem(inv: NodeInventory) -> str:
    assert len(inv.problems) == 1, inv.problems
    return inv.problems[0]


# --- per-device attributes ----------------------------------------------------------------------


def test_garbage_core_count(node: EmulatedPaths) -> None:
    (dev_dir(node, 2) / "core_count").write_text("abc")
    inv = rescan(node)
    d = inv.device(2)
    assert d is not None and d.core_count is None
    # The rest of the device and the other devices are unaffected.
    assert d.connected == (1, 3)
    assert {x.core_count for x in inv.devices if x.index != 2} == {2}
    problem = only_problem(inv)
    assert str(dev_dir(node, 2) / "core_count") in problem
    assert "'abc' is not an integer" in problem


@pytest.mark.parametrize("value", ["0", "-2", "8\x00", ""])
def test_core_count_out_of_range_or_malformed(node: EmulatedPaths, value: str) -> None:
    (dev_dir(node, 0) / "core_count").write_text(value)
    inv = rescan(node)
    assert inv.devices[0].core_count is None
    assert "core_count: garbage" in only_problem(inv)


def test_non_ascii_and_oversized_values(node: EmulatedPaths) -> None:
    (dev_dir(node, 0) / "core_count").write_bytes(b"\xff\xfe")
    (dev_dir(node, 1) / "core_count").write_text("8" * 5000)
    inv = rescan(node)
    assert inv.devices[0].core_count is None and inv.devices[1].core_count is None
    assert [p.split(": ", 1)[1] for p in inv.problems] == [
        "garbage: not ASCII text",
        "garbage: longer than 4096 bytes",
    ]


def test_directory_in_place_of_file(node: EmulatedPaths) -> None:
    # Works as root too (unlike chmod 000): reading a directory always fails.
    f = dev_dir(node, 1) / "core_count"
    f.unlink()
    f.mkdir()
    inv = rescan(node)
    assert inv.devices[1].core_count is None
    assert only_problem(inv) == f"{f}: unreadable: is a directory"


_RESCAN_SCRIPT = """
import json, sys
from pathlib import Path
from neuron_dra.nodeplugin.discovery.sysfs import scan
inv = scan(Path(sys.argv[1]), Path(sys.argv[2]), node_name="n")
print(json.dumps({"connected": list(inv.devices[1].connected), "problems": list(inv.problems)}))
"""


def test_unreadable_file(node: EmulatedPaths) -> None:
    f = dev_dir(node, 1) / "connected_devices"
    f.chmod(0)
    try:
        if os.geteuid() != 0:
            inv = rescan(node)
            connected, problems = list(inv.devices[1].connected), list(inv.problems)
        else:
            # Root reads a mode-000 file anyway: scan in a process whose capabilities leave
            # out the two that let it (as an unprivileged plugin would run).
            setpriv = shutil.which("setpriv")
            assert setpriv, "util-linux setpriv is needed to drop root's file capabilities"
            drop = "-dac_override,-dac_read_search"
            out = subprocess.run(
                [setpriv, f"--bounding-set={drop}", f"--inh-caps={drop}", "--",
                 sys.executable, "-c", _RESCAN_SCRIPT, str(node.sysfs_root), str(node.dev_root)],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            got = json.loads(out)
            connected, problems = got["connected"], got["problems"]
    finally:
        f.chmod(0o644)
    assert connected == []
    assert len(problems) == 1 and problems[0].startswith(f"{f}: unreadable: "), problems


def test_missing_required_and_optional_attributes(node: EmulatedPaths) -> None:
    d = dev_dir(node, 4)
    (d / "core_count").unlink()
    (d / "info/architecture/device_name").unlink()
    (d / "info/serial_number").unlink()  # optional: older chips have none
    shutil.rmtree(d / "stats")  # optional as well
    inv = rescan(node)
    dev = inv.device(4)
    assert dev is not None
    assert (dev.core_count, dev.device_name, dev.serial_number) == (None, None, None)
    assert dev.arch_type == "NDv3" and dev.healthy
    assert inv.problems == (
        f"{d / 'core_count'}: missing",
        f"{d / 'info/architecture/device_name'}: missing",
    )


@pytest.mark.parametrize("value", ["1, x, 3\n", "1,,2\n", "-1\n"])
def test_garbage_connected_devices_dropped_entirely(node: EmulatedPaths, value: str) -> None:
    (dev_dir(node, 0) / "connected_devices").write_text(value)
    inv = rescan(node)
    assert inv.devices[0].connected == ()
    assert "is not a list of device indices" in only_problem(inv)


def test_connected_devices_spacing_tolerated(node: EmulatedPaths) -> None:
    (dev_dir(node, 0) / "connected_devices").write_text("12,3 ,4,  1\n")
    assert rescan(node).devices[0].connected == (12, 3, 4, 1)


def test_garbage_serial_number(node: EmulatedPaths) -> None:
    (dev_dir(node, 0) / "info/serial_number").write_text("not-a-serial\n")
    (dev_dir(node, 1) / "info/serial_number").write_text("\n")  # driver: read failed
    (dev_dir(node, 2) / "info/serial_number").write_text("ABCDEF0123456789\n")
    inv = rescan(node)
    assert [d.serial_number for d in inv.devices[:3]] == [None, None, "abcdef0123456789"]
    assert "16 hex digits" in only_problem(inv)


# --- device nodes and disappearing devices ----------------------------------------------------


def test_missing_dev_node_skips_device(node: EmulatedPaths) -> None:
    (node.dev_root / "neuron4").unlink()
    inv = rescan(node)
    assert [d.index for d in inv.devices] == [0, 1, 2, 3, 5]
    assert only_problem(inv) == (
        f"{node.dev_root / 'neuron4'}: device node missing; neuron4 skipped"
    )


def test_regular_file_is_not_a_device_outside_emulation(node: EmulatedPaths) -> None:
    (node.sysfs_root / sysfs.EMULATION_MARKER).unlink()
    inv = rescan(node)
    assert inv.devices == ()
    assert len(inv.problems) == 6
    assert all("not a character device" in p for p in inv.problems)


def test_character_device_accepted_without_marker(node: EmulatedPaths) -> None:
    # /dev/null is a real character device; a symlink to it stands in for /dev/neuron0.
    (node.sysfs_root / sysfs.EMULATION_MARKER).unlink()
    (node.dev_root / "neuron0").unlink()
    (node.dev_root / "neuron0").symlink_to("/dev/null")
    inv = rescan(node)
    assert [d.index for d in inv.devices] == [0]


def test_directory_as_dev_node_rejected(node: EmulatedPaths) -> None:
    (node.dev_root / "neuron3").unlink()
    (node.dev_root / "neuron3").mkdir()
    inv = rescan(node)
    assert inv.device(3) is None
    assert "neuron3: not a character device; neuron3 skipped" in only_problem(inv)


def test_vanished_device_directory(node: EmulatedPaths) -> None:
    # The class symlink is still listed but its target is gone (driver unloading).
    shutil.rmtree(dev_dir(node, 4).resolve())
    inv = rescan(node)
    assert inv.device(4) is None and len(inv.devices) == 5
    assert only_problem(inv) == (
        f"{dev_dir(node, 4)}: device directory vanished during the scan; skipped"
    )


def test_device_vanishing_while_being_read(
    node: EmulatedPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = sysfs.health_faults

    def health_then_vanish(sys_dir: Path, problems: list[str]) -> tuple[HealthFault, ...]:
        result = real(sys_dir, problems)
        if sys_dir.name == "neuron5":
            shutil.rmtree(sys_dir.resolve())
        return result

    monkeypatch.setattr(sysfs, "health_faults", health_then_vanish)
    inv = rescan(node)
    assert inv.device(5) is None and len(inv.devices) == 5
    assert "vanished during the scan" in only_problem(inv)


def test_devices_listed_from_virtual_dir_only(node: EmulatedPaths) -> None:
    for i in range(6):
        class_file(node, f"neuron{i}").unlink()
    inv = rescan(node)
    assert [d.index for d in inv.devices] == list(range(6))
    assert inv.problems == ()


def test_no_driver(tmp_path: Path) -> None:
    inv = scan(tmp_path / "sys", tmp_path / "dev", node_name="n", node_labels={LABEL: "x"})
    assert inv.devices == () and inv.ultraserver is None and inv.driver_version is None
    assert inv.problems[0].endswith(
        "missing; the neuron driver is not loaded (or sysfs is not mounted)"
    )


def test_devices_sorted_numerically(tmp_path: Path) -> None:
    paths = write_emulated_tree(tmp_path, "inf2.48xlarge", node_name="n")
    assert [d.index for d in rescan(paths).devices] == list(range(12))
    assert sysfs.device_index("neuron12") == 12
    assert sysfs.device_index("neuron012") is None
    assert sysfs.device_index("server_id_2") is None


def test_host_dev_root(node: EmulatedPaths) -> None:
    inv = rescan(node, host_dev_root=Path("/dev"))
    assert inv.devices[3].dev_path == "/dev/neuron3"


# --- health -------------------------------------------------------------------------------------


def test_uncorrected_ecc_marks_unhealthy(node: EmulatedPaths) -> None:
    (dev_dir(node, 4) / "stats/hardware/mem_ecc_uncorrected").write_text("2\n")
    (dev_dir(node, 4) / "stats/hardware/sram_ecc_uncorrected").write_text("1\n")
    (dev_dir(node, 5) / "stats/hardware/mem_ecc_repairable_uncorrected").write_text("junk\n")
    inv = rescan(node)
    d4, d5 = inv.device(4), inv.device(5)
    assert d4 is not None and not d4.healthy
    assert d4.unhealthy_reasons == ("sram_ecc_uncorrected = 1", "mem_ecc_uncorrected = 2")
    # An unparseable counter is a problem to log, not evidence of bad hardware.
    assert d5 is not None and d5.healthy
    assert "mem_ecc_repairable_uncorrected: garbage" in only_problem(inv)


def test_unhealthy_components_separators(node: EmulatedPaths) -> None:
    f = dev_dir(node, 0) / sysfs.UNHEALTHY_COMPONENTS_FILE
    f.parent.mkdir()  # Inf2 has no health_status/ in the emulated tree
    f.write_text("hbm, link_host link_efa,\n")
    d = rescan(node).devices[0]
    assert d.unhealthy_reasons == tuple(
        f"unhealthy component: {c}" for c in ("hbm", "link_host", "link_efa")
    )


# --- UltraServer class files --------------------------------------------------------------------


def test_ultraserver_values(trn2u: EmulatedPaths) -> None:
    us = rescan(trn2u).ultraserver
    assert us is not None
    assert (us.node_id_4, us.node_id_2) == (1, 1)
    assert us.server_id_2 == us.server_id_4 and us.server_id_4 is not None


def test_partially_busy_election(trn2u: EmulatedPaths) -> None:
    class_file(trn2u, "node_id_4").write_text("busy\n")
    inv = rescan(trn2u)
    assert inv.ultraserver is not None
    assert inv.ultraserver.node_id_4 is None
    assert inv.ultraserver.node_counts == (1, 2, 4)
    assert "election in progress (node_id_4 read 'busy')" in only_problem(inv)


@pytest.mark.parametrize(
    ("name", "value", "field", "expected", "problem"),
    [
        ("ultraserver_mode", "1,9,3", "modes", (UltraServerMode.X4, UltraServerMode.X2V), "'9'"),
        ("ultraserver_mode", "4", "modes", (UltraServerMode.X1,), None),
        ("server_id_4", "xyz", "server_id_4", None, "16 hex digits"),
        ("server_id_4", "00000000000000AB", "server_id_4", "00000000000000ab", None),
        ("server_id_2", "0000000000000000", "server_id_2", None, None),
        ("node_id_4", "invalid", "node_id_4", None, "'invalid'"),
        ("node_id_4", "7", "node_id_4", None, "a node id in 0..3"),
        ("node_id_2", "2", "node_id_2", None, "a node id in 0..1"),
        ("node_id_2", "-1", "node_id_2", None, None),
        ("node_id_2", "one", "node_id_2", None, "not a node id"),
    ],
)
def test_ultraserver_file_parsing(
    trn2u: EmulatedPaths, name: str, value: str, field: str, expected: object, problem: str | None
) -> None:
    class_file(trn2u, name).write_text(value + "\n")
    inv = rescan(trn2u)
    assert getattr(inv.ultraserver, field) == expected
    if problem is None:
        assert inv.problems == ()
    else:
        assert problem in only_problem(inv)


def test_no_ultraserver_files_means_none(node: EmulatedPaths) -> None:
    for name in US_FILES:
        class_file(node, name).unlink()
    inv = rescan(node)
    assert inv.ultraserver is None and inv.problems == ()


# --- node-wide values ---------------------------------------------------------------------------


def test_missing_module_version(node: EmulatedPaths) -> None:
    shutil.rmtree(node.sysfs_root / "module")
    inv = rescan(node)
    assert inv.driver_version is None
    assert "module/neuron/version: missing or empty" in only_problem(inv)
    assert len(inv.devices) == 6


def test_dmi_absent_node_label_used(node: EmulatedPaths) -> None:
    (node.sysfs_root / "class/dmi/id").unlink()
    shutil.rmtree(node.sysfs_root / "devices/virtual/dmi")
    inv = rescan(node, node_labels={LABEL: "inf2.24xlarge"})
    assert inv.instance_type == "inf2.24xlarge" and inv.problems == ()
    unknown = rescan(node)
    assert unknown.instance_type is None
    assert "instance type unknown" in only_problem(unknown)


def test_dmi_from_virtual_path_and_wins_over_label(node: EmulatedPaths) -> None:
    (node.sysfs_root / "class/dmi/id").unlink()  # only devices/virtual/dmi/id remains
    inv = rescan(node, node_labels={LABEL: "inf2.48xlarge"})
    assert inv.instance_type == "inf2.24xlarge"
    assert "differs from Node label" in only_problem(inv)


@pytest.mark.parametrize(
    ("text", "expected", "problem"),
    [
        ("NEURON_LOGICAL_NC_CONFIG=1\n", 1, None),
        ('# set by user data\n\nexport NEURON_LOGICAL_NC_CONFIG="2"\n', 2, None),
        ("NEURON_LOGICAL_NC_CONFIG=2\nNEURON_LOGICAL_NC_CONFIG=1\n", 1, None),
        ("NEURON_LOGICAL_NC_CONFIG=3\n", None, "1 or 2"),
        ("SOMETHING_ELSE=1\n", None, "no NEURON_LOGICAL_NC_CONFIG"),
    ],
)
def test_lnc_config(
    node: EmulatedPaths, text: str, expected: int | None, problem: str | None
) -> None:
    f = node.opt_root / sysfs.LOGICAL_NC_CONFIG_FILE
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(text)
    inv = rescan(node, opt_root=node.opt_root)
    assert inv.lnc_default == expected
    if problem is None:
        assert inv.problems == ()
    else:
        assert problem in only_problem(inv)
    # Without opt_root the file is not consulted at all.
    assert rescan(node).lnc_default is None


def test_lnc_config_absent_is_not_a_problem(node: EmulatedPaths) -> None:
    inv = rescan(node, opt_root=node.opt_root)
    assert inv.lnc_default is None and inv.problems == ()


# --- EFA map ------------------------------------------------------------------------------------


def test_efa_map_for_missing_device_reported(node: EmulatedPaths) -> None:
    inv = rescan(node, efa_map={0: "0000:10:1b.0", 20: "0000:11:1b.0"})
    assert inv.devices[0].efa_pci_address == "0000:10:1b.0"
    assert inv.devices[1].efa_pci_address is None
    assert "[20]" in only_problem(inv)


@pytest.mark.parametrize(
    "content",
    ["not json", "[]", '{"x": "0000:10:1b.0"}', '{"0": "10:1b.0"}', '{"0": 5}', '{"-1": "a"}'],
)
def test_load_efa_map_rejects_bad_files(tmp_path: Path, content: str) -> None:
    f = tmp_path / "efa.json"
    f.write_text(content)
    with pytest.raises(ValueError, match=str(f)):
        load_efa_map(f)


def test_load_efa_map(tmp_path: Path) -> None:
    f = tmp_path / "efa.json"
    f.write_text('{"1": "0000:1A:1b.0", "0": "0000:10:1b.0"}')
    assert load_efa_map(f) == {0: "0000:10:1b.0", 1: "0000:1a:1b.0"}
    with pytest.raises(ValueError, match="cannot load"):
        load_efa_map(tmp_path / "absent.json")
