"""Wire-level facts of the kubelet gRPC APIs, checked against our generated code.

The kubelet is a Go client we cannot run here, so these tests pin what it
actually looks at: the HTTP/2 method path of every RPC and the protobuf field
numbers/types of every message. Expected byte strings are computed by hand
from the protobuf encoding rules (tag = field_number << 3 | wire_type), not
produced by the library under test, so a wrong field number or package line
in a .proto file makes them fail.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from neuron_dra.proto.dra.v1 import api_pb2 as v1
from neuron_dra.proto.dra.v1 import api_pb2_grpc as v1_grpc
from neuron_dra.proto.dra.v1beta1 import api_pb2 as v1beta1
from neuron_dra.proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from neuron_dra.proto.drahealth.v1alpha1 import api_pb2 as health
from neuron_dra.proto.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from neuron_dra.proto.pluginregistration.v1 import api_pb2 as reg
from neuron_dra.proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from neuron_dra.sim.scratch import work_dir

REPO = Path(__file__).resolve().parents[2]

V1_PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
V1_UNPREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"
V1BETA1_PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources"
V1BETA1_UNPREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources"
GET_INFO = "/pluginregistration.Registration/GetInfo"
NOTIFY = "/pluginregistration.Registration/NotifyRegistrationStatus"
WATCH = "/v1alpha1.DRAResourceHealth/NodeWatchResources"

# (generated module, service, method, path the kubelet dials, server-streaming)
METHODS: list[tuple[Any, str, str, str, bool]] = [
    (v1, "DRAPlugin", "NodePrepareResources", V1_PREPARE, False),
    (v1, "DRAPlugin", "NodeUnprepareResources", V1_UNPREPARE, False),
    (v1beta1, "DRAPlugin", "NodePrepareResources", V1BETA1_PREPARE, False),
    (v1beta1, "DRAPlugin", "NodeUnprepareResources", V1BETA1_UNPREPARE, False),
    (reg, "Registration", "GetInfo", GET_INFO, False),
    (reg, "Registration", "NotifyRegistrationStatus", NOTIFY, False),
    (health, "DRAResourceHealth", "NodeWatchResources", WATCH, True),
]


def _ld(field: int, payload: bytes) -> bytes:
    """Length-delimited field (wire type 2); payloads here are < 128 bytes."""
    assert len(payload) < 0x80
    return bytes([field << 3 | 2, len(payload)]) + payload


# --------------------------------------------------------------------------
# Method paths, from the descriptors
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mod", "service", "method", "path", "streaming"),
    METHODS,
    ids=[m[3] for m in METHODS],
)
def test_method_path_from_descriptor(
    mod: Any, service: str, method: str, path: str, streaming: bool
) -> None:
    md = mod.DESCRIPTOR.services_by_name[service].methods_by_name[method]
    # gRPC builds the path as "/<package>.<Service>/<Method>".
    assert f"/{md.containing_service.full_name}/{md.name}" == path
    assert md.client_streaming is False
    assert md.server_streaming is streaming


def test_descriptor_files_are_unique_and_packages_match_upstream() -> None:
    # All four files are "api.proto" upstream; identical names would collide
    # in the process-wide descriptor pool, hence the neuron_dra/proto prefix.
    files = {m.DESCRIPTOR.name: m.DESCRIPTOR.package for m in (v1, v1beta1, reg, health)}
    assert files == {
        "neuron_dra/proto/dra/v1/api.proto": "k8s.io.kubelet.pkg.apis.dra.v1",
        "neuron_dra/proto/dra/v1beta1/api.proto": "k8s.io.kubelet.pkg.apis.dra.v1beta1",
        "neuron_dra/proto/pluginregistration/v1/api.proto": "pluginregistration",
        "neuron_dra/proto/drahealth/v1alpha1/api.proto": "v1alpha1",
    }


# --------------------------------------------------------------------------
# Method paths, on the wire
# --------------------------------------------------------------------------


class _PathRecorder(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Records the method path of every incoming call as the server saw it."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        self.paths.append(details.method)
        return await continuation(details)


def _prepared(claims: Any, response_cls: Any) -> Any:
    resp = response_cls()
    for claim in claims:
        dev = resp.claims[claim.uid].devices.add()
        dev.pool_name = claim.namespace
        dev.device_name = claim.name
    return resp


class _V1(v1_grpc.DRAPluginServicer):
    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        return _prepared(request.claims, v1.NodePrepareResourcesResponse)

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        resp = v1.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            resp.claims[claim.uid].error = "v1"
        return resp


class _V1beta1(v1beta1_grpc.DRAPluginServicer):
    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        return _prepared(request.claims, v1beta1.NodePrepareResourcesResponse)

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        resp = v1beta1.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            resp.claims[claim.uid].error = "v1beta1"
        return resp


class _Registration(reg_grpc.RegistrationServicer):
    async def GetInfo(self, request: Any, context: Any) -> Any:
        return reg.PluginInfo(type="DRAPlugin", name="neuron.aws.com")

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        return reg.RegistrationStatusResponse()


class _Health(health_grpc.DRAResourceHealthServicer):
    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        for status in (health.HEALTHY, health.UNHEALTHY):
            yield health.NodeWatchResourcesResponse(devices=[health.DeviceHealth(health=status)])


@pytest.fixture
def socket_dir() -> Iterator[str]:
    # pytest's tmp_path can exceed the 107-byte sun_path limit.
    path = str(work_dir("wire", Path("/tmp")))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_paths_on_the_wire(socket_dir: str) -> None:
    recorder = _PathRecorder()
    server = grpc.aio.server(interceptors=[recorder])
    v1_grpc.add_DRAPluginServicer_to_server(_V1(), server)  # type: ignore[no-untyped-call]
    v1beta1_grpc.add_DRAPluginServicer_to_server(_V1beta1(), server)  # type: ignore[no-untyped-call]
    reg_grpc.add_RegistrationServicer_to_server(_Registration(), server)  # type: ignore[no-untyped-call]
    health_grpc.add_DRAResourceHealthServicer_to_server(_Health(), server)  # type: ignore[no-untyped-call]
    target = f"unix://{socket_dir}/dra.sock"
    assert server.add_insecure_port(target) == 1  # 0 would mean "bind failed"
    await server.start()
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            claims = [v1.Claim(namespace="ns", uid="uid-1", name="claim")]

            # 1. Generated stubs: whatever path they send is what the server records.
            s1 = v1_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
            r = await s1.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=claims))
            assert r.claims["uid-1"].devices[0].device_name == "claim"
            r = await s1.NodeUnprepareResources(v1.NodeUnprepareResourcesRequest(claims=claims))
            assert r.claims["uid-1"].error == "v1"

            b_claims = [v1beta1.Claim(namespace="ns", uid="uid-2", name="c2")]
            sb = v1beta1_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
            r = await sb.NodePrepareResources(v1beta1.NodePrepareResourcesRequest(claims=b_claims))
            assert r.claims["uid-2"].devices[0].pool_name == "ns"
            r = await sb.NodeUnprepareResources(
                v1beta1.NodeUnprepareResourcesRequest(claims=b_claims)
            )
            assert r.claims["uid-2"].error == "v1beta1"

            sr = reg_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            info = await sr.GetInfo(reg.InfoRequest())
            assert (info.type, info.name) == ("DRAPlugin", "neuron.aws.com")
            await sr.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True))

            sh = health_grpc.DRAResourceHealthStub(channel)  # type: ignore[no-untyped-call]
            seen = [
                m.devices[0].health
                async for m in sh.NodeWatchResources(health.NodeWatchResourcesRequest())
            ]
            assert seen == [health.HEALTHY, health.UNHEALTHY]

            assert recorder.paths == [
                V1_PREPARE,
                V1_UNPREPARE,
                V1BETA1_PREPARE,
                V1BETA1_UNPREPARE,
                GET_INFO,
                NOTIFY,
                WATCH,
            ]

            # 2. Literal paths, as the Go kubelet dials them, reach our servicers
            # (raw bytes both ways, so no generated code on the client side).
            raw_claim = b"\x0a\x01n\x12\x01u\x1a\x01c"  # Claim{namespace=n, uid=u, name=c}
            for path in (V1_UNPREPARE, V1BETA1_UNPREPARE):
                call = channel.unary_unary(path)
                out = await call(_ld(1, raw_claim))
                answer = b"v1" if path == V1_UNPREPARE else b"v1beta1"
                # map<string, NodeUnprepareResourceResponse>{"u": {error: answer}}
                assert out == _ld(1, _ld(1, b"u") + _ld(2, _ld(1, answer)))
            assert await channel.unary_unary(GET_INFO)(b"") == (
                _ld(1, b"DRAPlugin") + _ld(2, b"neuron.aws.com")
            )
            # A wrong path (e.g. the registration string used as a service
            # name) must not be served.
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await channel.unary_unary("/v1.DRAPlugin/NodePrepareResources")(b"")
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(None)


# --------------------------------------------------------------------------
# Field numbers and types, by exact encoding
# --------------------------------------------------------------------------


@pytest.mark.parametrize("mod", [v1, v1beta1], ids=["v1", "v1beta1"])
def test_claim_and_request_encoding(mod: Any) -> None:
    claim = mod.Claim(namespace="a", uid="b", name="c")
    assert claim.SerializeToString() == b"\x0a\x01a\x12\x01b\x1a\x01c"
    body = b"\x0a\x01a\x12\x01b\x1a\x01c"
    for req in (mod.NodePrepareResourcesRequest, mod.NodeUnprepareResourcesRequest):
        assert req(claims=[claim, claim]).SerializeToString() == _ld(1, body) * 2


def test_v1_device_encoding_including_share_id() -> None:
    dev = v1.Device(
        request_names=["r1", "r2"],
        pool_name="p",
        device_name="d",
        cdi_device_ids=["k8s.neuron.aws.com/device=x"],
        share_id="s",
    )
    assert dev.SerializeToString() == (
        b"\x0a\x02r1\x0a\x02r2"  # 1 request_names, repeated string
        b"\x12\x01p"  # 2 pool_name
        b"\x1a\x01d"  # 3 device_name
        + _ld(4, b"k8s.neuron.aws.com/device=x")  # 4 cdi_device_ids
        + b"\x2a\x01s"  # 5 share_id
    )


def test_v1_share_id_is_proto3_optional() -> None:
    # Explicit presence: unset is omitted, but set-to-empty is still sent.
    dev = v1.Device(pool_name="p")
    assert not dev.HasField("share_id")
    assert dev.SerializeToString() == b"\x12\x01p"
    dev.share_id = ""
    assert dev.HasField("share_id")
    assert dev.SerializeToString() == b"\x12\x01p\x2a\x00"


def test_v1beta1_device_has_no_share_id() -> None:
    fields = v1beta1.Device.DESCRIPTOR.fields_by_name
    assert set(fields) == {"request_names", "pool_name", "device_name", "cdi_device_ids"}
    assert 5 not in v1beta1.Device.DESCRIPTOR.fields_by_number
    with pytest.raises(ValueError):
        v1beta1.Device(share_id="s")  # type: ignore[call-arg]
    # The v1 message is otherwise identical on the wire.
    both: dict[str, Any] = {
        "request_names": ["r"],
        "pool_name": "p",
        "device_name": "d",
        "cdi_device_ids": ["x"],
    }
    assert (
        v1beta1.Device(**both).SerializeToString()
        == v1.Device(**both).SerializeToString()
        == b"\x0a\x01r\x12\x01p\x1a\x01d\x22\x01x"
    )


@pytest.mark.parametrize("mod", [v1, v1beta1], ids=["v1", "v1beta1"])
def test_prepare_response_map_encoding(mod: Any) -> None:
    resp = mod.NodePrepareResourcesResponse()
    resp.claims["u"].devices.add(pool_name="p")
    resp.claims["u"].error = "e"
    value = _ld(1, b"\x12\x01p") + _ld(2, b"e")  # NodePrepareResourceResponse
    # A map is a repeated entry message: key = field 1, value = field 2.
    assert resp.SerializeToString() == _ld(1, _ld(1, b"u") + _ld(2, value))


@pytest.mark.parametrize("mod", [v1, v1beta1], ids=["v1", "v1beta1"])
def test_unprepare_response_map_encoding(mod: Any) -> None:
    resp = mod.NodeUnprepareResourcesResponse()
    resp.claims["u"].error = "e"
    assert resp.SerializeToString() == _ld(1, _ld(1, b"u") + _ld(2, _ld(1, b"e")))


@pytest.mark.parametrize("mod", [v1, v1beta1], ids=["v1", "v1beta1"])
def test_touching_a_map_entry_sends_the_uid(mod: Any) -> None:
    # The kubelet requires an entry for every claim even on plain success;
    # merely indexing the map must be enough to put the UID on the wire.
    for cls in (mod.NodePrepareResourcesResponse, mod.NodeUnprepareResourcesResponse):
        resp = cls()
        resp.claims["u"]  # creating the entry is the point
        wire = resp.SerializeToString()
        assert _ld(1, b"u") in wire
        assert list(cls.FromString(wire).claims) == ["u"]


def test_plugin_info_encoding() -> None:
    info = reg.PluginInfo(
        type="DRAPlugin",
        name="neuron.aws.com",
        endpoint="/var/lib/kubelet/plugins/neuron.aws.com/dra.sock",
        supported_versions=["v1.DRAPlugin", "v1beta1.DRAPlugin"],
    )
    assert info.SerializeToString() == (
        b"\x0a\x09DRAPlugin"
        b"\x12\x0eneuron.aws.com"
        + _ld(3, b"/var/lib/kubelet/plugins/neuron.aws.com/dra.sock")
        + b"\x22\x0cv1.DRAPlugin"
        b"\x22\x11v1beta1.DRAPlugin"
    )


def test_registration_status_encoding() -> None:
    # Field 1 is a varint bool, field 2 a string.
    status = reg.RegistrationStatus(plugin_registered=True, error="x")
    assert status.SerializeToString() == b"\x08\x01\x12\x01x"
    assert reg.RegistrationStatus.FromString(b"\x08\x01").plugin_registered is True
    assert reg.InfoRequest().SerializeToString() == b""
    assert reg.RegistrationStatusResponse().SerializeToString() == b""


def test_health_status_enum_values() -> None:
    # Package-scoped enum: values are module-level names in Python.
    assert (health.UNKNOWN, health.HEALTHY, health.UNHEALTHY) == (0, 1, 2)
    assert dict(health.HealthStatus.items()) == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}


def test_device_health_encoding() -> None:
    dh = health.DeviceHealth(
        device=health.DeviceIdentifier(pool_name="p", device_name="d"),
        health=health.UNHEALTHY,
        last_updated_time=1_700_000_000,
        health_check_timeout_seconds=60,
        message="m",
    )
    expected = (
        _ld(1, b"\x0a\x01p\x12\x01d")  # 1 device {1 pool_name, 2 device_name}
        + b"\x10\x02"  # 2 health = UNHEALTHY (varint)
        + b"\x18\x80\xe2\xcf\xaa\x06"  # 3 last_updated_time = 1_700_000_000 (varint)
        + b"\x20\x3c"  # 4 health_check_timeout_seconds = 60
        + b"\x2a\x01m"  # 5 message (1.36 field; older kubelets skip it)
    )
    assert dh.SerializeToString() == expected
    assert health.NodeWatchResourcesResponse(devices=[dh]).SerializeToString() == _ld(1, expected)
    assert health.NodeWatchResourcesRequest().SerializeToString() == b""


# --------------------------------------------------------------------------
# hack/gen-proto
# --------------------------------------------------------------------------

needs_grpc_tools = pytest.mark.skipif(
    importlib.util.find_spec("grpc_tools") is None,
    reason="grpcio-tools is not installed (dev extra); cannot regenerate",
)


def _gen_proto(
    root: Path, *args: str, python: str = sys.executable
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(root / "hack" / "gen-proto"), *args],
        env={**os.environ, "PYTHON": python},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@needs_grpc_tools
def test_committed_generated_code_is_fresh() -> None:
    res = _gen_proto(REPO, "--check")
    assert res.returncode == 0, res.stderr


@needs_grpc_tools
def test_check_reports_stale_and_orphaned_files() -> None:
    # Work on a copy so the real tree is never touched.
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "hack").mkdir()
        shutil.copy2(REPO / "hack" / "gen-proto", root / "hack" / "gen-proto")
        shutil.copytree(REPO / "proto", root / "proto")
        gen = root / "proto/neuron_dra/proto/dra/v1/api_pb2.py"
        gen.write_text(gen.read_text() + "# edited\n")
        (root / "proto/neuron_dra/proto/dra/v1/gone_pb2.py").write_text("")

        res = _gen_proto(root, "--check")
        assert res.returncode == 1
        assert "proto/neuron_dra/proto/dra/v1/api_pb2.py (differs)" in res.stderr
        assert "proto/neuron_dra/proto/dra/v1/gone_pb2.py (no matching .proto)" in res.stderr
        assert "v1beta1" not in res.stderr

        # Regenerating repairs both problems.
        assert _gen_proto(root).returncode == 0
        assert not (root / "proto/neuron_dra/proto/dra/v1/gone_pb2.py").exists()
        assert _gen_proto(root, "--check").returncode == 0


def test_wrong_grpcio_tools_version_is_refused() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        fake = Path(tmp) / "python"
        # Stands in for an interpreter whose grpcio-tools is the wrong version.
        fake.write_text("#!/bin/sh\ncat >/dev/null\necho 1.0.0\n")
        fake.chmod(0o755)
        res = _gen_proto(REPO, "--check", python=str(fake))
    assert res.returncode == 1
    assert "need grpcio-tools==1.85.1" in res.stderr
    assert "found '1.0.0'" in res.stderr
