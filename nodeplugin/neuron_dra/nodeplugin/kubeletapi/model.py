"""Protobuf-free vocabulary of the kubelet-facing layer.

Everything the rest of the plugin needs to implement or call the kubelet APIs is a plain
frozen dataclass or a Protocol here, so the checkpoint/CDI code never sees a generated
message and the gRPC translation stays in one place (``_proto.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

#: ``PluginInfo.type`` of a DRA driver (pluginregistration constants).
DRA_PLUGIN_TYPE: Final = "DRAPlugin"
#: Registration strings, *not* the gRPC service names (which carry the proto package): the
#: kubelet 1.34+ takes the first entry of our list that it supports, so v1 comes first.
V1_SERVICE: Final = "v1.DRAPlugin"
V1BETA1_SERVICE: Final = "v1beta1.DRAPlugin"
#: dra-health: a 1.37 kubelet prefers v1 when advertised, 1.34-1.36 kubelets know only
#: v1alpha1 (a 1.36 kubelet opens it on every plugin, advertised or not). Both are served.
HEALTH_V1_SERVICE: Final = "v1.DRAResourceHealth"
HEALTH_SERVICE: Final = "v1alpha1.DRAResourceHealth"
HEALTH_VERSIONS: Final = (HEALTH_V1_SERVICE, HEALTH_SERVICE)
#: The DRA versions we serve, in the order we advertise them (``_proto.DRA_CODECS`` has one
#: codec for each, in this order).
DRA_VERSIONS: Final = (V1_SERVICE, V1BETA1_SERVICE)

#: The kubelet cancels every Prepare/Unprepare call after this many seconds.
KUBELET_CALL_TIMEOUT: Final = 45.0
#: Our own budget stays below it so that the kubelet gets per-claim errors it can show in
#: pod events instead of an opaque DEADLINE_EXCEEDED.
DEFAULT_BUDGET: Final = 40.0
#: How often the health stream resends the full list: comfortably below the kubelet's 30 s
#: default health timeout.
DEFAULT_RESEND_INTERVAL: Final = 10.0


def validate_budget(budget: float) -> float:
    if not 0 < budget < KUBELET_CALL_TIMEOUT:
        raise ValueError(
            f"budget must be between 0 and the kubelet's {KUBELET_CALL_TIMEOUT:g}s call "
            f"timeout (exclusive), got {budget!r}"
        )
    return budget


class KubeletAPIError(Exception):
    """Base class of the errors raised by this package."""


class SocketPathError(KubeletAPIError):
    """A socket path cannot be used (too long, not a socket, in use, bind failed)."""


class ServerStateError(KubeletAPIError):
    """``PluginServer`` used out of order (started twice, ...)."""


class RegistrationRejected(KubeletAPIError):
    """The (simulated) kubelet refused a plugin in the registration handshake."""


class PluginCallError(KubeletAPIError):
    """A call to a plugin ended with a non-OK gRPC status (the whole batch failed)."""

    def __init__(self, method: str, code: str, details: str) -> None:
        super().__init__(f"{method}: {code}: {details}")
        self.method = method
        self.code = code
        self.details = details


@dataclass(frozen=True)
class ClaimRef:
    """The three fields the kubelet sends per claim; the allocation must be fetched."""

    namespace: str
    uid: str
    name: str

    @property
    def key(self) -> str:
        """``namespace/name``, the form used in messages shown to users."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PreparedDevice:
    #: Base request names (no ``/subrequest``); empty means "all requests of the claim".
    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    #: Fully qualified ``vendor/class=name`` CDI device ids.
    cdi_device_ids: tuple[str, ...]
    #: The allocation's ``shareID`` (a device several claims may share); sent over v1 only,
    #: the one version with the field (1.35+ kubelets read it).
    share_id: str | None = None


@dataclass(frozen=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    #: Non-empty means this claim failed; the kubelet then ignores ``devices``.
    error: str = ""


@dataclass(frozen=True)
class UnprepareResult:
    error: str = ""


@dataclass(frozen=True)
class DeviceHealthReport:
    pool_name: str
    device_name: str
    #: ``None`` is reported as UNKNOWN.
    healthy: bool | None
    #: Unix seconds when the status was determined.
    last_updated: int
    #: 1.35+ kubelets mark the device Unknown after this long without a report; 0: the
    #: stream's own (a few resend intervals). Older kubelets skip the field.
    timeout_seconds: int = 0
    #: Why (for an unhealthy device: the driver's health signals); 1.36+ kubelets show it
    #: in the pod's ``allocatedResourcesStatus``, older ones skip the field.
    message: str = ""


@dataclass(frozen=True)
class PluginInfo:
    """``pluginregistration.PluginInfo`` as a value."""

    type: str
    name: str
    endpoint: str
    supported_versions: tuple[str, ...]


class DriverBackend(Protocol):
    """What the DRA servicers delegate to (checkpoint + CDI live behind it).

    Both methods get the whole batch of one kubelet call and return results keyed by
    claim UID. Missing entries and exceptions are turned into per-claim errors by the
    servicer, so an implementation may raise for a batch-wide failure. Calls are cancelled
    (``CancelledError``) when the servicer's time budget runs out, so work must be
    cancellation-safe; the kubelet retries and both operations must be idempotent.
    """

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]: ...

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareResult]: ...


class HealthSource(Protocol):
    """Device health for the ``v1alpha1.DRAResourceHealth`` stream.

    ``generation`` increases whenever ``snapshot()`` would return something different.
    ``changed(since)`` returns as soon as ``generation > since``: being level-triggered
    on a number read together with the snapshot, no change can slip in between taking a
    snapshot and starting to wait (which an edge-triggered "await the next change"
    cannot promise for an ``async def``).
    """

    @property
    def generation(self) -> int: ...

    def snapshot(self) -> list[DeviceHealthReport]: ...

    async def changed(self, since: int) -> None: ...
