"""/healthz, /readyz and /metrics over real HTTP (aiohttp client against the served port)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from aiohttp.test_utils import make_mocked_request
from neuron_dra.common.httpserver import Check, CheckResult, HttpServer, plain_metrics_handler
from prometheus_client import CollectorRegistry, Counter


@pytest.fixture
def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    c = Counter("neuron_dra_test_things", "Things done.", ["kind"], registry=reg)
    c.labels("a").inc(3)
    return reg


@pytest_asyncio.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        yield s


async def get(session: aiohttp.ClientSession, srv: HttpServer, path: str) -> tuple[int, str]:
    async with session.get(f"http://127.0.0.1:{srv.port}{path}") as resp:
        return resp.status, await resp.text()


class Flag:
    """A readiness input that a test flips, like the publisher's ``published`` event."""

    def __init__(self, message: str) -> None:
        self.ok = False
        self.message = message

    def __call__(self) -> CheckResult:
        return (True, "ok") if self.ok else (False, self.message)


async def test_all_checks_pass(registry: CollectorRegistry, session: aiohttp.ClientSession) -> None:
    async def loop_alive() -> CheckResult:
        await asyncio.sleep(0)
        return True, "ok"

    async with HttpServer(
        registry=registry,
        liveness=[("loop", loop_alive)],
        readiness=[Check("synced", lambda: (True, "ok"))],
    ) as srv:
        port = await srv.start("127.0.0.1", 0)
        assert port == srv.port > 0

        assert await get(session, srv, "/healthz") == (200, "ok\n")
        assert await get(session, srv, "/readyz") == (200, "ok\n")
        status, body = await get(session, srv, "/readyz?verbose")
        assert status == 200
        assert body == "[+]synced ok\nreadyz check passed\n"


async def test_failing_readiness_is_503_with_the_failing_checks(
    registry: CollectorRegistry, session: aiohttp.ClientSession
) -> None:
    published = Flag("ResourceSlices not published yet")
    srv = HttpServer(registry=registry, readiness=[("cache", lambda: (True, "ok"))])
    srv.add_readiness("published", published)
    await srv.start("127.0.0.1", 0)
    try:
        status, body = await get(session, srv, "/readyz")
        assert status == 503
        assert body.splitlines() == [
            "[+]cache ok",
            "[-]published failed: ResourceSlices not published yet",
            "readyz check failed",
        ]
        # Liveness does not depend on readiness.
        assert await get(session, srv, "/healthz") == (200, "ok\n")

        published.ok = True
        assert await get(session, srv, "/readyz") == (200, "ok\n")

        # Checks added after start are served too (components are often built later).
        srv.add_liveness("grpc", lambda: (False, "DRA socket closed"))
        status, body = await get(session, srv, "/healthz")
        assert status == 503 and "[-]grpc failed: DRA socket closed" in body
    finally:
        await srv.stop()


async def test_raising_and_hanging_checks_fail_without_breaking_the_endpoint(
    registry: CollectorRegistry, session: aiohttp.ClientSession
) -> None:
    never = asyncio.Event()

    def broken() -> CheckResult:
        raise RuntimeError("boom")

    async def hangs() -> CheckResult:
        await never.wait()
        return True, "ok"

    srv = HttpServer(
        registry=registry,
        liveness=[("broken", broken), ("hangs", hangs)],
        check_timeout=0.05,
    )
    await srv.start("127.0.0.1", 0)
    try:
        status, body = await get(session, srv, "/healthz")
    finally:
        await srv.stop()
    assert status == 503
    assert "[-]broken failed: RuntimeError: boom" in body
    assert "[-]hangs failed: timed out after 0.05s" in body


async def test_metrics_exposition(
    registry: CollectorRegistry, session: aiohttp.ClientSession
) -> None:
    async with HttpServer(registry=registry) as srv:
        await srv.start("127.0.0.1", 0)
        async with session.get(f"http://127.0.0.1:{srv.port}/metrics") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = await resp.text()
        assert 'neuron_dra_test_things_total{kind="a"} 3.0' in text

        headers = {"Accept": "application/openmetrics-text; version=1.0.0"}
        async with session.get(f"http://127.0.0.1:{srv.port}/metrics", headers=headers) as resp:
            assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
            assert (await resp.text()).rstrip().endswith("# EOF")


async def test_plain_metrics_fallback(registry: CollectorRegistry) -> None:
    handler = plain_metrics_handler(registry)
    resp = await handler(make_mocked_request("GET", "/metrics"))
    assert isinstance(resp, aiohttp.web.Response)
    assert resp.content_type == "text/plain"
    assert resp.body is not None
    assert b'neuron_dra_test_things_total{kind="a"} 3.0' in bytes(resp.body)  # type: ignore[arg-type]


async def test_port_zero_picks_distinct_free_ports_and_stop_closes(
    registry: CollectorRegistry, session: aiohttp.ClientSession
) -> None:
    a, b = HttpServer(registry=registry), HttpServer(registry=registry)
    await a.start("127.0.0.1", 0)
    await b.start("127.0.0.1", 0)
    port = a.port
    assert port != b.port
    with pytest.raises(RuntimeError, match="already started"):
        await a.start("127.0.0.1", 0)
    await b.stop()
    await a.stop()
    await a.stop()  # idempotent

    with pytest.raises(RuntimeError, match="not started"):
        _ = a.port
    with pytest.raises(aiohttp.ClientConnectionError):
        await session.get(f"http://127.0.0.1:{port}/healthz")


async def test_taken_port_fails_to_start_and_leaves_nothing_running(
    registry: CollectorRegistry,
) -> None:
    async with HttpServer(registry=registry) as first:
        await first.start("127.0.0.1", 0)
        second = HttpServer(registry=registry)
        with pytest.raises(OSError):
            await second.start("127.0.0.1", first.port)
        with pytest.raises(RuntimeError, match="not started"):
            _ = second.port
