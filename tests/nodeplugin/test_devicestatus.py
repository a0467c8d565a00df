"""ResourceClaim status.devices (prepare/devicestatus.py): the entries built from a prepared
claim (pure), and the writer converging them over real HTTP against the fake API server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes_asyncio import client
from neuron_dra.common.k8s.client import KubeClient
from neuron_dra.common.k8s.clock import InstantClock
from neuron_dra.common.k8s.workqueue import ExponentialBackoff
from neuron_dra.nodeplugin.prepare import checkpoint as ckpt
from neuron_dra.nodeplugin.prepare.devicestatus import (
    DeviceStatusWriter,
    StatusReportingBackend,
    device_statuses,
)
from neuron_dra.sim.fakeapi.server import FakeAPIServer

NODE = "trn2u-1"
WAIT = 10.0


def entry(uid: str, name: str, devices: tuple[str, ...], env: dict[str, str]) -> ckpt.ClaimEntry:
    return ckpt.ClaimEntry(
        uid=uid,
        namespace="default",
        name=name,
        devices=tuple(
            ckpt.DeviceRecord(("d",), NODE, d, (f"k8s.neuron.aws.com/claim={uid}-{d}",))
            for d in devices
        ),
        device_indices=tuple(
            int(d.removeprefix("neurondevice")) for d in devices if d.startswith("neurondevice")
        ),
        cdi_spec={"containerEdits": {"env": [f"{k}={v}" for k, v in env.items()]}},
        prepared_at="2026-11-26T01:00:00Z",
    )


WORKLOAD_ENV = {
    "NEURON_RT_VISIBLE_CORES": "8-15",
    "NEURON_LOGICAL_NC_CONFIG": "2",
    "NEURON_RT_ULTRASERVER_MODE": "1",
    "NEURON_RT_ULTRASERVER_SERVER_ID": "a1b2c3d4e5f60719",
    "NEURON_RT_ULTRASERVER_NODE_ID": "1",
    "NEURON_GLOBAL_TOPOID": "5",
    "NEURON_GLOBAL_TOPOID0_HOST": "10.0.0.4",
}


def test_each_device_gets_a_ready_condition_and_the_runtime_values_as_data() -> None:
    e = entry("u1", "c1", ("neurondevice2", "neurondevice3"), WORKLOAD_ENV)
    first, second = device_statuses(e)
    assert (first["driver"], first["pool"], first["device"]) == (
        "neuron.aws.com",
        NODE,
        "neurondevice2",
    )
    (cond,) = first["conditions"]
    assert cond["type"] == "Ready" and cond["status"] == "True" and cond["reason"] == "Prepared"
    assert cond["lastTransitionTime"] == "2026-11-26T01:00:00Z"
    assert first["data"] == {
        "deviceId": 2,
        "visibleCores": "8-15",
        "logicalNeuronCore": 2,
        "ultraserverRuntimeMode": 1,
        "ultraserverServerId": "a1b2c3d4e5f60719",
        "ultraserverServerNodeId": 1,
        "globalTopologyId": 5,
    }
    assert second["device"] == "neurondevice3" and second["data"]["deviceId"] == 3


def test_a_claim_without_environment_reports_the_device_only() -> None:
    """Admin access: no runtime environment, and the whole-node device has no index."""
    (status,) = device_statuses(entry("u2", "watch", ("neuronnode",), {}))
    assert status["device"] == "neuronnode" and status["data"] == {}


def test_a_shared_device_is_named_with_its_share_id() -> None:
    """Core sharing: the allocation's key has the shareID, and the API server accepts an
    entry only for an allocated (driver, pool, device, shareID)."""
    e = entry("u3", "core", ("neurondevice3",), {"NEURON_RT_VISIBLE_CORES": "13"})
    share = "5f0c7a9e-2b1d-4c3e-8f4a-0d6b9e1c2a37"
    device = e.devices[0]
    shared = ckpt.ClaimEntry(**{**e.__dict__, "devices": (ckpt.DeviceRecord(
        device.request_names, device.pool_name, device.device_name, device.cdi_device_ids, share
    ),)})  # fmt: skip
    (status,) = device_statuses(shared)
    assert status["shareID"] == share and status["data"]["visibleCores"] == "13"
    (plain,) = device_statuses(e)
    assert "shareID" not in plain


def claim(name: str, devices: tuple[str, ...]) -> dict[str, Any]:
    results = [
        {"request": "d", "driver": "neuron.aws.com", "pool": NODE, "device": d} for d in devices
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "d", "exactly": {"deviceClassName": "x"}}]}},
        "status": {"allocation": {"devices": {"results": results}}},
    }


class Holder:
    def __init__(self) -> None:
        self.checkpoint = ckpt.Checkpoint()

    def put(self, e: ckpt.ClaimEntry) -> None:
        self.checkpoint = self.checkpoint.with_claim(e)

    def drop(self, uid: str) -> None:
        self.checkpoint = self.checkpoint.without_claim(uid)


async def created_claim(server: FakeAPIServer, name: str, devices: tuple[str, ...]) -> str:
    obj = server.create(claim(name, devices))
    status = claim(name, devices)["status"]
    server.patch(
        "resource.k8s.io/v1",
        "ResourceClaim",
        name,
        {"status": status},
        namespace="default",
        subresource="status",
    )
    return str(obj["metadata"]["uid"])


def devices_of(server: FakeAPIServer, name: str) -> list[dict[str, Any]]:
    obj = server.get("resource.k8s.io/v1", "ResourceClaim", name, "default") or {}
    return list((obj.get("status") or {}).get("devices") or [])


@pytest.fixture
def writer_parts(
    fake_apiserver: FakeAPIServer, kube_api_client: client.ApiClient
) -> tuple[FakeAPIServer, Holder, DeviceStatusWriter]:
    holder = Holder()
    writer = DeviceStatusWriter(
        KubeClient(kube_api_client),
        checkpoint=lambda: holder.checkpoint,
        clock=InstantClock(),
        rate_limiter=ExponentialBackoff(0.001, 0.01),
    )
    return fake_apiserver, holder, writer


async def settle(writer: DeviceStatusWriter, server: FakeAPIServer, done: Any) -> None:
    writer.request()
    async with asyncio.timeout(WAIT):
        await writer.wait_until(done)


async def test_the_writer_reports_prepared_claims_and_takes_the_report_back(
    writer_parts: tuple[FakeAPIServer, Holder, DeviceStatusWriter],
) -> None:
    server, holder, writer = writer_parts
    uid = await created_claim(server, "c1", ("neurondevice2",))
    holder.put(entry(uid, "c1", ("neurondevice2",), WORKLOAD_ENV))
    writer.start()
    try:
        await settle(writer, server, lambda: bool(devices_of(server, "c1")))
        (status,) = devices_of(server, "c1")
        assert status["device"] == "neurondevice2" and status["data"]["globalTopologyId"] == 5
        patches = server.request_counts[("patch", "resourceclaims/status")]
        # Nothing changed: a second pass writes nothing.
        await settle(writer, server, lambda: writer._worker.runs >= 2)
        assert server.request_counts[("patch", "resourceclaims/status")] == patches
        # Unprepared while the claim stays allocated: the Ready report goes.
        holder.drop(uid)
        await settle(writer, server, lambda: not devices_of(server, "c1"))
        assert writer.written == {}
    finally:
        await writer.stop()


async def test_without_the_permission_the_writer_stops_after_one_refusal(
    writer_parts: tuple[FakeAPIServer, Holder, DeviceStatusWriter],
) -> None:
    """Before 1.36 the chart grants no resourceclaims/status: one 403, one log line, and no
    more requests; nothing else is affected."""
    server, holder, writer = writer_parts
    uid = await created_claim(server, "c2", ("neurondevice4",))
    holder.put(entry(uid, "c2", ("neurondevice4",), WORKLOAD_ENV))
    server.faults.fail_next(100, 403, verb="patch", resource="resourceclaims/status")
    writer.start()
    try:
        await settle(writer, server, lambda: not writer.permitted)
        holder.put(entry("u-other", "c3", ("neurondevice5",), {}))
        writer.request()
        await settle(writer, server, lambda: writer._worker.runs >= 1)
        assert server.faults.injected == 1 and devices_of(server, "c2") == []
    finally:
        await writer.stop()


async def test_a_claim_gone_or_replaced_is_not_an_error(
    writer_parts: tuple[FakeAPIServer, Holder, DeviceStatusWriter],
) -> None:
    server, holder, writer = writer_parts
    holder.put(entry("u-gone", "gone", ("neurondevice1",), {}))
    writer.start()
    try:
        await settle(writer, server, lambda: "u-gone" in writer.written)
        assert writer._worker.failures == 0
    finally:
        await writer.stop()


async def test_a_report_the_server_refuses_as_invalid_is_dropped_not_retried(
    writer_parts: tuple[FakeAPIServer, Holder, DeviceStatusWriter],
) -> None:
    """1.34's apply of a claim's status can fail on the claim's own allocation ("field is
    immutable", 422): the claim is prepared all the same, so the report is dropped."""
    server, holder, writer = writer_parts
    uid = await created_claim(server, "c4", ("neurondevice6",))
    holder.put(entry(uid, "c4", ("neurondevice6",), WORKLOAD_ENV))
    server.faults.fail_next(100, 422, verb="patch", resource="resourceclaims/status")
    writer.start()
    try:
        await settle(writer, server, lambda: uid in writer.written)
        assert server.faults.injected == 1 and writer._worker.failures == 0
    finally:
        await writer.stop()


class _CountingWriter:
    """Stands in for the writer: counts the requests to converge, and says when one came."""

    def __init__(self) -> None:
        self.requests = 0
        self.asked = asyncio.Event()

    def request(self) -> None:
        self.requests += 1
        self.asked.set()


class _Backend:
    async def prepare(self, claims: Any) -> dict[str, Any]:
        return {}

    async def unprepare(self, claims: Any) -> dict[str, Any]:
        return {}


async def test_the_writer_is_asked_after_the_answer_once_per_burst() -> None:
    """Asked at once, the status PATCH ran on the loop while gRPC sent the answer: the
    request comes a moment after the call, and the calls of one burst share it."""
    writer = _CountingWriter()
    backend = StatusReportingBackend(_Backend(), writer, delay=0.05)  # type: ignore[arg-type]
    await backend.prepare([])
    await backend.unprepare([])
    await backend.prepare([])
    assert writer.requests == 0  # the answers are out before any status work
    await asyncio.wait_for(writer.asked.wait(), 5)
    assert writer.requests == 1
    await backend.unprepare([])  # a later call asks again
    writer.asked.clear()
    await asyncio.wait_for(writer.asked.wait(), 5)
    assert writer.requests == 2
