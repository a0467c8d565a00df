"""The kubelet side of the plugin on real nodes: a small cluster (two trn2.48xlarge nodes, no
controller) per kubelet minor: 1.34 and 1.37 on their own control planes, and the kubelets
pinned for their nodes only (1.35, 1.36) against the newest control plane, as the
version-skew policy allows: the real-node smoke of those minors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from neuron_dra.nodeplugin.prepare.cdi import list_cdi_specs
from neuron_dra.sim.kubebuild import kube_modules, newest_minor
from neuron_dra.sim.realcluster import enabled_minors
from neuron_dra.sim.simcluster import SimCluster, SimNode
from neuron_dra.sim.worlds import real_control_plane, require_real_nodes

NS = "default"
NODES = [SimNode("kn-0", "trn2.48xlarge"), SimNode("kn-1", "trn2.48xlarge")]


def kubelet_params() -> list[str]:
    full = enabled_minors()
    if not full:
        return []
    nodes_only = [m.name for m in kube_modules() if not m.has_control_plane]
    return [*full, *(nodes_only if newest_minor() in full else [])]


@pytest.fixture(scope="package", params=kubelet_params())
def kubelet(request: pytest.FixtureRequest) -> str:
    """The kubelets' minor (pytest ids: ``1.34`` ...)."""
    return str(request.param)


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def cluster(kubelet: str) -> AsyncIterator[SimCluster]:
    require_real_nodes(kubelet)
    full = kubelet in enabled_minors()
    control_plane = real_control_plane(kubelet if full else newest_minor())
    async with SimCluster(
        NODES,
        kubernetes="real",
        control_plane=control_plane,
        minor=control_plane.minor,
        kubelet_minor=kubelet,
        kubelet_verbosity=3,  # "Processing resource": the kubelet has begun a Prepare
        plugin_args=("--rescan-interval", "2"),  # health changes show in seconds
        controller=False,
    ) as sim:
        yield sim


@pytest_asyncio.fixture(loop_scope="package")
async def sim(cluster: SimCluster) -> AsyncIterator[SimCluster]:
    """The kubelet minor's cluster, its pods and templates deleted afterwards."""
    yield cluster
    for p in cluster.pods(NS):
        await cluster.delete("v1", "Pod", p["metadata"]["name"], NS)
    for kind in ("ResourceClaimTemplate", "ResourceClaim"):
        for o in cluster.view.list("resource.k8s.io/v1", kind, NS):
            await cluster.delete("resource.k8s.io/v1", kind, o["metadata"]["name"], NS)
    try:
        await cluster.wait_until(lambda: cluster.idle(NS), "pods gone and every claim unprepared")
    except TimeoutError as exc:
        left = {
            "pods": [(p["metadata"]["name"], p["status"].get("phase")) for p in cluster.pods(NS)],
            "claims": [c["metadata"]["name"] for c in cluster.claims(NS)],
            "cdi": {
                n.name: sorted(list_cdi_specs(cluster.cdi_root(n.name))) for n in cluster.nodes
            },
        }
        raise TimeoutError(f"{exc}: left {left}") from None
