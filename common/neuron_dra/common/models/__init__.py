"""API models: opaque device configs and the UltraServer custom resources."""

from neuron_dra.common.models.configs import (
    ConfigError,
    NeuronConfig,
    OpaqueConfig,
    UltraServerConfig,
    decode_opaque_config,
    encode_opaque_config,
)
from neuron_dra.common.models.crds import (
    AllocationPolicy,
    NeuronUltraServer,
    NeuronUltraServerSpec,
    NeuronUltraServerStatus,
    NeuronUltraServerWorkload,
    NeuronUltraServerWorkloadSpec,
    NeuronUltraServerWorkloadStatus,
    ResourceClaimTemplateRef,
    UltraServerAllocation,
    UltraServerNode,
    WorkloadDeviceConfig,
)
from neuron_dra.common.models.k8s import Condition, ObjectMeta

__all__ = [
    "AllocationPolicy",
    "Condition",
    "ConfigError",
    "NeuronConfig",
    "NeuronUltraServer",
    "NeuronUltraServerSpec",
    "NeuronUltraServerStatus",
    "NeuronUltraServerWorkload",
    "NeuronUltraServerWorkloadSpec",
    "NeuronUltraServerWorkloadStatus",
    "ObjectMeta",
    "OpaqueConfig",
    "ResourceClaimTemplateRef",
    "UltraServerAllocation",
    "UltraServerConfig",
    "UltraServerNode",
    "WorkloadDeviceConfig",
    "decode_opaque_config",
    "encode_opaque_config",
]
