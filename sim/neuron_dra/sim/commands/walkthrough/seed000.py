"""The walkthrough's step for seed 000 (the UltraServer Operator guide): the UltraServer
operator, from a NeuronUltraServerWorkload to 8 ranked pods and back."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import yaml
from neuron_dra.common import constants as c
from neuron_dra.common.k8s.errors import InvalidError, KubeError
from neuron_dra.sim.commands.walkthrough.tables import mode_label
from neuron_dra.sim.commands.walkthrough.tools import (
    ENV_MODE,
    ENV_NODE,
    ENV_RANK,
    ENV_RANK0,
    NS,
    JsonDict,
    PodView,
    StepFailed,
    WalkthroughTools,
    expect,
)
from neuron_dra.sim.simcluster.topology import ULTRASERVER_TYPE

WORKLOAD_PLACEHOLDER = "<trn3pds instance type>"


def workload_for_sim(doc: Mapping[str, Any], instance_type: str) -> JsonDict:
    """The seed's workload with its instance-type placeholder filled in."""
    out = copy.deepcopy(dict(doc))
    if out.get("spec", {}).get("instanceType") == WORKLOAD_PLACEHOLDER:
        out["spec"]["instanceType"] = instance_type
    return out


class OperatorSteps(WalkthroughTools):
    """The step of seed 000 (the UltraServer operator)."""

    async def operator(self) -> None:
        base = f"/apis/{c.CRD_GROUP}/{c.CRD_VERSION}/namespaces/{NS}/{c.PLURAL_WORKLOAD}"
        (doc,) = self.spec("ultraserver-workload.yaml")
        workload = workload_for_sim(doc, ULTRASERVER_TYPE)
        self.say("  kubectl apply -f examples/specs/ultraserver-workload.yaml")
        if doc["spec"]["instanceType"] != workload["spec"]["instanceType"]:
            self.say(
                f"    (instanceType {WORKLOAD_PLACEHOLDER!r} set to {ULTRASERVER_TYPE}, "
                "the simulated UltraServers)"
            )
        bad = copy.deepcopy(workload)
        bad["metadata"]["name"] = "bad-topology"
        bad["spec"]["topologySize"] = 3
        try:
            await self.sim.apply(bad, NS)
        except KubeError as exc:
            expect(
                isinstance(exc, InvalidError) and "spec.topologySize" in str(exc),
                f"topologySize 3: expected 422 naming spec.topologySize, got {exc}",
            )
            self.say(f"  (a copy with topologySize: 3 is refused at admission: {exc})")
        else:
            raise StepFailed("a workload with topologySize 3 was accepted")
        await self.sim.apply(workload, NS)
        name = workload["metadata"]["name"]
        wl = await self.sim.wait_until(
            lambda: (
                (w := self.sim.workload(name))
                and w.get("status", {}).get("state") == "Allocated"
                and w
            ),
            f"workload {name} Allocated",
        )
        status = wl["status"]
        self.say(f"  kubectl get nusw {name}")
        await self.server_table(base)
        self.say(f"  kubectl get nusw {name} -o yaml   (status)")
        shown = {
            k: status.get(k)
            for k in (
                "state",
                "workloadId",
                "allocatedUltraServers",
                "totalNodesAllocated",
                "allocationTime",
            )
        }
        for line in yaml.safe_dump({"status": shown}, sort_keys=False).splitlines():
            self.say("    " + line)
        self.say()
        wid = status["workloadId"]
        expect(status.get("totalNodesAllocated") == 8, f"8 nodes allocated, got {status}")
        expect(len(status.get("allocatedUltraServers") or []) == 2, "2 UltraServers allocated")
        rct_name = workload["spec"]["resourceClaimTemplate"]["name"]
        # Watches of different kinds are not ordered with each other: the template and the
        # slices' tags may show up after the workload's status, so wait for them.
        await self.sim.wait_until(
            lambda: self.sim.view.get("resource.k8s.io/v1", "ResourceClaimTemplate", rct_name, NS),
            f"ResourceClaimTemplate {rct_name} generated",
        )
        tagged = await self.sim.wait_until(
            lambda: self.tagged_nodes(wid, at_least=8), "8 nodes tagged"
        )
        self.say(
            f"  ResourceClaimTemplate {rct_name} generated; workloadId {wid} on the devices "
            f"of {len(tagged)} nodes"
        )
        self.say(f"  kubectl get nus -n {c.DRIVER_NAMESPACE}")
        await self.server_table(
            f"/apis/{c.CRD_GROUP}/{c.CRD_VERSION}/namespaces/{c.DRIVER_NAMESPACE}/{c.PLURAL_ULTRASERVER}"
        )

        (deploy,) = await self.apply_spec("ultraserver-training-deployment.yaml")
        pods = await self.running_workload(deploy)
        rows = []
        ranks: dict[int, PodView] = {}
        for pod in pods:
            v = await self.view(pod)
            node = self.sim.node(v.node)
            rank = int(v.env.get(ENV_RANK, "-1"))
            ranks[rank] = v
            rows.append(
                (
                    v.name,
                    v.node,
                    node.ultraserver_id,
                    rank,
                    v.env.get(ENV_RANK0),
                    mode_label(v.env.get(ENV_MODE)),
                    v.env.get(ENV_NODE),
                )
            )
        rows.sort(key=lambda r: int(str(r[3])))
        self.table(("POD", "NODE", "ULTRASERVER", "RANK", "RANK-0 HOST", "MODE", "NODE ID"), rows)
        expect(sorted(ranks) == list(range(8)), f"ranks 0..7, got {sorted(ranks)}")
        expect(len({v.node for v in ranks.values()}) == 8, "8 pods on 8 different nodes")
        expect(
            {v.node for v in ranks.values()} == set(tagged), "the pods run on the allocated nodes"
        )
        leaders = {v.env.get(ENV_RANK0) for v in ranks.values()}
        leader = self.sim.node_address(ranks[0].node)
        expect(leaders == {leader}, f"one rank-0 host ({leader}), got {leaders}")
        modes = {v.env.get(ENV_MODE) for v in ranks.values()}
        expect(modes == {"1"}, f"topologySize 4: {ENV_MODE}=1 (X4) everywhere, got {modes}")

        self.say("  kubectl delete deployment my-training-workload-deployment")
        await self.remove(deploy)
        self.say(f"  kubectl delete neuronultraserverworkload {name}")
        await self.sim.delete(f"{c.CRD_GROUP}/{c.CRD_VERSION}", c.KIND_WORKLOAD, name, NS)
        await self.sim.wait_until(lambda: self.sim.workload(name) is None, f"workload {name} gone")
        # The template goes with the workload (garbage collection: no instant on a real
        # control plane), so wait for it rather than read once.
        await self.sim.wait_until(
            lambda: (
                self.sim.view.get("resource.k8s.io/v1", "ResourceClaimTemplate", rct_name, NS)
                is None
            ),
            f"ResourceClaimTemplate {rct_name} deleted with the workload",
        )
        await self.sim.wait_until(lambda: not self.tagged_nodes(wid) or None, "tags cleared")
        self.say(f"  released: template {rct_name} deleted, workloadId cleared from every slice")
