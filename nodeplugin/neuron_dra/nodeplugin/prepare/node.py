"""The node as Prepare reads it: the one module of ``prepare/`` that reads discovery's inventory
(pure).

Prepare needs a few facts of its node: the instance profile, the LNC a container gets when its
claim sets none, each Neuron device's node, the UltraServer ids of the node's election, and
what a claim is checked against (:class:`~.claims.NodeFacts`). :class:`PrepareNode` answers in
Prepare's words, so the rest of the room does not depend on how discovery describes a node.
The plugin hands the preparer a fresh one per read (dependency injection: the preparer is
given ``Callable[[], PrepareNode]``). Each answer is computed from the inventory when asked
for, as it was before this view existed, so a node that cannot be described (no instance
type) fails the same step of Prepare as it did.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from neuron_dra.common.profiles import InstanceProfile
from neuron_dra.nodeplugin.discovery.facts import (
    InventoryError,
    inventory_profile,
    node_default_lnc,
    ultraserver_node_counts,
)
from neuron_dra.nodeplugin.discovery.model import NodeInventory
from neuron_dra.nodeplugin.prepare.claims import NodeFacts


class UndescribedNode(LookupError):
    """The node cannot be described yet (e.g. no instance type): retryable, as discovery may
    learn more on its next pass (a Node label, a loaded driver)."""


@dataclass(frozen=True)
class DeviceNode:
    """One Neuron device's node as the container runtime is given it."""

    #: The device node's path on the host (``/dev/neuron3``, or under another /dev root).
    host_path: str
    #: A placeholder file of emulation mode, not a character device.
    emulated: bool


@dataclass(frozen=True)
class UltraServerIds:
    """The node's ids in one UltraServer grouping (2 or 4 nodes), once elected."""

    server_id: str
    node_id: int


class PrepareNode:
    """This node's facts as Prepare needs them, read from one inventory."""

    def __init__(self, inventory: NodeInventory) -> None:
        self._inventory = inventory

    @property
    def name(self) -> str:
        return self._inventory.node_name

    @functools.cached_property
    def profile(self) -> InstanceProfile:
        """The instance profile; raises discovery's InventoryError (a ValueError) when the
        instance type is unknown."""
        return inventory_profile(self._inventory)

    @property
    def default_lnc(self) -> int:
        """The LNC a container gets when its claim does not configure one."""
        return node_default_lnc(self._inventory, self.profile)

    def device(self, index: int) -> DeviceNode | None:
        """Neuron device ``index``'s node; None when discovery did not see the device."""
        device = self._inventory.device(index)
        if device is None:
            return None
        return DeviceNode(host_path=device.dev_path, emulated=device.emulated)

    @property
    def supports_x2v(self) -> bool:
        """Whether the node's 2-node UltraServer pairs run over vertical links."""
        us = self._inventory.ultraserver
        return bool(us and us.supports_x2v)

    def ultraserver_ids(self, node_count: int) -> UltraServerIds | None:
        """The node's server and node id in its ``node_count``-node grouping (2 or 4); None
        before the election is done, or for any other size (a single node has no peers)."""
        us = self._inventory.ultraserver
        if us is None or node_count < 2:
            return None
        four = node_count == 4
        server_id = us.server_id_4 if four else us.server_id_2
        node_id = us.node_id_4 if four else us.node_id_2
        if server_id is None or node_id is None:
            return None
        return UltraServerIds(server_id, node_id)

    def facts(self) -> NodeFacts:
        """What a claim is checked against (the plugin's view: discovery's). Raises
        :class:`UndescribedNode` when the instance type cannot be described."""
        try:
            profile = self.profile
        except InventoryError as exc:
            raise UndescribedNode(str(exc)) from None
        counts = ultraserver_node_counts(self._inventory, profile)
        elected = frozenset(n for n in counts if n > 1 and self.ultraserver_ids(n) is not None)
        return NodeFacts(
            profile=profile,
            device_indices=frozenset(d.index for d in self._inventory.devices),
            ultraserver_node_counts=counts,
            ultraserver_elected=elected,
        )
