"""CDI specs for prepared claims: content (pure) and spec files (edge)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from neuron_dra.common.profiles import PROFILES, UltraServerMode, connected_groups
from neuron_dra.common.ultraserver import UltraServerPeers
from neuron_dra.nodeplugin.discovery.model import (
    NeuronDevice,
    NodeInventory,
    UltraServerInfo,
)
from neuron_dra.nodeplugin.prepare import cdi
from neuron_dra.nodeplugin.prepare.cdi import (
    cdi_device_ids,
    list_cdi_specs,
    remove_cdi_spec,
    runtime_ultraserver_mode,
    visible_cores,
    write_cdi_spec,
)
from neuron_dra.nodeplugin.prepare.claims import ClaimPlan
from neuron_dra.nodeplugin.prepare.node import PrepareNode


def cdi_spec_for(plan: ClaimPlan, inventory: NodeInventory, **kw: Any) -> dict[str, Any]:
    """The spec on a node with this inventory (Prepare reads it through PrepareNode)."""
    return cdi.cdi_spec_for(plan, PrepareNode(inventory), **kw)


def claim_env(plan: ClaimPlan, inventory: NodeInventory, **kw: Any) -> dict[str, str]:
    return cdi.claim_env(plan, PrepareNode(inventory), **kw)


NODE = "ip-10-0-0-1"
UID = "c0ffee00-1111-4222-8333-444455556666"  # letter first
DIGIT_UID = "5e1f2b9c-0d7a-4c3e-9f1b-2a6d8e4c7b10"

US_FULL = UltraServerInfo(
    modes=(UltraServerMode.X4, UltraServerMode.X2V, UltraServerMode.X1),
    server_id_2="a1b2c3d4e5f60718",
    server_id_4="a1b2c3d4e5f60719",
    node_id_2=1,
    node_id_4=3,
)


def make_inventory(
    instance_type: str,
    *,
    ultraserver: UltraServerInfo | None = None,
    lnc: int | None = None,
    dev_root: str = "/dev",
) -> NodeInventory:
    p = PROFILES[instance_type]
    return NodeInventory(
        node_name=NODE,
        instance_type=instance_type,
        driver_version="2.24.7.0",
        devices=tuple(
            NeuronDevice(index=i, dev_path=f"{dev_root}/neuron{i}", core_count=p.cores_per_device)
            for i in range(p.device_count)
        ),
        ultraserver=ultraserver,
        lnc_default=lnc,
    )


def make_plan(
    *indices: int,
    lnc: int | None = None,
    mode: int | None = None,
    uid: str = UID,
    node_device: bool = False,
    all_indices: int = 16,
) -> ClaimPlan:
    if node_device:
        devices: tuple[tuple[tuple[str, ...], str], ...] = ((("neurons",), "neuronnode"),)
        indices = tuple(range(all_indices))
    else:
        devices = tuple((("neurons",), f"neurondevice{i}") for i in indices)
    return ClaimPlan(
        claim_uid=uid,
        namespace="default",
        name="claim",
        devices=devices,
        device_indices=tuple(indices),
        lnc=lnc,
        ultraserver_mode_nodes=mode,
        workload_id=None,
    )


def env_of(spec: dict[str, Any]) -> dict[str, str]:
    """The environment a container given every CDI device of the spec ends up with.

    CDI applies spec-level edits once and device edits per device; for the same name the
    last value wins. Also asserts the spec never sets a name twice, so order cannot matter.
    """
    entries = list(spec.get("containerEdits", {}).get("env", []))
    for device in spec["devices"]:
        entries += device["containerEdits"].get("env", [])
    names = [e.split("=", 1)[0] for e in entries]
    assert len(names) == len(set(names)), entries
    return dict(e.split("=", 1) for e in entries)


_CDI_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")
_CDI_KIND = re.compile(
    r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?/[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?"
)


def assert_cdi_valid(spec: dict[str, Any]) -> None:
    """The rules of the CDI specification (cdiVersion, kind, names) that our content can break."""
    assert set(spec) <= {"cdiVersion", "kind", "devices", "containerEdits", "annotations"}
    assert _CDI_KIND.fullmatch(spec["kind"])
    names = [d["name"] for d in spec["devices"]]
    assert names and len(names) == len(set(names))
    for d in spec["devices"]:
        assert _CDI_NAME.fullmatch(d["name"])
        assert d["containerEdits"], "empty device edits are invalid"
        for node in d["containerEdits"].get("deviceNodes", []):
            assert node["path"].startswith("/dev/")
            if "hostPath" in node:
                assert spec["cdiVersion"] >= "0.5.0"
        if d["name"][0].isdigit():
            assert spec["cdiVersion"] >= "0.5.0"
    for e in spec.get("containerEdits", {}).get("env", []):
        assert "=" in e and not e.startswith("=")


TRN2 = make_inventory("trn2.48xlarge")
TRN1 = make_inventory("trn1.32xlarge")
TRN2U = make_inventory("trn2u.48xlarge", ultraserver=US_FULL)


# --- NEURON_RT_VISIBLE_CORES and LNC ---------------------------------------------------------


def test_trn2_row_at_default_lnc_2() -> None:
    env = env_of(cdi_spec_for(make_plan(4, 5, 6, 7), TRN2))
    assert env == {"NEURON_RT_VISIBLE_CORES": "16-31"}


def test_trn2_row_at_configured_lnc_1() -> None:
    env = env_of(cdi_spec_for(make_plan(4, 5, 6, 7, lnc=1), TRN2))
    assert env == {"NEURON_RT_VISIBLE_CORES": "32-63", "NEURON_LOGICAL_NC_CONFIG": "1"}


def test_trn2_configured_lnc_2_is_still_passed() -> None:
    env = env_of(cdi_spec_for(make_plan(4, 5, 6, 7, lnc=2), TRN2))
    assert env == {"NEURON_RT_VISIBLE_CORES": "16-31", "NEURON_LOGICAL_NC_CONFIG": "2"}


def test_trn2_node_default_lnc_1_reaches_the_container() -> None:
    # The container cannot read the node's LNC file: tell the runtime what the ids assume.
    env = env_of(cdi_spec_for(make_plan(4, 5, 6, 7), make_inventory("trn2.48xlarge", lnc=1)))
    assert env == {"NEURON_RT_VISIBLE_CORES": "32-63", "NEURON_LOGICAL_NC_CONFIG": "1"}


def test_trn1_row_and_no_lnc_variable() -> None:
    assert env_of(cdi_spec_for(make_plan(0, 1, 2, 3), TRN1)) == {"NEURON_RT_VISIBLE_CORES": "0-7"}
    # LNC 1 on trn1 is accepted by plan_claim but is not a runtime setting there.
    env = env_of(cdi_spec_for(make_plan(0, 1, 2, 3, lnc=1), TRN1))
    assert env == {"NEURON_RT_VISIBLE_CORES": "0-7"}


def test_single_device_and_whole_node() -> None:
    assert env_of(cdi_spec_for(make_plan(15), TRN2))["NEURON_RT_VISIBLE_CORES"] == "60-63"
    spec = cdi_spec_for(make_plan(node_device=True), TRN2U)
    assert env_of(spec)["NEURON_RT_VISIBLE_CORES"] == "0-63"


def test_visible_cores_rejects_gaps() -> None:
    with pytest.raises(RuntimeError, match="not consecutive"):
        visible_cores([0, 2], 4)


@given(
    name=st.sampled_from(sorted(PROFILES)),
    data=st.data(),
)
def test_any_connected_group_gets_exactly_its_cores_as_one_range(
    name: str, data: st.DataObject
) -> None:
    profile = PROFILES[name]
    sizes = [s for s in range(1, profile.device_count + 1) if connected_groups(profile, s)]
    group = data.draw(st.sampled_from(connected_groups(profile, data.draw(st.sampled_from(sizes)))))
    lnc = data.draw(st.sampled_from(sorted(profile.allowed_lnc)))
    per_device = profile.cores_per_device // lnc
    text = env_of(cdi_spec_for(make_plan(*group, lnc=lnc), make_inventory(name)))[
        "NEURON_RT_VISIBLE_CORES"
    ]
    first, _, last = text.partition("-")
    ids = set(range(int(first), int(last or first) + 1))
    expected = {d * per_device + c for d in group for c in range(per_device)}
    assert ids == expected


# --- device nodes, names, versions ------------------------------------------------------------


def test_spec_shape() -> None:
    spec = cdi_spec_for(make_plan(0, 1, 2, 3), TRN2)
    assert spec == {
        "cdiVersion": "0.3.0",
        "kind": "k8s.neuron.aws.com/claim",
        "devices": [
            {
                "name": f"{UID}-neurondevice{i}",
                "containerEdits": {"deviceNodes": [{"path": f"/dev/neuron{i}"}]},
            }
            for i in range(4)
        ],
        "containerEdits": {"env": ["NEURON_RT_VISIBLE_CORES=0-15"]},
    }
    assert_cdi_valid(spec)


def test_node_device_gets_every_device_node() -> None:
    spec = cdi_spec_for(make_plan(node_device=True), TRN2U)
    assert [d["name"] for d in spec["devices"]] == [f"{UID}-neuronnode"]
    nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
    assert nodes == [{"path": f"/dev/neuron{i}"} for i in range(16)]
    assert_cdi_valid(spec)


def test_digit_first_names_need_0_5_0() -> None:
    spec = cdi_spec_for(make_plan(0, uid=DIGIT_UID), TRN2)
    assert spec["cdiVersion"] == "0.5.0"
    assert_cdi_valid(spec)


def test_emulated_device_nodes_are_complete_char_devices() -> None:
    # The emulated /dev/neuron<N> are regular files, which containerd's CDI refuses to stat as
    # devices; fully specified nodes (type + major) are taken as they are.
    inv = make_inventory("trn2.48xlarge", dev_root="/var/lib/neuron-dra/emulation/dev")
    inv = dataclasses.replace(
        inv, devices=tuple(dataclasses.replace(d, emulated=True) for d in inv.devices)
    )
    spec = cdi_spec_for(make_plan(3), inv)
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/neuron3", "type": "c", "major": 1, "minor": 3}
    ]
    assert spec["cdiVersion"] == "0.3.0"
    assert_cdi_valid(spec)


def test_device_nodes_under_another_dev_root_use_host_path() -> None:
    inv = make_inventory("trn2.48xlarge", dev_root="/var/lib/neuron-dra/emulation/dev")
    spec = cdi_spec_for(make_plan(3), inv)
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/neuron3", "hostPath": "/var/lib/neuron-dra/emulation/dev/neuron3"}
    ]
    assert spec["cdiVersion"] == "0.5.0"


def test_cdi_device_ids() -> None:
    assert cdi_device_ids(make_plan(4, 5)) == [
        f"k8s.neuron.aws.com/claim={UID}-neurondevice4",
        f"k8s.neuron.aws.com/claim={UID}-neurondevice5",
    ]


def test_env_set_exactly_once_for_a_multi_device_claim() -> None:
    spec = cdi_spec_for(make_plan(*range(8), lnc=1, mode=4), TRN2U)
    assert all("env" not in d["containerEdits"] for d in spec["devices"])
    env_of(spec)  # asserts no name appears twice


# --- UltraServer ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "x2v", "expected"),
    [
        (4, True, UltraServerMode.X4),
        (4, False, UltraServerMode.X4),
        (2, True, UltraServerMode.X2V),
        (2, False, UltraServerMode.X2H),
        (1, True, UltraServerMode.X1),
    ],
)
def test_runtime_mode_is_the_driver_enum(nodes: int, x2v: bool, expected: UltraServerMode) -> None:
    assert runtime_ultraserver_mode(nodes, supports_x2v=x2v) is expected


def test_ultraserver_env_4_nodes() -> None:
    env = env_of(cdi_spec_for(make_plan(node_device=True, mode=4), TRN2U))
    assert env == {
        "NEURON_RT_VISIBLE_CORES": "0-63",
        "NEURON_RT_ULTRASERVER_MODE": "1",
        "NEURON_RT_ULTRASERVER_SERVER_ID": "a1b2c3d4e5f60719",
        "NEURON_RT_ULTRASERVER_NODE_ID": "3",
    }


def test_ultraserver_env_2_nodes_prefers_vertical() -> None:
    env = claim_env(make_plan(node_device=True, mode=2), TRN2U)
    assert env["NEURON_RT_ULTRASERVER_MODE"] == "3"
    assert env["NEURON_RT_ULTRASERVER_SERVER_ID"] == "a1b2c3d4e5f60718"
    assert env["NEURON_RT_ULTRASERVER_NODE_ID"] == "1"
    horizontal_only = UltraServerInfo(
        modes=(UltraServerMode.X4, UltraServerMode.X2H, UltraServerMode.X1),
        server_id_2="b" * 16,
        node_id_2=0,
    )
    inv = make_inventory("trn2u.48xlarge", ultraserver=horizontal_only)
    assert claim_env(make_plan(node_device=True, mode=2), inv)["NEURON_RT_ULTRASERVER_MODE"] == "2"


def test_ultraserver_env_single_node_has_no_peers_to_name() -> None:
    env = claim_env(make_plan(node_device=True, mode=1), TRN2U)
    assert env["NEURON_RT_ULTRASERVER_MODE"] == "4"
    assert "NEURON_RT_ULTRASERVER_SERVER_ID" not in env
    assert "NEURON_RT_ULTRASERVER_NODE_ID" not in env


def test_ultraserver_env_without_election_is_an_internal_error() -> None:
    inv = make_inventory("trn2u.48xlarge", ultraserver=UltraServerInfo(modes=(UltraServerMode.X4,)))
    with pytest.raises(RuntimeError, match="no 4-node UltraServer id"):
        claim_env(make_plan(node_device=True, mode=4), inv)


def test_operator_topology_env() -> None:
    peers = UltraServerPeers(
        ultraserver_index=2, topology_size=4, node_index=3, leader_host="ip-10-0-0-7"
    )
    env = claim_env(make_plan(node_device=True, mode=4), TRN2U, topology=peers)
    assert env["NEURON_GLOBAL_TOPOID"] == "11"
    assert env["NEURON_GLOBAL_TOPOID0_HOST"] == "ip-10-0-0-7"
    # Without an UltraServerConfig the workload's unit size decides the mode.
    env = claim_env(make_plan(node_device=True), TRN2U, topology=peers)
    assert env["NEURON_RT_ULTRASERVER_MODE"] == "1"


def test_no_ultraserver_env_for_plain_claims() -> None:
    env = claim_env(make_plan(node_device=True), TRN2U)
    assert not any(k.startswith("NEURON_RT_ULTRASERVER") for k in env)


# --- spec files -------------------------------------------------------------------------------


def test_write_is_atomic_and_named_by_convention(tmp_path: Path) -> None:
    spec = cdi_spec_for(make_plan(0, 1, 2, 3), TRN2)
    path = write_cdi_spec(tmp_path / "cdi", spec, UID)
    assert path == tmp_path / "cdi" / f"k8s.neuron.aws.com-claim_{UID}.json"
    assert json.loads(path.read_text()) == spec
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert os.listdir(tmp_path / "cdi") == [path.name]  # no temporary files left behind

    newer = cdi_spec_for(make_plan(0, 1, 2, 3, lnc=1), TRN2)
    assert write_cdi_spec(tmp_path / "cdi", newer, UID) == path
    assert json.loads(path.read_text()) == newer
    assert os.listdir(tmp_path / "cdi") == [path.name]


def test_failed_write_keeps_old_spec_and_leaves_no_temp_file(tmp_path: Path) -> None:
    spec = cdi_spec_for(make_plan(0), TRN2)
    path = write_cdi_spec(tmp_path, spec, UID)
    with pytest.raises(TypeError):
        write_cdi_spec(tmp_path, {"devices": [object()]}, UID)
    assert json.loads(path.read_text()) == spec
    assert os.listdir(tmp_path) == [path.name]


def test_remove_is_idempotent(tmp_path: Path) -> None:
    write_cdi_spec(tmp_path, cdi_spec_for(make_plan(0), TRN2), UID)
    remove_cdi_spec(tmp_path, UID)
    remove_cdi_spec(tmp_path, UID)
    remove_cdi_spec(tmp_path / "missing-dir", UID)
    assert os.listdir(tmp_path) == []


def test_list_specs_sees_only_ours(tmp_path: Path) -> None:
    write_cdi_spec(tmp_path, cdi_spec_for(make_plan(0), TRN2), UID)
    write_cdi_spec(tmp_path, cdi_spec_for(make_plan(1, uid=DIGIT_UID), TRN2), DIGIT_UID)
    (tmp_path / "nvidia.com-gpu.json").write_text("{}")
    (tmp_path / f".k8s.neuron.aws.com-claim_{UID}.json.abc.tmp").write_text("")
    (tmp_path / "k8s.neuron.aws.com-claim_.json").write_text("{}")
    assert list_cdi_specs(tmp_path) == {UID, DIGIT_UID}
    assert list_cdi_specs(tmp_path / "missing") == set()
