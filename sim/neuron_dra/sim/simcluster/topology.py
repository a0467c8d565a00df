"""Which nodes a simulated cluster has: pure data, no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

#: The instance type of the default cluster's UltraServers.
ULTRASERVER_TYPE: Final = "trn2u.48xlarge"
KUBELET_VERSION: Final = "v1.34.2"


@dataclass(frozen=True)
class SimNode:
    """One emulated node: its kubelet plugin runs ``--emulation-mode instance_type``."""

    name: str
    instance_type: str
    ultraserver_id: str | None = None
    ultraserver_node_id: int | None = None


def ultraserver(
    ultraserver_id: str, *, prefix: str, instance_type: str = ULTRASERVER_TYPE, size: int = 4
) -> list[SimNode]:
    """The ``size`` nodes of one UltraServer: ``<prefix>-n0`` .. ``<prefix>-n<size-1>``."""
    return [SimNode(f"{prefix}-n{i}", instance_type, ultraserver_id, i) for i in range(size)]


def ultraserver_id(index: int) -> str:
    """The ``index``-th simulated UltraServer id: 16 hex digits, the form the hardware's
    ``server_id`` file holds (the emulated tree writes it as given)."""
    return f"{0x5EED0000A0000000 + index:016x}"


def ultraservers(count: int, *, instance_type: str = ULTRASERVER_TYPE) -> list[SimNode]:
    """``count`` UltraServers (:func:`ultraserver_id`), nodes ``<family>-<i>-n<j>``
    (``trn2u-0-n0`` ...)."""
    prefix = instance_type.split(".", 1)[0]
    return [
        node
        for i in range(count)
        for node in ultraserver(
            ultraserver_id(i), prefix=f"{prefix}-{i}", instance_type=instance_type
        )
    ]


def default_nodes() -> list[SimNode]:
    """The embedded default (issue 5): two trn2u.48xlarge UltraServers (8 nodes), two
    trn2.48xlarge, one trn1.32xlarge and one inf2.48xlarge."""
    return [
        *ultraservers(2),
        SimNode("trn2-0", "trn2.48xlarge"),
        SimNode("trn2-1", "trn2.48xlarge"),
        SimNode("trn1-0", "trn1.32xlarge"),
        SimNode("inf2-0", "inf2.48xlarge"),
    ]


def check_unique(nodes: Sequence[SimNode]) -> None:
    """Refuse duplicate node names or UltraServer node ids (what would confuse a reader
    of the sim more than any error message)."""
    seen: set[str] = set()
    slots: set[tuple[str, int]] = set()
    for node in nodes:
        if node.name in seen:
            raise ValueError(f"node {node.name} appears twice")
        seen.add(node.name)
        if node.ultraserver_id is not None:
            slot = (node.ultraserver_id, int(node.ultraserver_node_id or 0))
            if slot in slots:
                raise ValueError(f"UltraServer {slot[0]} has two nodes with node id {slot[1]}")
            slots.add(slot)


#: DNS suffix of the simulated nodes' ``InternalDNS`` (EKS: ``<region>.compute.internal``).
DNS_SUFFIX: Final = "sim.compute.internal"


def node_dns_name(name: str) -> str:
    return f"{name}.{DNS_SUFFIX}"


def node_object(node: SimNode, index: int = 0) -> dict[str, Any]:
    """The Node as a kubelet registers it: Ready, with the well-known labels and addresses
    (the kubelet plugin hands rank 0's address to every rank as NEURON_GLOBAL_TOPOID0_HOST)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": {
                "kubernetes.io/hostname": node.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": node.instance_type,
            },
        },
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": f"10.0.{index // 250}.{index % 250 + 4}"},
                {"type": "InternalDNS", "address": node_dns_name(node.name)},
                {"type": "Hostname", "address": node.name},
            ],
            "conditions": [ready_condition(True)],
            "nodeInfo": {"kubeletVersion": KUBELET_VERSION},
        },
    }


def ready_condition(ready: bool, *, reason: str | None = None) -> dict[str, Any]:
    return {
        "type": "Ready",
        "status": "True" if ready else "False",
        "reason": reason or ("KubeletReady" if ready else "KubeletNotReady"),
        "message": "kubelet is posting ready status" if ready else "kubelet stopped posting",
    }
