"""What discovery reports about a node: the contract between discovery and the rest.

Discovery (real sysfs, pyudev, or an emulated tree) produces a ``NodeInventory``;
the ResourceSlice builder, the CDI edit computation and the node labeller are
pure functions of it (plus the Node's labels). Values the hardware did not give
us are ``None`` rather than guessed, and everything discovery had to ignore is
listed in ``problems`` so it can be logged with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from neuron_dra.common.profiles import UltraServerMode


class FailureClass(Enum):
    """What kind of health signal found a device unhealthy: each has its own taint key, so an
    admin or a claim can tolerate one class and not another (docs/configuration.md, "Device
    health and taints")."""

    #: The driver names the failed component (``stats/hardware/health_status/
    #: unhealthy_components``: hbm, sram, a link ...).
    COMPONENT = "component"
    #: Memory returned data its ECC could not correct (``stats/hardware/*_ecc_uncorrected``).
    UNCORRECTED_ECC = "uncorrected-ecc"


@dataclass(frozen=True)
class HealthFault:
    """One reason a device is unhealthy: its class, what failed (a component, a counter) and
    the sentence users read in events and the pod's resource health."""

    kind: FailureClass
    #: The failed component (``hbm``) or the counter (``mem_ecc_uncorrected``).
    item: str
    reason: str


#: ``server_id_<n>`` value meaning "no UltraServer / election not done".
NO_SERVER_ID = "0000000000000000"


@dataclass(frozen=True)
class PciLocation:
    """Where a Neuron device sits on the PCI bus (``discovery/pci.py`` says how it is known)."""

    #: ``0000:58:00.0``: the PCI device bound to the neuron driver that is this device.
    bus_id: str
    #: ``pci0000:57``: the root complex above it; None if sysfs does not show one.
    pcie_root: str | None = None
    #: NUMA node of the PCI device; None when the kernel reports none (-1).
    numa_node: int | None = None


@dataclass(frozen=True)
class NeuronDevice:
    """One ``/dev/neuron<index>`` device."""

    index: int
    #: Path of the device node as the container runtime must see it (host path), e.g. /dev/neuron3.
    dev_path: str
    #: Physical NeuronCores (sysfs ``core_count``; not LNC-aware). None if unreadable.
    core_count: int | None = None
    #: Neighbour device indices from ``connected_devices``.
    connected: tuple[int, ...] = ()
    #: ``info/architecture/arch_type`` (e.g. NDv3), ``device_name`` (e.g. Trainium2),
    #: ``instance_type`` (family as the driver names it, e.g. Trn2).
    arch_type: str | None = None
    device_name: str | None = None
    arch_instance_family: str | None = None
    serial_number: str | None = None
    #: PCI address of the EFA device paired with this Neuron device, when known; drives the
    #: AWS connected-group id rule (docs/architecture.md, "Discovery → ResourceSlice").
    efa_pci_address: str | None = None
    #: False when hardware health signals report a problem; ``faults`` say which.
    healthy: bool = True
    faults: tuple[HealthFault, ...] = ()
    #: The device node is a placeholder file of emulation mode, not a character device.
    emulated: bool = False
    #: PCI address, root complex and NUMA node; None when no trustworthy source names the
    #: PCI device behind ``/dev/neuron<index>`` (sysfs does not link the two).
    pci: PciLocation | None = None

    @property
    def unhealthy_reasons(self) -> tuple[str, ...]:
        return tuple(f.reason for f in self.faults)


@dataclass(frozen=True)
class UltraServerInfo:
    """Class-level UltraServer election results (``/sys/class/neuron_device/*``)."""

    #: Supported driver modes from ``ultraserver_mode`` (empty: not an UltraServer platform).
    modes: tuple[UltraServerMode, ...] = ()
    #: 16 hex chars from ``server_id_2`` / ``server_id_4``; None when unset (all zeros) or busy.
    server_id_2: str | None = None
    server_id_4: str | None = None
    #: ``node_id_2`` / ``node_id_4``; None when -1, busy or invalid.
    node_id_2: int | None = None
    node_id_4: int | None = None

    @property
    def node_counts(self) -> tuple[int, ...]:
        """Supported UltraServer sizes in nodes, ascending (e.g. (1, 2, 4))."""
        return tuple(sorted({m.node_count for m in self.modes}))

    @property
    def supports_x2v(self) -> bool:
        return UltraServerMode.X2V in self.modes


@dataclass(frozen=True)
class NodeInventory:
    """Everything discovery learned about this node's Neuron hardware."""

    node_name: str
    #: EC2 instance type (DMI ``product_name``, else the Node label); None if unknown.
    instance_type: str | None
    #: ``/sys/module/neuron/version``, e.g. 2.24.7.0; None if the module is not loaded.
    driver_version: str | None
    devices: tuple[NeuronDevice, ...]
    ultraserver: UltraServerInfo | None = None
    #: Node-wide default LNC from ``/opt/aws/neuron/logical_nc_config`` when present.
    lnc_default: int | None = None
    #: Things discovery ignored, each with its reason (logged, never fatal).
    problems: tuple[str, ...] = field(default=())

    def device(self, index: int) -> NeuronDevice | None:
        return next((d for d in self.devices if d.index == index), None)
