"""``neuron-dra check-claim`` through the CLI entry, against emulated nodes, slice files and a
(fake) cluster, for every example template."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from inventories import profile_inventory
from neuron_dra.common.deviceclasses import (
    NEURON_CLASS_EXPRESSION,
    ULTRASERVER_CLASS_EXPRESSION,
    default_device_classes,
)
from neuron_dra.common.profiles import PROFILES, UltraServerMode
from neuron_dra.nodeplugin.discovery.model import (
    NodeInventory,
    UltraServerInfo,
)
from neuron_dra.nodeplugin.prepare.claims import ClaimError, plan_claim
from neuron_dra.nodeplugin.prepare.node import PrepareNode
from neuron_dra.nodeplugin.publish.slices import build_resource_slices
from neuron_dra.sim.allocation import AllocatedDevice, AllocationResult
from neuron_dra.sim.cli import main
from neuron_dra.sim.commands.check_claim.allocation import count_hint
from neuron_dra.sim.commands.check_claim.nodes import split_by_node
from neuron_dra.sim.commands.check_claim.prepare import node_facts, prepare_problems
from neuron_dra.sim.commands.check_claim.sources import from_emulation
from neuron_dra.sim.fakeapi.server import FakeAPIServer
from neuron_dra.sim.fakeapi.validation.builtin import validate_builtin
from neuron_dra.sim.paths import repo_root

SPECS = repo_root() / "examples" / "specs"
EXAMPLES = [
    "connected-4-devices.yaml",
    "all-devices-xl.yaml",
    "half-node-l.yaml",
    "driver-version.yaml",
    "lnc1.yaml",
    "ultraserver-4-node.yaml",
    "invalid-trn1-7-devices.yaml",
]
TRN2_SELECTOR = "device.attributes['neuron.aws.com'].instanceType == 'trn2.48xlarge'"
TRN1_HINT = "trn1.32xlarge: 7 devices are not a connected set (valid: 1, 4, 8, 16)"
TRN1_7_ERROR = (
    "Instance type trn1.32xlarge does not support requests for device: 7. "
    "Please request a different number of devices."
)


@pytest.fixture(autouse=True)
def _emulate_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    # --emulate writes a sysfs tree per node to a temporary directory; on tmpfs that is
    # several times faster than on the test machines' disks.
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        monkeypatch.setattr(tempfile, "tempdir", str(shm))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["check-claim", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def emulate(*types: str) -> list[str]:
    return [arg for t in types for arg in ("--emulate", t)]


def spec(name: str) -> str:
    return str(SPECS / name)


def write_yaml(path: Path, *docs: Any) -> str:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return str(path)


def devices(line_start: str, out: str) -> list[str]:
    line = next(ln for ln in out.splitlines() if ln.strip().startswith(line_start))
    return line.split(":", 1)[1].strip().split(", ")


def dev_names(*ids: int) -> list[str]:
    return [f"neurondevice{i}" for i in ids]


# --- the example files ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_is_a_valid_v1_template(name: str) -> None:
    docs = list(yaml.safe_load_all((SPECS / name).read_text()))
    assert len(docs) == 1
    obj = docs[0]
    assert obj["apiVersion"] == "resource.k8s.io/v1"
    assert obj["kind"] == "ResourceClaimTemplate"
    assert validate_builtin("resource.k8s.io", "resourceclaimtemplates", obj, None) == []


# (file, emulated type, exit code, devices of request "neurons" or None, text expected)
CASES = [
    ("connected-4-devices.yaml", "trn2.48xlarge", 0, dev_names(0, 1, 2, 3), "fits on 1 of 1"),
    ("connected-4-devices.yaml", "trn1.32xlarge", 1, None, f"selector `{TRN2_SELECTOR}` matches"),
    ("connected-4-devices.yaml", "inf2.48xlarge", 1, None, "matches none of the 12 devices"),
    ("all-devices-xl.yaml", "trn2.48xlarge", 0, dev_names(*range(16)), "fits on 1 of 1"),
    ("all-devices-xl.yaml", "inf2.48xlarge", 1, None, "matches none of the 12 devices"),
    ("half-node-l.yaml", "trn2.48xlarge", 0, dev_names(*range(8)), "fits on 1 of 1"),
    ("half-node-l.yaml", "trn1.32xlarge", 1, None, "matches none of the 16 devices"),
    ("driver-version.yaml", "trn2.48xlarge", 0, dev_names(*range(8)), "fits on 1 of 1"),
    ("driver-version.yaml", "inf2.48xlarge", 1, None, "matches none of the 12 devices"),
    (
        "lnc1.yaml",
        "trn2.48xlarge",
        0,
        dev_names(*range(16)),
        "config from claim for requests neurons: NeuronConfig logicalNeuronCore: 1",
    ),
    ("lnc1.yaml", "trn1.32xlarge", 1, None, "matches none of the 16 devices"),
    (
        "ultraserver-4-node.yaml",
        "trn2u.48xlarge",
        0,
        ["neuronnode"],
        "config from claim for requests neurons: UltraServerConfig ultraserverMode: 4",
    ),
    (
        "ultraserver-4-node.yaml",
        "trn2.48xlarge",
        1,
        None,
        "resourceType == 'neuron_node'` matches none of the 16 devices",
    ),
    ("invalid-trn1-7-devices.yaml", "trn1.32xlarge", 1, None, TRN1_HINT),
    ("invalid-trn1-7-devices.yaml", "inf2.48xlarge", 1, None, "matches none of the 12 devices"),
]


@pytest.mark.parametrize(("name", "instance_type", "code", "want", "text"), CASES)
def test_example_against_an_emulated_node(
    capsys: pytest.CaptureFixture[str],
    name: str,
    instance_type: str,
    code: int,
    want: list[str] | None,
    text: str,
) -> None:
    got, out, err = run(capsys, "-f", spec(name), *emulate(instance_type))
    assert (got, err) == (code, ""), out
    assert text in out
    if want is not None:
        assert f"  node {instance_type}:" in out
        assert devices("request neurons:", out) == want
    else:
        assert "does not fit on any of 1 nodes" in out


def test_trn1_seven_devices_explains_the_connected_set(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "-f", spec("invalid-trn1-7-devices.yaml"), *emulate("trn1.32xlarge"))
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == "ResourceClaimTemplate trn1-7-devices: does not fit on any of 1 nodes"
    assert lines[1].startswith("  node trn1.32xlarge: the scheduler would allocate neurondevice0")
    assert lines[1].endswith(f"the kubelet plugin would refuse to prepare them: {TRN1_7_ERROR}")
    assert lines[2] == f"  {TRN1_HINT}"


def test_hint_only_for_nodes_the_selectors_accept(capsys: pytest.CaptureFixture[str]) -> None:
    # 7 is no connected set on trn2 either, but the selector rules trn2 out: no trn2 hint.
    code, out, _ = run(
        capsys,
        "-f",
        spec("invalid-trn1-7-devices.yaml"),
        *emulate("trn1.32xlarge", "trn2.48xlarge", "inf2.48xlarge"),
    )
    assert code == 1
    assert "does not fit on any of 3 nodes" in out
    assert TRN1_HINT in out
    assert "trn2.48xlarge: 7 devices" not in out
    assert "inf2.48xlarge: 7" not in out


def test_several_nodes_choose_the_fitting_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "-f",
        spec("ultraserver-4-node.yaml"),
        *emulate("trn2.48xlarge", "trn2u.48xlarge", "trn2u.48xlarge", "trn1.32xlarge"),
    )
    assert code == 0
    assert "fits on 2 of 4 nodes" in out
    assert "  node trn2u.48xlarge-0 (trn2u.48xlarge):" in out
    assert "  also fits on: trn2u.48xlarge-1" in out
    assert "not on nodes trn1.32xlarge, trn2.48xlarge: request neurons: selector" in out


def test_inf2_ring_counts_fit_and_other_drivers_configs_show(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "three", "namespace": "ml"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "neurons",
                            "exactly": {"deviceClassName": "neuron.aws.com", "count": 3},
                        }
                    ],
                    "config": [{"opaque": {"driver": "efa.example.com", "parameters": {"x": 1}}}],
                }
            }
        },
    }
    path = write_yaml(tmp_path / "three.yaml", template)
    code, out, _ = run(capsys, "-f", path, *emulate("inf2.48xlarge"))
    assert code == 0, out
    assert out.splitlines()[0] == "ResourceClaimTemplate ml/three: fits on 1 of 1 nodes"
    assert devices("request neurons:", out) == dev_names(0, 1, 2)
    assert 'config from claim for all requests: driver efa.example.com: {"x": 1}' in out
    # On trn1 three devices are refused, with the hint.
    code, out, _ = run(capsys, "-f", path, *emulate("trn1.32xlarge"))
    assert code == 1
    assert "trn1.32xlarge: 3 devices are not a connected set (valid: 1, 4, 8, 16)" in out


def test_seed_v1beta1_template_with_pods_and_config_checks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    beta = {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "1x4-connected-neurons"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "neurons",
                            "deviceClassName": "neuron.aws.com",
                            "allocationMode": "ExactCount",
                            "count": 4,
                            "selectors": [{"cel": {"expression": TRN2_SELECTOR}}],
                        }
                    ],
                    "constraints": [
                        {
                            "requests": ["neurons"],
                            "matchAttribute": "resource.aws.com/devicegroup4_id",
                        }
                    ],
                }
            }
        },
    }
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pod0"}, "spec": {}}
    typo = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "typo", "namespace": "ns"},
        "spec": {
            "devices": {
                "requests": [{"name": "n", "exactly": {"deviceClassName": "neuron.aws.com"}}],
                "config": [
                    {
                        "opaque": {
                            "driver": "neuron.aws.com",
                            "parameters": {
                                "apiVersion": "neuron.aws.com/v1",
                                "kind": "NeuronConfig",
                                "logicalNeuronCores": 1,
                            },
                        }
                    }
                ],
            }
        },
    }
    path = write_yaml(tmp_path / "seed.yaml", beta, pod, typo)
    code, out, _ = run(capsys, "-f", path, *emulate("trn2.48xlarge"))
    assert code == 1
    assert "ResourceClaimTemplate 1x4-connected-neurons: fits on 1 of 1 nodes" in out
    assert devices("request neurons:", out) == dev_names(0, 1, 2, 3)
    assert "ResourceClaim ns/typo: does not fit" in out
    # Prepare's own words (the agreement tests below pin them).
    assert (
        "refuse to prepare them: invalid claim config #0 for driver neuron.aws.com: "
        'unknown field "logicalNeuronCores" in NeuronConfig'
    ) in out


def test_claim_errors_and_api_validation(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def claim(name: str, body: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "n", "exactly": body}]}},
        }

    path = write_yaml(
        tmp_path / "c.yaml",
        claim("zero", {"deviceClassName": "neuron.aws.com", "count": 0}),
        claim("nocls", {"deviceClassName": "nope.example.com"}),
    )
    code, out, _ = run(capsys, "-f", path, *emulate("trn2.48xlarge"))
    assert code == 1
    assert out.splitlines() == [
        "ResourceClaim ns/zero: cannot be allocated: the API server would reject it: "
        "spec.devices.requests[0].exactly.count: Invalid value: 0: must be greater than zero",
        "ResourceClaim ns/nocls: cannot be allocated: request n: device class "
        "nope.example.com not found",
    ]


def test_device_class_in_the_file_is_used(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cls = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "trn2-only"},
        "spec": {"selectors": [{"cel": {"expression": TRN2_SELECTOR}}]},
    }
    rct = yaml.safe_load((SPECS / "half-node-l.yaml").read_text())
    request = rct["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    request["deviceClassName"] = "trn2-only"
    del request["selectors"]
    path = write_yaml(tmp_path / "c.yaml", cls, rct)
    code, out, _ = run(capsys, "-f", path, *emulate("trn1.32xlarge", "trn2.48xlarge"))
    assert code == 0, out
    assert "node trn2.48xlarge:" in out
    assert "not on node trn1.32xlarge: request neurons: none of the 16 devices matches" in out


# --- json ----------------------------------------------------------------------------------------


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "-f",
        spec("connected-4-devices.yaml"),
        "-f",
        spec("invalid-trn1-7-devices.yaml"),
        *emulate("trn2.48xlarge", "trn1.32xlarge"),
        "-o",
        "json",
    )
    assert code == 1
    body = json.loads(out)
    assert body["fits"] is False
    ok, bad = body["claims"]
    assert (ok["name"], ok["fits"], ok["node"]) == ("1x4-connected-neurons", True, "trn2.48xlarge")
    chosen = next(n for n in ok["nodes"] if n["node"] == "trn2.48xlarge")
    assert [d["device"] for d in chosen["devices"]] == dev_names(0, 1, 2, 3)
    assert chosen["allocation"]["devices"]["results"][0]["pool"] == "trn2.48xlarge"
    assert (bad["name"], bad["fits"], bad["node"]) == ("trn1-7-devices", False, None)
    assert bad["hints"] == [TRN1_HINT]
    trn1 = next(n for n in bad["nodes"] if n["node"] == "trn1.32xlarge")
    assert trn1["fits"] is False and len(trn1["devices"]) == 7
    assert TRN1_7_ERROR in trn1["reasons"][0]


# --- bad input -----------------------------------------------------------------------------------


def test_bad_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: [\n")
    text = tmp_path / "text.yaml"
    text.write_text("hello\n")
    cases = [
        (["-f", str(tmp_path / "missing.yaml")], "missing.yaml: file not found"),
        (["-f", str(broken)], "not valid YAML: line 2, column 1"),
        (["-f", str(text)], "document 1 is not a Kubernetes object (a string)"),
        (
            ["-f", spec("ultraserver-workload.yaml")],
            "no ResourceClaimTemplate or ResourceClaim in it (found: NeuronUltraServerWorkload)",
        ),
    ]
    for argv, message in cases:
        code, out, err = run(capsys, *argv, *emulate("trn2.48xlarge"))
        assert (code, out) == (2, ""), argv
        assert err.startswith("error: ") and message in err, err
    code, _, err = run(capsys, "-f", spec("lnc1.yaml"), *emulate("trn9.huge"))
    assert code == 2 and "--emulate trn9.huge: unknown instance type" in err
    code, _, err = run(capsys, "-f", spec("lnc1.yaml"), "--slices", str(broken))
    assert code == 2 and "--slices" in err and "not valid YAML" in err
    code, _, err = run(capsys, "-f", spec("lnc1.yaml"), "--slices", spec("lnc1.yaml"))
    assert code == 2 and "no ResourceSlice in it" in err
    code, _, err = run(capsys, "-f", spec("lnc1.yaml"), "--kubeconfig", str(tmp_path / "nope"))
    assert code == 2 and "file not found" in err
    with pytest.raises(SystemExit) as exc:
        main(["check-claim", "-f", spec("lnc1.yaml")])  # no source of devices
    assert exc.value.code == 2


# --- --slices ------------------------------------------------------------------------------------


def allocated_claim(node: str, *device_ids: int) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "busy", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "n",
                        "exactly": {"deviceClassName": "neuron.aws.com", "count": len(device_ids)},
                    }
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "n",
                            "driver": "neuron.aws.com",
                            "pool": node,
                            "device": f"neurondevice{i}",
                        }
                        for i in device_ids
                    ]
                }
            }
        },
    }


def test_slices_file_with_devices_in_use(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    slices = from_emulation(["trn2.48xlarge"]).slices
    as_list = {"apiVersion": "v1", "kind": "List", "items": slices}
    path = tmp_path / "slices.json"
    path.write_text(json.dumps(as_list))
    code, out, _ = run(capsys, "-f", spec("connected-4-devices.yaml"), "--slices", str(path))
    assert code == 0
    assert devices("request neurons:", out) == dev_names(0, 1, 2, 3)
    # With devices 1 and 6 in use, the first free row is devices 8-11.
    busy = write_yaml(tmp_path / "busy.yaml", *slices, allocated_claim("trn2.48xlarge", 1, 6))
    code, out, _ = run(capsys, "-f", spec("connected-4-devices.yaml"), "--slices", busy)
    assert code == 0
    assert devices("request neurons:", out) == dev_names(8, 9, 10, 11)
    code, out, _ = run(capsys, "-f", spec("all-devices-xl.yaml"), "--slices", busy)
    assert code == 1
    assert "needs 16 devices, 16 match, but only 14 are free (2 in use)" in out


# --- --kubeconfig --------------------------------------------------------------------------------


async def test_kubeconfig_against_a_cluster(
    fake_apiserver: FakeAPIServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for cls in default_device_classes():
        fake_apiserver.create(cls)
    for s in from_emulation(["trn2.48xlarge", "trn1.32xlarge"]).slices:
        s = copy.deepcopy(s)
        del s["metadata"]["ownerReferences"]  # no Node objects here
        fake_apiserver.create(s)
    claim = allocated_claim("trn2.48xlarge", 0, 1, 2, 3, 4)
    status = claim.pop("status")
    created = fake_apiserver.create(claim)
    fake_apiserver.update({**created, "status": status}, subresource="status")
    kubeconfig = tmp_path / "kubeconfig"
    fake_apiserver.write_kubeconfig(kubeconfig)

    def check(name: str) -> tuple[int, str, str]:
        return run(capsys, "-f", spec(name), "--kubeconfig", str(kubeconfig))

    code, out, _ = await asyncio.to_thread(check, "half-node-l.yaml")
    assert code == 0, out
    assert devices("request neurons:", out) == dev_names(*range(8, 16))
    code, out, _ = await asyncio.to_thread(check, "all-devices-xl.yaml")
    assert code == 1
    assert "only 11 are free (5 in use)" in out
    code, out, _ = await asyncio.to_thread(check, "invalid-trn1-7-devices.yaml")
    assert code == 1
    assert TRN1_HINT in out and TRN1_7_ERROR in out


async def test_kubeconfig_without_device_classes(
    fake_apiserver: FakeAPIServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    fake_apiserver.write_kubeconfig(kubeconfig)
    code, out, _ = await asyncio.to_thread(
        run, capsys, "-f", spec("lnc1.yaml"), "--kubeconfig", str(kubeconfig)
    )
    assert code == 1
    assert "device class neuron.aws.com not found" in out


# --- the DeviceClasses ---------------------------------------------------------------------------


def test_default_device_classes() -> None:
    classes = {c["metadata"]["name"]: c for c in default_device_classes()}
    assert sorted(classes) == [
        "extended-resource.neuron.aws.com",
        "neuron.aws.com",
        "ultraserver.neuron.aws.com",
    ]
    assert classes["extended-resource.neuron.aws.com"]["spec"]["extendedResourceName"] == (
        "aws.amazon.com/neuron"
    )
    assert NEURON_CLASS_EXPRESSION == (
        'device.driver == "neuron.aws.com" && '
        '!("workloadId" in device.attributes["neuron.aws.com"])'
    )
    assert ULTRASERVER_CLASS_EXPRESSION == (
        'device.driver == "neuron.aws.com" && "workloadId" in device.attributes["neuron.aws.com"]'
    )
    for cls in classes.values():
        assert validate_builtin("resource.k8s.io", "deviceclasses", cls, None) == []


# --- agreement with the kubelet plugin's Prepare -------------------------------------------------
#
# check-claim's verdict on an allocation must be what Prepare (plan_claim, over the node's
# discovered inventory) says about it: the same message, or success for both. The node's
# ResourceSlice is built from the inventory by the plugin's own slice builder, as on a cluster.

AGREE_NODE = "ip-10-0-0-1.ec2.internal"
AGREE_CLAIM = ("ml", "pod0-neurons-x7k2p")
WORKLOAD_LABEL = "neuron.aws.com/workload-id"
ELECTED = UltraServerInfo(
    modes=(UltraServerMode.X4, UltraServerMode.X2V, UltraServerMode.X1),
    server_id_2="a1b2c3d4e5f60718",
    server_id_4="a1b2c3d4e5f60719",
    node_id_2=1,
    node_id_4=3,
)


def inventory(instance_type: str, ultraserver: UltraServerInfo | None = None) -> NodeInventory:
    return profile_inventory(instance_type, AGREE_NODE, ultraserver=ultraserver, chip_name=False)


def neuron_config(lnc: Any, *, requests: list[str] | None = None, source: str = "FromClaim") -> Any:
    params = {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": lnc}
    entry = {"source": source, "opaque": {"driver": "neuron.aws.com", "parameters": params}}
    return {**entry, "requests": requests} if requests is not None else entry


def us_config(mode: Any) -> Any:
    params = {
        "apiVersion": "neuron.aws.com/v1",
        "kind": "UltraServerConfig",
        "ultraserverMode": mode,
    }
    return {"source": "FromClaim", "opaque": {"driver": "neuron.aws.com", "parameters": params}}


def verdicts(
    inv: NodeInventory,
    devices_by_request: dict[str, list[int | str]],
    config: list[Any] | None = None,
    *,
    labels: dict[str, str] | None = None,
    workload_ids: dict[int | str, str] | None = None,
) -> tuple[str | None, str | None]:
    """(Prepare's refusal, check-claim's), each None when it would prepare the allocation."""
    slices = build_resource_slices(
        inv,
        node_name=AGREE_NODE,
        node_uid="node-uid",
        node_labels={},
        dra_driver_version="0.1.0",
        workload_ids=workload_ids or {},
        generation=0,
    )
    allocated = [
        AllocatedDevice(
            request, "neuron.aws.com", AGREE_NODE, d if isinstance(d, str) else f"neurondevice{d}"
        )
        for request, ds in devices_by_request.items()
        for d in ds
    ]
    allocation = {
        "devices": {
            "results": [
                {"request": a.request, "driver": a.driver, "pool": a.pool, "device": a.device}
                for a in allocated
            ],
            "config": config or [],
        }
    }
    namespace, name = AGREE_CLAIM
    claim = {
        "metadata": {
            "uid": "claim-uid",
            "namespace": namespace,
            "name": name,
            "labels": labels or {},
        },
        "status": {"allocation": allocation},
    }
    published = {d["name"]: d["attributes"] for s in slices for d in s["spec"]["devices"]}
    try:
        plan_claim(claim, node=PrepareNode(inv), published=published)
        prepare = None
    except ClaimError as exc:
        prepare = exc.message.removeprefix(f"claim {namespace}/{name}: ")
    (node,) = split_by_node(slices)
    result = AllocationResult(AGREE_NODE, tuple(allocated), allocation)
    problems = prepare_problems(result, node, labels)
    assert len(problems) <= 1, problems
    return prepare, (problems[0] if problems else None)


def seed_refusal(instance_type: str, count: int) -> str:
    return (
        f"Instance type {instance_type} does not support requests for device: {count}. "
        "Please request a different number of devices."
    )


TRN1, TRN2, INF2 = "trn1.32xlarge", "trn2.48xlarge", "inf2.48xlarge"
# (case, instance type, devices per request, configs, Prepare's refusal (a part of it) or None)
AGREEMENT_CASES: list[tuple[str, str, dict[str, list[int | str]], list[Any], str | None]] = [
    ("trn1 one device", TRN1, {"n": [5]}, [], None),
    ("trn1 a row", TRN1, {"n": [4, 5, 6, 7]}, [], None),
    ("trn1 a half", TRN1, {"n": list(range(8, 16))}, [], None),
    ("trn1 all", TRN1, {"n": list(range(16))}, [], None),
    ("trn1 seven", TRN1, {"n": list(range(7))}, [], seed_refusal(TRN1, 7)),
    ("trn1 two", TRN1, {"n": [0, 1]}, [], seed_refusal(TRN1, 2)),
    ("trn1 four not a row", TRN1, {"n": [0, 1, 2, 4]}, [], "is not one connected group"),
    ("trn2 a row", TRN2, {"n": [12, 13, 14, 15]}, [], None),
    ("trn2 five", TRN2, {"n": [0, 1, 2, 3, 4]}, [], seed_refusal(TRN2, 5)),
    ("trn2 twelve", TRN2, {"n": list(range(12))}, [], seed_refusal(TRN2, 12)),
    ("trn2 two halves' rows", TRN2, {"n": [*range(4), *range(12, 16)]}, [], "not one connected"),
    ("inf2 three in a row", INF2, {"n": [3, 4, 5]}, [], None),
    ("inf2 seven in a row", INF2, {"n": list(range(2, 9))}, [], None),
    ("inf2 gappy", INF2, {"n": [0, 2, 3]}, [], "device set 0, 2, 3: it is not one connected"),
    ("inf2 wrapping the ring", INF2, {"n": [10, 11, 0, 1]}, [], "are not consecutive"),
    ("trn1 LNC 1", TRN1, {"n": [0]}, [neuron_config(1)], None),
    ("trn1 LNC 2", TRN1, {"n": [0]}, [neuron_config(2)], "logicalNeuronCore 2 is not supported"),
    ("inf2 LNC 2", INF2, {"n": [0]}, [neuron_config(2)], "not supported on inf2.48xlarge"),
    ("trn2 LNC 1", TRN2, {"n": [0]}, [neuron_config(1)], None),
    ("trn2 LNC 2", TRN2, {"n": [0]}, [neuron_config(2)], None),
    ("trn2 LNC 3", TRN2, {"n": [0]}, [neuron_config(3)], "logicalNeuronCore must be 1 or 2"),
    (
        "trn1 claim's LNC 1 beats the class's LNC 2",
        TRN1,
        {"n": [0]},
        [neuron_config(2, requests=["n"], source="FromClass"), neuron_config(1)],
        None,
    ),
    (
        "trn2 LNC differs between requests",
        TRN2,
        {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]},
        [neuron_config(1, requests=["a"]), neuron_config(2, requests=["b"])],
        "conflicting logicalNeuronCore values",
    ),
    ("trn2 UltraServerConfig", TRN2, {"n": [0]}, [us_config(4)], "needs an UltraServer node"),
    ("trn1 UltraServerConfig", TRN1, {"n": [0]}, [us_config(1)], "needs an UltraServer node"),
    ("inf2 UltraServerConfig", INF2, {"n": [0]}, [us_config(2)], "needs an UltraServer node"),
    ("trn2u UltraServerConfig 4", "trn2u.48xlarge", {"n": ["neuronnode"]}, [us_config(4)], None),
    ("trn2u UltraServerConfig 1", "trn2u.48xlarge", {"n": ["neuronnode"]}, [us_config(1)], None),
    (
        "trn2u neuronnode and a device",
        "trn2u.48xlarge",
        {"n": ["neuronnode", 3]},
        [],
        "neuronnode (the whole node) and neurondevice3 overlap",
    ),
    (
        "a config of another kind",
        TRN2,
        {"n": [0]},
        [{"opaque": {"driver": "neuron.aws.com", "parameters": {"kind": "GpuConfig"}}}],
        "invalid claim config #0",
    ),
]


@pytest.mark.parametrize(
    ("instance_type", "allocated", "config", "refusal"),
    [case[1:] for case in AGREEMENT_CASES],
    ids=[case[0] for case in AGREEMENT_CASES],
)
def test_check_claim_says_what_prepare_says(
    instance_type: str,
    allocated: dict[str, list[int | str]],
    config: list[Any],
    refusal: str | None,
) -> None:
    us = ELECTED if PROFILES[instance_type].ultraserver_capable else None
    prepare, predicted = verdicts(inventory(instance_type, us), allocated, config)
    assert predicted == prepare
    if refusal is None:
        assert prepare is None
    else:
        assert prepare is not None and refusal in prepare


def test_ultraserver_mode_the_node_does_not_offer() -> None:
    inv = inventory(
        "trn2u.48xlarge",
        UltraServerInfo(
            modes=(UltraServerMode.X4, UltraServerMode.X1), server_id_4="a" * 16, node_id_4=0
        ),
    )
    prepare, predicted = verdicts(inv, {"n": ["neuronnode"]}, [us_config(2)])
    assert predicted == prepare
    assert prepare is not None and "supported node counts: 1, 4" in prepare


# (case, devices, claim's workload label, tags as published, Prepare's refusal (a part) or None)
WORKLOAD_CASES: list[tuple[str, list[int | str], str | None, dict[int | str, str], str | None]] = [
    ("the workload's own claim", ["neuronnode"], "w-a", {"node": "w-a"}, None),
    ("a claim of no workload", ["neuronnode"], None, {"node": "w-a"}, "belongs to no workload"),
    ("another workload's claim", ["neuronnode"], "w-b", {"node": "w-a"}, "belongs to workload w-b"),
    ("a tagged device under neuronnode", ["neuronnode"], "w-b", {5: "w-a"}, "neurondevice5"),
    ("untagged devices are free", [0, 1, 2, 3], None, {5: "w-a"}, None),
    ("devices not (yet) tagged", ["neuronnode"], "w-a", {}, "not reserved for that workload"),
]


@pytest.mark.parametrize(
    ("allocated", "label", "tags", "refusal"),
    [case[1:] for case in WORKLOAD_CASES],
    ids=[case[0] for case in WORKLOAD_CASES],
)
def test_workload_reservations_agree(
    allocated: list[int | str], label: str | None, tags: dict[int | str, str], refusal: str | None
) -> None:
    prepare, predicted = verdicts(
        inventory("trn2u.48xlarge", ELECTED),
        {"n": allocated},
        [us_config(4)],
        labels={WORKLOAD_LABEL: label} if label else None,
        workload_ids=tags,
    )
    assert predicted == prepare
    if refusal is None:
        assert prepare is None
    else:
        assert prepare is not None and refusal in prepare


def test_the_election_is_the_one_check_a_slice_cannot_show() -> None:
    # Before the UltraServer election the plugin refuses mode 4 (retryable: it usually
    # completes); the 2-node ids are not in the slice, so check-claim does not predict it.
    inv = inventory("trn2u.48xlarge", UltraServerInfo(modes=(UltraServerMode.X4,)))
    prepare, predicted = verdicts(inv, {"n": ["neuronnode"]}, [us_config(4)])
    assert prepare is not None and "election not complete" in prepare
    assert predicted is None


@pytest.mark.parametrize("instance_type", sorted(PROFILES))
def test_count_hint_is_prepares_count_rule(instance_type: str) -> None:
    # The hint names a count exactly when Prepare refuses that many devices with the seed's
    # message (here the first ``count`` devices, a connected set whenever one exists).
    inv = inventory(instance_type)
    (node,) = split_by_node(
        build_resource_slices(
            inv,
            node_name=AGREE_NODE,
            node_uid="node-uid",
            node_labels={},
            dra_driver_version="0.1.0",
            generation=0,
        )
    )
    facts = node_facts(node)
    assert facts is not None
    for count in range(1, PROFILES[instance_type].device_count + 1):
        prepare, _ = verdicts(inv, {"n": list(range(count))})
        refused_for_count = prepare == seed_refusal(instance_type, count)
        assert (count_hint(count, facts.profile) is not None) == refused_for_count, count


def test_cli_reports_prepares_workload_refusal(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    slices = build_resource_slices(
        inventory("trn2u.48xlarge", ELECTED),
        node_name=AGREE_NODE,
        node_uid="node-uid",
        node_labels={},
        dra_driver_version="0.1.0",
        workload_ids={"node": "w-a"},
        generation=0,
    )
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "w-b-node", "namespace": "ml"},
        "spec": {
            "metadata": {"labels": {WORKLOAD_LABEL: "w-b"}},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "n",
                            "exactly": {
                                "deviceClassName": "ultraserver.neuron.aws.com",
                                "selectors": [
                                    {
                                        "cel": {
                                            "expression": "device.attributes['neuron.aws.com']"
                                            ".resourceType == 'neuron_node'"
                                        }
                                    }
                                ],
                            },
                        }
                    ]
                }
            },
        },
    }
    claims = write_yaml(tmp_path / "t.yaml", template)
    code, out, _ = run(capsys, "-f", claims, "--slices", write_yaml(tmp_path / "s.yaml", *slices))
    assert code == 1, out
    assert out.splitlines()[1] == (
        f"  node {AGREE_NODE}: the scheduler would allocate neuronnode, but the kubelet plugin "
        "would refuse to prepare them: device neurondevice0 is reserved for workload w-a, but "
        "the claim belongs to workload w-b (label neuron.aws.com/workload-id); only that "
        "workload's claims may use it"
    )
    template["spec"]["metadata"]["labels"][WORKLOAD_LABEL] = "w-a"
    code, out, _ = run(
        capsys,
        "-f",
        write_yaml(tmp_path / "t.yaml", template),
        "--slices",
        str(tmp_path / "s.yaml"),
    )
    assert code == 0, out
