"""Emulated sysfs/dev trees: every instance type, scanned by the production scanner."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from neuron_dra.common.profiles import (
    PROFILES,
    Topology,
    UltraServerMode,
    profile_for,
    torus_neighbours,
)
from neuron_dra.nodeplugin.discovery import emulation
from neuron_dra.nodeplugin.discovery.emulation import (
    EmulatedPaths,
    mark_unhealthy,
    set_election_busy,
    write_emulated_tree,
)
from neuron_dra.nodeplugin.discovery.model import NodeInventory, UltraServerInfo
from neuron_dra.nodeplugin.discovery.sysfs import EMULATION_MARKER, load_efa_map, scan

ALL_TYPES = sorted(PROFILES)
ULTRASERVER_TYPES = [t for t in ALL_TYPES if PROFILES[t].ultraserver_capable]
# The brief's minimum list; the parametrisation below covers every profile anyway.
REQUIRED = [
    "inf1.24xlarge", "inf2.xlarge", "inf2.48xlarge", "trn1.2xlarge", "trn1.32xlarge",
    "trn1n.32xlarge", "trn2.3xlarge", "trn2.48xlarge", "trn2u.48xlarge", "trn3.48xlarge",
]  # fmt: skip

FAMILY_ARCH = {
    "Inferentia": ("NDv1", "Inf1"),
    "Trainium1": ("NDv2", "Trn1"),
    "Inferentia2": ("NDv3", "Inf2"),
    "Trainium2": ("NDv3", "Trn2"),
    "Trainium3": ("NDv4", "Trn3"),
}


def emulate_and_scan(
    root: Path, instance_type: str, node_name: str = "node-0", **kw: object
) -> tuple[EmulatedPaths, NodeInventory]:
    paths = write_emulated_tree(root, instance_type, node_name=node_name, **kw)  # type: ignore[arg-type]
    inv = scan(paths.sysfs_root, paths.dev_root, node_name=node_name, opt_root=paths.opt_root)
    return paths, inv


def without_pci(inv: NodeInventory) -> NodeInventory:
    """The inventory as ``scan`` alone reports it (``scan_emulated`` adds PCI locations)."""
    devices = tuple(dataclasses.replace(d, pci=None) for d in inv.devices)
    return dataclasses.replace(inv, devices=devices)


def snapshot(root: Path) -> dict[str, tuple[str, str]]:
    """Every path under root -> (kind, content or link target)."""
    out: dict[str, tuple[str, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir", "")
            else:
                out[rel] = ("file", p.read_text())
    return out


def test_required_types_are_emulated() -> None:
    assert set(REQUIRED) <= set(ALL_TYPES)


@pytest.mark.parametrize("instance_type", ALL_TYPES)
def test_every_type_scans_back_to_its_profile(tmp_path: Path, instance_type: str) -> None:
    profile = PROFILES[instance_type]
    paths, inv = emulate_and_scan(tmp_path, instance_type)

    assert inv.problems == ()
    assert inv.instance_type == instance_type
    assert inv.driver_version == "2.24.7.0"
    assert inv.lnc_default is None
    assert [d.index for d in inv.devices] == list(range(profile.device_count))
    arch_type, family = FAMILY_ARCH[profile.device_name]
    for d in inv.devices:
        assert d.core_count == profile.cores_per_device
        assert d.dev_path == str(paths.dev_root / f"neuron{d.index}")
        assert (d.arch_type, d.device_name, d.arch_instance_family) == (
            arch_type, profile.device_name, family,
        )  # fmt: skip
        assert d.healthy and d.unhealthy_reasons == ()
        assert d.efa_pci_address is None
        assert d.emulated  # placeholder files, not device nodes: CDI must say so
        # Physical-core directories: one per core, as the driver creates them.
        sys_dir = paths.sysfs_root / "devices/virtual/neuron_device" / f"neuron{d.index}"
        assert len(list(sys_dir.glob("neuron_core*"))) == profile.cores_per_device

    n = profile.device_count
    for d in inv.devices:
        match profile.topology:
            case Topology.TORUS:
                assert profile.torus_dims is not None
                assert set(d.connected) == torus_neighbours(*profile.torus_dims, d.index)
                assert len(d.connected) == 4
            case Topology.RING:
                assert d.connected == ((d.index - 1) % n, (d.index + 1) % n)
            case Topology.SINGLE | Topology.SWITCH:
                assert d.connected == ()

    # What discovery reads back lets the generic fallback infer the same topology: the
    # emulated links are consistent with the profile rules, not just with our own reader.
    inferred = profile_for(
        "unknown.emulated",
        discovered_device_count=len(inv.devices),
        discovered_cores_per_device=inv.devices[0].core_count,
        arch=inv.devices[0].device_name,
        discovered_neighbours={d.index: d.connected for d in inv.devices},
    )
    assert (inferred.topology, inferred.torus_dims) == (profile.topology, profile.torus_dims)

    if profile.ultraserver_capable:
        us = inv.ultraserver
        assert us is not None
        assert us.node_counts == (1, 2, 4)
        assert us.supports_x2v
        assert us.modes == (UltraServerMode.X4, UltraServerMode.X2V, UltraServerMode.X1)
        assert us.server_id_4 is not None and us.server_id_2 == us.server_id_4  # node 0
        assert (us.node_id_2, us.node_id_4) == (0, 0)
    else:
        # The files exist with the driver's "not an UltraServer platform" values.
        assert inv.ultraserver == UltraServerInfo()
        assert inv.ultraserver.node_counts == ()


def test_raw_file_formats_match_the_driver(tmp_path: Path) -> None:
    paths = write_emulated_tree(tmp_path, "trn2.48xlarge", node_name="n")
    dev = paths.sysfs_root / "class/neuron_device"
    assert (dev / "neuron0/core_count").read_bytes() == b"8"  # no trailing newline
    assert (dev / "neuron0/connected_devices").read_text() == "12, 3, 4, 1\n"
    assert (dev / "neuron5/connected_devices").read_text() == "1, 4, 9, 6\n"
    assert (dev / "ultraserver_mode").read_text() == "\n"
    assert (dev / "server_id_4").read_text() == "0000000000000000\n"
    assert (dev / "node_id_4").read_text() == "-1\n"
    assert os.readlink(dev / "neuron3") == "../../devices/virtual/neuron_device/neuron3"
    assert (paths.sysfs_root / "class/dmi/id/product_name").read_text() == "trn2.48xlarge\n"
    assert (paths.sysfs_root / "module/neuron/version").read_text() == "2.24.7.0\n"
    assert (paths.dev_root / "neuron15").is_file()
    assert (paths.sysfs_root / EMULATION_MARKER).is_file()

    single = write_emulated_tree(tmp_path / "single", "inf2.xlarge", node_name="n")
    assert (single.sysfs_root / "class/neuron_device/neuron0/connected_devices").read_text() == (
        "\n"
    )


def test_serial_numbers(tmp_path: Path) -> None:
    _, inv = emulate_and_scan(tmp_path / "a", "trn1.32xlarge", node_name="a")
    _, other = emulate_and_scan(tmp_path / "b", "trn1.32xlarge", node_name="b")
    serials = [d.serial_number for d in inv.devices]
    assert all(s is not None and len(s) == 16 and int(s, 16) >= 0 for s in serials)
    assert len(set(serials)) == 16
    assert not set(serials) & {d.serial_number for d in other.devices}
    # Inf1 (driver arch v1) has no serial number file: optional, so not a problem.
    _, inf1 = emulate_and_scan(tmp_path / "c", "inf1.24xlarge")
    assert {d.serial_number for d in inf1.devices} == {None}
    assert inf1.problems == ()


def test_ultraserver_identity_derived_from_node_names(tmp_path: Path) -> None:
    infos = {}
    for i in range(5):
        _, inv = emulate_and_scan(tmp_path / str(i), "trn2u.48xlarge", node_name=f"trn-{i}")
        assert inv.ultraserver is not None
        infos[i] = inv.ultraserver
    # Nodes 0-3 form one UltraServer, trn-4 starts the next; node ids are n % 4.
    assert len({infos[i].server_id_4 for i in range(4)}) == 1
    assert infos[0].server_id_4 != infos[4].server_id_4
    assert [infos[i].node_id_4 for i in range(5)] == [0, 1, 2, 3, 0]
    assert [infos[i].node_id_2 for i in range(5)] == [0, 1, 0, 1, 0]
    # X2V pairs {0,1} and {2,3}: each pair shares server_id_2; the second pair's is S - 1.
    s = infos[0].server_id_4
    assert s is not None
    assert infos[0].server_id_2 == infos[1].server_id_2 == s
    assert infos[2].server_id_2 == infos[3].server_id_2 == f"{int(s, 16) - 1:016x}"


def test_ultraserver_identity_explicit(tmp_path: Path) -> None:
    _, inv = emulate_and_scan(
        tmp_path / "hex", "trn2u.48xlarge", node_name="x",
        ultraserver_id="00000000000000AB", ultraserver_node_id=3,
    )  # fmt: skip
    assert inv.ultraserver == UltraServerInfo(
        modes=(UltraServerMode.X4, UltraServerMode.X2V, UltraServerMode.X1),
        server_id_2="00000000000000aa",
        server_id_4="00000000000000ab",
        node_id_2=1,
        node_id_4=3,
    )
    # A non-hex id is hashed; the same id always maps to the same server id.
    _, a = emulate_and_scan(tmp_path / "a", "trn3p.48xlarge", ultraserver_id="cb-123")
    _, b = emulate_and_scan(tmp_path / "b", "trn3p.48xlarge", ultraserver_id="cb-123")
    assert a.ultraserver is not None and b.ultraserver is not None
    assert a.ultraserver.server_id_4 == b.ultraserver.server_id_4 == emulation.server_id("cb-123")
    assert emulation.derive_ultraserver("no-digits") == ("no-digits", 0)
    assert emulation.derive_ultraserver("ip-10-0-0-13") == ("ip-10-0-0-3", 1)


def test_server_id_2_wraps_at_zero() -> None:
    assert emulation.server_id_2("0000000000000000", 2) == "ffffffffffffffff"
    assert emulation.server_id_2("00000000000000ff", 1) == "00000000000000ff"


@pytest.mark.parametrize(
    ("instance_type", "kwargs", "message"),
    [
        ("trn9.huge", {}, "known types: inf1.24xlarge, inf1.2xlarge"),
        ("trn2.48xlarge", {"ultraserver_id": "x"}, "not UltraServer-capable"),
        ("trn2.48xlarge", {"ultraserver_node_id": 0}, "not UltraServer-capable"),
        ("trn2u.48xlarge", {"ultraserver_node_id": 4}, "must be 0..3"),
        ("trn2u.48xlarge", {"ultraserver_id": "0" * 16}, "no server"),
        ("inf2.48xlarge", {"lnc": 2}, "LNC 2 is not supported"),
        ("trn1.32xlarge", {"efa": True}, "one EFA per device"),
        ("inf2.xlarge", {"driver_version": "2.24\nx"}, "not a version string"),
    ],
)
def test_invalid_requests(
    tmp_path: Path, instance_type: str, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        write_emulated_tree(tmp_path, instance_type, node_name="n", **kwargs)  # type: ignore[arg-type]


def test_lnc_file(tmp_path: Path) -> None:
    paths, inv = emulate_and_scan(tmp_path, "trn2.48xlarge", lnc=1)
    assert (paths.opt_root / "aws/neuron/logical_nc_config").read_text() == (
        "NEURON_LOGICAL_NC_CONFIG=1\n"
    )
    assert inv.lnc_default == 1
    assert without_pci(emulation.scan_emulated(paths, node_name="node-0")) == inv


def test_efa_map(tmp_path: Path) -> None:
    paths = write_emulated_tree(tmp_path, "trn2u.48xlarge", node_name="n", efa=True)
    assert paths.efa_map_path is not None
    efa = load_efa_map(paths.efa_map_path)
    assert sorted(efa) == list(range(16))
    assert len(set(efa.values())) == 16
    inv = scan(paths.sysfs_root, paths.dev_root, node_name="n", efa_map=efa)
    assert [d.efa_pci_address for d in inv.devices] == [efa[i] for i in range(16)]
    assert without_pci(emulation.scan_emulated(paths, node_name="n")) == inv
    assert write_emulated_tree(tmp_path / "no", "trn2u.48xlarge", node_name="n").efa_map_path is (
        None
    )


def test_deterministic(tmp_path: Path) -> None:
    kw = {"node_name": "trn-5", "lnc": 2, "efa": True}
    write_emulated_tree(tmp_path / "a", "trn2u.48xlarge", **kw)  # type: ignore[arg-type]
    write_emulated_tree(tmp_path / "b", "trn2u.48xlarge", **kw)  # type: ignore[arg-type]
    a, b = snapshot(tmp_path / "a"), snapshot(tmp_path / "b")
    assert len(a) > 100
    assert a == b
    write_emulated_tree(tmp_path / "c", "trn2u.48xlarge", node_name="trn-6")
    assert snapshot(tmp_path / "c") != a


def test_rewrite_replaces_previous_tree(tmp_path: Path) -> None:
    write_emulated_tree(tmp_path, "trn2u.48xlarge", node_name="n", lnc=1, efa=True)
    _, inv = emulate_and_scan(tmp_path, "inf2.xlarge", node_name="n")
    assert [d.index for d in inv.devices] == [0]
    assert inv.lnc_default is None
    assert not (tmp_path / "efa-map.json").exists()
    assert snapshot(tmp_path) == snapshot(
        write_emulated_tree(
            tmp_path.parent / "fresh", "inf2.xlarge", node_name="n"
        ).sysfs_root.parent
    )


def test_refuses_to_overwrite_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "important").write_text("keep me")
    with pytest.raises(ValueError, match="refusing to overwrite"):
        write_emulated_tree(tmp_path, "inf2.xlarge", node_name="n")
    assert (tmp_path / "important").read_text() == "keep me"


def test_mark_unhealthy_and_back(tmp_path: Path) -> None:
    paths, _ = emulate_and_scan(tmp_path, "trn2.48xlarge")
    mark_unhealthy(paths, 3, ["hbm", "link_efa"])
    inv = scan(paths.sysfs_root, paths.dev_root, node_name="node-0")
    bad = inv.device(3)
    assert bad is not None and not bad.healthy
    assert bad.unhealthy_reasons == ("unhealthy component: hbm", "unhealthy component: link_efa")
    assert all(d.healthy for d in inv.devices if d.index != 3)

    mark_unhealthy(paths, 3, [])
    again = scan(paths.sysfs_root, paths.dev_root, node_name="node-0").device(3)
    assert again is not None and again.healthy


def test_mark_unhealthy_on_older_chip_and_bad_input(tmp_path: Path) -> None:
    # Trn1 has no health_status directory yet; marking creates it.
    paths, _ = emulate_and_scan(tmp_path, "trn1.2xlarge")
    mark_unhealthy(paths, 0, ["sram"])
    d = scan(paths.sysfs_root, paths.dev_root, node_name="n").device(0)
    assert d is not None and d.unhealthy_reasons == ("unhealthy component: sram",)
    with pytest.raises(ValueError, match="no emulated device 1"):
        mark_unhealthy(paths, 1, ["hbm"])
    with pytest.raises(ValueError, match="identifiers"):
        mark_unhealthy(paths, 0, ["hbm,sram"])


def test_busy_election(tmp_path: Path) -> None:
    paths, _ = emulate_and_scan(tmp_path, "trn2u.48xlarge", node_name="trn-2")
    set_election_busy(paths)
    inv = scan(paths.sysfs_root, paths.dev_root, node_name="trn-2")
    assert inv.ultraserver == UltraServerInfo()
    assert len(inv.problems) == 1
    assert "election in progress" in inv.problems[0]
    assert "ultraserver_mode, node_id_2, node_id_4" in inv.problems[0]
    # Devices are still usable while the election runs.
    assert len(inv.devices) == 16


def test_reuse_keeps_a_complete_tree_of_the_same_parameters(tmp_path: Path) -> None:
    """A second plugin instance (a rolling update) must not wipe the tree the first is
    scanning; what was written into it (a device marked unhealthy) stays."""
    from neuron_dra.nodeplugin.discovery.emulation import mark_unhealthy

    paths = write_emulated_tree(tmp_path, "trn2.48xlarge", node_name="n", reuse=True)
    mark_unhealthy(paths, 3, ["hbm"])
    marked = sorted(
        p for p in paths.sysfs_root.rglob("unhealthy_components") if p.read_text().strip()
    )
    assert len(marked) == 1
    write_emulated_tree(tmp_path, "trn2.48xlarge", node_name="n", reuse=True)
    assert marked[0].read_text().strip() == "hbm"
    # Other parameters, or no reuse: written anew.
    write_emulated_tree(tmp_path, "trn2.48xlarge", node_name="n", lnc=1, reuse=True)
    assert not marked[0].read_text().strip()
    mark_unhealthy(paths, 3, ["hbm"])
    write_emulated_tree(tmp_path, "trn2.48xlarge", node_name="n", lnc=1)
    assert not marked[0].read_text().strip()
