"""End-to-end tests over the simulated cluster (``neuron_dra.sim.simcluster``).

Each test runs on the fake world and on the real control plane of every pinned minor
(``world`` fixture; pytest ids ``fake`` / ``real-1.34`` ...). One cluster of the embedded
default (two trn2u.48xlarge UltraServers, two trn2.48xlarge, one trn1.32xlarge, one
inf2.48xlarge: 12 real kubelet plugins, the controller, scheduler and kubelets) is shared by
the package's tests: starting it takes seconds. The ``sim`` fixture hands it to one test and
afterwards returns it to idle (workload controllers stopped, pods, templates and UltraServer
workloads deleted, every claim unprepared and released), so tests do not depend on each
other's order. Tests that break nodes use a cluster of their own (tests/e2e_clusters).
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from neuron_dra.sim.commands.walkthrough import Walkthrough
from neuron_dra.sim.simcluster import SimCluster, default_nodes
from neuron_dra.sim.worlds import cluster_kwargs, world_params

from .reset import reset


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
