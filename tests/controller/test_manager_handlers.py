"""The manager's event handlers queue the right keys (no API server: the stores are fed by
hand, the queues are read back)."""

from __future__ import annotations

from kubernetes_asyncio import client as k8s_client
from neuron_dra.common.constants import DRIVER_NAMESPACE
from neuron_dra.common.k8s.client import KubeClient
from neuron_dra.common.ultraserver import workload_id
from neuron_dra.controller.manager import ControllerManager, ManagerConfig
from neuron_dra.controller.workloads import orphan_claims_key


async def test_a_workload_gone_for_good_has_its_leftover_claims_looked_for() -> None:
    """A claim made from the template while the workload was being deleted still belonged
    to a known workload when it arrived, and an allocated claim gets no further event: the
    workload's final delete must queue the orphan check, or the claim (and its pod) stay."""
    kube = KubeClient(k8s_client.ApiClient(k8s_client.Configuration()), owned=True)
    manager = ControllerManager(kube, ManagerConfig(namespace=DRIVER_NAMESPACE))
    try:
        workload = {
            "apiVersion": "neuron.aws.com/v1beta1",
            "kind": "NeuronUltraServerWorkload",
            "metadata": {"name": "train", "namespace": "team-a", "uid": "1234-abcd"},
        }
        manager.ctx.workloads.replace([workload], "1")
        delta = manager.ctx.workloads.apply_event("DELETED", workload)
        assert delta is not None
        workloads_reflector = next(
            r for r in manager.reflectors if r.store is manager.ctx.workloads
        )
        await workloads_reflector._dispatch(delta)  # what the reflector does after a watch event
        queued = []
        while len(manager.workload_queue):
            key = await manager.workload_queue.get()
            queued.append(key)
            manager.workload_queue.done(key)
        wid = workload_id("train", "1234-abcd")
        assert orphan_claims_key("team-a", wid) in queued
        assert "team-a/train" in queued  # and the workload's own key, as before
    finally:
        await kube.close()
