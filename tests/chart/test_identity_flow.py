"""The components under the chart's identities, on the real control plane (issue 11): the
chart installed by the real helm (its RBAC and ValidatingAdmissionPolicies active, with
``Node,RBAC`` authorization), then the controller and one kubelet plugin per node talking
with tokens of the chart's ServiceAccounts from the TokenRequest API. Each plugin's token is
bound to a Pod placed on its node, so the API server puts the node's name in it, as for a
real DaemonSet pod. The whole flow runs: plugins publish their slices, the controller
discovers the UltraServer and allocates a workload, the real scheduler allocates the pods'
claims inside the reservation, the simulated kubelets have the plugins prepare them, and
deleting the workload frees everything. The API server's audit log must then hold requests
of every identity and not one 403 answer to any of them.

The components run in the test's process (``SimCluster``), each with its own client and
token: to the API server they are exactly the processes the chart deploys.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from neuron_dra.common import constants as c
from neuron_dra.sim.realcluster import RealControlPlane
from neuron_dra.sim.simcluster.cluster import CONTROLLER, SimCluster
from neuron_dra.sim.simcluster.topology import ultraservers

from .conftest import Helm
from .realchart import (
    CONTROLLER_SA,
    NS,
    OFF_NODES,
    PLUGIN_SA,
    ChartOnCluster,
    control_plane,
    identity_pod,
    minor_params,
    request_token,
    sa_user,
    token_kubeconfig,
)

AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: Metadata
  userGroups: ["system:serviceaccounts:{NS}"]
- level: None
"""
WORKLOAD = "train"
TEMPLATE = "train-claims"


# One minor (the oldest supported): the identities, RBAC and policies are the chart's, the
# same on every minor; test_security.py and test_helm_install.py cover both minors.
@pytest.fixture(scope="module", params=minor_params()[:1])
def installed(
    request: pytest.FixtureRequest, helm: Helm
) -> Iterator[tuple[RealControlPlane, Path]]:
    with control_plane(request.param, audit_policy=AUDIT_POLICY) as cp:
        # The chart's own pods stay Pending (nodeSelector matches no node): no image runs
        # here; the components run in the test process under the pods' identities.
        ChartOnCluster(helm, cp).install(OFF_NODES)
        yield cp, cp.audit_log


def _identities(cp: RealControlPlane, tmp: Path) -> Any:
    def kubeconfig(component: str) -> Path:
        if component == CONTROLLER:
            token = request_token(cp, CONTROLLER_SA)
        else:  # a node's plugin: a token bound to a pod on that node
            pod = identity_pod(cp, component, PLUGIN_SA, f"plugin-{component}")
            token = request_token(cp, PLUGIN_SA, bound_pod=pod)
        return token_kubeconfig(cp, token, tmp / f"{component}.kubeconfig")

    return kubeconfig


def _workload() -> dict[str, Any]:
    return {
        "apiVersion": c.CRD_API_VERSION,
        "kind": c.KIND_WORKLOAD,
        "metadata": {"name": WORKLOAD},
        "spec": {
            "instanceType": "trn2u.48xlarge",
            "topologySize": 4,
            "serverCount": 1,
            "resourceClaimTemplate": {"name": TEMPLATE},
        },
    }


def _pod(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{WORKLOAD}-{i}", "labels": {"app": WORKLOAD}},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "public.ecr.aws/docker/library/alpine:latest",
                    "command": ["sleep", "infinity"],
                    "resources": {"claims": [{"name": "neuron"}]},
                }
            ],
            "resourceClaims": [{"name": "neuron", "resourceClaimTemplateName": TEMPLATE}],
        },
    }


def _audit(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def test_the_flow_under_the_charts_identities_gets_no_403(
    installed: tuple[RealControlPlane, Path], tmp_path: Path
) -> None:
    cp, audit = installed
    nodes = ultraservers(1)
    async with SimCluster(
        nodes, kubernetes="real", control_plane=cp, identities=_identities(cp, tmp_path)
    ) as sim:
        await sim.apply(_workload())
        await sim.wait_until(
            lambda: (
                ((sim.workload(WORKLOAD) or {}).get("status") or {}).get("state") == "Allocated"
            ),
            "workload Allocated",
        )
        # The template exists by now (written before the Allocated status); a pod that came
        # first would only wait for it.
        for i in range(4):
            await sim.apply(_pod(i))
        pods = await sim.wait_until(
            lambda: (
                p
                if len(p := sim.pods("default", f"app={WORKLOAD}")) == 4
                and all((x.get("status") or {}).get("phase") == "Running" for x in p)
                else None
            ),
            "4 pods Running (claims prepared)",
        )
        assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(n.name for n in nodes)
        for p in pods:
            await sim.delete("v1", "Pod", p["metadata"]["name"])
        await sim.delete(c.CRD_API_VERSION, c.KIND_WORKLOAD, WORKLOAD)
        await sim.wait_until(lambda: sim.workload(WORKLOAD) is None, "workload gone")
        await sim.wait_until(
            lambda: all(u["status"]["state"] == "Available" for u in sim.ultraservers()),
            "UltraServer Available again",
        )

    events = _audit(audit)
    by_user = Counter(e["user"]["username"] for e in events)
    plugin, controller = sa_user(PLUGIN_SA), sa_user(CONTROLLER_SA)
    # Every identity was heard, so "no 403" is about real traffic.
    assert by_user[plugin] > 0 and by_user[controller] > 0, by_user
    writes = Counter(
        (e["user"]["username"], e["verb"], e["objectRef"].get("resource"))
        for e in events
        if e["verb"] in ("create", "update", "patch", "delete")
    )
    assert writes[(controller, "create", "neuronultraservers")] >= 1, writes
    assert writes[(controller, "create", "resourceclaimtemplates")] >= 1, writes
    assert writes[(plugin, "create", "resourceslices")] >= 4, writes  # one per node
    # Each plugin's requests carried its own node in the token.
    plugin_nodes = {
        tuple(e["user"].get("extra", {}).get("authentication.kubernetes.io/node-name", []))
        for e in events
        if e["user"]["username"] == plugin
    }
    assert plugin_nodes == {(n.name,) for n in nodes}, plugin_nodes
    refused = [e for e in events if e.get("responseStatus", {}).get("code") == 403]
    if tuple(int(x) for x in cp.minor.split(".")[:2]) < (1, 36):
        # Before 1.36 the chart grants no resourceclaims/status (it would let a node's token
        # rewrite allocations): each plugin's first status.devices write is refused, and the
        # writer stops there (prepare/devicestatus.py). One each, nothing else.
        status_writes = [
            e
            for e in refused
            if e["user"]["username"] == plugin
            and e["verb"] == "patch"
            and e["objectRef"].get("resource") == "resourceclaims"
            and e["objectRef"].get("subresource") == "status"
        ]
        per_node = Counter(
            tuple(e["user"].get("extra", {}).get("authentication.kubernetes.io/node-name", []))
            for e in status_writes
        )
        assert status_writes and max(per_node.values()) == 1, per_node
        refused = [e for e in refused if e not in status_writes]
    denied = [
        f"{e['user']['username']} {e['verb']} {e['requestURI']}: "
        f"{e['responseStatus'].get('message', '')}"
        for e in refused
    ]
    assert denied == [], "\n".join(denied)
