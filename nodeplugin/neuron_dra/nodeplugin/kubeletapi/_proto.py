"""The only module that touches generated protobuf/gRPC code.

The ``*_pb2_grpc`` modules are unannotated, and ``grpc``/``google.protobuf`` ship no type
information, so every call into them is untyped. This module keeps those calls (and the
``type: ignore`` comments they need) in one place and exposes typed translations between
the dataclasses of ``model.py`` and the wire messages, for both the servers and the
(simulated) kubelet client.

v1 and v1beta1 DRA messages are identical apart from v1's ``Device.share_id`` (the shareID of
a device several claims share), so one ``DraCodec`` parameterised by the generated modules
serves both, setting and reading that field where the version has it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final

from grpc_health.v1 import health as _health_lib
from grpc_health.v1 import health_pb2 as _grpc_health_pb2
from grpc_health.v1 import health_pb2_grpc as _grpc_health_grpc
from neuron_dra.proto.dra.v1 import api_pb2 as _v1
from neuron_dra.proto.dra.v1 import api_pb2_grpc as _v1_grpc
from neuron_dra.proto.dra.v1beta1 import api_pb2 as _v1beta1
from neuron_dra.proto.dra.v1beta1 import api_pb2_grpc as _v1beta1_grpc
from neuron_dra.proto.drahealth.v1 import api_pb2 as _health_v1
from neuron_dra.proto.drahealth.v1 import api_pb2_grpc as _health_v1_grpc
from neuron_dra.proto.drahealth.v1alpha1 import api_pb2 as _health
from neuron_dra.proto.drahealth.v1alpha1 import api_pb2_grpc as _health_grpc
from neuron_dra.proto.pluginregistration.v1 import api_pb2 as _reg
from neuron_dra.proto.pluginregistration.v1 import api_pb2_grpc as _reg_grpc

from .model import (
    HEALTH_SERVICE,
    HEALTH_V1_SERVICE,
    V1_SERVICE,
    V1BETA1_SERVICE,
    ClaimRef,
    DeviceHealthReport,
    PluginInfo,
    PreparedDevice,
    PrepareResult,
    UnprepareResult,
)

#: A generated request/response message. Typed as Any because protobuf has no stubs here;
#: values of this type never leave this module's callers (the servicers) untranslated.
Message = Any


# --------------------------------------------------------------------------------------
# DRA (v1, v1beta1)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DraCodec:
    """Translation for one DRA API version; see ``DRA_V1`` and ``DRA_V1BETA1``."""

    #: "v1" / "v1beta1", used in logs.
    version: str
    #: The string advertised in ``PluginInfo.supported_versions``.
    registration_name: str
    _pb2: ModuleType
    _pb2_grpc: ModuleType

    @property
    def has_share_id(self) -> bool:
        """Whether this version's ``Device`` carries ``share_id`` (v1, not v1beta1)."""
        return "share_id" in self._pb2.Device.DESCRIPTOR.fields_by_name

    @property
    def service_name(self) -> str:
        """Full gRPC service name, the first part of the method path the kubelet dials."""
        name: str = self._pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name
        return name

    # --- server side ---------------------------------------------------------------

    def add_servicer(self, servicer: object, server: Any) -> None:
        """Register an object with ``NodePrepareResources``/``NodeUnprepareResources``."""
        self._pb2_grpc.add_DRAPluginServicer_to_server(servicer, server)

    @staticmethod
    def claims(request: Message) -> list[ClaimRef]:
        """Claims of a Prepare or Unprepare request (same shape in both)."""
        return [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]

    def prepare_response(self, results: Mapping[str, PrepareResult]) -> Message:
        resp = self._pb2.NodePrepareResourcesResponse()
        for uid, result in results.items():
            # Indexing the map creates the entry: a claim with no devices and no error
            # must still be present, or the kubelet reports it as skipped.
            entry = resp.claims[uid]
            if result.error:
                entry.error = result.error
                continue
            for dev in result.devices:
                added = entry.devices.add(
                    request_names=list(dev.request_names),
                    pool_name=dev.pool_name,
                    device_name=dev.device_name,
                    cdi_device_ids=list(dev.cdi_device_ids),
                )
                if dev.share_id is not None and self.has_share_id:
                    added.share_id = dev.share_id
        return resp

    def unprepare_response(self, results: Mapping[str, UnprepareResult]) -> Message:
        resp = self._pb2.NodeUnprepareResourcesResponse()
        for uid, result in results.items():
            entry = resp.claims[uid]
            if result.error:
                entry.error = result.error
        return resp

    # --- client side ---------------------------------------------------------------

    def stub(self, channel: Any) -> DraStub:
        return DraStub(self, self._pb2_grpc.DRAPluginStub(channel))

    def _request(self, cls_name: str, claims: Iterable[ClaimRef]) -> Message:
        cls = getattr(self._pb2, cls_name)
        claim_cls = self._pb2.Claim
        return cls(
            claims=[claim_cls(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]
        )

    def _prepare_results(self, resp: Message) -> dict[str, PrepareResult]:
        out: dict[str, PrepareResult] = {}
        shares = self.has_share_id
        for uid, entry in resp.claims.items():
            devices = tuple(
                PreparedDevice(
                    request_names=tuple(d.request_names),
                    pool_name=d.pool_name,
                    device_name=d.device_name,
                    cdi_device_ids=tuple(d.cdi_device_ids),
                    share_id=str(d.share_id) if shares and d.HasField("share_id") else None,
                )
                for d in entry.devices
            )
            out[str(uid)] = PrepareResult(devices=devices, error=str(entry.error))
        return out

    @staticmethod
    def _unprepare_results(resp: Message) -> dict[str, UnprepareResult]:
        return {str(uid): UnprepareResult(error=str(e.error)) for uid, e in resp.claims.items()}


class DraStub:
    """Typed client for one DRA version; gRPC errors propagate as ``grpc.aio.AioRpcError``.

    ``call_timeout`` becomes the gRPC deadline, which (unlike ``asyncio.timeout``) is also
    sent to the server, as the kubelet's is.
    """

    def __init__(self, codec: DraCodec, stub: Any) -> None:
        self._codec = codec
        self._stub = stub

    async def prepare(
        self, claims: Sequence[ClaimRef], call_timeout: float | None
    ) -> dict[str, PrepareResult]:
        req = self._codec._request("NodePrepareResourcesRequest", claims)
        resp = await self._stub.NodePrepareResources(req, timeout=call_timeout)
        return self._codec._prepare_results(resp)

    async def unprepare(
        self, claims: Sequence[ClaimRef], call_timeout: float | None
    ) -> dict[str, UnprepareResult]:
        req = self._codec._request("NodeUnprepareResourcesRequest", claims)
        resp = await self._stub.NodeUnprepareResources(req, timeout=call_timeout)
        return self._codec._unprepare_results(resp)


DRA_V1: Final = DraCodec("v1", V1_SERVICE, _v1, _v1_grpc)
DRA_V1BETA1: Final = DraCodec("v1beta1", V1BETA1_SERVICE, _v1beta1, _v1beta1_grpc)
#: In the order we advertise them (the kubelet takes the first one it supports).
DRA_CODECS: Final = (DRA_V1, DRA_V1BETA1)


# --------------------------------------------------------------------------------------
# pluginregistration
# --------------------------------------------------------------------------------------


def add_registration_servicer(servicer: object, server: Any) -> None:
    """``servicer`` has ``GetInfo`` and ``NotifyRegistrationStatus``."""
    _reg_grpc.add_RegistrationServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]


def plugin_info_message(info: PluginInfo) -> Message:
    return _reg.PluginInfo(
        type=info.type,
        name=info.name,
        endpoint=info.endpoint,
        supported_versions=list(info.supported_versions),
    )


def registration_status(request: Message) -> tuple[bool, str]:
    return bool(request.plugin_registered), str(request.error)


def registration_status_response() -> Message:
    return _reg.RegistrationStatusResponse()


class RegistrationStub:
    def __init__(self, channel: Any) -> None:
        self._stub = _reg_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]

    async def get_info(self, call_timeout: float | None) -> PluginInfo:
        m = await self._stub.GetInfo(_reg.InfoRequest(), timeout=call_timeout)
        return PluginInfo(
            type=str(m.type),
            name=str(m.name),
            endpoint=str(m.endpoint),
            supported_versions=tuple(str(v) for v in m.supported_versions),
        )

    async def notify(self, registered: bool, error: str, call_timeout: float | None) -> None:
        status = _reg.RegistrationStatus(plugin_registered=registered, error=error)
        await self._stub.NotifyRegistrationStatus(status, timeout=call_timeout)


# --------------------------------------------------------------------------------------
# dra-health (v1, v1alpha1)
# --------------------------------------------------------------------------------------

#: The kubelet keeps at most this many characters of a device's health message.
HEALTH_MESSAGE_LIMIT: Final = 1024


@dataclass(frozen=True)
class HealthCodec:
    """Translation for one dra-health version; v1 and v1alpha1 (at 1.36) have the same
    messages under another package. See ``HEALTH_CODECS``."""

    registration_name: str
    _pb2: ModuleType
    _pb2_grpc: ModuleType

    def add_servicer(self, servicer: object, server: Any) -> None:
        """``servicer`` has an async-generator ``NodeWatchResources``."""
        self._pb2_grpc.add_DRAResourceHealthServicer_to_server(servicer, server)

    def _status(self, healthy: bool | None) -> Any:
        if healthy is None:
            return self._pb2.UNKNOWN
        return self._pb2.HEALTHY if healthy else self._pb2.UNHEALTHY

    def watch_response(self, reports: Iterable[DeviceHealthReport]) -> Message:
        pb = self._pb2
        return pb.NodeWatchResourcesResponse(
            devices=[
                pb.DeviceHealth(
                    device=pb.DeviceIdentifier(pool_name=r.pool_name, device_name=r.device_name),
                    health=self._status(r.healthy),
                    last_updated_time=r.last_updated,
                    health_check_timeout_seconds=r.timeout_seconds,
                    message=_cut(r.message),
                )
                for r in reports
            ]
        )

    def reports(self, resp: Message) -> list[DeviceHealthReport]:
        decoded = {int(self._pb2.HEALTHY): True, int(self._pb2.UNHEALTHY): False}
        return [
            DeviceHealthReport(
                pool_name=str(d.device.pool_name),
                device_name=str(d.device.device_name),
                healthy=decoded.get(int(d.health)),
                last_updated=int(d.last_updated_time),
                timeout_seconds=int(d.health_check_timeout_seconds),
                message=str(d.message),
            )
            for d in resp.devices
        ]

    def stub(self, channel: Any) -> HealthStub:
        return HealthStub(self, channel)


def _cut(message: str) -> str:
    """As the kubelet cuts it: longer than the limit ends in "..." within it."""
    if len(message) <= HEALTH_MESSAGE_LIMIT:
        return message
    return message[: HEALTH_MESSAGE_LIMIT - 3] + "..."


HEALTH_V1: Final = HealthCodec(HEALTH_V1_SERVICE, _health_v1, _health_v1_grpc)
HEALTH_V1ALPHA1: Final = HealthCodec(HEALTH_SERVICE, _health, _health_grpc)
#: In ``HEALTH_VERSIONS`` order.
HEALTH_CODECS: Final = (HEALTH_V1, HEALTH_V1ALPHA1)


class HealthStub:
    def __init__(self, codec: HealthCodec, channel: Any) -> None:
        self._codec = codec
        self._stub = codec._pb2_grpc.DRAResourceHealthStub(channel)

    async def watch(self) -> AsyncGenerator[list[DeviceHealthReport], None]:
        """Each complete device list the plugin sends; ends with the stream."""
        request = self._codec._pb2.NodeWatchResourcesRequest()
        async for resp in self._stub.NodeWatchResources(request):
            yield self._codec.reports(resp)


# --------------------------------------------------------------------------------------
# grpc.health.v1 (for probes and sidecars; the kubelet does not use it)
# --------------------------------------------------------------------------------------


class GrpcHealth:
    """Thin typed wrapper of ``grpc_health``'s aio servicer."""

    SERVING: Final = _grpc_health_pb2.HealthCheckResponse.SERVING
    NOT_SERVING: Final = _grpc_health_pb2.HealthCheckResponse.NOT_SERVING

    def __init__(self) -> None:
        self._servicer = _health_lib.aio.HealthServicer()

    def add_to(self, server: Any) -> None:
        _grpc_health_grpc.add_HealthServicer_to_server(self._servicer, server)

    async def set_serving(self, services: Iterable[str]) -> None:
        for name in services:
            await self._servicer.set(name, self.SERVING)

    async def shutdown(self) -> None:
        """Every service reports NOT_SERVING and further ``set`` calls are ignored."""
        await self._servicer.enter_graceful_shutdown()


async def grpc_health_check(channel: Any, service: str, call_timeout: float | None) -> str:
    """Status name (e.g. ``"SERVING"``) of ``grpc.health.v1.Health/Check``."""
    stub = _grpc_health_grpc.HealthStub(channel)
    request = _grpc_health_pb2.HealthCheckRequest(service=service)
    resp = await stub.Check(request, timeout=call_timeout)
    name: str = _grpc_health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    return name
