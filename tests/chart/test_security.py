"""The chart's identities on the real kube-apiserver (``Node,RBAC``, the chart's
ValidatingAdmissionPolicies active), installed by the real helm:

- ``kubectl auth can-i --list`` of each ServiceAccount equals its table in docs/security.md
  (read from the file, so the document cannot drift from the chart);
- every forbidden probe of docs/security.md is denied, with the message that says why, for
  real tokens of the chart's ServiceAccounts (TokenRequest; the plugin's bound to a Pod on
  its node, as the kubelet's projected token is); and the controls succeed, so each denial
  is for the stated reason and not because everything fails.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from neuron_dra.sim.realcluster import (
    APISERVER,
    CONTROLLER_MANAGER,
    ETCD,
    Identity,
    RealControlPlane,
)

from .conftest import Helm
from .realchart import (
    CONTROLLER_SA,
    NS,
    PLUGIN_SA,
    RELEASE,
    ChartOnCluster,
    control_plane,
    create,
    identity_pod,
    kubectl_as,
    minor_params,
    request_token,
    sa_user,
    token_kubeconfig,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
NODE_A, NODE_B = "node-a", "node-b"
ALICE = Identity("alice")  # edit in team-a
BOB = Identity("bob")  # cluster-admin by RBAC, not system:masters


@dataclass
class World:
    chart: ChartOnCluster
    cp: RealControlPlane
    plugin_a: Path  # plugin token bound to a pod on node A
    plugin_unbound: Path  # plugin token bound to nothing
    controller: Path
    alice: Path
    bob: Path
    tmp: Path

    def apply(
        self, kubeconfig: Path, verb: str, obj: dict[str, Any], *extra: str
    ) -> tuple[bool, str]:
        path = self.tmp / f"{obj['kind']}-{obj['metadata']['name']}-{verb}.json"
        path.write_text(json.dumps(obj))
        return self.run(kubeconfig, verb, "-f", str(path), *extra)

    def run(self, kubeconfig: Path, *args: str) -> tuple[bool, str]:
        proc = kubectl_as(self.cp, kubeconfig, *args)
        return proc.returncode == 0, (proc.stderr or proc.stdout).strip()


def _slice(node: str, name: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-neuron"},
        "spec": {
            "driver": "neuron.aws.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "neurondevice0"}],
        },
    }


WORKLOAD = {
    "apiVersion": "neuron.aws.com/v1beta1",
    "kind": "NeuronUltraServerWorkload",
    "metadata": {"name": "train", "namespace": "team-a"},
    "spec": {"instanceType": "trn2u.48xlarge", "topologySize": 4, "serverCount": 1},
}


def _ultraserver(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "neuron.aws.com/v1beta1",
        "kind": "NeuronUltraServer",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"instanceType": "trn2u.48xlarge", "topology": []},
    }


@pytest.fixture(scope="module", params=minor_params())
def world(
    request: pytest.FixtureRequest, helm: Helm, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("security")
    # The controller-manager aggregates the chart's user roles into admin/edit/view.
    with control_plane(request.param, components=(ETCD, APISERVER, CONTROLLER_MANAGER)) as cp:
        chart = ChartOnCluster(helm, cp)
        chart.install()
        for node in (NODE_A, NODE_B):
            create(cp, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
        for ns in ("team-a", "team-b"):
            cp.kubectl("create", "namespace", ns)
        cp.kubectl("create", "rolebinding", "alice-edit", "--clusterrole", "edit",
                   "--user", ALICE.user, "-n", "team-a")  # fmt: skip
        # The built-in roles do not cover DRA's claims: a cluster grants them itself.
        cp.kubectl("create", "role", "claims", "-n", "team-a", "--verb=get,list,watch,create",
                   "--resource=resourceclaims.resource.k8s.io")  # fmt: skip
        cp.kubectl("create", "rolebinding", "alice-claims", "--role", "claims",
                   "--user", ALICE.user, "-n", "team-a")  # fmt: skip
        _until_aggregated(cp)
        cp.kubectl("create", "clusterrolebinding", "bob-admin", "--clusterrole",
                   "cluster-admin", "--user", BOB.user)  # fmt: skip
        create(cp, _slice(NODE_B))
        create(cp, _ultraserver("us-x"))
        pod = identity_pod(cp, NODE_A, PLUGIN_SA, "plugin-on-node-a")
        yield World(
            chart=chart,
            cp=cp,
            plugin_a=token_kubeconfig(
                cp, request_token(cp, PLUGIN_SA, bound_pod=pod), tmp / "plugin-a"
            ),
            plugin_unbound=token_kubeconfig(cp, request_token(cp, PLUGIN_SA), tmp / "unbound"),
            controller=token_kubeconfig(cp, request_token(cp, CONTROLLER_SA), tmp / "ctl"),
            alice=cp.kubeconfig(ALICE),
            bob=cp.kubeconfig(BOB),
            tmp=tmp,
        )


def _until_aggregated(cp: RealControlPlane, limit: float = 60.0) -> None:
    """Until the clusterrole-aggregation controller has added the chart's workload rules to
    the built-in edit role (it works from its own watch; nothing to wait on but the role)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        rules = (
            json.loads(cp.kubectl("get", "clusterrole", "edit", "-o", "json")).get("rules") or []
        )
        if any("neuronultraserverworkloads" in r.get("resources", []) for r in rules):
            return
        time.sleep(0.2)
    raise AssertionError(f"the edit role has no workload rules after {limit:.0f} s")


# --- can-i --list against the document ---------------------------------------------------------


Rule = tuple[str, str, frozenset[str]]  # resource, resource names, verbs


def _can_i(cp: RealControlPlane, user: str) -> set[Rule]:
    out = cp.kubectl("auth", "can-i", "--list", "--as", user, "-n", NS)
    rules: set[Rule] = set()
    for line in out.splitlines()[1:]:
        found = re.match(r"^(\S+)\s+\[\]\s+\[([^\]]*)\]\s+\[([^\]]*)\]\s*$", line)
        if found:  # resource rows; non-resource URL rows start with blanks
            rules.add((found[1], found[2], frozenset(found[3].split())))
    return rules


def _documented(section: str, minor: str) -> set[Rule]:
    """The rules docs/security.md lists for ``section``, without the rows it marks as granted
    only from a later minor ("**1.36+ only**") when ``minor`` is older."""
    version = tuple(int(x) for x in minor.split(".")[:2])
    text = DOC.read_text()
    start = text.index(f"## {section}")
    end = text.find("\n## ", start + 1)
    rules: set[Rule] = set()
    for line in text[start:end].splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and line.startswith("| `"):
            resource, names, verbs, why = cells
            since = re.match(r"\*\*(\d+)\.(\d+)\+ only\*\*", why)
            if since and version < (int(since.group(1)), int(since.group(2))):
                continue
            rules.add((resource, names, frozenset(verbs.split())))
    return rules


@pytest.mark.parametrize(
    ("section", "service_account"),
    [("The kubelet plugin", PLUGIN_SA), ("The controller", CONTROLLER_SA)],
)
def test_can_i_list_equals_the_documented_table(
    world: World, section: str, service_account: str
) -> None:
    everyone = _can_i(world.cp, sa_user("no-such-account"))
    granted = _can_i(world.cp, sa_user(service_account)) - everyone
    assert granted == _documented(section, world.cp.minor)


# --- forbidden probes ----------------------------------------------------------------------------


OWN_NODE = "may write only the {res} of its own node, not those of node node-b"
OWN_SLICES = OWN_NODE.format(res="resourceslices")


def _probes(w: World) -> list[tuple[str, tuple[bool, str], str]]:
    b_slice = json.loads(w.cp.kubectl("get", "resourceslice", f"{NODE_B}-neuron", "-o", "json"))
    b_slice["spec"]["devices"].append({"name": "neurondevice1"})
    us = json.loads(w.cp.kubectl("get", "neuronultraserver", "us-x", "-n", NS, "-o", "json"))
    us["status"] = {"state": "Available"}
    return [
        ("plugin A creates a slice of node B",
         w.apply(w.plugin_a, "create", _slice(NODE_B, "stolen")), OWN_SLICES),
        ("plugin A updates node B's slice",
         w.apply(w.plugin_a, "replace", b_slice), OWN_SLICES),
        ("plugin A deletes node B's slice",
         w.run(w.plugin_a, "delete", "resourceslice", f"{NODE_B}-neuron"),
         OWN_SLICES),
        ("plugin A labels Node B",
         w.run(w.plugin_a, "label", "node", NODE_B, "stolen=yes"), OWN_NODE.format(res="nodes")),
        ("an unbound plugin token creates its own slice",
         w.apply(w.plugin_unbound, "create", _slice(NODE_A, "unbound")),
         "only with a token bound to its node"),
        ("plugin A creates a NeuronUltraServer",
         w.apply(w.plugin_a, "create", _ultraserver("us-stolen")),
         'cannot create resource "neuronultraservers"'),
        ("plugin A updates a NeuronUltraServer's status",
         w.apply(w.plugin_a, "replace", us, "--subresource=status"),
         'cannot update resource "neuronultraservers/status"'),
        ("the controller deletes a Node",
         w.run(w.controller, "delete", "node", NODE_B), 'cannot delete resource "nodes"'),
        ("the controller creates a ResourceSlice",
         w.apply(w.controller, "create", _slice(NODE_A, "by-controller")),
         'cannot create resource "resourceslices"'),
        ("the controller reads Secrets",
         w.run(w.controller, "get", "secrets", "-n", NS), 'cannot list resource "secrets"'),
        ("alice lists claims in team-b",
         w.run(w.alice, "get", "resourceclaims", "-n", "team-b"),
         'User "alice" cannot list resource "resourceclaims"'),
        ("alice lists workloads in team-b",
         w.run(w.alice, "get", "neuronultraserverworkloads", "-n", "team-b"),
         'User "alice" cannot list resource "neuronultraserverworkloads"'),
        ("alice (edit in team-a) updates a NeuronUltraServer",
         w.run(w.alice, "label", "neuronultraserver", "us-x", "-n", NS, "mine=yes"),
         'User "alice" cannot get resource "neuronultraservers"'),
        ("bob (cluster-admin by RBAC) updates a NeuronUltraServer",
         w.run(w.bob, "label", "neuronultraserver", "us-x", "-n", NS, "mine=yes"),
         "NeuronUltraServers are system-owned and written only by the neuron-dra controller"),
    ]  # fmt: skip


def test_forbidden_probes_are_denied_with_a_clear_message(world: World) -> None:
    failures = []
    for name, (ok, message), expected in _probes(world):
        if ok or expected not in message:
            failures.append(f"{name}: {'ALLOWED' if ok else message}")
    assert failures == []
    # Nothing a probe tried left a trace.
    assert "stolen" not in world.cp.kubectl("get", "node", NODE_B, "--show-labels")
    assert world.cp.kubectl("get", "node", NODE_B, "-o", "name").strip() == f"node/{NODE_B}"


def test_the_controls_succeed(world: World) -> None:
    """The same identities do what they are for, so the denials above are for the stated
    reason."""
    w = world
    created = w.apply(w.plugin_a, "create", _slice(NODE_A))
    live = json.loads(w.cp.kubectl("get", "resourceslice", f"{NODE_A}-neuron", "-o", "json"))
    live["spec"]["devices"].append({"name": "neurondevice1"})
    us = json.loads(w.cp.kubectl("get", "neuronultraserver", "us-x", "-n", NS, "-o", "json"))
    us["status"] = {"state": "Available"}
    results = {
        "plugin A creates its slice": created,
        "plugin A updates its slice": w.apply(w.plugin_a, "replace", live),
        "plugin A labels its Node": w.run(w.plugin_a, "label", "node", NODE_A, "us=1"),
        "plugin A deletes its slice": w.run(
            w.plugin_a, "delete", "resourceslice", f"{NODE_A}-neuron"
        ),
        "the controller writes NeuronUltraServer status": w.apply(
            w.controller, "replace", us, "--subresource=status"
        ),
        "alice lists claims in team-a": w.run(w.alice, "get", "resourceclaims", "-n", "team-a"),
        "alice (edit) creates a workload in team-a": w.apply(w.alice, "create", WORKLOAD),
        "alice (edit) lists workloads in team-a": w.run(
            w.alice, "get", "neuronultraserverworkloads", "-n", "team-a"
        ),
    }
    assert {k: v for k, v in results.items() if not v[0]} == {}


# --- the policies as the API server reads them ---------------------------------------------------


def test_admission_policies_pass_the_apiservers_type_check(world: World) -> None:
    """The controller-manager's policy status controller type-checks each policy's CEL
    against the schemas of the resources it matches and reports what would fail at
    admission (an unknown field, a type mismatch) as warnings: there must be none."""
    cp = world.cp
    selector = f"app.kubernetes.io/instance={RELEASE}"
    cp.kubectl(
        "wait", "validatingadmissionpolicy", "-l", selector, "--timeout=120s",
        "--for=jsonpath={.status.observedGeneration}=1",
    )  # fmt: skip
    policies = json.loads(
        cp.kubectl("get", "validatingadmissionpolicy", "-l", selector, "-o", "json")
    )
    checked = {p["metadata"]["name"]: p["status"].get("typeChecking") for p in policies["items"]}
    # The plugin's own node, the controller's UltraServers, the capacity-block label.
    assert len(checked) == 3, checked
    assert {
        name: tc for name, tc in checked.items() if tc is None or tc.get("expressionWarnings")
    } == {}
