"""Work queue semantics (client-go's), driven by a fake clock: no real sleeps."""

from __future__ import annotations

import asyncio

import pytest
from neuron_dra.common.k8s.clock import FakeClock
from neuron_dra.common.k8s.workqueue import (
    ExponentialBackoff,
    MaxOf,
    QueueMetrics,
    QueueShutDown,
    TokenBucket,
    WorkQueue,
    default_rate_limiter,
)
from prometheus_client import CollectorRegistry


async def test_fifo_and_dedup() -> None:
    q: WorkQueue[str] = WorkQueue()
    for k in ["a", "b", "a", "c", "b"]:
        q.add(k)
    assert len(q) == 3
    got = [await q.get() for _ in range(3)]
    assert got == ["a", "b", "c"]
    assert len(q) == 0


async def test_readd_while_processing_is_deferred_until_done() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    key = await q.get()
    q.add("a")  # changed while being processed
    q.add("a")  # ...twice: still one more run
    assert len(q) == 0, "must not be handed to a second worker concurrently"
    second = asyncio.ensure_future(q.get())
    await asyncio.sleep(0)
    assert not second.done()
    q.done(key)
    assert await asyncio.wait_for(second, 1) == "a"
    q.done("a")
    assert len(q) == 0


async def test_concurrent_workers_never_share_a_key() -> None:
    q: WorkQueue[int] = WorkQueue()
    active: set[int] = set()
    runs: dict[int, int] = {}

    async def worker() -> None:
        while True:
            try:
                k = await q.get()
            except QueueShutDown:
                return
            assert k not in active
            active.add(k)
            runs[k] = runs.get(k, 0) + 1
            await asyncio.sleep(0)
            q.add(k % 3) if runs[k] == 1 else None  # re-add a key possibly in flight
            await asyncio.sleep(0)
            active.discard(k)
            q.done(k)

    workers = [asyncio.create_task(worker()) for _ in range(4)]
    for i in range(10):
        q.add(i)
    await asyncio.wait_for(q.wait_idle(), 5)
    q.shutdown()
    await asyncio.wait_for(asyncio.gather(*workers), 5)
    assert set(runs) == set(range(10))


async def test_get_blocks_until_add() -> None:
    q: WorkQueue[str] = WorkQueue()
    getter = asyncio.ensure_future(q.get())
    await asyncio.sleep(0)
    assert not getter.done()
    q.add("x")
    assert await asyncio.wait_for(getter, 1) == "x"


async def test_cancelled_getter_does_not_swallow_key() -> None:
    q: WorkQueue[str] = WorkQueue()
    g1 = asyncio.ensure_future(q.get())
    g2 = asyncio.ensure_future(q.get())
    await asyncio.sleep(0)
    q.add("x")  # wakes g1 ...
    g1.cancel()  # ... which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await g1
    assert await asyncio.wait_for(g2, 1) == "x"


async def test_shutdown_drains_then_raises() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.shutdown()
    q.add("b")  # ignored after shutdown
    assert await q.get() == "a"
    with pytest.raises(QueueShutDown):
        await q.get()


async def test_shutdown_wakes_blocked_getters() -> None:
    q: WorkQueue[str] = WorkQueue()
    getters = [asyncio.ensure_future(q.get()) for _ in range(3)]
    await asyncio.sleep(0)
    q.shutdown()
    for g in getters:
        with pytest.raises(QueueShutDown):
            await asyncio.wait_for(g, 1)


async def test_add_after_uses_clock_and_earliest_wins() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(clock=clock)
    q.add_after("a", 10)
    q.add_after("a", 20)  # later: ignored
    q.add_after("b", 5)
    await clock.wait_for_sleepers(2)
    assert len(q) == 0
    await clock.advance(5)
    assert len(q) == 1 and await q.get() == "b"
    q.add_after("a", 3)  # earlier than 10 from "now": replaces the pending one
    await clock.wait_for_sleepers(1)
    await clock.advance(3)
    assert await q.get() == "a"
    await clock.advance(100)
    assert len(q) == 0, "the superseded timer must not add the key again"


async def test_add_after_nonpositive_is_immediate() -> None:
    q: WorkQueue[str] = WorkQueue(clock=FakeClock())
    q.add_after("a", 0)
    assert len(q) == 1


async def test_shutdown_cancels_delayed_adds() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(clock=clock)
    q.add_after("a", 1)
    await clock.wait_for_sleepers(1)
    q.shutdown()
    await clock.advance(2)
    with pytest.raises(QueueShutDown):
        await q.get()


async def test_rate_limited_backoff_grows_and_forget_resets() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(clock=clock, rate_limiter=ExponentialBackoff(1.0, 8.0))
    delays = []
    for _ in range(5):
        q.add_rate_limited("k")
        await clock.wait_for_sleepers(1)
        start = clock.now()
        deadline = clock.next_deadline()
        assert deadline is not None
        delays.append(deadline - start)
        await clock.advance(deadline - start)
        assert await q.get() == "k"
        q.done("k")
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert q.num_requeues("k") == 5
    q.forget("k")
    assert q.num_requeues("k") == 0


def test_exponential_backoff_defaults_and_cap() -> None:
    b: ExponentialBackoff[str] = ExponentialBackoff()
    assert b.when("x") == pytest.approx(0.005)
    assert b.when("x") == pytest.approx(0.010)
    assert b.when("y") == pytest.approx(0.005), "per key"
    for _ in range(100):
        last = b.when("x")
    assert last == 1000.0


def test_token_bucket_spreads_bursts() -> None:
    clock = FakeClock()
    tb: TokenBucket[str] = TokenBucket(qps=10.0, burst=2, clock=clock)
    assert tb.when("a") == 0.0
    assert tb.when("b") == 0.0
    assert tb.when("c") == pytest.approx(0.1)
    assert tb.when("d") == pytest.approx(0.2)


async def test_max_of_combines() -> None:
    clock = FakeClock()
    lim = MaxOf[str](ExponentialBackoff(0.005, 1000.0), TokenBucket(1.0, 1, clock))
    assert lim.when("a") == pytest.approx(0.005)
    assert lim.when("b") == pytest.approx(1.0)  # bucket empty: global limit dominates
    assert default_rate_limiter(clock).when("z") == pytest.approx(0.005)


async def test_metrics() -> None:
    reg = CollectorRegistry()
    metrics = QueueMetrics(reg)
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue("ctl", clock=clock, metrics=metrics)
    q.add("a")
    q.add("b")
    q.add("a")
    assert reg.get_sample_value("neuron_dra_workqueue_depth", {"name": "ctl"}) == 2
    assert reg.get_sample_value("neuron_dra_workqueue_adds_total", {"name": "ctl"}) == 2
    await q.get()
    assert reg.get_sample_value("neuron_dra_workqueue_depth", {"name": "ctl"}) == 1
    q.add_rate_limited("x")
    assert reg.get_sample_value("neuron_dra_workqueue_retries_total", {"name": "ctl"}) == 1
    # A second queue shares the metrics object under another label.
    WorkQueue[str]("other", metrics=metrics).add("z")
    assert reg.get_sample_value("neuron_dra_workqueue_depth", {"name": "other"}) == 1
    q.shutdown()


async def test_wait_idle_covers_processing_and_delayed() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(clock=clock)
    q.add_after("a", 1)
    idle = asyncio.ensure_future(q.wait_idle())
    await asyncio.sleep(0)
    assert not idle.done()
    await clock.advance(1)
    k = await q.get()
    await asyncio.sleep(0)
    assert not idle.done(), "still processing"
    q.done(k)
    await asyncio.wait_for(idle, 1)
