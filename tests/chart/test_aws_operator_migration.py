"""A cluster that ran AWS's UltraServer operator moves to neuron-dra, on the real control plane.

docs/configuration.md, "Compatibility with AWS's UltraServer operator", gives the steps; this
test takes them with the real helm and kubectl, in that order:

1. AWS's CRDs (tests/chart/fixtures/aws-ultraserver-operator-crds.yaml) installed as AWS's
   chart installs them, as templates of a Helm release, and objects written into them as AWS's
   operator writes them: NeuronUltraServers with its link spelling and ``state: Ready``, an
   allocation entry in ``phase: Bound`` without a workloadId, a workload with ``failureStrategy:
   MigrateAffected`` and its status, the ResourceClaimTemplate it generated.
2. The CRDs marked ``helm.sh/resource-policy=keep`` and the operator switched off in that
   release (its CRDs survive; without the mark helm deletes them, and every object with them),
   then the release uninstalled.
3. Our CRDs applied over theirs as the install script applies them, and our chart installed.

Then every stored object is still readable and updatable, a workload written for AWS's CRDs
(examples/specs/aws-operator-workload.yaml) is accepted with AWS's default LNC, and our
controller and plugins (in this process, on simulated nodes) take the old objects over: the
foreign entry is released and the workload allocated again under our record, its template
replaced, the NeuronUltraServers respelt; MigrateAffected swaps a failed unit as
ReplaceAffected does. The Node label ``topology.k8s.aws/capacity-block-id`` cannot change.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from neuron_dra.common.constants import DRIVER_NAMESPACE, LABEL_WORKLOAD_ID
from neuron_dra.sim.realcluster import ADMIN, RealControlPlane
from neuron_dra.sim.simcluster.cluster import SIMULATED_NODES, SimCluster
from neuron_dra.sim.simcluster.topology import ultraserver_id, ultraservers

from .conftest import CHART, REPO, Helm, HelmError
from .realchart import OFF_NODES, ChartOnCluster, control_plane, minor_params

FIXTURE = Path(__file__).parent / "fixtures" / "aws-ultraserver-operator-crds.yaml"
EXAMPLE = REPO / "examples" / "specs" / "aws-operator-workload.yaml"
CRDS = ("neuronultraservers.neuron.aws.com", "neuronultraserverworkloads.neuron.aws.com")
API = "neuron.aws.com/v1beta1"
AWS_RELEASE, AWS_NS = "aws-neuron", "kube-system"
LEGACY = "legacy-job"
LEGACY_RCT = "legacy-job-rct"
T0 = "2026-07-20T10:00:00Z"
OUR_STATES = ("Available", "PartiallyAllocated", "FullyAllocated")


def _aws_chart(root: Path) -> Path:
    """A chart holding the fixture as AWS's chart holds its CRDs: templates, switched by
    ``ultraserverOperator.enabled``."""
    chart = root / "aws-neuron"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: aws-neuron\nversion: 1.9.0\n")
    (chart / "values.yaml").write_text("ultraserverOperator:\n  enabled: true\n")
    (chart / "templates" / "ultraserver-operator-crds.yaml").write_text(
        "{{- if .Values.ultraserverOperator.enabled }}\n" + FIXTURE.read_text() + "{{- end }}\n"
    )
    return chart


class Cluster:
    """kubectl and helm as the admin on one control plane."""

    def __init__(self, cp: RealControlPlane, helm: Helm) -> None:
        self.cp, self.helm = cp, helm

    def kubectl(self, *args: str, obj: Any = None, check: bool = True) -> str:
        if obj is None:
            return self.cp.kubectl(*args, check=check)
        with tempfile.NamedTemporaryFile("w", suffix=".json", dir="/tmp") as f:
            json.dump(obj, f)
            f.flush()
            return self.cp.kubectl(*args, "-f", f.name, check=check)

    def refused(self, *args: str) -> str:
        """kubectl's error for a request the API server must refuse."""
        proc = subprocess.run(
            [str(self.cp.bin_dir / "kubectl"), "--kubeconfig", str(self.cp.kubeconfig(ADMIN)),
             *args], capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        assert proc.returncode != 0, f"kubectl {' '.join(args)} was accepted"
        return proc.stderr

    def run_helm(self, *args: str) -> str:
        proc = self.helm.run(*args, "--kubeconfig", str(self.cp.kubeconfig(ADMIN)))
        if proc.returncode != 0:
            raise HelmError(proc.stderr.strip())
        return proc.stdout

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any]:
        return dict(json.loads(self.kubectl("get", kind, name, "-n", namespace, "-o", "json")))

    def write_status(self, kind: str, name: str, namespace: str, status: Any) -> None:
        live = self.get(kind, name, namespace)
        live["status"] = status
        self.kubectl("replace", "--subresource=status", obj=live)

    def crd_uids(self) -> list[str]:
        out = self.kubectl("get", "crd", *CRDS, "-o", "jsonpath={.items[*].metadata.uid}")
        return out.split()


def _condition(type_: str, reason: str) -> dict[str, Any]:
    return {"type": type_, "status": "True", "reason": reason, "message": "",
            "lastTransitionTime": T0}  # fmt: skip


def _write_as_aws_operator(c: Cluster, nodes: dict[str, list[str]]) -> None:
    """What AWS's operator leaves behind: one NeuronUltraServer per UltraServer (named by its
    id, in the driver namespace, as its guide shows them), the first holding ``LEGACY``."""
    c.kubectl("create", "namespace", DRIVER_NAMESPACE)
    for index, (us, members) in enumerate(sorted(nodes.items())):
        topology = [
            {"nodeName": n, "nodeId": i, "linkStatusHorizontal": "up", "linkStatusVertical": "up"}
            for i, n in enumerate(members)
        ]
        c.kubectl("create", obj={
            "apiVersion": API, "kind": "NeuronUltraServer",
            "metadata": {"name": us, "namespace": DRIVER_NAMESPACE},
            "spec": {"instanceType": "trn2u.48xlarge", "topology": topology},
        })  # fmt: skip
        status: dict[str, Any] = {
            "state": "Ready",
            "observedGeneration": 1,
            "conditions": [_condition("Ready", "Healthy")],
        }
        if index == 0:
            status["allocations"] = [{
                "allocatedAt": T0, "allocatedNodes": members, "leaderNodeName": members[0],
                "nodeCount": 4, "phase": "Bound", "ultraserverIndex": 0,
                "workloadRef": f"default/{LEGACY}",
            }]  # fmt: skip
            status["conditions"].append(_condition("Allocated", "Allocated"))
        c.write_status("nus", us, DRIVER_NAMESPACE, status)
    created = json.loads(c.kubectl("create", "-o", "json", obj={
        "apiVersion": API, "kind": "NeuronUltraServerWorkload",
        "metadata": {"name": LEGACY, "namespace": "default"},
        "spec": {
            "instanceType": "trn2u.48xlarge", "topologySize": 4, "serverCount": 1,
            "allocationPolicy": {"failureStrategy": "MigrateAffected"},
            "config": {}, "resourceClaimTemplate": {"name": LEGACY_RCT},
        },
    }))  # fmt: skip
    # AWS's defaults, applied by its schema.
    assert created["spec"]["config"] == {"logicalNeuronCore": 2}
    c.write_status("nusw", LEGACY, "default", {
        "state": "Allocated", "allocatedUltraServers": [sorted(nodes)[0]], "allocatedAt": T0,
        "observedGeneration": 1,
        "conditions": [_condition("Ready", "Allocated"), _condition("Progressing", "Done")],
    })  # fmt: skip
    # The template it generated, owned by the workload as a controller's is.
    c.kubectl("create", obj={
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": LEGACY_RCT, "namespace": "default", "ownerReferences": [{
            "apiVersion": API, "kind": "NeuronUltraServerWorkload", "name": LEGACY,
            "uid": created["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True,
        }]},
        "spec": {"spec": {"devices": {"requests": [{"name": "neuron", "exactly": {
            "deviceClassName": "neuron.aws.com", "allocationMode": "All",
            "selectors": [{"cel": {"expression":
                'device.attributes["neuron.aws.com"].workloadId == "legacy-job"'}}],
        }}]}}},
    })  # fmt: skip


# One minor (the oldest supported): validation ratcheting, which lets AWS's stored objects be
# updated under our schema, is the same on every pinned minor (GA since 1.33).
@pytest.fixture(scope="module", params=minor_params()[:1])
def cluster(request: pytest.FixtureRequest, helm: Helm) -> Iterator[Cluster]:
    # The controller-manager makes the default ServiceAccount SimCluster waits for.
    with control_plane(request.param) as cp:
        yield Cluster(cp, helm)


async def test_a_cluster_of_aws_operator_moves_to_neuron_dra(
    cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    nodes = ultraservers(2)
    members = {
        us: [n.name for n in nodes if n.ultraserver_id == us]
        for us in (ultraserver_id(0), ultraserver_id(1))
    }

    # --- 1. AWS's operator: its chart's CRDs, its objects ---------------------------------
    aws_chart = _aws_chart(tmp_path)
    c.run_helm("install", AWS_RELEASE, str(aws_chart), "--namespace", AWS_NS)
    _write_as_aws_operator(c, members)
    aws_template_uid = c.get("resourceclaimtemplate", LEGACY_RCT, "default")["metadata"]["uid"]

    # --- 2. switch the operator off, keeping its CRDs --------------------------------------
    uids = c.crd_uids()
    c.kubectl("annotate", "crd", *CRDS, "helm.sh/resource-policy=keep")
    c.run_helm("upgrade", AWS_RELEASE, str(aws_chart), "--namespace", AWS_NS, "--reuse-values",
               "--set", "ultraserverOperator.enabled=false")  # fmt: skip
    c.run_helm("uninstall", AWS_RELEASE, "--namespace", AWS_NS)
    crds = json.loads(c.kubectl("get", "crd", *CRDS, "-o", "json"))["items"]
    assert [x["metadata"]["uid"] for x in crds] == uids, "the CRDs are the same objects"
    assert not any(x["metadata"].get("deletionTimestamp") for x in crds)

    # --- 3. ours over theirs, as examples/scripts/install-dra-driver.sh applies them --------
    c.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    c.kubectl("wait", "--for=condition=Established", *[f"crd/{n}" for n in CRDS])
    ChartOnCluster(c.helm, c.cp).install(OFF_NODES)  # finds the CRDs there: skips crds/
    assert c.crd_uids() == uids
    for path in sorted((CHART / "crds").glob("*.yaml")):
        # Server-side apply leaves nothing of AWS's schema behind: a CRD's schema is one
        # value (atomic), not a merge of both.
        ours = yaml.safe_load(path.read_text())
        live = json.loads(c.kubectl("get", "crd", ours["metadata"]["name"], "-o", "json"))
        assert live["spec"]["versions"] == ours["spec"]["versions"], path.name
        assert live["spec"]["names"] == ours["spec"]["names"], path.name

    # Every stored object reads and updates under our schema.
    legacy_us, spare_us = sorted(members)
    for kind, name, ns in (
        ("nus", legacy_us, DRIVER_NAMESPACE),
        ("nus", spare_us, DRIVER_NAMESPACE),
        ("nusw", LEGACY, "default"),
    ):
        obj = c.get(kind, name, ns)
        c.kubectl("label", kind, name, "-n", ns, "migrated=true")
        assert c.get(kind, name, ns)["metadata"]["labels"] == {"migrated": "true"}
        assert c.get(kind, name, ns)["status"] == obj["status"]
    assert c.get("nus", legacy_us, DRIVER_NAMESPACE)["status"]["state"] == "Ready"
    # A status write that keeps AWS's entry (no workloadId, which ours requires) is allowed:
    # unchanged parts of stored objects are not validated again.
    nus = c.get("nus", legacy_us, DRIVER_NAMESPACE)
    nus["status"]["nodeCount"] = 4
    c.kubectl("replace", "--subresource=status", obj=nus)

    # The example, written for AWS's CRDs, is accepted as written: AWS's LNC default.
    c.kubectl("create", "--validate=strict", "-n", "default", "-f", str(EXAMPLE))
    example = yaml.safe_load(EXAMPLE.read_text())
    name = example["metadata"]["name"]
    created = c.get("nusw", name, "default")
    assert created["spec"]["config"] == {"logicalNeuronCore": 2}
    assert created["spec"]["allocationPolicy"]["failureStrategy"] == "MigrateAffected"

    # The Node label AWS's operator protected is protected by our chart's policy.
    label = "topology.k8s.aws/capacity-block-id"
    cb_node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cb-node"}}
    cb_node["metadata"]["labels"] = {label: "cr-1"}  # set at creation: allowed
    c.kubectl("create", obj=cb_node)
    for change, said in ((f"{label}=cr-2", "'cr-1' -> 'cr-2'"), (f"{label}-", "'cr-1' -> unset")):
        denied = c.refused("label", "node", "cb-node", "--overwrite", change)
        assert "cannot be added, changed or removed" in denied, denied
        assert f"node cb-node: {said}" in denied, denied
    c.kubectl("label", "node", "cb-node", "team=a")  # other labels stay free
    c.kubectl("delete", "node", "cb-node")

    # --- our controller takes over --------------------------------------------------------
    async with SimCluster(nodes, kubernetes="real", control_plane=c.cp,
                          nodes_kind=SIMULATED_NODES) as sim:  # fmt: skip

        def allocated(wl: str) -> dict[str, Any] | None:
            w = sim.workload(wl) or {}
            status = w.get("status") or {}
            return (
                status if status.get("state") == "Allocated" and status.get("workloadId") else None
            )

        def entries(wl: str) -> list[tuple[str, dict[str, Any]]]:
            return [
                (u["metadata"]["name"], e)
                for u in sim.ultraservers()
                for e in (u.get("status") or {}).get("allocations") or []
                if e["workloadRef"] == f"default/{wl}"
            ]

        legacy = await sim.wait_until(lambda: allocated(LEGACY), "legacy-job allocated by us")
        wid = legacy["workloadId"]
        assert legacy["allocatedAt"] == legacy["allocationTime"]
        assert legacy["totalNodesAllocated"] == 4
        await sim.wait_until(
            lambda: (
                [e for _, e in entries(LEGACY)]
                and all(
                    e.get("workloadId") == wid and e["phase"] == "Bound" for _, e in entries(LEGACY)
                )
            ),
            "AWS's entry replaced by ours, Bound once the nodes carry the tag",
        )
        template = await sim.wait_until(
            lambda: (t := sim.view.get("resource.k8s.io/v1", "ResourceClaimTemplate", LEGACY_RCT,
                                       "default"))
            and (t["metadata"].get("labels") or {}).get(LABEL_WORKLOAD_ID) == wid
            and t,
            "AWS's template replaced by ours",
        )  # fmt: skip
        assert template["metadata"]["uid"] != aws_template_uid

        def respelt() -> bool:
            """Both NeuronUltraServers in our words: state and link status."""
            found = sim.ultraservers()
            return len(found) == 2 and all(
                (u.get("status") or {}).get("state") in OUR_STATES
                and {t["linkStatusHorizontal"] for t in u["spec"]["topology"]} == {"Up"}
                for u in found
            )

        await sim.wait_until(respelt, "AWS's NeuronUltraServers respelt by our discovery")

        # MigrateAffected is ReplaceAffected: a failed node's unit moves, nothing else does.
        first = await sim.wait_until(lambda: allocated(name), f"{name} allocated")
        assert first["allocatedAt"] == first["allocationTime"]
        # The UltraServers' watch is not ordered with the workloads': wait for the entry of
        # this allocation there too.
        ((us_before, entry),) = await sim.wait_until(
            lambda: (
                (now := entries(name))
                and all(e.get("workloadId") == first["workloadId"] for _, e in now)
                and now
            ),
            f"{name}'s entry on an UltraServer",
        )
        failed = entry["allocatedNodes"][1]
        await sim.fail_node(failed)

        def moved() -> list[tuple[str, dict[str, Any]]] | None:
            now = entries(name)
            if len(now) == 1 and failed not in now[0][1]["allocatedNodes"]:
                return now
            return None

        ((us_after, new_entry),) = await sim.wait_until(moved, "the failed unit replaced")
        assert us_after == us_before, "the other node pair of the same UltraServer was free"
        assert set(new_entry["allocatedNodes"]).isdisjoint(entry["allocatedNodes"])
        await sim.wait_until(lambda: sim.events(name, "UnitsReplaced"), "UnitsReplaced event")
        assert [e for _, e in entries(LEGACY)] and allocated(LEGACY), "legacy-job untouched"
