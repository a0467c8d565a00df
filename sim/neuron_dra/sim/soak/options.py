"""The soak's settings (``hack/soak``'s flags) and the constants of the cluster it builds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_dra.sim.realcluster import APISERVER, CONTROLLER_MANAGER, ETCD, SCHEDULER

JsonDict = dict[str, Any]
NS = "default"
CONTROLLER_LEASE = "neuron-dra-controller"
TOPOLOGY_SIZE = 4
INSTANCE_TYPE = "trn2u.48xlarge"
#: Longest nodes directory that leaves room for ``/<node>/plugins/<driver>/dra.sock``.
SHORT_PATH = 50
CONTROL_PLANE = (ETCD, APISERVER, CONTROLLER_MANAGER, SCHEDULER)


@dataclass
class Options:
    minutes: float = 5.0
    seed: int = 1
    nodes: int = 16
    minor: str = "1.34"
    workdir: Path | None = None
    #: Mean seconds between two faults (each waits for the system to be whole again).
    fault_interval: float = 20.0
    #: Mean seconds between two churn operations.
    op_interval: float = 1.5
    #: A deleted workload's devices must be free this long after the system is whole.
    free_bound: float = 60.0
    #: How long the system may take to be whole after a fault, or to converge at the end.
    recover_limit: float = 180.0
    converge_limit: float = 240.0
    #: Churn past ``minutes`` until every planned fault has fired and its recovery was seen
    #: (faults run one after another, each waiting for the system to be whole: on a slow
    #: machine they take longer, and a fixed window would end before the last ones).
    until_faults: bool = False
    #: With ``until_faults``: the churn's limit, in s from its start; the faults not reached
    #: by then are a violation that names them.
    churn_limit: float = 900.0
    #: The faults to inject instead of the seed's draw, each ``AT:KIND:TARGET:DOWNTIME``
    #: (``--fault``; :func:`neuron_dra.sim.soak.faults.forced_schedule` reads them), so that
    #: a run that chose its faults replays with them.
    faults: tuple[str, ...] = ()
    #: Real nodes (real kubelets, containerd, containers) instead of simulated kubelets.
    real_nodes: bool = False
    keep: bool = False
    quiet: bool = False

    def command(self) -> str:
        """The command that replays this run (the same seed: the same faults and operations)."""
        real = " --real-nodes" if self.real_nodes else ""
        until = f" --until-faults --churn-limit {self.churn_limit:g}" if self.until_faults else ""
        forced = "".join(f" --fault {fault}" for fault in self.faults)
        return (
            f"hack/soak --minutes {self.minutes:g} --seed {self.seed} --nodes {self.nodes} "
            f"--minor {self.minor} --fault-interval {self.fault_interval:g} "
            f"--op-interval {self.op_interval:g} --free-bound {self.free_bound:g}"
            f"{real}{until}{forced}"
        )
