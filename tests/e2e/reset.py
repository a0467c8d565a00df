"""Back to an idle cluster between tests that share one."""

from __future__ import annotations

from neuron_dra.common import constants as c
from neuron_dra.sim.simcluster import SimCluster
from neuron_dra.sim.simcluster.cluster import RECOVERY_LIMIT

NS = "default"


async def reset(sim: SimCluster) -> None:
    """Back to an idle cluster, through the API like a user would; nodes that failed come
    back first (their kubelets finish the pods deleted meanwhile)."""
    assert sim.cp is not None
    for node in sorted(sim.failed_nodes):
        await sim.recover_node(node)
    for workload in list(sim.cp.workloads):
        await sim.cp.remove(workload)
    for w in sim.view.list(c.CRD_API_VERSION, c.KIND_WORKLOAD, NS):
        await sim.delete(c.CRD_API_VERSION, c.KIND_WORKLOAD, w["metadata"]["name"], NS)
    for pod in sim.pods(NS):
        await sim.delete("v1", "Pod", pod["metadata"]["name"], NS)
    for rct in sim.view.list("resource.k8s.io/v1", "ResourceClaimTemplate", NS):
        await sim.delete("resource.k8s.io/v1", "ResourceClaimTemplate", rct["metadata"]["name"], NS)

    def idle() -> bool:
        states = {(u.get("status") or {}).get("state") for u in sim.ultraservers()}
        return (
            sim.idle(NS)
            and not sim.view.list(c.CRD_API_VERSION, c.KIND_WORKLOAD, NS)
            and states <= {"Available"}
            and sim.whole()
        )

    await sim.wait_until(idle, "the cluster back to idle", RECOVERY_LIMIT)
