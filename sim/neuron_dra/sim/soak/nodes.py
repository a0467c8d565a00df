"""What the soak needs of its nodes, whichever they are: simulated kubelets in the soak's own
process (:mod:`.simnodes`, the fast default) or real nodes, with real kubelets, containerd
and containers (:mod:`.realnodes`, ``hack/soak --real-nodes``). The harness, the faults and
the checks read the nodes only through this."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from neuron_dra.sim.soak.options import JsonDict

if TYPE_CHECKING:
    from neuron_dra.sim.soak.children import Child
    from neuron_dra.sim.soak.faults import Fault


class SoakNodes(Protocol):
    #: The faults of the nodes themselves (kind → weight in the schedule); none when the
    #: nodes are simulated.
    fault_weights: Mapping[str, int]

    async def start(self) -> None:
        """The nodes up, and each node's plugin started and added to ``soak.children``."""

    async def registered(self) -> bool | str:
        """True once every node's kubelet registered its plugin; else what is missing."""

    async def plugin_ready(self, child: Child) -> bool:
        """The plugin's ``/readyz``: registered and its slice published."""

    def plugin_restarted(self, child: Child) -> None:
        """A plugin process was started again (a simulated kubelet re-registers it)."""

    def down(self) -> str | None:
        """Which of the nodes' own processes (kubelet, containerd) is down, or None."""

    async def restart_dead(self) -> None:
        """Restart a node process that died by itself (systemd's ``Restart=always``)."""

    async def inject(self, fault: Fault) -> float:
        """Do a node fault (kill, planned downtime, restart); returns the monotonic time of
        the restart, from which recovery is measured."""

    def checkpoint(self, node: str) -> Path:
        """The plugin's checkpoint file of ``node``, as a host path."""

    def cdi_root(self, node: str) -> Path:
        """The plugin's CDI spec directory of ``node``, as a host path."""

    def kubelet_prepared(self, node: str) -> set[str]:
        """The claim UIDs ``node``'s kubelet holds prepared."""

    def pod_container(self) -> JsonDict:
        """The churn's pods' container (image, command): one a check can look inside."""

    async def check_containers(self, snap: JsonDict, *, every: bool) -> list[tuple[str, str]]:
        """What Running containers got that their claims do not give (each new container
        once; ``every``: all of them again)."""

    def containers_looked_into(self) -> int:
        """How many containers the check looked inside so far."""

    def container_looks_failed(self) -> list[str]:
        """The looks inside that failed (each tried again later), with why."""

    async def stop(self) -> None: ...
