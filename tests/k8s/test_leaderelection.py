"""Lease leader election against the fake API server, on a fake clock."""

from __future__ import annotations

import asyncio
import random
import re
from typing import Any

import pytest
from neuron_dra.common.k8s import errors
from neuron_dra.common.k8s.client import LEASES, KubeClient
from neuron_dra.common.k8s.clock import FakeClock
from neuron_dra.common.k8s.leaderelection import (
    LeaderElectionConfig,
    LeaderElector,
    format_microtime,
    parse_microtime,
)
from neuron_dra.sim.fakeapi.server import FakeAPIServer

WAIT = 10.0
NS = "default"
LEASE = "neuron-dra-controller"
MICROTIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


class Candidate:
    def __init__(self, kube: KubeClient, clock: FakeClock, identity: str, **cfg: Any) -> None:
        self.identity = identity
        self.started = 0
        self.cancelled = asyncio.Event()
        self.stopped = asyncio.Event()
        self.leaders: list[str] = []
        self.elector = LeaderElector(
            kube.resource(LEASES),
            LeaderElectionConfig(LEASE, NS, identity, **cfg),
            on_started_leading=self._lead,
            on_stopped_leading=self.stopped.set,
            on_new_leader=self.leaders.append,
            clock=clock,
            rng=random.Random(7),
        )
        self.task: asyncio.Task[None] | None = None

    async def _lead(self) -> None:
        self.started += 1
        try:
            await asyncio.Event().wait()  # lead until cancelled
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    def run(self) -> Candidate:
        self.task = asyncio.ensure_future(self.elector.run())
        return self

    async def finish(self) -> None:
        if self.task is not None and not self.task.done():
            self.elector.stop()
            await asyncio.wait_for(self.task, WAIT)


async def lease(kube: KubeClient) -> dict[str, Any]:
    spec: dict[str, Any] = (await kube.resource(LEASES).get(LEASE, NS))["spec"]
    return spec


async def quiesce(clock: FakeClock, sleepers: int) -> None:
    await asyncio.wait_for(clock.wait_for_sleepers(sleepers), WAIT)


async def test_one_leads_other_waits_then_takes_over_on_release(kube: KubeClient) -> None:
    clock = FakeClock()
    a = Candidate(kube, clock, "a").run()
    await asyncio.wait_for(a.elector.became_leader.wait(), WAIT)
    b = Candidate(kube, clock, "b").run()
    await quiesce(clock, 2)  # a waits to renew, b waits to retry
    assert a.elector.is_leader and not b.elector.is_leader
    assert b.elector.leader == "a" and b.leaders == ["a"]

    spec = await lease(kube)
    assert spec["holderIdentity"] == "a"
    assert spec["leaseDurationSeconds"] == 15 and spec["leaseTransitions"] == 0
    assert MICROTIME.match(spec["acquireTime"]) and MICROTIME.match(spec["renewTime"])
    acquired = spec["acquireTime"]

    # A renewal moves renewTime but keeps acquireTime.
    await clock.advance(2.0)
    await quiesce(clock, 2)
    spec = await lease(kube)
    assert spec["acquireTime"] == acquired
    assert parse_microtime(spec["renewTime"]) > parse_microtime(acquired)
    assert not b.elector.is_leader, "b must not take a lease that is being renewed"

    # Graceful stop releases: b need not wait out the lease duration.
    a.elector.stop()
    await asyncio.wait_for(a.task, WAIT)  # type: ignore[arg-type]
    assert a.cancelled.is_set() and a.stopped.is_set() and not a.elector.is_leader
    assert (await lease(kube))["holderIdentity"] == ""
    await clock.advance(2.4)  # one jittered retry period
    await asyncio.wait_for(b.elector.became_leader.wait(), WAIT)
    spec = await lease(kube)
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    assert b.started == 1
    await b.finish()


async def test_takeover_only_after_expiry_when_leader_vanishes(kube: KubeClient) -> None:
    clock = FakeClock()
    a = Candidate(kube, clock, "a", release_on_stop=False).run()
    await asyncio.wait_for(a.elector.became_leader.wait(), WAIT)
    # The leader crashes: its task dies without releasing or renewing.
    assert a.task is not None
    a.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await a.task
    assert (await lease(kube))["holderIdentity"] == "a", "no release on crash"

    b = Candidate(kube, clock, "b").run()
    await quiesce(clock, 1)  # b observed the lease and waits
    observed = clock.now()
    # Expiry is measured from when *b* first saw the record, on b's clock: step time forward
    # and let b run a round whenever its (jittered) retry period is up.
    while not b.elector.is_leader:
        await clock.advance(0.5)
        await quiesce(clock, 1)
    waited = clock.now() - observed
    assert 15.0 <= waited <= 15.0 + 2.4 + 0.5, waited
    spec = await lease(kube)
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    await b.finish()


async def test_leader_steps_down_when_it_cannot_renew(
    kube: KubeClient, fake_apiserver: FakeAPIServer
) -> None:
    clock = FakeClock()
    a = Candidate(kube, clock, "a").run()
    await asyncio.wait_for(a.elector.became_leader.wait(), WAIT)
    await quiesce(clock, 1)
    # Someone else holds the lease now (e.g. a partition healed the other way round).
    current = fake_apiserver.get("coordination.k8s.io/v1", "Lease", LEASE, NS)
    assert current is not None
    current["spec"]["holderIdentity"] = "intruder"
    fake_apiserver.update(current)
    assert a.task is not None
    start = clock.now()
    while not a.task.done():
        await clock.advance(1.0)
        # Either a round happened and a sleeps again, or a gave up.
        sleeping = asyncio.ensure_future(clock.wait_for_sleepers(1))
        await asyncio.wait_for(
            asyncio.wait({a.task, sleeping}, return_when=asyncio.FIRST_COMPLETED), WAIT
        )
        sleeping.cancel()
    assert clock.now() - start >= 10.0, "keeps trying for the whole renew deadline"
    await a.task
    assert a.cancelled.is_set() and a.stopped.is_set()
    assert (await lease(kube))["holderIdentity"] == "intruder", "a lost: it must not release"


async def test_conflict_on_write_is_a_lost_round_not_an_error(
    kube: KubeClient, fake_apiserver: FakeAPIServer
) -> None:
    clock = FakeClock()
    a = Candidate(kube, clock, "a")
    await kube.resource(LEASES).create(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": LEASE, "namespace": NS},
            "spec": {"holderIdentity": "", "leaseDurationSeconds": 1, "leaseTransitions": 3},
        }
    )
    fake_apiserver.faults.fail_next(1, 409, verb="update", resource="leases")
    assert await a.elector.try_acquire_or_renew() is False
    assert await a.elector.try_acquire_or_renew() is True
    spec = await lease(kube)
    assert spec["holderIdentity"] == "a" and spec["leaseTransitions"] == 4


async def test_create_race_has_one_winner(kube: KubeClient) -> None:
    clock = FakeClock()
    a, b = Candidate(kube, clock, "a"), Candidate(kube, clock, "b")
    results = await asyncio.gather(
        a.elector.try_acquire_or_renew(), b.elector.try_acquire_or_renew()
    )
    assert sorted(results) == [False, True]
    winner = "a" if results[0] else "b"
    assert (await lease(kube))["holderIdentity"] == winner


async def test_server_errors_do_not_crash_the_campaign(
    kube: KubeClient, fake_apiserver: FakeAPIServer
) -> None:
    clock = FakeClock()
    fake_apiserver.faults.fail_next(1, 500, verb="get", resource="leases")
    a = Candidate(kube, clock, "a").run()
    await quiesce(clock, 1)
    assert not a.elector.is_leader
    await clock.advance(2.4)
    await asyncio.wait_for(a.elector.became_leader.wait(), WAIT)
    await a.finish()


async def test_leading_coroutine_failure_steps_down_and_raises(kube: KubeClient) -> None:
    clock = FakeClock()

    async def crash() -> None:
        raise RuntimeError("controller crashed")

    elector = LeaderElector(
        kube.resource(LEASES),
        LeaderElectionConfig(LEASE, NS, "a"),
        on_started_leading=crash,
        clock=clock,
    )
    with pytest.raises(RuntimeError, match="controller crashed"):
        await asyncio.wait_for(elector.run(), WAIT)
    assert (await lease(kube))["holderIdentity"] == "", "released for a quick failover"


def test_config_validation() -> None:
    LeaderElectionConfig("l", "ns", "me")  # defaults are valid (15 > 10 > 1.2 * 2)
    with pytest.raises(ValueError):
        LeaderElectionConfig("l", "ns", "me", lease_duration=10, renew_deadline=10)
    with pytest.raises(ValueError):
        LeaderElectionConfig("l", "ns", "me", renew_deadline=2.4, retry_period=2)
    with pytest.raises(ValueError):
        LeaderElectionConfig("l", "ns", "")
    with pytest.raises(ValueError):
        LeaderElectionConfig("l", "ns", "me", retry_period=0)


def test_microtime_format() -> None:
    from datetime import UTC, datetime, timedelta, timezone

    t = datetime(2026, 3, 4, 5, 6, 7, 89, tzinfo=UTC)
    assert format_microtime(t) == "2026-03-04T05:06:07.000089Z"
    assert parse_microtime("2026-03-04T05:06:07.000089Z") == t
    assert parse_microtime("2026-03-04T07:06:07+02:00") == t.replace(microsecond=0)
    other = datetime(2026, 3, 4, 7, 6, 7, tzinfo=timezone(timedelta(hours=2)))
    assert format_microtime(other) == "2026-03-04T05:06:07.000000Z"
    with pytest.raises(ValueError):
        format_microtime(datetime(2026, 1, 1))


def test_requires_lease_resource(kube: KubeClient) -> None:
    from neuron_dra.common.k8s.client import CONFIG_MAPS

    async def noop() -> None:
        pass

    with pytest.raises(ValueError):
        LeaderElector(
            kube.resource(CONFIG_MAPS),
            LeaderElectionConfig("l", "ns", "me"),
            on_started_leading=noop,
        )


_ = errors  # typed errors are what the elector relies on internally
