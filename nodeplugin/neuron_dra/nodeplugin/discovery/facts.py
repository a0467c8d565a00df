"""What this node's inventory means, as the slice builder and Prepare both read it: its
instance profile, default LNC, UltraServer sizes and each device's cores. Pure."""

from __future__ import annotations

from neuron_dra.common.profiles import InstanceProfile, profile_for
from neuron_dra.nodeplugin.discovery.model import NeuronDevice, NodeInventory


class InventoryError(ValueError):
    """The inventory cannot be described (e.g. no instance type): nothing can be published.

    Retryable from the plugin's point of view: discovery may learn more (the Node label, a
    loaded driver) on its next pass.
    """


def inventory_profile(inventory: NodeInventory) -> InstanceProfile:
    """The instance profile for the node, falling back to what discovery saw for new types."""
    if not inventory.instance_type:
        raise InventoryError(
            f"node {inventory.node_name}: instance type unknown (no DMI product_name and no "
            "node.kubernetes.io/instance-type label)"
        )
    first = min(inventory.devices, key=lambda d: d.index) if inventory.devices else None
    return profile_for(
        inventory.instance_type,
        discovered_device_count=len(inventory.devices) or None,
        discovered_cores_per_device=first.core_count if first else None,
        arch=first.device_name if first else None,
        discovered_neighbours={d.index: d.connected for d in inventory.devices},
    )


def node_default_lnc(inventory: NodeInventory, profile: InstanceProfile) -> int:
    """The LNC a container gets when its claim does not configure one.

    The node-wide setting (``/opt/aws/neuron/logical_nc_config``) counts only where the type
    supports it; a stray value on e.g. trn1 is ignored rather than publishing nonsense.
    """
    lnc = inventory.lnc_default
    return lnc if lnc is not None and lnc in profile.allowed_lnc else profile.default_lnc


def ultraserver_node_counts(inventory: NodeInventory, profile: InstanceProfile) -> tuple[int, ...]:
    """UltraServer sizes (in nodes) this node can take part in; () if not UltraServer-capable.

    The driver's ``ultraserver_mode`` list is authoritative when present (it reflects the
    election and link state); the profile covers drivers that do not publish it.
    """
    us = inventory.ultraserver
    if us is not None and us.modes:
        return us.node_counts
    return profile.ultraserver_node_counts


def device_core_count(device: NeuronDevice, profile: InstanceProfile) -> int:
    return device.core_count if device.core_count is not None else profile.cores_per_device
