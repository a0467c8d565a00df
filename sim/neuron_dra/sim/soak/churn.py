"""The churn: workloads (as pods or a Deployment) and plain claims created and deleted at
random, each choice drawn from the seed; a deleted workload is noted to be checked for
being freed."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from neuron_dra.common.constants import DRIVER_NAME
from neuron_dra.common.k8s.client import NEURON_ULTRASERVER_WORKLOADS, PODS, RESOURCE_CLAIMS
from neuron_dra.common.k8s.errors import NotFoundError
from neuron_dra.common.ultraserver import workload_id
from neuron_dra.sim.simcluster.realworld import DEPLOYMENTS
from neuron_dra.sim.soak.options import INSTANCE_TYPE, NS, TOPOLOGY_SIZE, JsonDict

if TYPE_CHECKING:
    from neuron_dra.sim.soak.harness import Soak


@dataclass
class Workload:
    name: str
    server_count: int
    mode: str  # "pods" | "deployment"
    created_at: float
    pods_created: bool = False
    wid: str | None = None


async def churn(soak: Soak, end: float, done: Callable[[], bool] = lambda: False) -> None:
    """Operations until ``end`` (a monotonic time) or until ``done()`` says so."""
    while time.monotonic() < end and not done() and not soak.stopping.is_set():
        await asyncio.sleep(soak.rng.expovariate(1 / soak.o.op_interval))
        ops = ["workload+", "workload-", "claim+", "claim-"]
        live = len(soak.workloads)
        max_workloads = max(1, len(soak.nodes) // TOPOLOGY_SIZE)
        weights = [
            3 if live < max_workloads else 0,
            2 if live else 0,
            3 if len(soak.plain) < len(soak.nodes) else 0,
            2 if soak.plain else 0,
        ]
        op = soak.rng.choices(ops, weights)[0]
        # Drawn before the attempt, so a failed op does not shift the sequence.
        draw = soak.rng.random()
        try:
            await advance(soak)
            if op == "workload+":
                await create_workload(soak, draw)
            elif op == "workload-":
                await delete_workload(soak, draw)
            elif op == "claim+":
                await create_claim(soak, draw)
            else:
                await delete_claim(soak, draw)
            soak.ops[op] += 1
        except Exception as exc:
            soak.op_failures[op] += 1
            soak.event(f"op {op} failed: {type(exc).__name__}: {str(exc)[:120]}")


def pod_body(
    name: str, claim: JsonDict, container: JsonDict, labels: JsonDict | None = None
) -> JsonDict:
    """A pod using one claim with one container (its image and command: the nodes' choice,
    :meth:`.nodes.SoakNodes.pod_container`)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"soak": "1"}},
        "spec": {
            "containers": [
                {"name": "c", **container, "resources": {"claims": [{"name": "neuron"}]}}
            ],
            "resourceClaims": [{"name": "neuron", **claim}],
            # Leases may lapse while the API server is down: no evictions for that.
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 5,
        },
    }


async def create_workload(soak: Soak, draw: float) -> None:
    assert soak.kube is not None
    name = soak.name("w")
    count = 1 if draw < 0.6 else 2
    mode = "deployment" if (draw * 10) % 1 < 0.3 else "pods"
    body = {
        "apiVersion": "neuron.aws.com/v1beta1",
        "kind": "NeuronUltraServerWorkload",
        "metadata": {"name": name},
        "spec": {
            "instanceType": INSTANCE_TYPE,
            "topologySize": TOPOLOGY_SIZE,
            "serverCount": count,
            "allocationPolicy": {"failureStrategy": "NoOp"},
            "resourceClaimTemplate": {"name": f"{name}-rct"},
        },
    }
    created = await soak.kube.resource(NEURON_ULTRASERVER_WORKLOADS).create(body, NS)
    wid = workload_id(name, str(created["metadata"]["uid"]))
    soak.workloads[name] = Workload(name, count, mode, soak.now(), wid=wid)
    soak.event(f"op create workload {name} serverCount={count} ({mode})")


async def advance(soak: Soak) -> None:
    """Workloads that became Allocated get their pods (or Deployment)."""
    assert soak.kube is not None
    for w in list(soak.workloads.values()):
        if w.pods_created:
            continue
        obj = await soak.kube.resource(NEURON_ULTRASERVER_WORKLOADS).get(w.name, NS)
        status = obj.get("status") or {}
        if status.get("state") != "Allocated":
            continue
        if status.get("workloadId") != w.wid:
            soak.violate("workload-id", f"{w.name}: status says {status.get('workloadId')}")
        pods = TOPOLOGY_SIZE * w.server_count
        claim = {"resourceClaimTemplateName": f"{w.name}-rct"}
        labels = {"soak": "1", "workload": w.name}
        if w.mode == "deployment":
            template = pod_body("x", claim, soak.node_side.pod_container(), labels)
            body = {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": w.name},
                "spec": {
                    "replicas": pods,
                    "selector": {"matchLabels": labels},
                    "template": {"metadata": {"labels": labels}, "spec": template["spec"]},
                },
            }
            await soak.kube.resource(DEPLOYMENTS).create(body, NS)
        else:
            for i in range(pods):
                body = pod_body(f"{w.name}-{i}", claim, soak.node_side.pod_container(), labels)
                await soak.kube.resource(PODS).create(body, NS)
        w.pods_created = True
        soak.event(f"op workload {w.name} ({w.wid}) Allocated: {pods} pods ({w.mode})")


async def delete_workload_pods(soak: Soak, w: Workload) -> None:
    assert soak.kube is not None
    if w.mode == "deployment":
        with contextlib.suppress(NotFoundError):
            await soak.kube.resource(DEPLOYMENTS).delete(
                w.name, NS, propagation_policy="Background"
            )
    for pod in (
        await soak.kube.resource(PODS).list_all(NS, label_selector=f"workload={w.name}")
    ).items:
        with contextlib.suppress(NotFoundError):
            await soak.kube.resource(PODS).delete(pod["metadata"]["name"], NS)


async def delete_workload(soak: Soak, draw: float) -> None:
    assert soak.kube is not None
    name = sorted(soak.workloads)[int(draw * len(soak.workloads))]
    w = soak.workloads[name]
    api = soak.kube.resource(NEURON_ULTRASERVER_WORKLOADS)
    wid = w.wid
    pods_first = (draw * 10) % 1 < 0.5
    if pods_first:
        await delete_workload_pods(soak, w)
    with contextlib.suppress(NotFoundError):
        await api.delete(name, NS)
    if not pods_first:
        await delete_workload_pods(soak, w)
    del soak.workloads[name]
    if wid:
        soak.pending_free[wid] = (time.monotonic(), name)
    order = "pods first" if pods_first else "workload first"
    soak.event(f"op delete workload {name} ({wid}; {order})")


async def create_claim(soak: Soak, draw: float) -> None:
    assert soak.kube is not None
    count = [1, 1, 4, 4, 8, 16][int(draw * 6)]
    name = soak.name("c")
    exactly: JsonDict = {
        "deviceClassName": DRIVER_NAME,
        "allocationMode": "ExactCount",
        "count": count,
    }
    devices: JsonDict = {"requests": [{"name": "neurons", "exactly": exactly}]}
    if count > 1:
        devices["constraints"] = [
            {
                "requests": ["neurons"],
                "matchAttribute": f"resource.aws.com/devicegroup{count}_id",
            }
        ]
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "labels": {"soak": "1"}},
        "spec": {"devices": devices},
    }
    await soak.kube.resource(RESOURCE_CLAIMS).create(claim, NS)
    pod = pod_body(f"{name}-pod", {"resourceClaimName": name}, soak.node_side.pod_container())
    # Most plain claims stay off the first UltraServers (room for workloads); some roam.
    servers = len(soak.nodes) // TOPOLOGY_SIZE
    if servers > 1 and (draw * 10) % 1 < 0.8:
        allowed = [n.name for n in soak.nodes[(servers // 2) * TOPOLOGY_SIZE :]]
        pod["spec"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": allowed,
                                }
                            ]
                        }
                    ]
                }
            }
        }
    await soak.kube.resource(PODS).create(pod, NS)
    soak.plain[name] = f"{name}-pod"
    soak.event(f"op create claim {name} count={count}")


async def delete_claim(soak: Soak, draw: float) -> None:
    assert soak.kube is not None
    name = sorted(soak.plain)[int(draw * len(soak.plain))]
    pod = soak.plain[name]
    with contextlib.suppress(NotFoundError):
        await soak.kube.resource(PODS).delete(pod, NS)
    with contextlib.suppress(NotFoundError):
        await soak.kube.resource(RESOURCE_CLAIMS).delete(name, NS)
    del soak.plain[name]
    soak.event(f"op delete claim {name}")
