"""End-to-end tests over the simulated cluster (``neuron_dra.sim.simcluster``).

Each test runs on the fake world and on the real control plane of every pinned minor
(``world`` fixture; pytest ids ``fake`` / ``real-1.34`` ...). One cluster of the embedded
default (two trn2u.48xlarge UltraServers, two trn2.48xlarge, one trn1.32xlarge, one
inf2.48xlarge: 12 real kubelet plugins, the controller, scheduler and kubelets) is shared by
the package's tests: starting it takes seconds. The ``sim`` fixture hands it to one test and
afterwards returns it to idle (workload controllers stopped, pods, templates and UltraServer
workloads deleted, every claim unprepared and released), so tests do not depend on each
other's order. Tests that break nodes build their own cluster (on a real world, with a
control plane of their own).
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from neuron_dra.common import constants as c
from neuron_dra.sim.commands.walkthrough import Walkthrough
from neuron_dra.sim.simcluster import SimCluster, default_nodes
from neuron_dra.sim.worlds import cluster_kwargs, world_params

NS = "default"


async def reset(sim: SimCluster) -> None:
    """Back to an idle cluster, through the API like a user would."""
    assert sim.cp is not None
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
        )

    await sim.wait_until(idle, "the cluster back to idle")


@pytest.fixture(scope="package", params=world_params())
def world(request: pytest.FixtureRequest) -> str:
    """``fake`` or ``real-<minor>``: every e2e test runs on each (the ids say which)."""
    return str(request.param)


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def shared_cluster(world: str) -> AsyncIterator[SimCluster]:
    async with SimCluster(default_nodes(), **cluster_kwargs(world)) as sim:
        yield sim


@pytest_asyncio.fixture(loop_scope="package")
async def sim(shared_cluster: SimCluster) -> AsyncIterator[SimCluster]:
    yield shared_cluster
    await reset(shared_cluster)


@pytest_asyncio.fixture(loop_scope="package")
async def walk(sim: SimCluster) -> Walkthrough:
    """The walkthrough's steps, printing into a buffer (``walk.out.getvalue()``)."""
    return Walkthrough(sim, io.StringIO())
