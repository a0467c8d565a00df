"""The chaos soak in short on real nodes (``hack/soak --real-nodes``): a fixed seed, 4 real
nodes (one UltraServer), a churn of at least 75 s that goes on until every kind of fault has
fired once and the system was whole again after it: kill -9 of the controller leader and
standby, a plugin, each control-plane component, a kubelet and a containerd, and a node
reboot. The faults run one after another, each waiting for the system to recover, so a slow
machine makes the soak longer, not red; a fault not reached within the churn's limit is a
violation that names it. It must end with no violation (including: every Running container
has exactly its claims' devices and environment) and no process left behind."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from neuron_dra.sim.realcluster import APISERVER, CONTROLLER_MANAGER, ETCD, SCHEDULER
from neuron_dra.sim.realnode.fleet import node_tier_problem
from neuron_dra.sim.soak.children import PLUGIN
from neuron_dra.sim.soak.faults import LEADER, STANDBY, Fault, fault_text
from neuron_dra.sim.soak.harness import Soak
from neuron_dra.sim.soak.options import Options
from neuron_dra.sim.soak.realnodes import CONTAINERD_KILL, KUBELET_KILL, REBOOT
from neuron_dra.sim.worlds import require_built

MINOR = "1.34"
EVERY_KIND = (
    LEADER, STANDBY, PLUGIN, SCHEDULER, CONTROLLER_MANAGER, APISERVER, ETCD,
    KUBELET_KILL, CONTAINERD_KILL, REBOOT,
)  # fmt: skip
#: The nodes' faults fall on different nodes; the reboot on one whose pods then run again.
_TARGETS = {PLUGIN: "trn2u-0-n2", KUBELET_KILL: "trn2u-0-n1", CONTAINERD_KILL: "trn2u-0-n3"}
_TARGETS[REBOOT] = "trn2u-0-n0"


def test_short_soak_on_real_nodes_loses_nothing_under_every_fault(tmp_path: Path) -> None:
    require_built(MINOR)
    problem = node_tier_problem(MINOR)
    if problem:
        pytest.fail(f"real nodes cannot run: {problem}")
    soak = Soak(
        Options(
            minutes=1.25,
            seed=13,
            nodes=4,
            minor=MINOR,
            workdir=tmp_path / "soak",
            fault_interval=6.0,
            real_nodes=True,
            until_faults=True,
            faults=EVERY_KIND_ONCE,
            quiet=True,
        )
    )
    code = asyncio.run(soak.run())
    report = soak.report(True)
    assert code == 0, report["violations"]
    assert set(report["faults"]) == set(EVERY_KIND), report["faults"]
    assert report["operations"], report
    assert report["free_latency_s"]["n"] > 0
    # The container check ran: Running containers were looked into, not skipped.
    assert report["containers_looked_into"] > 0, report


#: Every kind once, in a fixed order (``--fault`` each, so the replay line carries them). The
#: seed's drawn faults are the longer soak's (``hack/soak``): with the churn lasting until
#: every planned fault has fired, a tail of drawn faults would only lengthen this one.
EVERY_KIND_ONCE = tuple(
    fault_text(Fault(8.0 + 6.0 * i, kind, _TARGETS.get(kind, kind), 1.0))
    for i, kind in enumerate(EVERY_KIND)
)


pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")
