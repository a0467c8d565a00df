"""The HTTP endpoints both processes serve: ``/healthz``, ``/readyz`` and ``/metrics``.

One aiohttp app on the process's event loop (not ``prometheus_client``'s own server): no thread,
and a liveness probe that is answered at all proves the loop is not blocked.

Checks are named callables returning ``(ok, message)``, sync or async. The response follows
kube-apiserver's health endpoints: ``ok`` when all pass; otherwise 503 with one line per check
(``[+]name ok`` / ``[-]name failed: message``) so ``kubectl describe pod`` shows which check
failed and why. ``?verbose`` lists every check even when all pass. A check that raises or
exceeds ``check_timeout`` fails with that as its message rather than failing the endpoint.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Self

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

if TYPE_CHECKING:
    # Imported where used: aiohttp.web costs a process ~0.05 s of start-up, and the kubelet
    # plugin publishes its ResourceSlice before it starts serving (load_web() preloads it).
    from aiohttp import web

log = logging.getLogger(__name__)

CheckResult = tuple[bool, str]
CheckFn = Callable[[], CheckResult | Awaitable[CheckResult]]


@dataclass(frozen=True)
class Check:
    name: str
    fn: CheckFn


def _as_checks(checks: Sequence[Check | tuple[str, CheckFn]]) -> list[Check]:
    return [c if isinstance(c, Check) else Check(*c) for c in checks]


async def run_check(check: Check, seconds: float) -> CheckResult:
    """Run one check for at most ``seconds``; exceptions and timeouts become failures."""
    try:
        async with asyncio.timeout(seconds):
            result = check.fn()
            if inspect.isawaitable(result):
                result = await result
    except TimeoutError:
        return False, f"timed out after {seconds:g}s"
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.warning("health check %s raised", check.name, exc_info=exc)
        return False, f"{type(exc).__name__}: {exc}"
    ok, message = result
    return bool(ok), str(message)


def load_web() -> None:
    """Import aiohttp's server side now (safe in a worker thread) rather than in ``start``."""
    from aiohttp import web  # noqa: F401


def _metrics_handler_for(
    registry: CollectorRegistry,
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    try:
        # Negotiates OpenMetrics and honours ?name[]= filters (prometheus-client >= 0.22).
        from prometheus_client.aiohttp import make_aiohttp_handler
    except ImportError:  # pragma: no cover - depends on the installed prometheus-client
        return plain_metrics_handler(registry)
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]] = make_aiohttp_handler(
        registry, disable_compression=True
    )
    return handler


def plain_metrics_handler(
    registry: CollectorRegistry,
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The text exposition format only; the fallback for older prometheus-client releases."""

    from aiohttp import web

    async def handler(_request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    return handler


class HttpServer:
    """``/healthz``, ``/readyz`` and ``/metrics`` on one port.

    Checks may be passed at construction or added before or after :meth:`start` (the lists
    are read per request), since the components they probe are often built later.
    """

    def __init__(
        self,
        *,
        registry: CollectorRegistry,
        liveness: Sequence[Check | tuple[str, CheckFn]] = (),
        readiness: Sequence[Check | tuple[str, CheckFn]] = (),
        check_timeout: float = 5.0,
        shutdown_timeout: float = 2.0,
    ) -> None:
        if check_timeout <= 0:
            raise ValueError("check_timeout must be positive")
        self.registry = registry
        self.liveness = _as_checks(liveness)
        self.readiness = _as_checks(readiness)
        self.check_timeout = check_timeout
        self.shutdown_timeout = shutdown_timeout
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    def add_liveness(self, name: str, fn: CheckFn) -> None:
        self.liveness.append(Check(name, fn))

    def add_readiness(self, name: str, fn: CheckFn) -> None:
        self.readiness.append(Check(name, fn))

    def make_app(self) -> web.Application:
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", _metrics_handler_for(self.registry))
        return app

    async def _healthz(self, request: web.Request) -> web.Response:
        return await self._respond(request, "healthz", self.liveness)

    async def _readyz(self, request: web.Request) -> web.Response:
        return await self._respond(request, "readyz", self.readiness)

    async def _respond(self, request: web.Request, what: str, checks: list[Check]) -> web.Response:
        from aiohttp import web

        snapshot = list(checks)
        results = await asyncio.gather(*(run_check(c, self.check_timeout) for c in snapshot))
        failed = any(not ok for ok, _ in results)
        if not failed and "verbose" not in request.query:
            return web.Response(text="ok\n")
        lines = [
            f"[+]{c.name} ok" if ok else f"[-]{c.name} failed: {msg}"
            for c, (ok, msg) in zip(snapshot, results, strict=True)
        ]
        lines.append(f"{what} check failed" if failed else f"{what} check passed")
        return web.Response(text="\n".join(lines) + "\n", status=503 if failed else 200)

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self, host: str = "0.0.0.0", port: int = 0) -> int:
        """Listen on ``host:port`` (port 0: a free one); returns the port actually bound."""
        if self._runner is not None:
            raise RuntimeError("already started")
        from aiohttp import web

        runner = web.AppRunner(
            self.make_app(),
            access_log=None,
            handle_signals=False,
            shutdown_timeout=self.shutdown_timeout,
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        address = runner.addresses[0]
        self._port = int(address[1])
        log.info("serving /healthz, /readyz, /metrics on %s:%d", host, self._port)
        return self._port

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("not started")
        return self._port

    async def stop(self) -> None:
        """Stop listening and finish in-flight requests (bounded by ``shutdown_timeout``)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        self._port = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
