"""The kubelet-facing gRPC layer over real Unix sockets.

The kubelet side is played by ``kubelet_wire`` (hand-written protobuf on raw bytes, no
``neuron_dra.proto`` import), so these tests check wire compatibility with the upstream
field numbers, not just agreement of our code with itself; the optional upstream tier runs
the same flows with stubs compiled from k8s.io/kubelet's own .proto files. ``KubeletClient``
(our generated stubs) is tested against the same server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import kubelet_wire as wire
import pytest
from neuron_dra.nodeplugin.kubeletapi import (
    DRA_PLUGIN_TYPE,
    HEALTH_SERVICE,
    V1_SERVICE,
    V1BETA1_SERVICE,
    ClaimRef,
    DeviceHealthReport,
    HealthBoard,
    PluginCallError,
    PluginServer,
    PreparedDevice,
    PrepareResult,
    RegistrationRejected,
    ServerStateError,
    SocketPathError,
    UnprepareResult,
    socket_paths,
)
from neuron_dra.sim.kubeletclient import KubeletClient, discover, pick_service
from neuron_dra.sim.scratch import work_dir

DRIVER = "neuron.aws.com"
VERSIONS = ["v1", "v1beta1"]
# Generous per-step bound so a hang fails the test instead of stalling the run.
STEP = 10.0

A = ("team-a", "uid-a", "claim-a")
B = ("team-b", "uid-b", "claim-b")


def ref(c: tuple[str, str, str]) -> ClaimRef:
    return ClaimRef(*c)


def device_for(c: ClaimRef) -> PreparedDevice:
    return PreparedDevice(
        request_names=("main", "aux"),
        pool_name="node-1",
        device_name=f"neuron-{c.name}",
        cdi_device_ids=(f"k8s.neuron.aws.com/device={c.uid}-0", "k8s.neuron.aws.com/node=all"),
    )


@dataclass
class FakeBackend:
    """Test double of the checkpoint/CDI backend; every behaviour is switchable."""

    #: Per-claim errors by UID (the other claims of the batch succeed).
    errors: dict[str, str] = field(default_factory=dict)
    #: UIDs left out of the returned mapping.
    omit: set[str] = field(default_factory=set)
    #: UIDs prepared successfully with no devices.
    no_devices: set[str] = field(default_factory=set)
    #: Extra UIDs the backend (wrongly) answers for.
    extra: set[str] = field(default_factory=set)
    #: Raised for the whole batch.
    fail_with: Exception | None = None
    #: If set, calls wait for it (to hold a call in flight or exceed the budget).
    release: asyncio.Event | None = None
    #: The shareID every prepared device carries (a shared device), if any.
    share_id: str | None = None
    calls: list[tuple[str, list[ClaimRef]]] = field(default_factory=list)
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)

    async def _enter(self, op: str, claims: Sequence[ClaimRef]) -> None:
        self.calls.append((op, list(claims)))
        self.entered.set()
        if self.release is not None:
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        if self.fail_with is not None:
            raise self.fail_with

    def _uids(self, claims: Sequence[ClaimRef]) -> list[str]:
        return [c.uid for c in claims if c.uid not in self.omit] + sorted(self.extra)

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        await self._enter("prepare", claims)
        by_uid = {c.uid: c for c in claims}
        out: dict[str, PrepareResult] = {}
        for uid in self._uids(claims):
            if uid in self.errors:
                # Devices alongside an error must not reach the kubelet.
                out[uid] = PrepareResult(devices=(device_for(by_uid[uid]),), error=self.errors[uid])
            elif uid in self.no_devices:
                out[uid] = PrepareResult()
            else:
                c = by_uid.get(uid, ClaimRef("x", uid, "x"))
                device = dataclasses.replace(device_for(c), share_id=self.share_id)
                out[uid] = PrepareResult(devices=(device,))
        return out

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareResult]:
        await self._enter("unprepare", claims)
        return {uid: UnprepareResult(error=self.errors.get(uid, "")) for uid in self._uids(claims)}


def expected_device(c: tuple[str, str, str]) -> wire.WireDevice:
    d = device_for(ref(c))
    return wire.WireDevice(
        list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids), None
    )


@dataclass
class Dirs:
    plugins: Path
    registrar: Path


@pytest.fixture
def dirs() -> Iterator[Dirs]:
    # Under /tmp: pytest's tmp_path can exceed the 107-byte socket path limit.
    root = work_dir("kubeletapi", Path("/tmp"))
    try:
        yield Dirs(root / "plugins", root / "registry")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


def make_server(dirs: Dirs, backend: FakeBackend, **kw: Any) -> PluginServer:
    return PluginServer(
        driver_name=DRIVER,
        plugins_dir=dirs.plugins,
        registrar_dir=dirs.registrar,
        backend=backend,
        **kw,
    )


@pytest.fixture
async def server(dirs: Dirs, backend: FakeBackend) -> AsyncIterator[PluginServer]:
    srv = make_server(dirs, backend, budget=5.0)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop(grace=None)


def is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def leftover_socket(path: Path, *, listening: bool = False) -> socket.socket:
    """A socket file at ``path``; closed (stale) unless ``listening``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    if listening:
        s.listen(1)
    else:
        s.close()
    return s


# --------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------


async def test_get_info_fields_and_order(server: PluginServer, dirs: Dirs) -> None:
    kubelet = wire.WireKubelet()
    info = await kubelet.get_info(server.registration_socket)
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == str(dirs.plugins / DRIVER / "dra.sock")
    assert Path(info.endpoint).is_absolute() and is_socket(Path(info.endpoint))
    # v1 first: a 1.34+ kubelet takes the first entry of *our* list that it supports.
    assert info.supported_versions == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert server.registration_socket == dirs.registrar / f"{DRIVER}-reg.sock"
    # The kubelet may ask again at any time (health check); same answer.
    assert await kubelet.get_info(server.registration_socket) == info
    assert server.registration.info_requests == 2
    assert not server.registered.is_set()


async def test_notify_registration_status_is_recorded(server: PluginServer) -> None:
    kubelet = wire.WireKubelet()
    assert await kubelet.notify(server.registration_socket, True) == b""
    await asyncio.wait_for(server.registered.wait(), STEP)
    assert server.registration.last_error == ""

    msg = "RegisterPlugin error -- plugin name neuron.aws.com already registered"
    # A failed registration is answered OK too (the kubelet only logs notify errors).
    assert await kubelet.notify(server.registration_socket, False, msg) == b""
    assert not server.registered.is_set()
    assert server.registration.last_error == msg
    assert server.registration.notifications == 2

    await kubelet.notify(server.registration_socket, True)
    assert server.registered.is_set() and server.registration.last_error == ""


async def test_health_service_is_advertised_only_when_served(
    dirs: Dirs, backend: FakeBackend
) -> None:
    async with make_server(dirs, backend, health_source=HealthBoard()) as srv:
        info = await wire.WireKubelet().get_info(srv.registration_socket)
        assert info.supported_versions == [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        ]


# --------------------------------------------------------------------------------------
# Prepare / Unprepare
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
async def test_prepare_and_unprepare_round_trip(
    server: PluginServer, backend: FakeBackend, version: str
) -> None:
    kubelet = wire.WireKubelet()
    got = await kubelet.prepare(server.dra_socket, version, [A, B])
    assert got == {
        "uid-a": wire.WirePrepared([expected_device(A)], ""),
        "uid-b": wire.WirePrepared([expected_device(B)], ""),
    }
    assert all(d.share_id is None for r in got.values() for d in r.devices)
    assert backend.calls == [("prepare", [ref(A), ref(B)])]

    assert await kubelet.unprepare(server.dra_socket, version, [A, B]) == {
        "uid-a": "",
        "uid-b": "",
    }
    assert backend.calls[1] == ("unprepare", [ref(A), ref(B)])


@pytest.mark.parametrize("version", VERSIONS)
async def test_share_id_goes_to_the_kubelet_over_v1_only(
    server: PluginServer, backend: FakeBackend, version: str
) -> None:
    """A device several claims share is named with the allocation's shareID (field 5 of
    v1's Device, 1.35+); v1beta1 has no such field, so nothing is sent there."""
    backend.share_id = "5f0c7a9e-2b1d-4c3e-8f4a-0d6b9e1c2a37"
    got = await wire.WireKubelet().prepare(server.dra_socket, version, [A])
    (device,) = got["uid-a"].devices
    assert device.share_id == (backend.share_id if version == "v1" else None)


@pytest.mark.parametrize("version", VERSIONS)
async def test_per_claim_errors_are_isolated(
    server: PluginServer, backend: FakeBackend, version: str
) -> None:
    backend.errors = {"uid-a": "device neuron-3 is unhealthy"}
    kubelet = wire.WireKubelet()
    got = await kubelet.prepare(server.dra_socket, version, [A, B])
    # The error entry carries no devices; the other claim is unaffected.
    assert got["uid-a"] == wire.WirePrepared([], "device neuron-3 is unhealthy")
    assert got["uid-b"] == wire.WirePrepared([expected_device(B)], "")

    assert await kubelet.unprepare(server.dra_socket, version, [A, B]) == {
        "uid-a": "device neuron-3 is unhealthy",
        "uid-b": "",
    }


@pytest.mark.parametrize("version", VERSIONS)
async def test_success_without_devices_still_has_an_entry(
    server: PluginServer, backend: FakeBackend, version: str
) -> None:
    # Otherwise the kubelet counts the claim as skipped and fails the pod.
    backend.no_devices = {"uid-a"}
    got = await wire.WireKubelet().prepare(server.dra_socket, version, [A])
    assert got == {"uid-a": wire.WirePrepared([], "")}


@pytest.mark.parametrize("version", VERSIONS)
async def test_omitted_claims_get_errors_and_unknown_uids_are_dropped(
    server: PluginServer, backend: FakeBackend, version: str
) -> None:
    backend.omit = {"uid-b"}
    backend.extra = {"uid-stranger"}
    kubelet = wire.WireKubelet()
    got = await kubelet.prepare(server.dra_socket, version, [A, B])
    assert set(got) == {"uid-a", "uid-b"}  # never a UID the kubelet did not ask about
    assert got["uid-a"].error == ""
    assert got["uid-b"].devices == []
    assert "team-b/claim-b" in got["uid-b"].error and "retry" in got["uid-b"].error

    unprepared = await kubelet.unprepare(server.dra_socket, version, [A, B])
    assert set(unprepared) == {"uid-a", "uid-b"}
    assert unprepared["uid-a"] == "" and "team-b/claim-b" in unprepared["uid-b"]


@pytest.mark.parametrize("version", VERSIONS)
async def test_backend_exception_becomes_per_claim_errors(
    server: PluginServer, backend: FakeBackend, version: str
) -> None:
    backend.fail_with = RuntimeError("checkpoint {file} is corrupt")  # braces on purpose
    kubelet = wire.WireKubelet()
    got = await kubelet.prepare(server.dra_socket, version, [A, B])  # status is OK
    assert got == {
        "uid-a": wire.WirePrepared(
            [], "preparing claim team-a/claim-a failed: checkpoint {file} is corrupt"
        ),
        "uid-b": wire.WirePrepared(
            [], "preparing claim team-b/claim-b failed: checkpoint {file} is corrupt"
        ),
    }
    assert await kubelet.unprepare(server.dra_socket, version, [A]) == {
        "uid-a": "unpreparing claim team-a/claim-a failed: checkpoint {file} is corrupt"
    }


async def test_backend_timeout_error_is_not_mistaken_for_the_budget(
    server: PluginServer, backend: FakeBackend
) -> None:
    backend.fail_with = TimeoutError("API server did not answer")
    got = await wire.WireKubelet().prepare(server.dra_socket, "v1", [A])
    assert got["uid-a"].error == "preparing claim team-a/claim-a failed: API server did not answer"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("op", ["prepare", "unprepare"])
async def test_budget_expiry_answers_ok_with_timeout_errors(
    dirs: Dirs, backend: FakeBackend, version: str, op: str
) -> None:
    backend.release = asyncio.Event()  # never set: the backend hangs
    # Stand-in for the kubelet's 45 s deadline vs our 40 s budget, scaled down.
    kubelet = wire.WireKubelet(call_timeout=3.0)
    async with make_server(dirs, backend, budget=0.2) as srv:
        # Per-claim timeouts in the answer mean the plugin answered before the kubelet's own
        # deadline (which would fail the whole call instead).
        if op == "prepare":
            got = await kubelet.prepare(srv.dra_socket, version, [A, B])
            errors = {uid: r.error for uid, r in got.items()}
            assert all(r.devices == [] for r in got.values())
        else:
            errors = await kubelet.unprepare(srv.dra_socket, version, [A, B])
        verb = "preparing" if op == "prepare" else "unpreparing"
        assert errors == {
            "uid-a": f"timed out after 0.2s {verb} claim team-a/claim-a; the kubelet will retry",
            "uid-b": f"timed out after 0.2s {verb} claim team-b/claim-b; the kubelet will retry",
        }
        # Like a Go context deadline, the backend's work is cancelled.
        await asyncio.wait_for(backend.cancelled.wait(), STEP)


@pytest.mark.parametrize(
    "claims",
    [
        [("ns", "", "name")],
        [("", "uid", "name")],
        [("ns", "uid", "")],
        [("ns", "uid", "one"), ("ns", "uid", "other")],
    ],
    ids=["empty-uid", "empty-namespace", "empty-name", "uid-conflict"],
)
@pytest.mark.parametrize("version", VERSIONS)
async def test_malformed_request_is_invalid_argument(
    server: PluginServer, backend: FakeBackend, version: str, claims: list[tuple[str, str, str]]
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await wire.WireKubelet().prepare(server.dra_socket, version, claims)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert backend.calls == []


async def test_empty_and_repeated_claims(server: PluginServer, backend: FakeBackend) -> None:
    kubelet = wire.WireKubelet()
    assert await kubelet.prepare(server.dra_socket, "v1", []) == {}
    assert backend.calls == []
    # The same claim twice is answered once and passed to the backend once.
    got = await kubelet.prepare(server.dra_socket, "v1", [A, A])
    assert list(got) == ["uid-a"]
    assert backend.calls == [("prepare", [ref(A)])]


async def test_wrong_method_paths_are_unimplemented(server: PluginServer) -> None:
    async with wire.channel(server.dra_socket) as ch:
        for path in ("/v1.DRAPlugin/NodePrepareResources", wire.WATCH):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await wire.unary(ch, path, b"")
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


# --------------------------------------------------------------------------------------
# Sockets and lifecycle
# --------------------------------------------------------------------------------------


async def test_stale_sockets_are_replaced(
    dirs: Dirs, backend: FakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    dra, reg = socket_paths(DRIVER, dirs.plugins, dirs.registrar, None)
    leftover_socket(dra)
    leftover_socket(reg)
    caplog.set_level(logging.INFO, logger="neuron_dra.nodeplugin.kubeletapi")
    async with make_server(dirs, backend) as srv:
        removed = [
            getattr(r, "path", None)
            for r in caplog.records
            if r.getMessage() == "removing stale socket"
        ]
        assert removed == [str(dra), str(reg)]
        info = await wire.WireKubelet().get_info(srv.registration_socket)
        assert info.name == DRIVER
        assert await wire.WireKubelet().unprepare(srv.dra_socket, "v1", [A]) == {"uid-a": ""}


@pytest.mark.parametrize("which", ["dra", "registration"])
async def test_non_socket_file_is_refused_with_a_clear_error(
    dirs: Dirs, backend: FakeBackend, which: str
) -> None:
    dra, reg = socket_paths(DRIVER, dirs.plugins, dirs.registrar, None)
    path = dra if which == "dra" else reg
    path.parent.mkdir(parents=True)
    path.write_text("not a socket")
    srv = make_server(dirs, backend)
    with pytest.raises(SocketPathError) as err:
        await srv.start()
    assert str(path) in str(err.value)
    assert "not a Unix socket" in str(err.value) and "Remove it" in str(err.value)
    assert path.read_text() == "not a socket"  # untouched
    # Nothing was started: no socket of ours is left behind for the kubelet to find.
    assert not is_socket(dra) and not is_socket(reg)
    await srv.stop()


async def test_socket_in_use_by_a_live_process_is_refused(dirs: Dirs, backend: FakeBackend) -> None:
    _, reg = socket_paths(DRIVER, dirs.plugins, dirs.registrar, None)
    other = leftover_socket(reg, listening=True)
    try:
        with pytest.raises(SocketPathError, match="in use by another running process"):
            await make_server(dirs, backend).start()
        assert is_socket(reg)  # the other instance keeps its registration
    finally:
        other.close()


async def test_two_instances_with_pod_uids_side_by_side(dirs: Dirs) -> None:
    old_backend, new_backend = FakeBackend(), FakeBackend()
    old = make_server(dirs, old_backend, pod_uid="pod-old")
    new = make_server(dirs, new_backend, pod_uid="pod-new")
    assert old.dra_socket == dirs.plugins / DRIVER / "dra-pod-old.sock"
    assert old.registration_socket == dirs.registrar / f"{DRIVER}-pod-old-reg.sock"
    await old.start()
    try:
        await new.start()
        try:
            kubelet = wire.WireKubelet()
            infos = [await kubelet.get_info(s.registration_socket) for s in (old, new)]
            assert [i.endpoint for i in infos] == [str(old.dra_socket), str(new.dra_socket)]
            await kubelet.prepare(old.dra_socket, "v1", [A])
            await kubelet.prepare(new.dra_socket, "v1", [B])
            assert [c[1] for c in old_backend.calls] == [[ref(A)]]
            assert [c[1] for c in new_backend.calls] == [[ref(B)]]

            # The old pod goes away during the rolling update: only its sockets vanish.
            await old.stop()
            assert not old.dra_socket.exists() and not old.registration_socket.exists()
            assert is_socket(new.dra_socket) and is_socket(new.registration_socket)
            assert (await kubelet.get_info(new.registration_socket)).name == DRIVER
        finally:
            await new.stop()
    finally:
        await old.stop()


async def test_stop_removes_exactly_our_two_sockets(dirs: Dirs, backend: FakeBackend) -> None:
    srv = make_server(dirs, backend)
    await srv.start()
    others = [
        dirs.registrar / "other.example.com-reg.sock",
        dirs.plugins / DRIVER / "dra-some-other-pod.sock",
    ]
    listeners = [leftover_socket(p, listening=True) for p in others]
    note = dirs.plugins / DRIVER / "checkpoint.json"
    note.write_text("{}")
    try:
        await srv.stop()
        assert not srv.dra_socket.exists() and not srv.registration_socket.exists()
        assert all(is_socket(p) for p in others)
        assert note.read_text() == "{}"
        assert sorted(os.listdir(dirs.registrar)) == ["other.example.com-reg.sock"]
        await srv.stop()  # idempotent
    finally:
        for s in listeners:
            s.close()


async def test_stop_deregisters_first_and_lets_inflight_calls_finish(
    dirs: Dirs, backend: FakeBackend
) -> None:
    backend.release = asyncio.Event()
    srv = make_server(dirs, backend)
    await srv.start()
    await wire.WireKubelet().notify(srv.registration_socket, True)
    inflight = asyncio.create_task(wire.WireKubelet().prepare(srv.dra_socket, "v1", [A]))
    await asyncio.wait_for(backend.entered.wait(), STEP)

    stopping = asyncio.create_task(srv.stop(grace=STEP))
    # No event exists for a file disappearing: poll, bounded.
    deadline = time.monotonic() + STEP
    while srv.registration_socket.exists():
        assert time.monotonic() < deadline, "registration socket not removed"
        await asyncio.sleep(0.01)
    assert not srv.registered.is_set()
    assert not stopping.done()  # the DRA server still waits for the in-flight call

    backend.release.set()
    got = await asyncio.wait_for(inflight, STEP)
    assert got["uid-a"].error == ""
    await asyncio.wait_for(stopping, STEP)
    assert not srv.dra_socket.exists()


async def test_grpc_health_reports_serving(server: PluginServer) -> None:
    async with wire.channel(server.dra_socket) as ch:
        for service in ("", "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"):
            raw = await wire.unary(ch, wire.HEALTH_CHECK, wire.health_check_request(service))
            assert wire.decode_health_check_response(raw) == 1  # SERVING


async def test_start_twice_and_constructor_validation(
    server: PluginServer, dirs: Dirs, backend: FakeBackend
) -> None:
    with pytest.raises(ServerStateError):
        await server.start()
    with pytest.raises(ValueError, match="budget"):
        make_server(dirs, backend, budget=45.0)
    with pytest.raises(ValueError, match="absolute"):
        PluginServer(driver_name=DRIVER, plugins_dir="rel", registrar_dir="/x", backend=backend)
    for bad in ("a/b", ".hidden", ""):
        with pytest.raises(ValueError, match="pod UID"):
            make_server(dirs, backend, pod_uid=bad)
    with pytest.raises(SocketPathError, match="107"):
        PluginServer(
            driver_name=DRIVER,
            plugins_dir="/tmp/" + "d" * 100,
            registrar_dir=dirs.registrar,
            backend=backend,
        )


# --------------------------------------------------------------------------------------
# dra-health v1 and v1alpha1
# --------------------------------------------------------------------------------------

H0 = DeviceHealthReport("node-1", "neuron-0", True, 1_700_000_000)
H1 = DeviceHealthReport("node-1", "neuron-1", None, 1_700_000_001, timeout_seconds=60)
#: A device's timeout when its report has none: 3 resend intervals (10 s by default).
DEFAULT_TIMEOUT = 30


@pytest.mark.parametrize("path", [wire.WATCH_V1, wire.WATCH], ids=["v1", "v1alpha1"])
async def test_health_stream_sends_full_list_on_connect_and_on_change(
    dirs: Dirs, backend: FakeBackend, path: str
) -> None:
    """Either version (a 1.37 kubelet opens v1, 1.34-1.36 ones v1alpha1) gives the same
    complete lists, each device with its timeout and, when unhealthy, why."""
    board = HealthBoard([H0, H1])
    async with make_server(dirs, backend, health_source=board) as srv:
        async with wire.channel(srv.dra_socket) as ch:
            call = wire.stream(ch, path, b"")
            it = call.__aiter__()
            first = wire.decode_watch_response(await asyncio.wait_for(it.__anext__(), STEP))
            assert first == [
                wire.WireDeviceHealth(
                    "node-1", "neuron-0", wire.HEALTHY, 1_700_000_000, DEFAULT_TIMEOUT
                ),
                wire.WireDeviceHealth("node-1", "neuron-1", wire.UNKNOWN, 1_700_000_001, 60),
            ]
            why = "sysfs stats/hardware/sram_ecc_uncorrected: 3; " + "x" * 2000
            board.put(DeviceHealthReport("node-1", "neuron-0", False, 1_700_000_100, message=why))
            second = wire.decode_watch_response(await asyncio.wait_for(it.__anext__(), STEP))
            # The kubelet keeps 1024 characters: a longer message is cut as it would cut it.
            assert second[0] == wire.WireDeviceHealth(
                "node-1", "neuron-0", wire.UNHEALTHY, 1_700_000_100, DEFAULT_TIMEOUT,
                why[:1021] + "...",
            )  # fmt: skip
            assert second[1] == first[1]  # complete list every time
            call.cancel()  # the kubelet hangs up
        # A hung-up stream does not keep the server from stopping promptly.
        await asyncio.wait_for(srv.stop(grace=STEP * 3), STEP)


async def test_health_stream_ends_when_the_server_stops(dirs: Dirs, backend: FakeBackend) -> None:
    srv = make_server(dirs, backend, health_source=HealthBoard([H0]))
    await srv.start()
    try:
        async with wire.channel(srv.dra_socket) as ch:
            call = wire.stream(ch, wire.WATCH, b"")
            it = call.__aiter__()
            await asyncio.wait_for(it.__anext__(), STEP)
            # With a long grace, stop() only returns fast if the stream ends by itself.
            await asyncio.wait_for(srv.stop(grace=STEP * 3), STEP)
            with pytest.raises(StopAsyncIteration):
                await asyncio.wait_for(it.__anext__(), STEP)
            assert await call.code() == grpc.StatusCode.OK
    finally:
        await srv.stop()


async def test_health_stream_resends_without_changes(dirs: Dirs, backend: FakeBackend) -> None:
    # The kubelet marks devices Unknown when not re-reported within its timeout.
    srv = make_server(dirs, backend, health_source=HealthBoard([H0]), health_resend_interval=0.05)
    async with srv, wire.channel(srv.dra_socket) as ch:
        call = wire.stream(ch, wire.WATCH, b"")
        it = call.__aiter__()
        msgs = [await asyncio.wait_for(it.__anext__(), STEP) for _ in range(3)]
        assert msgs[0] == msgs[1] == msgs[2]
        call.cancel()


async def test_health_board_generation_is_level_triggered() -> None:
    board = HealthBoard([H0])
    g = board.generation
    board.put(H0)  # no change: no new generation
    assert board.generation == g
    board.replace([H0, H1])
    # A change that happened before waiting is not missed.
    await asyncio.wait_for(board.changed(g), STEP)
    assert board.snapshot() == [H0, H1]
    waiter = asyncio.create_task(board.changed(board.generation))
    await asyncio.sleep(0)
    assert not waiter.done()
    board.replace([H1])
    await asyncio.wait_for(waiter, STEP)


# --------------------------------------------------------------------------------------
# KubeletClient (our generated stubs) against PluginServer
# --------------------------------------------------------------------------------------


async def test_kubelet_client_flow(dirs: Dirs, backend: FakeBackend) -> None:
    board = HealthBoard([H0])
    async with make_server(dirs, backend, pod_uid="p1", health_source=board) as srv:
        # Things the discovery must ignore.
        leftover_socket(dirs.registrar / ".hidden-reg.sock", listening=True).close()
        (dirs.registrar / "README").write_text("not a socket")
        client = KubeletClient(dirs.registrar)
        try:
            assert client.discover() == [srv.registration_socket]
            [plugin] = await client.register_all()
            assert plugin.service == V1_SERVICE
            assert plugin.info.type == DRA_PLUGIN_TYPE
            assert plugin.endpoint == str(srv.dra_socket)
            assert HEALTH_SERVICE in plugin.info.supported_versions
            await asyncio.wait_for(srv.registered.wait(), STEP)
            assert client.plugin(DRIVER) is plugin
            assert await client.register_all() == []  # already known

            backend.errors = {"uid-b": "no such device"}
            assert await plugin.prepare([ref(A), ref(B)]) == {
                "uid-a": PrepareResult(devices=(device_for(ref(A)),)),
                "uid-b": PrepareResult(error="no such device"),
            }
            assert await plugin.unprepare([ref(A)]) == {"uid-a": UnprepareResult()}
            backend.share_id = "5f0c7a9e-2b1d-4c3e-8f4a-0d6b9e1c2a37"
            ((device,),) = [r.devices for r in (await plugin.prepare([ref(A)])).values()]
            assert device.share_id == backend.share_id  # our client reads it (v1)
            backend.share_id = None

            with pytest.raises(PluginCallError) as err:
                await plugin.prepare([ClaimRef("ns", "", "x")])
            assert err.value.code == "INVALID_ARGUMENT"

            reports = plugin.health_stream()  # over v1, the newest advertised
            with_timeout = dataclasses.replace(H0, timeout_seconds=DEFAULT_TIMEOUT)
            assert await asyncio.wait_for(anext(reports), STEP) == [with_timeout]
            await reports.aclose()

            # Registering the same endpoint again is refused, and the plugin is told.
            with pytest.raises(RegistrationRejected, match="already registered"):
                await client.register(srv.registration_socket)
            assert not srv.registered.is_set()
            assert "already registered" in srv.registration.last_error
        finally:
            await client.close()


async def test_kubelet_client_prefers_the_newest_instance(dirs: Dirs) -> None:
    b_old, b_new = FakeBackend(), FakeBackend()
    async with make_server(dirs, b_old, pod_uid="old") as old:
        client = KubeletClient(dirs.registrar)
        try:
            await client.register(old.registration_socket)
            async with make_server(dirs, b_new, pod_uid="new") as new:
                await client.register(new.registration_socket)
                assert client.plugin(DRIVER).endpoint == str(new.dra_socket)
                await client.plugin(DRIVER).unprepare([ref(A)])
                assert b_new.calls and not b_old.calls
        finally:
            await client.close()


def test_pick_service_follows_the_plugins_order() -> None:
    assert pick_service([V1_SERVICE, V1BETA1_SERVICE]) == V1_SERVICE
    assert pick_service([HEALTH_SERVICE, V1BETA1_SERVICE, V1_SERVICE]) == V1BETA1_SERVICE
    with pytest.raises(RegistrationRejected, match="none of the services"):
        pick_service(["v1alpha3.NodeService"])
    with pytest.raises(RegistrationRejected, match="no supported versions"):
        pick_service([])


def test_discover_skips_dot_names_and_non_sockets(dirs: Dirs) -> None:
    good = dirs.registrar / "sub" / "x-reg.sock"
    leftover_socket(good)
    leftover_socket(dirs.registrar / ".tmp" / "y-reg.sock")
    leftover_socket(dirs.registrar / ".z-reg.sock")
    (dirs.registrar / "plain").write_text("")
    assert discover(dirs.registrar) == [good]


# --------------------------------------------------------------------------------------
# Optional tier: stubs compiled from upstream k8s.io/kubelet protos
# --------------------------------------------------------------------------------------


def test_strip_gogo_keeps_the_message_and_drops_only_gogo() -> None:
    text = (
        'import "github.com/gogo/protobuf/gogoproto/gogo.proto";\n'
        "option (gogoproto.goproto_getters_all) = true;\n"
        'message Claim { string uid = 2 [(gogoproto.customname) = "UID"]; }\n'
    )
    assert wire.strip_gogo(text).strip() == "message Claim { string uid = 2; }"


def upstream_kubelet_apis() -> Path | None:
    """``pkg/apis`` of k8s.io/kubelet: ``$KUBELET_API_PROTO_DIR``, else the module the 1.34
    pin builds with, in the Go module cache (hack/k8s/build downloads it)."""
    if os.environ.get("KUBELET_API_PROTO_DIR"):
        return Path(os.environ["KUBELET_API_PROTO_DIR"])
    go_mod = Path(__file__).resolve().parents[2] / "hack" / "k8s" / "v1.34" / "go.mod"
    pinned = re.search(r"k8s\.io/kubelet => k8s\.io/kubelet (v\S+)", go_mod.read_text())
    cache = os.environ.get("GOMODCACHE")
    if not cache and shutil.which("go"):
        cache = subprocess.run(
            ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=False
        ).stdout.strip()
    if not pinned or not cache:
        return None
    apis = Path(cache) / f"k8s.io/kubelet@{pinned.group(1)}" / "pkg" / "apis"
    return apis if apis.is_dir() else None


async def test_flows_with_upstream_protos(dirs: Dirs, backend: FakeBackend) -> None:
    found = upstream_kubelet_apis()
    if found is None:
        why = (
            "k8s.io/kubelet's .proto files not found: run hack/k8s/build (it fills the Go "
            "module cache) or set KUBELET_API_PROTO_DIR to a k8s.io/kubelet checkout's pkg/apis"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(why)
        pytest.skip(why)
    apis = found
    work = work_dir("upstream", Path("/tmp"))
    try:
        gen = wire.compile_upstream(apis, work)
        backend.errors = {"uid-b": "boom"}
        async with make_server(dirs, backend) as srv:
            # A subprocess, because the upstream messages have the same full names as
            # ours and cannot share this process's descriptor pool.
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                wire.__file__,
                "--registration-socket",
                str(srv.registration_socket),
                "--dra-socket",
                str(srv.dra_socket),
                "--claims",
                json.dumps([A, B]),
                env={**os.environ, "PYTHONPATH": str(gen)},
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, err.decode()
            assert srv.registered.is_set()
        result = json.loads(out)
        assert result["info"] == {
            "type": "DRAPlugin",
            "name": DRIVER,
            "endpoint": str(srv.dra_socket),
            "supported_versions": ["v1.DRAPlugin", "v1beta1.DRAPlugin"],
        }
        dev_a = expected_device(A)
        for version in VERSIONS:
            assert result[version]["prepare"] == {
                "uid-a": {
                    "devices": [
                        {
                            "request_names": dev_a.request_names,
                            "pool_name": dev_a.pool_name,
                            "device_name": dev_a.device_name,
                            "cdi_device_ids": dev_a.cdi_device_ids,
                            "share_id": None,
                        }
                    ],
                    "error": "",
                },
                "uid-b": {"devices": [], "error": "boom"},
            }
            assert result[version]["unprepare"] == {"uid-a": "", "uid-b": "boom"}
    finally:
        shutil.rmtree(work, ignore_errors=True)
