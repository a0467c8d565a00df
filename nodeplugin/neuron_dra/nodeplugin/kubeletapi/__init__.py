"""The kubelet-facing gRPC layer of the kubelet plugin.

What the kubelet expects of it: docs/architecture.md, "What the kubelet expects".

``PluginServer`` serves DRA v1 + v1beta1 (and optionally dra-health v1alpha1) on the DRA
socket and the registration service on the registration socket, translating between the
wire and the plain dataclasses of ``model``; the claim work itself is a ``DriverBackend``.
Generated protobuf code is only touched in ``_proto``, and importing this package does not
import the gRPC stack (``wiring`` does, when the servers start).
"""

from .model import (
    DEFAULT_BUDGET,
    DRA_PLUGIN_TYPE,
    HEALTH_SERVICE,
    HEALTH_V1_SERVICE,
    HEALTH_VERSIONS,
    KUBELET_CALL_TIMEOUT,
    V1_SERVICE,
    V1BETA1_SERVICE,
    ClaimRef,
    DeviceHealthReport,
    DriverBackend,
    HealthSource,
    KubeletAPIError,
    PluginCallError,
    PluginInfo,
    PreparedDevice,
    PrepareResult,
    RegistrationRejected,
    ServerStateError,
    SocketPathError,
    UnprepareResult,
)
from .server import PluginServer, load_grpc_stack, socket_paths
from .state import HealthBoard, RegistrationState

__all__ = [
    "DEFAULT_BUDGET",
    "DRA_PLUGIN_TYPE",
    "HEALTH_SERVICE",
    "HEALTH_V1_SERVICE",
    "HEALTH_VERSIONS",
    "KUBELET_CALL_TIMEOUT",
    "V1BETA1_SERVICE",
    "V1_SERVICE",
    "ClaimRef",
    "DeviceHealthReport",
    "DriverBackend",
    "HealthBoard",
    "HealthSource",
    "KubeletAPIError",
    "PluginCallError",
    "PluginInfo",
    "PluginServer",
    "PrepareResult",
    "PreparedDevice",
    "RegistrationRejected",
    "RegistrationState",
    "ServerStateError",
    "SocketPathError",
    "UnprepareResult",
    "load_grpc_stack",
    "socket_paths",
]
