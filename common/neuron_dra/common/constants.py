"""Names that other programs, users and the kubelet depend on.

Everything here is part of a wire contract: ResourceSlice attributes that users write CEL
against, Node labels that LeaderWorkerSet annotations refer to, CRD coordinates that kubectl
and RBAC use. Changing a value is a breaking change for someone outside this repository, so
each one is defined exactly once, here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

# --- driver and device classes --------------------------------------------------------------

DRIVER_NAME: Final = "neuron.aws.com"
#: Unqualified attribute and capacity names live in the driver's domain.
ATTRIBUTE_DOMAIN: Final = DRIVER_NAME

#: Selects every Neuron device that is not reserved for an UltraServer workload.
DEVICE_CLASS_NEURON: Final = "neuron.aws.com"
#: Used by the ResourceClaimTemplates the controller generates for workloads.
DEVICE_CLASS_ULTRASERVER: Final = "ultraserver.neuron.aws.com"
#: Backs the device plugin's extended resource (pods asking ``aws.amazon.com/neuron``).
DEVICE_CLASS_EXTENDED_RESOURCE: Final = "extended-resource.neuron.aws.com"
#: The Neuron device plugin's whole-device extended resource.
EXTENDED_RESOURCE_NEURON: Final = "aws.amazon.com/neuron"

#: Namespace of the driver's own objects, including every NeuronUltraServer.
DRIVER_NAMESPACE: Final = "neuron-dra-driver"

DEVICE_NAME_PREFIX: Final = "neurondevice"
#: The whole-node device published on UltraServer-capable nodes.
NODE_DEVICE_NAME: Final = "neuronnode"


def device_name(device_id: int) -> str:
    """ResourceSlice device name of Neuron device ``device_id`` (``/dev/neuron<N>``)."""
    if device_id < 0:
        raise ValueError(f"device id must be >= 0, got {device_id}")
    return f"{DEVICE_NAME_PREFIX}{device_id}"


def device_index(name: str) -> int | None:
    """The device id a :func:`device_name` names; None for any other name (``neuronnode``,
    another driver's device, a non-canonical spelling such as ``neurondevice03``)."""
    digits = name.removeprefix(DEVICE_NAME_PREFIX)
    if digits == name or not (digits.isascii() and digits.isdigit()):
        return None
    index = int(digits)
    return index if device_name(index) == name else None


# --- ResourceSlice API limits (resource.k8s.io/v1 validation, Kubernetes 1.34) -------------

MAX_DEVICES_PER_SLICE: Final = 128
MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE: Final = 32
MAX_ATTRIBUTE_ID_LENGTH: Final = 32
MAX_ATTRIBUTE_VALUE_LENGTH: Final = 64

# --- device attributes ----------------------------------------------------------------------

ATTR_DEVICE_ID: Final = "deviceId"
ATTR_RESOURCE_TYPE: Final = "resourceType"
ATTR_INSTANCE_TYPE: Final = "instanceType"
ATTR_NEURON_DRIVER_VERSION: Final = "neuronDriverVersion"
ATTR_DRA_DRIVER_VERSION: Final = "draDriverVersion"
ATTR_CORE_COUNT: Final = "coreCount"
ATTR_LOGICAL_CORE_COUNT: Final = "logicalCoreCount"
ATTR_TOPOLOGY_X: Final = "topology_x"
ATTR_TOPOLOGY_Y: Final = "topology_y"
ATTR_TOPOLOGY4_ID: Final = "topology4_id"
ATTR_TOPOLOGY8_ID: Final = "topology8_id"
ATTR_NETWORK_NODE_LAYER1: Final = "networkNodeLayer1"
ATTR_NETWORK_NODE_LAYER2: Final = "networkNodeLayer2"
ATTR_NETWORK_NODE_LAYER3: Final = "networkNodeLayer3"
ATTR_ULTRASERVER_ID: Final = "ultraserverId"
ATTR_CAPACITY_BLOCK_ID: Final = "capacityBlockId"
ATTR_ULTRASERVER_NODE_ID: Final = "ultraserverNodeId"
ATTR_ULTRASERVER_MODES: Final = "ultraserverModes"
ATTR_WORKLOAD_ID: Final = "workloadId"
ATTR_HEALTHY: Final = "healthy"

#: Connected-group ids are published in the domain shared with the EFA driver (DRANET), so a
#: claim can ``matchAttribute`` across Neuron and EFA devices.
DEVICE_GROUP_DOMAIN: Final = "resource.aws.com"


def device_group_attribute(size: int) -> str:
    """Fully qualified name of the connected-group id attribute for groups of ``size``."""
    if size < 1:
        raise ValueError(f"device group size must be >= 1, got {size}")
    return f"{DEVICE_GROUP_DOMAIN}/devicegroup{size}_id"


#: Kubernetes' standard attributes (the upstream helper package
#: k8s.io/dynamic-resource-allocation/deviceattribute names them): the same names from every
#: driver, so one ``matchAttribute`` aligns a Neuron device with a NIC, EFA or CPU device of
#: another driver under the same PCIe root complex or NUMA node.
STANDARD_ATTRIBUTE_DOMAIN: Final = "resource.kubernetes.io"
#: ``pci<domain>:<bus>`` of the root complex above the device, e.g. ``pci0000:57``.
ATTR_PCIE_ROOT: Final = f"{STANDARD_ATTRIBUTE_DOMAIN}/pcieRoot"
#: The device's own PCI address, ``<domain>:<bus>:<device>.<function>``, e.g. ``0000:58:00.0``.
ATTR_PCI_BUS_ID: Final = f"{STANDARD_ATTRIBUTE_DOMAIN}/pciBusID"
#: The NUMA node of the device (int); absent when the kernel reports none (-1).
ATTR_NUMA_NODE: Final = f"{STANDARD_ATTRIBUTE_DOMAIN}/numaNode"

#: Attributes only the per-claim device metadata file (KEP-5304) carries: what the claim's
#: containers were prepared with, beside the device's ResourceSlice attributes. Each mirrors
#: a variable of the container's environment (docs/configuration.md, "Device metadata file").
METADATA_ATTR_LOGICAL_NEURON_CORE: Final = "logicalNeuronCore"
METADATA_ATTR_VISIBLE_CORES: Final = "visibleCores"
METADATA_ATTR_ULTRASERVER_NODE_COUNT: Final = "ultraserverNodeCount"
METADATA_ATTR_ULTRASERVER_RUNTIME_MODE: Final = "ultraserverRuntimeMode"
METADATA_ATTR_ULTRASERVER_SERVER_ID: Final = "ultraserverServerId"
METADATA_ATTR_ULTRASERVER_SERVER_NODE_ID: Final = "ultraserverServerNodeId"
METADATA_ATTR_GLOBAL_TOPOLOGY_ID: Final = "globalTopologyId"
METADATA_ATTR_GLOBAL_TOPOLOGY_ID0_HOST: Final = "globalTopologyId0Host"

RESOURCE_TYPE_DEVICE: Final = "neuron_device"
RESOURCE_TYPE_NODE: Final = "neuron_node"

CAPACITY_MEMORY: Final = "memory"
CAPACITY_CORES: Final = "cores"
#: Logical NeuronCores at the node's default LNC: published (with core sharing on) for claims
#: that ask for some cores of a device (``capacity.requests``) rather than the whole device.
CAPACITY_LOGICAL_CORES: Final = "logicalCores"

# --- Node labels ----------------------------------------------------------------------------

LABEL_INSTANCE_TYPE: Final = "node.kubernetes.io/instance-type"
#: Set by Kubernetes' resourceclaim controller on a claim it makes from a template: the name
#: the pod gives the claim (where the claim's device metadata files appear in its containers).
ANNOTATION_POD_CLAIM_NAME: Final = "resource.kubernetes.io/pod-claim-name"
LABEL_CAPACITY_BLOCK_ID: Final = "topology.k8s.aws/capacity-block-id"
LABEL_NETWORK_NODE_LAYER1: Final = "topology.k8s.aws/network-node-layer-1"
LABEL_NETWORK_NODE_LAYER2: Final = "topology.k8s.aws/network-node-layer-2"
LABEL_NETWORK_NODE_LAYER3: Final = "topology.k8s.aws/network-node-layer-3"

#: Which Node label feeds which device attribute (all three are optional on a Node).
NETWORK_NODE_LAYER_ATTRIBUTES: Final[tuple[tuple[str, str], ...]] = (
    (LABEL_NETWORK_NODE_LAYER1, ATTR_NETWORK_NODE_LAYER1),
    (LABEL_NETWORK_NODE_LAYER2, ATTR_NETWORK_NODE_LAYER2),
    (LABEL_NETWORK_NODE_LAYER3, ATTR_NETWORK_NODE_LAYER3),
)

_ULTRASERVER_LABEL_PREFIX: Final = "neuron.amazonaws.com/ultraserver-"
LABEL_ULTRASERVER_MODE: Final = _ULTRASERVER_LABEL_PREFIX + "mode"
LABEL_ULTRASERVER_SERVER_ID_2: Final = _ULTRASERVER_LABEL_PREFIX + "server-id-2"
LABEL_ULTRASERVER_SERVER_ID_4: Final = _ULTRASERVER_LABEL_PREFIX + "server-id-4"
LABEL_ULTRASERVER_NODE_ID_2: Final = _ULTRASERVER_LABEL_PREFIX + "node-id-2"
LABEL_ULTRASERVER_NODE_ID_4: Final = _ULTRASERVER_LABEL_PREFIX + "node-id-4"

#: Every label the kubelet plugin owns on its Node; it removes the ones it no longer sets.
ULTRASERVER_NODE_LABELS: Final[tuple[str, ...]] = (
    LABEL_ULTRASERVER_MODE,
    LABEL_ULTRASERVER_SERVER_ID_2,
    LABEL_ULTRASERVER_SERVER_ID_4,
    LABEL_ULTRASERVER_NODE_ID_2,
    LABEL_ULTRASERVER_NODE_ID_4,
)


def format_ultraserver_modes(node_counts: Iterable[int]) -> str:
    """Encode supported UltraServer node counts the way the label and attribute carry them.

    The observed label value is ``1_2_4``: node counts (not the driver's mode enum), ascending,
    joined by ``_``.
    """
    counts = sorted(set(node_counts))
    if any(c < 1 for c in counts):
        raise ValueError(f"node counts must be >= 1, got {counts}")
    return "_".join(str(c) for c in counts)


def parse_ultraserver_modes(value: object) -> tuple[int, ...]:
    """The node counts an ``ultraserverModes`` value (or the mode label) carries, ascending;
    () for anything that is not one. The one reader of what :func:`format_ultraserver_modes`
    writes (tests/docs/test_wire_readers.py keeps it so)."""
    if not isinstance(value, str):
        return ()
    return tuple(sorted({int(part) for part in value.split("_") if part.isdigit()}))


# --- opaque device configs ------------------------------------------------------------------

CONFIG_API_VERSION: Final = "neuron.aws.com/v1"
#: Older spellings seen in the beta documentation; still accepted on input, never written.
CONFIG_API_VERSIONS_ACCEPTED: Final[tuple[str, ...]] = (
    CONFIG_API_VERSION,
    "neuron.aws.com/v1alphav1",
    "resource.neuron.aws.com/v1alphav1",
)
CONFIG_KIND_NEURON: Final = "NeuronConfig"
CONFIG_KIND_ULTRASERVER: Final = "UltraServerConfig"

# --- custom resources -----------------------------------------------------------------------

CRD_GROUP: Final = "neuron.aws.com"
CRD_VERSION: Final = "v1beta1"
CRD_API_VERSION: Final = f"{CRD_GROUP}/{CRD_VERSION}"
CRD_CATEGORY: Final = "neuron"

KIND_ULTRASERVER: Final = "NeuronUltraServer"
PLURAL_ULTRASERVER: Final = "neuronultraservers"
SINGULAR_ULTRASERVER: Final = "neuronultraserver"
SHORT_NAME_ULTRASERVER: Final = "nus"

KIND_WORKLOAD: Final = "NeuronUltraServerWorkload"
PLURAL_WORKLOAD: Final = "neuronultraserverworkloads"
SINGULAR_WORKLOAD: Final = "neuronultraserverworkload"
SHORT_NAME_WORKLOAD: Final = "nusw"

#: Label on the generated ResourceClaimTemplate's claim template, so that Prepare can match a
#: claim to the workload whose reserved devices it is allowed to use.
LABEL_WORKLOAD_ID: Final = "neuron.aws.com/workload-id"

#: Held on a NeuronUltraServerWorkload until its UltraServers are released and untagged.
FINALIZER_WORKLOAD: Final = "neuron.aws.com/workload-protection"

#: Label values are limited to 63 characters and the workload id travels in
#: ``LABEL_WORKLOAD_ID``, so it must fit there.
WORKLOAD_ID_MAX_LENGTH: Final = 63

#: Device taints the kubelet plugin puts on a device its health signals find failing, one key
#: per failure class (docs/configuration.md, "Device health and taints"); the value says what
#: failed. A device with no known class (never from our discovery) gets the generic key.
TAINT_KEY_UNHEALTHY_COMPONENT: Final = "neuron.aws.com/unhealthy-component"
TAINT_KEY_UNCORRECTED_ECC: Final = "neuron.aws.com/uncorrected-ecc"
TAINT_KEY_UNHEALTHY: Final = "neuron.aws.com/unhealthy"
#: Effects the plugin may give its taints (chart value ``kubeletPlugin.deviceTaints.effect``);
#: ``off`` publishes none. NoExecute evicts the pods using the device, so it is opt-in.
TAINT_EFFECT_NO_SCHEDULE: Final = "NoSchedule"
TAINT_EFFECT_NO_EXECUTE: Final = "NoExecute"
TAINT_EFFECTS_OFF: Final = "off"
