"""Lease-based leader election (``coordination.k8s.io/v1``) on the raw-dict client.

Same protocol as client-go's, so our replicas interoperate with its tooling and semantics:

- Every write is a PUT guarded by the resourceVersion we read; a 409 means another candidate
  wrote first and this round is lost (not an error worth shouting about).
- Expiry is judged on *our* monotonic clock from when we last saw the lease record change, not
  from ``renewTime``: wall clocks of different nodes may disagree.
- ``leaseTransitions`` counts takeovers; ``acquireTime`` is kept across renewals.
- On graceful stop the leader releases the lease (empty holder, 1 s duration), so the other
  replica takes over after one retry period instead of a full lease duration.

The ``kubernetes_asyncio.leaderelection`` module lacks release-on-stop and transitions, and
writes naive local timestamps (as of kubernetes_asyncio 36), hence this small implementation.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .client import ResourceClient
from .clock import Clock, SystemClock
from .errors import AlreadyExistsError, ConflictError, KubeError, NotFoundError

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]

#: Kubernetes MicroTime wire format (Go layout ``2006-01-02T15:04:05.000000Z07:00`` in UTC).
MICROTIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
#: client-go jitters the retry period by up to this factor.
JITTER_FACTOR = 1.2


def format_microtime(t: datetime) -> str:
    if t.tzinfo is None:
        raise ValueError("naive datetime; use a timezone-aware UTC time")
    return t.astimezone(UTC).strftime(MICROTIME_FORMAT)


def parse_microtime(s: str) -> datetime:
    """Parse RFC 3339 (with or without fraction, ``Z`` or offset) into an aware datetime."""
    return datetime.fromisoformat(s.replace("Z", "+00:00")).astimezone(UTC)


@dataclass(frozen=True)
class LeaderElectionConfig:
    lease_name: str
    namespace: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    release_on_stop: bool = True

    def __post_init__(self) -> None:
        if not self.lease_name or not self.namespace:
            raise ValueError("lease_name and namespace are required")
        if not self.identity:
            raise ValueError("identity must not be empty (an empty holder means 'released')")
        if self.retry_period <= 0:
            raise ValueError("retry_period must be positive")
        if self.lease_duration < 1:
            # leaseDurationSeconds is an integer on the wire.
            raise ValueError("lease_duration must be at least 1 second")
        if not self.lease_duration > self.renew_deadline:
            raise ValueError("lease_duration must be greater than renew_deadline")
        if not self.renew_deadline > JITTER_FACTOR * self.retry_period:
            raise ValueError(f"renew_deadline must be greater than {JITTER_FACTOR} * retry_period")


@dataclass(frozen=True)
class LeaderRecord:
    holder: str
    lease_duration_seconds: int
    acquire_time: str | None
    renew_time: str | None
    transitions: int

    @classmethod
    def from_lease(cls, lease: JsonDict) -> LeaderRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
        )

    def to_spec(self) -> JsonDict:
        spec: JsonDict = {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "leaseTransitions": self.transitions,
        }
        if self.acquire_time:
            spec["acquireTime"] = self.acquire_time
        if self.renew_time:
            spec["renewTime"] = self.renew_time
        return spec


Callback = Callable[[], Awaitable[None] | None]


class LeaderElector:
    """Campaign for a Lease; run ``on_started_leading`` while we hold it.

    ``run()`` returns when leadership is lost (renewal failed for ``renew_deadline``), when the
    leading coroutine finishes, or after :meth:`stop`. As with client-go, a lost leadership is
    meant to end the process (or at least this elector): start a new elector to campaign again.
    """

    def __init__(
        self,
        leases: ResourceClient,
        config: LeaderElectionConfig,
        *,
        on_started_leading: Callable[[], Awaitable[None]],
        on_stopped_leading: Callback | None = None,
        on_new_leader: Callable[[str], None] | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if leases.resource.kind != "Lease":
            raise ValueError(f"leader election needs the Lease resource, got {leases.resource}")
        self.leases = leases
        self.config = config
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._on_new_leader = on_new_leader
        self._clock: Clock = clock or SystemClock()
        self._rng = rng or random.Random()
        self._observed: LeaderRecord | None = None
        self._observed_time = 0.0
        self._observed_rv = ""
        self._leading = False
        self._leader = ""
        self._stop = asyncio.Event()
        self.became_leader = asyncio.Event()
        self.lost_leadership = asyncio.Event()

    # --- state ---------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self._leading

    @property
    def leader(self) -> str:
        """Holder identity last observed ("" if none)."""
        return self._leader

    def stop(self) -> None:
        """Ask ``run()`` to step down (releasing the lease if configured) and return."""
        self._stop.set()

    # --- protocol ------------------------------------------------------------------------

    @property
    def _timeout(self) -> float:
        # A single request must not outlive the renew deadline, or a hung connection would
        # keep us "leading" after others may have taken over.
        return self.config.renew_deadline

    def _now_str(self) -> str:
        return format_microtime(self._clock.wall())

    def _observe(self, record: LeaderRecord, rv: str) -> None:
        if record != self._observed:
            self._observed = record
            self._observed_time = self._clock.now()
        self._observed_rv = rv
        if record.holder != self._leader:
            self._leader = record.holder
            if self._on_new_leader is not None and record.holder:
                try:
                    self._on_new_leader(record.holder)
                except Exception:
                    log.exception("on_new_leader callback failed")

    async def try_acquire_or_renew(self) -> bool:
        """One round: create, renew or take over the lease. True if we hold it afterwards."""
        cfg = self.config
        now = self._now_str()
        duration = round(cfg.lease_duration)
        try:
            lease = await self.leases.get(
                cfg.lease_name, cfg.namespace, request_timeout=self._timeout
            )
        except NotFoundError:
            record = LeaderRecord(cfg.identity, duration, now, now, 0)
            body: JsonDict = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": cfg.lease_name, "namespace": cfg.namespace},
                "spec": record.to_spec(),
            }
            try:
                created = await self.leases.create(body, request_timeout=self._timeout)
            except AlreadyExistsError:
                log.debug("lease %s created by another candidate first", cfg.lease_name)
                return False
            self._observe(record, str(created["metadata"].get("resourceVersion") or ""))
            return True

        old = LeaderRecord.from_lease(lease)
        rv = str(lease["metadata"].get("resourceVersion") or "")
        self._observe(old, rv)
        i_hold_it = old.holder == cfg.identity
        if (
            not i_hold_it
            and old.holder
            and self._observed_time + old.lease_duration_seconds > self._clock.now()
        ):
            return False  # held by someone else and not expired (by our clock)

        if i_hold_it:
            record = LeaderRecord(
                cfg.identity, duration, old.acquire_time or now, now, old.transitions
            )
        else:
            # Takeover of an expired or released lease.
            record = LeaderRecord(cfg.identity, duration, now, now, old.transitions + 1)
        updated = copy.deepcopy(lease)
        updated["spec"] = {**(lease.get("spec") or {}), **record.to_spec()}
        try:
            result = await self.leases.replace(updated, request_timeout=self._timeout)
        except ConflictError:
            log.debug("lease %s changed under us (409); another candidate won", cfg.lease_name)
            return False
        self._observe(record, str(result["metadata"].get("resourceVersion") or ""))
        return True

    async def release(self) -> bool:
        """Give up the lease if we hold it, so another candidate need not wait for expiry."""
        cfg = self.config
        try:
            lease = await self.leases.get(cfg.lease_name, cfg.namespace)
        except KubeError as exc:
            log.warning("cannot release lease %s: %s", cfg.lease_name, exc)
            return False
        old = LeaderRecord.from_lease(lease)
        if old.holder != cfg.identity:
            return False
        now = self._now_str()
        record = LeaderRecord("", 1, now, now, old.transitions)
        updated = copy.deepcopy(lease)
        spec = {**(lease.get("spec") or {}), **record.to_spec()}
        spec["holderIdentity"] = ""
        updated["spec"] = spec
        try:
            await self.leases.replace(updated)
        except KubeError as exc:
            log.warning("cannot release lease %s: %s", cfg.lease_name, exc)
            return False
        log.info("released lease %s", cfg.lease_name)
        return True

    # --- loop ----------------------------------------------------------------------------

    def _jittered(self) -> float:
        p = self.config.retry_period
        return p + self._rng.random() * (JITTER_FACTOR - 1.0) * p

    async def _round(self) -> bool:
        try:
            return await self.try_acquire_or_renew()
        except KubeError as exc:
            log.warning("leader election %s: %s", self.config.lease_name, exc)
            return False

    async def _sleep_or_stop(self, seconds: float) -> bool:
        """Sleep on the injected clock; True if stop() was called meanwhile."""
        if self._stop.is_set():
            return True
        sleeper = asyncio.ensure_future(self._clock.sleep(seconds))
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (sleeper, stopper):
                if not t.done():
                    t.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await t
        return self._stop.is_set()

    async def _acquire(self) -> bool:
        while True:
            if await self._round():
                return True
            if await self._sleep_or_stop(self._jittered()):
                return False

    async def _renew_until_lost(self, leading: asyncio.Task[None]) -> str:
        """Renew every retry period; returns why we stopped ("lost", "stopped", "finished")."""
        cfg = self.config
        last_renew = self._clock.now()
        while True:
            sleeper = asyncio.ensure_future(self._sleep_or_stop(cfg.retry_period))
            await asyncio.wait({sleeper, leading}, return_when=asyncio.FIRST_COMPLETED)
            if leading.done():
                sleeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sleeper
                return "finished"
            if sleeper.result():
                return "stopped"
            if await self._round():
                last_renew = self._clock.now()
            elif self._clock.now() - last_renew >= cfg.renew_deadline:
                return "lost"

    async def run(self) -> None:
        """Campaign, lead, and step down. Re-raises an exception from ``on_started_leading``."""
        if not await self._acquire():
            return
        self._leading = True
        self.became_leader.set()
        log.info("%s became leader of lease %s", self.config.identity, self.config.lease_name)
        leading = asyncio.ensure_future(self._on_started())
        reason = "stopped"
        try:
            reason = await self._renew_until_lost(leading)
        finally:
            self._leading = False
            if not leading.done():
                leading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await leading
            if reason != "lost" and self.config.release_on_stop:
                await self.release()
            self.lost_leadership.set()
            log.info("%s stopped leading (%s)", self.config.identity, reason)
            if self._on_stopped is not None:
                try:
                    res = self._on_stopped()
                    if inspect.isawaitable(res):
                        await res
                except Exception:
                    log.exception("on_stopped_leading callback failed")
        if reason == "finished" and not leading.cancelled():
            exc = leading.exception()
            if exc is not None:
                raise exc
