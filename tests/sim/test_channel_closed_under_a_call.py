"""A simulated kubelet survives a plugin channel closed with a call in flight.

Re-registering a restarted plugin closes the channel of its previous instance. grpc.aio then
cancels the await of a call still in flight on that channel: ``CancelledError`` in a task
nobody cancelled. The simulated kubelet's worker took that for its own cancellation and
ended, and every later pod of its node waited for ever (a soak's claims left behind, their
pods Pending and deleting on the node whose plugin had restarted)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from neuron_dra.nodeplugin.kubeletapi.model import ClaimRef, PluginCallError, PluginInfo
from neuron_dra.sim.controlplane.base import Loop
from neuron_dra.sim.kubeletclient import KUBELET_DRA_CODECS, DraPlugin


class _Slow(grpc.GenericRpcHandler):
    """Every method answers after ``delay`` (the answer never arrives in these tests);
    ``entered`` is set once a call is being served."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.entered = asyncio.Event()

    def service(self, handler_call_details: Any) -> grpc.RpcMethodHandler:
        async def slow(request: bytes, context: Any) -> bytes:
            self.entered.set()
            await asyncio.sleep(self.delay)
            return b""

        return grpc.unary_unary_rpc_method_handler(slow)


@dataclass
class _Served:
    plugin: DraPlugin
    channel: grpc.aio.Channel
    slow: _Slow


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[_Served]:
    """A DraPlugin connected to a server whose every call stays in flight."""
    socket = tmp_path / "dra.sock"
    server = grpc.aio.server()
    slow = _Slow(30.0)
    server.add_generic_rpc_handlers((slow,))
    server.add_insecure_port(f"unix:{socket}")
    await server.start()
    service = next(iter(KUBELET_DRA_CODECS))
    channel = grpc.aio.insecure_channel(f"unix:{socket}")
    info = PluginInfo("DRAPlugin", "neuron.aws.com", str(socket), (service,))
    plugin = DraPlugin(tmp_path / "reg.sock", info, service, 45.0, channel)
    try:
        yield _Served(plugin, channel, slow)
    finally:
        await channel.close()
        await server.stop(None)


async def test_a_call_on_a_channel_closed_under_it_fails_as_a_call(served: _Served) -> None:
    call = asyncio.create_task(served.plugin.prepare([ClaimRef("default", "uid-1", "c")]))
    await asyncio.wait_for(served.slow.entered.wait(), 10)  # the call is in flight
    await served.channel.close()
    with pytest.raises(PluginCallError) as failed:
        await call
    assert failed.value.code == "CANCELLED"
    assert "connection closed during the call" in str(failed.value)


async def test_a_task_that_is_cancelled_while_calling_is_still_cancelled(served: _Served) -> None:
    call = asyncio.create_task(served.plugin.unprepare([ClaimRef("default", "uid-1", "c")]))
    await asyncio.wait_for(served.slow.entered.wait(), 10)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call


class _Flaky(Loop[str]):
    """Its first sync of a key is cancelled under it, as a closed channel does."""

    def __init__(self) -> None:
        super().__init__("flaky", backoff_base=0.001, backoff_cap=0.01)
        self.attempts: list[str] = []
        self.synced: dict[str, asyncio.Event] = {}

    async def sync(self, key: str) -> None:
        self.attempts.append(key)
        if len(self.attempts) == 1:
            raise asyncio.CancelledError
        self.synced.setdefault(key, asyncio.Event()).set()

    async def wait_synced(self, key: str) -> None:
        await asyncio.wait_for(self.synced.setdefault(key, asyncio.Event()).wait(), 10)


async def test_a_loop_retries_a_sync_cancelled_under_it_and_keeps_working() -> None:
    loop = _Flaky()
    await loop.start()
    try:
        loop.queue.add("pod-1")
        await loop.wait_synced("pod-1")
        assert loop.attempts == ["pod-1", "pod-1"]
        loop.queue.add("pod-2")  # the worker is still there for the next key
        await loop.wait_synced("pod-2")
    finally:
        await loop.stop()  # and it still stops when cancelled
