"""A node's inventory as discovery would report it for a known instance type, for tests that
need one without an emulated sysfs tree (each device as the profile says, with the options
the tests vary)."""

from __future__ import annotations

from neuron_dra.common.profiles import PROFILES
from neuron_dra.nodeplugin.discovery.model import (
    NeuronDevice,
    NodeInventory,
    PciLocation,
    UltraServerInfo,
)


def efa_address(index: int) -> str:
    """The PCI address of the EFA device paired with Neuron device ``index`` (four a bus)."""
    return f"0000:{0x10 + index // 4:02x}:{0x1B + index % 4:02x}.0"


def profile_inventory(
    instance_type: str,
    node_name: str,
    *,
    ultraserver: UltraServerInfo | None = None,
    chip_name: bool = True,
    efa: bool = False,
    pci: bool = False,
    unhealthy: tuple[int, ...] = (),
) -> NodeInventory:
    """Every device of ``instance_type``: with the profile's chip name (``chip_name``), its
    EFA pair (``efa``), a PCI location (``pci``: bus ``0x11 + index``, root ``0x10 + index``,
    NUMA node ``index // 8``), healthy unless in ``unhealthy``."""
    profile = PROFILES[instance_type]
    return NodeInventory(
        node_name=node_name,
        instance_type=instance_type,
        driver_version="2.24.7.0",
        devices=tuple(
            NeuronDevice(
                index=i,
                dev_path=f"/dev/neuron{i}",
                core_count=profile.cores_per_device,
                device_name=profile.device_name if chip_name else None,
                efa_pci_address=efa_address(i) if efa else None,
                pci=PciLocation(f"0000:{0x11 + i:02x}:00.0", f"pci0000:{0x10 + i:02x}", i // 8)
                if pci
                else None,
                healthy=i not in unhealthy,
            )
            for i in range(profile.device_count)
        ),
        ultraserver=ultraserver,
    )
