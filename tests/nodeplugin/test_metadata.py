"""The per-claim device metadata file (KEP-5304): the document built from a plan (pure), the
CDI spec's mounts of it, the files on disk, and a claim's files as one (claimfiles.py)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from inventories import profile_inventory
from neuron_dra.common.profiles import UltraServerMode
from neuron_dra.common.ultraserver import UltraServerPeers
from neuron_dra.nodeplugin.discovery.model import (
    NodeInventory,
    UltraServerInfo,
)
from neuron_dra.nodeplugin.prepare import cdi, claimfiles
from neuron_dra.nodeplugin.prepare import checkpoint as ckpt
from neuron_dra.nodeplugin.prepare import metadata as md
from neuron_dra.nodeplugin.prepare.cdi import spec_file_name
from neuron_dra.nodeplugin.prepare.claimfiles import (
    ClaimContent,
    ClaimFiles,
    metadata_claims,
    metadata_files_exist,
    remove_metadata_files,
    write_metadata_files,
)
from neuron_dra.nodeplugin.prepare.claims import ClaimPlan
from neuron_dra.nodeplugin.prepare.node import PrepareNode
from neuron_dra.nodeplugin.publish.slices import build_resource_slices

NODE = "ip-10-0-0-1"
DRIVER = "neuron.aws.com"
UID = "5e1f2b9c-0d7a-4c3e-9f1b-2a6d8e4c7b10"
ROOT = "/var/lib/kubelet/plugins/neuron.aws.com/dra-device-metadata"
LEADER = "ip-10-0-9-9.us-west-2.compute.internal"
US_FULL = UltraServerInfo(
    modes=(UltraServerMode.X4, UltraServerMode.X2V, UltraServerMode.X1),
    server_id_2="a1b2c3d4e5f60718",
    server_id_4="a1b2c3d4e5f60719",
    node_id_2=1,
    node_id_4=3,
)
FULL_LABELS = {
    "topology.k8s.aws/capacity-block-id": "cr-0123456789abcdef0",
    "topology.k8s.aws/network-node-layer-1": "nn-1",
    "topology.k8s.aws/network-node-layer-2": "nn-2",
    "topology.k8s.aws/network-node-layer-3": "nn-3",
}


def inventory(
    instance_type: str,
    *,
    ultraserver: UltraServerInfo | None = None,
    efa: bool = False,
    pci: bool = False,
) -> NodeInventory:
    return profile_inventory(instance_type, NODE, ultraserver=ultraserver, efa=efa, pci=pci)


def published(inv: NodeInventory, **kw: Any) -> dict[str, Any]:
    """This node's devices as its ResourceSlice has them (what Prepare hands the builder)."""
    kw.setdefault("node_labels", {})
    slices = build_resource_slices(
        inv, node_name=NODE, node_uid="node-uid", dra_driver_version="0.1.0", generation=1, **kw
    )
    return {d["name"]: d["attributes"] for s in slices for d in s["spec"]["devices"]}


def plan(
    *devices: tuple[tuple[str, ...], str],
    indices: tuple[int, ...],
    lnc: int | None = None,
    mode: int | None = None,
    admin: bool = False,
    workload: str | None = None,
) -> ClaimPlan:
    return ClaimPlan(
        claim_uid=UID,
        namespace="ml",
        name="train-0-neurons-x7k2q",
        devices=devices,
        device_indices=indices,
        lnc=lnc,
        ultraserver_mode_nodes=mode,
        workload_id=workload,
        admin_access=admin,
    )


def one_request(*indices: int, request: str = "neurons", **kw: Any) -> ClaimPlan:
    return plan(*(((request,), f"neurondevice{i}") for i in indices), indices=indices, **kw)


def documents(p: ClaimPlan, inv: NodeInventory, **kw: Any) -> dict[str, dict[str, Any]]:
    """The plan's documents; by default, for a claim the pod calls ``neurons``."""
    kw.setdefault("topology", None)
    kw.setdefault("published", published(inv))
    kw.setdefault("pod_claim_name", "neurons")
    return md.documents(p, node=PrepareNode(inv), driver=DRIVER, pool=NODE, **kw)


def cdi_spec_for(p: ClaimPlan, inv: NodeInventory) -> dict[str, Any]:
    return cdi.cdi_spec_for(p, PrepareNode(inv))


def claim_env(p: ClaimPlan, inv: NodeInventory, **kw: Any) -> dict[str, str]:
    return cdi.claim_env(p, PrepareNode(inv), **kw)


def build(p: ClaimPlan, inv: NodeInventory, **kw: Any) -> ClaimContent:
    return claimfiles.build(p, PrepareNode(inv), **kw)


def devices_of(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (request,) = doc["requests"]
    return {d["name"]: d for d in request["devices"]}


def values(attributes: dict[str, Any]) -> dict[str, Any]:
    """Attribute name -> its one value (``{"int": 3}`` -> 3)."""
    out = {}
    for name, value in attributes.items():
        ((_, v),) = value.items()
        out[name] = v
    return out


TRN2 = inventory("trn2.48xlarge")
TRN2U = inventory("trn2u.48xlarge", ultraserver=US_FULL)


# --- the document ----------------------------------------------------------------------------


def test_document_of_a_template_claim_exact() -> None:
    docs = documents(one_request(4, 5, lnc=1), TRN2)
    assert list(docs) == ["neurons"]
    doc = docs["neurons"]
    assert doc["metadata"] == {
        "name": "train-0-neurons-x7k2q",
        "namespace": "ml",
        "uid": UID,
        "generation": 1,
    }
    assert doc["podClaimName"] == "neurons"
    assert doc["requests"][0]["name"] == "neurons"
    dev4 = devices_of(doc)["neurondevice4"]
    assert (dev4["driver"], dev4["pool"], dev4["name"]) == (DRIVER, NODE, "neurondevice4")
    assert values(dev4["attributes"]) == {
        # The slice's, qualified, without `healthy`...
        "neuron.aws.com/deviceId": 4,
        "neuron.aws.com/resourceType": "neuron_device",
        "neuron.aws.com/instanceType": "trn2.48xlarge",
        "neuron.aws.com/neuronDriverVersion": "2.24.7.0",
        "neuron.aws.com/draDriverVersion": "0.1.0",
        "neuron.aws.com/coreCount": 8,
        "neuron.aws.com/topology_x": 1,
        "neuron.aws.com/topology_y": 0,
        "neuron.aws.com/topology4_id": 1,
        "neuron.aws.com/topology8_id": 0,
        "resource.aws.com/devicegroup4_id": published(TRN2)["neurondevice4"][
            "resource.aws.com/devicegroup4_id"
        ]["string"],
        "resource.aws.com/devicegroup8_id": published(TRN2)["neurondevice4"][
            "resource.aws.com/devicegroup8_id"
        ]["string"],
        "resource.aws.com/devicegroup16_id": published(TRN2)["neurondevice4"][
            "resource.aws.com/devicegroup16_id"
        ]["string"],
        # ...and what the container was prepared with: LNC 1, so 8 logical cores per device
        # (the slice says 4, at the node's default LNC 2), device 4 has cores 32-39.
        "neuron.aws.com/logicalNeuronCore": 1,
        "neuron.aws.com/logicalCoreCount": 8,
        "neuron.aws.com/visibleCores": "32-39",
    }
    assert list(dev4["attributes"]) == sorted(dev4["attributes"])
    assert values(devices_of(doc)["neurondevice5"]["attributes"])[
        "neuron.aws.com/visibleCores"
    ] == ("40-47")


def test_cores_in_the_file_are_the_environments() -> None:
    p = one_request(4, 5, 6, 7)  # the node's default LNC (2 on trn2)
    cores = [
        values(d["attributes"])["neuron.aws.com/visibleCores"]
        for d in devices_of(documents(p, TRN2)["neurons"]).values()
    ]
    assert cores == ["16-19", "20-23", "24-27", "28-31"]
    assert claim_env(p, TRN2)["NEURON_RT_VISIBLE_CORES"] == "16-31"
    assert values(devices_of(documents(p, TRN2)["neurons"])["neurondevice4"]["attributes"])[
        "neuron.aws.com/logicalNeuronCore"
    ] == (2)


@pytest.mark.parametrize(
    ("mode", "server", "node_id", "runtime_mode"),
    [(4, "a1b2c3d4e5f60719", 3, 1), (2, "a1b2c3d4e5f60718", 1, 3)],
)
def test_ultraserver_rank_card_agrees_with_the_environment(
    mode: int, server: str, node_id: int, runtime_mode: int
) -> None:
    p = plan(
        (("neurons",), "neuronnode"),
        indices=tuple(range(16)),
        mode=mode,
        workload="train-7f3a",
    )
    peers = UltraServerPeers(
        ultraserver_index=1, topology_size=mode, node_index=node_id, leader_host=LEADER
    )
    pub = published(TRN2U, workload_ids={"node": "train-7f3a"})
    attrs = values(
        devices_of(documents(p, TRN2U, topology=peers, published=pub)["neurons"])["neuronnode"][
            "attributes"
        ]
    )
    env = claim_env(p, TRN2U, topology=peers)
    card = {k: v for k, v in attrs.items() if k.split("/")[1] not in pub["neuronnode"]}
    assert card == {
        "neuron.aws.com/logicalNeuronCore": 2,
        "neuron.aws.com/visibleCores": env["NEURON_RT_VISIBLE_CORES"],
        "neuron.aws.com/ultraserverNodeCount": mode,
        "neuron.aws.com/ultraserverRuntimeMode": int(env["NEURON_RT_ULTRASERVER_MODE"]),
        "neuron.aws.com/ultraserverServerId": env["NEURON_RT_ULTRASERVER_SERVER_ID"],
        "neuron.aws.com/ultraserverServerNodeId": int(env["NEURON_RT_ULTRASERVER_NODE_ID"]),
        "neuron.aws.com/globalTopologyId": int(env["NEURON_GLOBAL_TOPOID"]),
        "neuron.aws.com/globalTopologyId0Host": env["NEURON_GLOBAL_TOPOID0_HOST"],
    }
    # 4 nodes: the 4-node server id and mode 1; 2 nodes: the pair's id and X2V (3).
    assert card["neuron.aws.com/ultraserverServerId"] == server
    assert card["neuron.aws.com/ultraserverRuntimeMode"] == runtime_mode
    assert card["neuron.aws.com/globalTopologyId"] == mode + node_id
    # The whole node: the slice's node-device attributes, the workload's tag among them.
    assert attrs["neuron.aws.com/workloadId"] == "train-7f3a"
    assert attrs["neuron.aws.com/resourceType"] == "neuron_node"


def test_a_leader_name_too_long_for_an_attribute_is_left_out() -> None:
    p = plan((("n",), "neuronnode"), indices=tuple(range(16)), mode=4, workload="w")
    peers = UltraServerPeers(1, 4, 3, "h" * 65)
    attrs = devices_of(documents(p, TRN2U, topology=peers)["n"])["neuronnode"]["attributes"]
    assert "neuron.aws.com/globalTopologyId0Host" not in attrs
    assert attrs["neuron.aws.com/globalTopologyId"] == {"int": 7}


def test_admin_access_gets_the_slice_attributes_only() -> None:
    p = one_request(0, 1, admin=True)
    attrs = devices_of(documents(p, TRN2)["neurons"])["neurondevice0"]["attributes"]
    expected = published(TRN2)["neurondevice0"]
    assert {k.split("/", 1)[1] if k.startswith(DRIVER) else k for k in attrs} == set(expected) - {
        "healthy"
    }
    assert attrs["neuron.aws.com/logicalCoreCount"] == expected["logicalCoreCount"]


def test_one_file_per_request_named_by_its_base_request() -> None:
    p = plan(
        (("big/trn2",), "neurondevice0"),
        (("big/trn2",), "neurondevice1"),
        (("small",), "neurondevice2"),
        indices=(0, 1, 2),
    )
    docs = documents(p, TRN2)
    assert sorted(docs) == ["big", "small"]
    # The subrequest that was allocated, as in the claim's results.
    assert docs["big"]["requests"][0]["name"] == "big/trn2"
    assert list(devices_of(docs["big"])) == ["neurondevice0", "neurondevice1"]
    assert list(devices_of(docs["small"])) == ["neurondevice2"]


def test_pod_claim_name_from_the_annotation() -> None:
    annotated = {"metadata": {"annotations": {"resource.kubernetes.io/pod-claim-name": "acc"}}}
    assert md.pod_claim_name(annotated) == "acc"
    assert md.pod_claim_name({"metadata": {"name": "named"}}) is None


def test_a_claim_named_in_the_pod_has_no_pod_claim_name() -> None:
    doc = documents(one_request(0), TRN2, pod_claim_name=None)["neurons"]
    assert "podClaimName" not in doc


def test_container_paths_follow_the_upstream_layout() -> None:
    base = "/var/run/kubernetes.io/dra-device-attributes"
    path = md.container_path(one_request(0), "neurons", driver=DRIVER, pod_claim_name="neurons")
    assert path == (f"{base}/resourceclaimtemplates/neurons/neurons/neuron.aws.com-metadata.json")
    assert md.container_path(one_request(0), "r", driver=DRIVER, pod_claim_name=None) == (
        f"{base}/resourceclaims/train-0-neurons-x7k2q/r/neuron.aws.com-metadata.json"
    )
    assert md.host_path(ROOT, UID, "r") == f"{ROOT}/{UID}_r.json"
    assert md.claim_of_host_file(f"{UID}_r.json") == UID
    assert md.claim_of_host_file(f".{UID}_r.json.0123456789.tmp") is None


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b"])
def test_names_that_would_escape_the_directory_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="cannot name a metadata file"):
        md.host_path(ROOT, bad, "r")
    with pytest.raises(ValueError, match="cannot name a metadata file"):
        md.container_path(one_request(0), bad, driver=DRIVER, pod_claim_name=None)
    with pytest.raises(ValueError, match="cannot name a metadata file"):
        md.container_path(one_request(0), "r", driver=DRIVER, pod_claim_name=bad or "a/b")
    with pytest.raises(ValueError, match="cannot name a metadata file"):
        md.host_path(ROOT, "a_b", "r")  # the uid's separator from the request


# --- the 32-attribute limit ------------------------------------------------------------------


def test_the_fullest_device_fits_the_format() -> None:
    inv = inventory("trn2u.48xlarge", ultraserver=US_FULL, efa=True, pci=True)
    pub = published(inv, node_labels=FULL_LABELS, workload_ids={"node": "w"})
    p = one_request(0, mode=4, workload="w")
    peers = UltraServerPeers(0, 4, 3, LEADER)
    attrs = devices_of(documents(p, inv, topology=peers, published=pub)["neurons"])
    names = set(attrs["neurondevice0"]["attributes"])
    assert len(names) == md.MAX_ATTRIBUTES
    # Pinned so that an attribute more, in the slice or the file, is a deliberate decision
    # about the 32 budget: the slice's 27 (minus healthy) and the 8 of the file are 34, so
    # the two of least use in a container make room.
    assert len(pub["neurondevice0"]) - 1 + 8 == 34
    slice_names = {k if "/" in k else f"{DRIVER}/{k}" for k in pub["neurondevice0"]}
    assert slice_names - names == {
        f"{DRIVER}/healthy",
        f"{DRIVER}/draDriverVersion",
        f"{DRIVER}/networkNodeLayer3",
    }
    assert "resource.kubernetes.io/pcieRoot" in names


def test_too_many_slice_attributes_make_room_least_useful_first() -> None:
    runtime = {f"{DRIVER}/r{i}": {"int": i} for i in range(10)}
    pub: dict[str, Any] = {f"z{i:02d}": {"int": i} for i in range(20)}
    pub |= {"draDriverVersion": {"version": "0.1.0"}, "networkNodeLayer3": {"string": "x"}}
    pub |= {"healthy": {"bool": True}, "deviceId": {"int": 1}}
    fitted = md.fit_attributes(pub, runtime, driver=DRIVER)
    assert len(fitted) == 32
    dropped = {f"{DRIVER}/{k}" for k in pub} - set(fitted)
    # 23 slice attributes (healthy left out), room for 22: the driver version goes first.
    assert dropped == {f"{DRIVER}/healthy", f"{DRIVER}/draDriverVersion"}
    pub |= {f"y{i}": {"int": i} for i in range(3)}
    dropped = {f"{DRIVER}/{k}" for k in pub} - set(md.fit_attributes(pub, runtime, driver=DRIVER))
    # Then the rest of _DROP_FIRST, then the last names.
    assert dropped == {
        f"{DRIVER}/{k}" for k in ("healthy", "draDriverVersion", "networkNodeLayer3", "z19", "z18")
    }


def test_a_runtime_attribute_wins_over_the_slices() -> None:
    fitted = md.fit_attributes(
        {"logicalCoreCount": {"int": 4}}, {f"{DRIVER}/logicalCoreCount": {"int": 8}}, driver=DRIVER
    )
    assert fitted == {f"{DRIVER}/logicalCoreCount": {"int": 8}}


# --- the stream ------------------------------------------------------------------------------


def test_stream_holds_the_object_once_per_version_newest_first() -> None:
    doc = documents(one_request(0), TRN2)["neurons"]
    raw = md.encode(doc).decode()
    objects = md.decode(raw)
    assert [o["apiVersion"] for o in objects] == [
        "metadata.resource.k8s.io/v1beta1",
        "metadata.resource.k8s.io/v1alpha1",
    ]
    for obj in objects:
        # The helper's field order: kind and apiVersion first.
        assert list(obj)[:2] == ["kind", "apiVersion"]
        assert obj["kind"] == "DeviceMetadata"
        assert {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")} == doc
    # One object a line (compact), each closed by a newline.
    assert [json.loads(line) for line in raw.splitlines()] == objects
    assert raw.endswith("}\n")
    assert md.decode("") == []


# --- the CDI spec's mounts -------------------------------------------------------------------


def test_each_request_is_mounted_on_its_first_device_only() -> None:
    p = plan(
        (("a",), "neurondevice0"),
        (("a",), "neurondevice1"),
        (("b/x",), "neurondevice2"),
        indices=(0, 1, 2),
    )
    spec = cdi_spec_for(p, TRN2)
    before = json.dumps(spec, sort_keys=True)
    mounted = md.with_mounts(spec, p, ["a", "b"], root=ROOT, driver=DRIVER, pod_claim_name=None)
    assert json.dumps(spec, sort_keys=True) == before  # the input is left alone
    mounts = [d["containerEdits"].get("mounts") for d in mounted["devices"]]
    base = "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/train-0-neurons-x7k2q"
    assert mounts == [
        [
            {
                "hostPath": f"{ROOT}/{UID}_a.json",
                "containerPath": f"{base}/a/neuron.aws.com-metadata.json",
                "options": ["ro", "bind"],
            }
        ],
        None,
        [
            {
                "hostPath": f"{ROOT}/{UID}_b.json",
                "containerPath": f"{base}/b/neuron.aws.com-metadata.json",
                "options": ["ro", "bind"],
            }
        ],
    ]
    # Device nodes and environment as before; mounts without a type need no newer CDI.
    assert [d["containerEdits"]["deviceNodes"] for d in mounted["devices"]] == [
        d["containerEdits"]["deviceNodes"] for d in spec["devices"]
    ]
    assert mounted["containerEdits"] == spec["containerEdits"]
    assert mounted["cdiVersion"] == spec["cdiVersion"] == "0.5.0"  # the uid starts with a digit


def test_build_without_device_metadata_is_the_plain_spec() -> None:
    p = one_request(0)
    kw: dict[str, Any] = {
        "cdi_kind": "k8s.neuron.aws.com/claim",
        "topology": None,
        "env_indices": None,
        "driver": DRIVER,
        "pool": NODE,
        "metadata_root": Path(ROOT),
        "pod_claim_name": "neurons",
    }
    assert build(p, TRN2, published=None, **kw) == ClaimContent(cdi_spec_for(p, TRN2), {})
    content = build(p, TRN2, published=published(TRN2), **kw)
    assert set(content.metadata) == {"neurons"}
    assert content.spec["devices"][0]["containerEdits"]["mounts"][0]["hostPath"] == (
        f"{ROOT}/{UID}_neurons.json"
    )


# --- files -----------------------------------------------------------------------------------


def entry_with_metadata(p: ClaimPlan, root: Path) -> ckpt.ClaimEntry:
    content = build(
        p,
        TRN2,
        cdi_kind="k8s.neuron.aws.com/claim",
        topology=None,
        env_indices=None,
        published=published(TRN2),
        driver=DRIVER,
        pool=NODE,
        metadata_root=root,
    )
    return ckpt.ClaimEntry(
        uid=p.claim_uid,
        namespace=p.namespace,
        name=p.name,
        devices=(),
        device_indices=p.device_indices,
        cdi_spec=content.spec,
        prepared_at="2026-01-01T00:00:00Z",
        metadata=content.metadata,
    )


def test_claim_files_written_checked_listed_and_removed(tmp_path: Path) -> None:
    root = tmp_path / "plugins" / DRIVER / md.HOST_SUBDIR
    files = ClaimFiles(tmp_path / "cdi", cdi_kind="k8s.neuron.aws.com/claim", metadata_root=root)
    entry = entry_with_metadata(one_request(0), root)
    assert not files.complete(entry)
    files.write(entry)
    assert files.complete(entry)
    assert files.present() == {UID}
    path = root / f"{UID}_neurons.json"
    assert md.decode(path.read_text())[0]["requests"][0]["devices"][0]["name"] == "neurondevice0"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # containers read it as any user
    # The spec mounts exactly that file.
    spec = json.loads((tmp_path / "cdi" / spec_file_name(UID)).read_text())
    assert spec["devices"][0]["containerEdits"]["mounts"][0]["hostPath"] == str(path)
    path.unlink()
    assert not files.complete(entry)
    files.remove(UID)
    files.remove(UID)  # idempotent
    assert files.present() == set()
    assert os.listdir(root) == []


def test_metadata_is_written_before_the_spec(tmp_path: Path) -> None:
    root = tmp_path / "meta"
    root.write_text("not a directory")  # the metadata write fails
    files = ClaimFiles(tmp_path / "cdi", cdi_kind="k8s.neuron.aws.com/claim", metadata_root=root)
    with pytest.raises(OSError):
        files.write(entry_with_metadata(one_request(0), root))
    assert not (tmp_path / "cdi" / spec_file_name(UID)).exists()


def test_list_remove_and_sweep_leftovers(tmp_path: Path) -> None:
    root = tmp_path / "meta"
    files = ClaimFiles(tmp_path / "cdi", cdi_kind="k8s.neuron.aws.com/claim", metadata_root=root)
    assert metadata_claims(root) == set()
    remove_metadata_files(root, UID)  # no directory yet: nothing to do
    write_metadata_files(root, UID, {"r": {"metadata": {}}, "s": {"metadata": {}}})
    write_metadata_files(root, "other", {"r": {"metadata": {}}})
    leftover = root / f".{UID}_r.json.0123456789.tmp"
    leftover.write_text("{")
    (root / "stray-file").write_text("")
    assert metadata_claims(root) == {UID, "other"} == files.present()
    files.sweep_temp_files()
    assert sorted(os.listdir(root)) == sorted(
        [f"{UID}_r.json", f"{UID}_s.json", "other_r.json", "stray-file"]
    )
    assert metadata_files_exist(root, UID, ["r", "s"])
    assert not metadata_files_exist(root, UID, ["r", "t"])
    remove_metadata_files(root, UID)
    assert sorted(os.listdir(root)) == ["other_r.json", "stray-file"]


@pytest.mark.parametrize("doc", [{}, {"metadata": {"name": "c"}}, {"requests": [], "x": "ü"}])
def test_stream_bytes_are_each_object_encoded_whole(doc: dict[str, Any]) -> None:
    # encode() puts one encoding of the fields behind each version's head: the bytes must be
    # those of each object encoded on its own, empty documents included.
    whole = "".join(
        json.dumps({"kind": md.KIND, "apiVersion": v, **doc}, separators=(",", ":")) + "\n"
        for v in md.API_VERSIONS
    )
    assert md.encode(doc).decode() == whole
