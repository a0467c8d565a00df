"""An independent kubelet-side client for wire-compatibility tests.

It deliberately does not import ``neuron_dra.proto``: requests are encoded and responses
decoded by hand from the field numbers of the upstream protos (k8s.io/kubelet v0.34/v0.35:
DRA v1 and v1beta1, plugin registration, DRA health), and sent as raw bytes on the full
method paths the Go kubelet dials. A wrong field number, wire type or package line in our
.proto files therefore breaks these tests even though our own generated code agrees with
itself.

Protobuf encoding in brief: every field is ``key = field_number << 3 | wire_type``
(varint) followed by a varint (type 0) or a varint length and that many bytes (type 2:
strings, sub-messages, map entries). A ``map<K, V>`` is a repeated entry message with
key = field 1 and value = field 2; proto3 omits default values.

The second half is the optional "upstream protos" tier: compile k8s.io/kubelet's own
.proto files with grpc_tools at test time and run the same flows with those stubs in a
subprocess (the upstream messages have the same full names as ours, so both sets cannot
live in one process's descriptor pool).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

V1_PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
V1_UNPREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"
V1BETA1_PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources"
V1BETA1_UNPREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources"
GET_INFO = "/pluginregistration.Registration/GetInfo"
NOTIFY = "/pluginregistration.Registration/NotifyRegistrationStatus"
WATCH = "/v1alpha1.DRAResourceHealth/NodeWatchResources"
#: dra-health v1 (1.37): the same messages under the package "v1".
WATCH_V1 = "/v1.DRAResourceHealth/NodeWatchResources"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"

PATHS = {
    "v1": (V1_PREPARE, V1_UNPREPARE),
    "v1beta1": (V1BETA1_PREPARE, V1BETA1_UNPREPARE),
}

VARINT, I64, LEN, I32 = 0, 1, 2, 5

# dra-health v1alpha1 HealthStatus
UNKNOWN, HEALTHY, UNHEALTHY = 0, 1, 2


class WireError(ValueError):
    pass


# --------------------------------------------------------------------------------------
# Encoding primitives
# --------------------------------------------------------------------------------------


def varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64  # int64 negatives are 10-byte two's complement
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def key(field_number: int, wire_type: int) -> bytes:
    return varint(field_number << 3 | wire_type)


def ld(field_number: int, payload: bytes) -> bytes:
    """Length-delimited field."""
    return key(field_number, LEN) + varint(len(payload)) + payload


def string(field_number: int, value: str) -> bytes:
    """proto3 scalar string: omitted when empty."""
    return ld(field_number, value.encode()) if value else b""


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise WireError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("varint too long")


def fields(buf: bytes) -> list[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) in wire order; unknown types are an error."""
    out: list[tuple[int, int, int | bytes]] = []
    pos = 0
    while pos < len(buf):
        k, pos = read_varint(buf, pos)
        number, wire_type = k >> 3, k & 7
        if number == 0:
            raise WireError("field number 0")
        value: int | bytes
        if wire_type == VARINT:
            value, pos = read_varint(buf, pos)
        elif wire_type == LEN:
            n, pos = read_varint(buf, pos)
            if pos + n > len(buf):
                raise WireError("truncated length-delimited field")
            value, pos = buf[pos : pos + n], pos + n
        elif wire_type in (I64, I32):
            size = 8 if wire_type == I64 else 4
            value, pos = buf[pos : pos + size], pos + size
        else:
            raise WireError(f"unsupported wire type {wire_type}")
        out.append((number, wire_type, value))
    return out


def _expect(number: int, wire_type: int, want: int, message: str) -> None:
    if wire_type != want:
        raise WireError(f"{message} field {number}: wire type {wire_type}, expected {want}")


def _text(value: int | bytes) -> str:
    assert isinstance(value, bytes)
    return value.decode()


def _bytes(value: int | bytes) -> bytes:
    assert isinstance(value, bytes)
    return value


def _int(value: int | bytes) -> int:
    assert isinstance(value, int)
    return value


# --------------------------------------------------------------------------------------
# Messages (field numbers from the upstream k8s.io/kubelet protos)
# --------------------------------------------------------------------------------------


def claim(namespace: str, uid: str, name: str) -> bytes:
    """Claim {1 namespace, 2 uid, 3 name}."""
    return string(1, namespace) + string(2, uid) + string(3, name)


def claims_request(claims: Iterable[tuple[str, str, str]]) -> bytes:
    """Node(Un)PrepareResourcesRequest {1 repeated Claim claims}."""
    return b"".join(ld(1, claim(*c)) for c in claims)


@dataclass
class WireDevice:
    request_names: list[str] = field(default_factory=list)
    pool_name: str = ""
    device_name: str = ""
    cdi_device_ids: list[str] = field(default_factory=list)
    share_id: str | None = None


@dataclass
class WirePrepared:
    devices: list[WireDevice] = field(default_factory=list)
    error: str = ""


def decode_device(buf: bytes) -> WireDevice:
    dev = WireDevice()
    for number, wt, value in fields(buf):
        if number in (1, 2, 3, 4, 5):
            _expect(number, wt, LEN, "Device")
        if number == 1:
            dev.request_names.append(_text(value))
        elif number == 2:
            dev.pool_name = _text(value)
        elif number == 3:
            dev.device_name = _text(value)
        elif number == 4:
            dev.cdi_device_ids.append(_text(value))
        elif number == 5:
            dev.share_id = _text(value)
    return dev


def _map_entries(buf: bytes, message: str) -> list[tuple[str, bytes]]:
    """Entries of field 1 ``map<string, Message>``; an absent value is an empty message."""
    entries: list[tuple[str, bytes]] = []
    for number, wt, value in fields(buf):
        if number != 1:
            continue
        _expect(number, wt, LEN, message)
        k, v = "", b""
        for n, w, x in fields(_bytes(value)):
            _expect(n, w, LEN, f"{message} map entry")
            if n == 1:
                k = _text(x)
            elif n == 2:
                v = _bytes(x)
        entries.append((k, v))
    return entries


def decode_prepare_response(buf: bytes) -> dict[str, WirePrepared]:
    """NodePrepareResourcesResponse {1 map<uid, NodePrepareResourceResponse>};
    NodePrepareResourceResponse {1 repeated Device devices, 2 error}."""
    out: dict[str, WirePrepared] = {}
    for uid, value in _map_entries(buf, "NodePrepareResourcesResponse"):
        if uid in out:
            raise WireError(f"duplicate map key {uid!r}")
        result = WirePrepared()
        for number, wt, x in fields(value):
            _expect(number, wt, LEN, "NodePrepareResourceResponse")
            if number == 1:
                result.devices.append(decode_device(_bytes(x)))
            elif number == 2:
                result.error = _text(x)
        out[uid] = result
    return out


def decode_unprepare_response(buf: bytes) -> dict[str, str]:
    """NodeUnprepareResourcesResponse {1 map<uid, {1 error}>} -> uid: error."""
    out: dict[str, str] = {}
    for uid, value in _map_entries(buf, "NodeUnprepareResourcesResponse"):
        error = ""
        for number, wt, x in fields(value):
            if number == 1:
                _expect(number, wt, LEN, "NodeUnprepareResourceResponse")
                error = _text(x)
        out[uid] = error
    return out


@dataclass
class WirePluginInfo:
    type: str = ""
    name: str = ""
    endpoint: str = ""
    supported_versions: list[str] = field(default_factory=list)


def decode_plugin_info(buf: bytes) -> WirePluginInfo:
    """PluginInfo {1 type, 2 name, 3 endpoint, 4 repeated supported_versions}."""
    info = WirePluginInfo()
    for number, wt, value in fields(buf):
        if number in (1, 2, 3, 4):
            _expect(number, wt, LEN, "PluginInfo")
        if number == 1:
            info.type = _text(value)
        elif number == 2:
            info.name = _text(value)
        elif number == 3:
            info.endpoint = _text(value)
        elif number == 4:
            info.supported_versions.append(_text(value))
    return info


def registration_status(registered: bool, error: str = "") -> bytes:
    """RegistrationStatus {1 bool plugin_registered (varint), 2 error}."""
    return (key(1, VARINT) + varint(1) if registered else b"") + string(2, error)


@dataclass
class WireDeviceHealth:
    pool_name: str = ""
    device_name: str = ""
    health: int = UNKNOWN
    last_updated_time: int = 0
    health_check_timeout_seconds: int = 0
    message: str = ""


def decode_watch_response(buf: bytes) -> list[WireDeviceHealth]:
    """NodeWatchResourcesResponse {1 repeated DeviceHealth{1 DeviceIdentifier{1 pool,
    2 device}, 2 HealthStatus (varint enum), 3 int64 last_updated_time,
    4 int64 health_check_timeout_seconds, 5 string message}}."""
    out: list[WireDeviceHealth] = []
    for number, wt, value in fields(buf):
        if number != 1:
            continue
        _expect(number, wt, LEN, "NodeWatchResourcesResponse")
        dh = WireDeviceHealth()
        for n, w, x in fields(_bytes(value)):
            if n == 1:
                _expect(n, w, LEN, "DeviceHealth")
                for n2, w2, x2 in fields(_bytes(x)):
                    _expect(n2, w2, LEN, "DeviceIdentifier")
                    if n2 == 1:
                        dh.pool_name = _text(x2)
                    elif n2 == 2:
                        dh.device_name = _text(x2)
            elif n in (2, 3, 4):
                _expect(n, w, VARINT, "DeviceHealth")
                if n == 2:
                    dh.health = _int(x)
                elif n == 3:
                    dh.last_updated_time = _int(x)
                else:
                    dh.health_check_timeout_seconds = _int(x)
            elif n == 5:
                _expect(n, w, LEN, "DeviceHealth")
                dh.message = _text(x)
        out.append(dh)
    return out


def health_check_request(service: str = "") -> bytes:
    """grpc.health.v1.HealthCheckRequest {1 service}."""
    return string(1, service)


def decode_health_check_response(buf: bytes) -> int:
    """HealthCheckResponse {1 ServingStatus status}: 1 = SERVING, 2 = NOT_SERVING."""
    status = 0
    for number, wt, value in fields(buf):
        if number == 1:
            _expect(number, wt, VARINT, "HealthCheckResponse")
            status = _int(value)
    return status


# --------------------------------------------------------------------------------------
# Raw calls
# --------------------------------------------------------------------------------------


def channel(socket_path: str | Path) -> Any:
    return grpc.aio.insecure_channel(f"unix://{socket_path}")


async def unary(ch: Any, path: str, payload: bytes, call_timeout: float = 10.0) -> bytes:
    """One unary call with no serializers: bytes go out and come back as they are.
    ``call_timeout`` is the gRPC deadline, sent to the server like the kubelet's."""
    call = ch.unary_unary(path, request_serializer=None, response_deserializer=None)
    response: bytes = await call(payload, timeout=call_timeout)
    return response


def stream(ch: Any, path: str, payload: bytes) -> Any:
    """A server-streaming call; iterate it for raw messages, ``.cancel()`` to hang up."""
    return ch.unary_stream(path, request_serializer=None, response_deserializer=None)(payload)


class WireKubelet:
    """The kubelet side of registration and DRA calls, on raw bytes."""

    def __init__(self, call_timeout: float = 45.0) -> None:
        self.call_timeout = call_timeout

    async def get_info(self, registration_socket: str | Path) -> WirePluginInfo:
        async with channel(registration_socket) as ch:
            return decode_plugin_info(await unary(ch, GET_INFO, b"", call_timeout=1.0))

    async def notify(
        self, registration_socket: str | Path, registered: bool, error: str = ""
    ) -> bytes:
        async with channel(registration_socket) as ch:
            return await unary(ch, NOTIFY, registration_status(registered, error), call_timeout=5.0)

    async def prepare(
        self, dra_socket: str | Path, version: str, claims: Iterable[tuple[str, str, str]]
    ) -> dict[str, WirePrepared]:
        async with channel(dra_socket) as ch:
            raw = await unary(ch, PATHS[version][0], claims_request(claims), self.call_timeout)
        return decode_prepare_response(raw)

    async def unprepare(
        self, dra_socket: str | Path, version: str, claims: Iterable[tuple[str, str, str]]
    ) -> dict[str, str]:
        async with channel(dra_socket) as ch:
            raw = await unary(ch, PATHS[version][1], claims_request(claims), self.call_timeout)
        return decode_unprepare_response(raw)


# --------------------------------------------------------------------------------------
# Optional tier: upstream k8s.io/kubelet protos compiled at test time
# --------------------------------------------------------------------------------------

#: upstream path under pkg/apis -> our module name for it (unique descriptor file names).
UPSTREAM_PROTOS = {
    "dra/v1/api.proto": "upstream_kubelet/dra_v1/api.proto",
    "dra/v1beta1/api.proto": "upstream_kubelet/dra_v1beta1/api.proto",
    "pluginregistration/v1/api.proto": "upstream_kubelet/pluginregistration_v1/api.proto",
}

_GOGO_IMPORT = re.compile(r'^\s*import\s+"github\.com/gogo/protobuf/[^"]*";\s*$', re.M)
_GOGO_FILE_OPTION = re.compile(r"^\s*option\s+\(gogoproto\.[^;]*;\s*$", re.M)
_GOGO_FIELD_OPTIONS = re.compile(r"\s*\[\s*\(gogoproto\.[^\]]*\]")


def strip_gogo(text: str) -> str:
    """1.34-era upstream protos use gogoproto options, which never change the wire format
    (1.35 dropped them); dropping them avoids needing gogo.proto on the include path."""
    text = _GOGO_IMPORT.sub("", text)
    text = _GOGO_FILE_OPTION.sub("", text)
    return _GOGO_FIELD_OPTIONS.sub("", text)


def compile_upstream(apis_dir: Path, work_dir: Path) -> Path:
    """Compile the upstream protos below ``apis_dir`` (k8s.io/kubelet ``pkg/apis``);
    returns the directory to put on PYTHONPATH. Raises FileNotFoundError if one is absent."""
    src, out = work_dir / "src", work_dir / "out"
    out.mkdir(parents=True)
    names = []
    for upstream, ours in UPSTREAM_PROTOS.items():
        text = (apis_dir / upstream).read_text()
        target = src / ours
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(strip_gogo(text))
        names.append(ours)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{src}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            *names,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out


async def _upstream_client(args: argparse.Namespace) -> dict[str, Any]:
    """Runs in the subprocess: the flows, with stubs generated from upstream protos."""

    # Imported by name: these modules only exist in the subprocess's PYTHONPATH.
    def gen(name: str) -> Any:
        return importlib.import_module(f"upstream_kubelet.{name}")

    v1, v1_grpc = gen("dra_v1.api_pb2"), gen("dra_v1.api_pb2_grpc")
    b1, b1_grpc = gen("dra_v1beta1.api_pb2"), gen("dra_v1beta1.api_pb2_grpc")
    reg, reg_grpc = gen("pluginregistration_v1.api_pb2"), gen("pluginregistration_v1.api_pb2_grpc")

    claims = [tuple(c) for c in json.loads(args.claims)]
    result: dict[str, Any] = {}
    async with channel(args.registration_socket) as ch:
        stub = reg_grpc.RegistrationStub(ch)
        info = await stub.GetInfo(reg.InfoRequest(), timeout=1)
        result["info"] = asdict(
            WirePluginInfo(info.type, info.name, info.endpoint, list(info.supported_versions))
        )
        await stub.NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=True), timeout=5
        )
    async with channel(args.dra_socket) as ch:
        for version, pb2, pb2_grpc in (("v1", v1, v1_grpc), ("v1beta1", b1, b1_grpc)):
            stub = pb2_grpc.DRAPluginStub(ch)
            req_claims = [pb2.Claim(namespace=n, uid=u, name=m) for n, u, m in claims]
            prep = await stub.NodePrepareResources(
                pb2.NodePrepareResourcesRequest(claims=req_claims), timeout=45
            )
            unprep = await stub.NodeUnprepareResources(
                pb2.NodeUnprepareResourcesRequest(claims=req_claims), timeout=45
            )
            result[version] = {
                "prepare": {
                    uid: asdict(
                        WirePrepared(
                            [
                                WireDevice(
                                    list(d.request_names),
                                    d.pool_name,
                                    d.device_name,
                                    list(d.cdi_device_ids),
                                )
                                for d in r.devices
                            ],
                            r.error,
                        )
                    )
                    for uid, r in prep.claims.items()
                },
                "unprepare": {uid: r.error for uid, r in unprep.claims.items()},
            }
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="kubelet flows with upstream-generated stubs")
    p.add_argument("--registration-socket", required=True)
    p.add_argument("--dra-socket", required=True)
    p.add_argument("--claims", required=True, help="JSON list of [namespace, uid, name]")
    args = p.parse_args(argv)
    print(json.dumps(asyncio.run(_upstream_client(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
