"""Claim preparation behind the kubelet's NodePrepareResources / NodeUnprepareResources.

What the kubelet expects (reference/kubelet-dra.md §4.1-4.2, §11.5-11.8):

* an answer for every claim of the call within its 45 s deadline, each claim on its own:
  one claim's failure is that claim's ``error`` and never affects the others;
* Prepare is idempotent (the kubelet forgets what it prepared when it restarts) and answers a
  repeat with the same CDI ids; Unprepare is idempotent and may name claims we never saw or
  that no longer exist in the API server, so it works from local state only;
* the CDI spec exists before Prepare returns.

For one claim, Prepare: answers from the checkpoint if already prepared; else reads the claim
(bounded retries within the call's budget), checks that it is the claim the kubelet means
(same uid) and is allocated, plans it (:func:`~.claims.plan_claim`, pure), refuses devices
another prepared claim holds, computes the CDI spec (pure), writes it, then records the claim
in the checkpoint. That order matters for crashes: a crash after the spec write leaves an
orphan spec that the start-up sweep deletes; the reverse order could leave a checkpoint entry
whose spec never existed, which a repeated Prepare would then report as done.

Claims of one call run concurrently. Device locks (taken in index order, so two claims never
wait on each other crosswise) serialize everything from the conflict check to the checkpoint
write, so two claims racing for one device cannot both win.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from neuron_dra.common.constants import DRIVER_NAME, NODE_DEVICE_NAME, device_name
from neuron_dra.common.k8s.client import NODES, RESOURCE_CLAIMS, KubeClient
from neuron_dra.common.k8s.clock import Clock, SystemClock
from neuron_dra.common.k8s.errors import KubeError, NotFoundError
from neuron_dra.nodeplugin import checkpoint as ckpt
from neuron_dra.nodeplugin.cdi import (
    CDI_KIND,
    CdiError,
    UltraServerPeers,
    cdi_device_ids,
    cdi_spec_for,
    list_cdi_specs,
    remove_cdi_spec,
    spec_file_name,
    write_cdi_spec,
)
from neuron_dra.nodeplugin.claims import ClaimError, ClaimPlan, plan_claim
from neuron_dra.nodeplugin.discovery.model import NodeInventory
from neuron_dra.nodeplugin.events import EventRecorder, EventType, ObjectRef
from neuron_dra.nodeplugin.kubeletapi import (
    ClaimRef,
    DriverBackend,
    PreparedDevice,
    PrepareResult,
    UnprepareResult,
)
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

log = logging.getLogger(__name__)

# --- configuration, errors, metrics ----------------------------------------------------------

InventoryProvider = Callable[[], NodeInventory]
PublishedProvider = Callable[[], Mapping[str, Mapping[str, Any]]]
TopologyProvider = Callable[[ClaimPlan], UltraServerPeers | None]

REASON_PREPARE_FAILED: Final = "PrepareFailed"
REASON_CHECKPOINT_RESET: Final = "CheckpointReset"
REASON_CDI_RESTORE_FAILED: Final = "CDISpecRestoreFailed"


@dataclass(frozen=True)
class PrepareLimits:
    """Bounds for one Prepare call. The kubelet gives up after 45 s and the gRPC layer cancels
    us at its own budget (``kubeletapi.DEFAULT_BUDGET``, 40 s); stopping API retries at 30 s
    means a claim whose read keeps failing gets its own clear error instead of a cancellation
    (reference/kubelet-dra.md §4.1)."""

    #: Seconds all claims of one call may spend reading their ResourceClaims, retries included.
    budget: float = 30.0
    #: Tries per claim read (1 = no retry).
    attempts: int = 6
    backoff_base: float = 0.2
    backoff_cap: float = 5.0
    #: Per-request timeout (never longer than what is left of the budget).
    request_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.budget <= 0 or self.attempts < 1 or self.backoff_base <= 0:
            raise ValueError("need budget > 0, attempts >= 1 and backoff_base > 0")


class PrepareFailure(Exception):
    """One claim cannot be prepared now. ``reason`` is a small fixed set (a metric label);
    ``permanent``: retrying the same request cannot help, the claim or node must change."""

    def __init__(self, message: str, *, reason: str, permanent: bool, event: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.permanent = permanent
        #: Worth a Warning Event on the claim (the user can act on it).
        self.event = event


class PreparerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.prepare_seconds = Histogram(
            "neuron_dra_prepare_seconds",
            "Time to prepare one claim (including reading it from the API server).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 45),
            registry=self.registry,
        )
        self.prepare_errors = Counter(
            "neuron_dra_prepare_errors_total",
            "Claims whose preparation failed, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.prepared_claims = Gauge(
            "neuron_dra_prepared_claims",
            "Claims currently prepared on this node (checkpoint entries).",
            registry=self.registry,
        )


def _base_request(name: str) -> str:
    # The kubelet matches containers' resources.claims[].request against base names; a
    # "req/sub" name would leave the container without its devices (kubelet-dra.md §11.7).
    return name.split("/", 1)[0]


def prepared_devices(plan: ClaimPlan, *, pool: str, cdi_kind: str) -> tuple[ckpt.DeviceRecord, ...]:
    """The kubelet's answer for a planned claim (pure)."""
    ids = cdi_device_ids(plan, cdi_kind=cdi_kind)
    out = []
    for (requests, device), cdi_id in zip(plan.devices, ids, strict=True):
        bases = tuple(dict.fromkeys(_base_request(r) for r in requests))
        out.append(ckpt.DeviceRecord(bases, pool, device, (cdi_id,)))
    return tuple(out)


def conflict_message(index: int, holder: ckpt.ClaimEntry) -> str:
    via = (
        f" (through {NODE_DEVICE_NAME})"
        if any(d.device_name == NODE_DEVICE_NAME for d in holder.devices)
        else ""
    )
    return (
        f"device {device_name(index)} is already prepared for ResourceClaim {holder.key} "
        f"(uid {holder.uid}){via}; a Neuron device can serve one claim at a time"
    )


def _answer(entry: ckpt.ClaimEntry) -> PrepareResult:
    return PrepareResult(
        devices=tuple(
            PreparedDevice(d.request_names, d.pool_name, d.device_name, d.cdi_device_ids)
            for d in entry.devices
        )
    )


def _no_topology(plan: ClaimPlan) -> UltraServerPeers | None:
    return None


# --- the backend -----------------------------------------------------------------------------


class Preparer:
    """The :class:`DriverBackend` of the Neuron kubelet plugin."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        node_name: str,
        cdi_root: Path,
        checkpoint_path: Path,
        inventory: InventoryProvider,
        published: PublishedProvider,
        driver_name: str = DRIVER_NAME,
        topology: TopologyProvider = _no_topology,
        clock: Clock | None = None,
        events: EventRecorder | None = None,
        limits: PrepareLimits | None = None,
        registry: CollectorRegistry | None = None,
        boot_id_path: Path = ckpt.DEFAULT_BOOT_ID_PATH,
        cdi_kind: str = CDI_KIND,
        rng: random.Random | None = None,
    ) -> None:
        self._kube = kube
        self._node = node_name
        self._driver = driver_name
        self._cdi_root = cdi_root
        self._ckpt_path = checkpoint_path
        self._inventory = inventory
        self._published = published
        self._topology = topology
        self._clock: Clock = clock or SystemClock()
        self._events = events or EventRecorder(
            kube, reporting_instance=node_name, clock=self._clock
        )
        self._limits = limits or PrepareLimits()
        self._boot_id_path = boot_id_path
        self._cdi_kind = cdi_kind
        self._rng = rng or random.Random()
        self.metrics = PreparerMetrics(registry)

        self._checkpoint = ckpt.Checkpoint()
        self._started = False
        self._start_lock = asyncio.Lock()
        # Serializes checkpoint read-modify-write-to-disk; held only around the save.
        self._ckpt_lock = asyncio.Lock()
        self._device_locks: dict[int, asyncio.Lock] = {}
        self._node_uid: str | None = None
        # Commits still running after their caller was cancelled (kept so they are not
        # garbage-collected mid-flight).
        self._commits: set[asyncio.Future[None]] = set()

    @property
    def checkpoint(self) -> ckpt.Checkpoint:
        """The current state (read-only snapshot; for the health server and tests)."""
        return self._checkpoint

    # -- start-up ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Recover once; Prepare/Unprepare call it too, so ordering mistakes are harmless."""
        async with self._start_lock:
            if not self._started:
                await self.recover()
                self._started = True

    async def recover(self) -> None:
        """Make disk consistent with the checkpoint after a (re)start.

        * load it (untrusted file: moved aside + Node Warning Event; reboot: entries dropped);
        * recreate missing CDI specs of claims still prepared: ``/var/run/cdi`` may have been
          emptied while the containers using them still need restarts to find their devices;
        * delete our CDI specs that no entry references: left by a crash between the spec
          write and the checkpoint write, or by claims dropped after a reboot;
        * delete leftover temp files of interrupted atomic writes.
        """
        boot_id = await asyncio.to_thread(ckpt.read_boot_id, self._boot_id_path)
        result = await asyncio.to_thread(
            ckpt.load, self._ckpt_path, boot_id=boot_id, now=self._clock.wall()
        )
        for note in result.notes:
            log.warning("%s", note)
        for warning in result.warnings:
            log.warning("%s", warning)
            await self._node_event(EventType.WARNING, REASON_CHECKPOINT_RESET, warning)
        if result.dirty:
            await asyncio.to_thread(ckpt.save, self._ckpt_path, result.checkpoint)
        self._checkpoint = result.checkpoint

        present = await asyncio.to_thread(list_cdi_specs, self._cdi_root, cdi_kind=self._cdi_kind)
        for uid, entry in sorted(self._checkpoint.claims.items()):
            if uid in present:
                continue
            try:
                await asyncio.to_thread(self._write_spec, entry.cdi_spec, uid)
            except OSError as exc:
                # Keep going: other claims' specs and the sweep still matter. The claim stays
                # recorded; a repeated Prepare tries the write again.
                msg = f"cannot restore CDI spec of ResourceClaim {entry.key} (uid {uid}): {exc}"
                log.error("%s", msg)
                await self._node_event(EventType.WARNING, REASON_CDI_RESTORE_FAILED, msg)
            else:
                log.info("restored missing CDI spec of ResourceClaim %s (uid %s)", entry.key, uid)
        for uid in sorted(present - set(self._checkpoint.claims)):
            log.info("removing orphan CDI spec for claim uid %s (not in the checkpoint)", uid)
            await asyncio.to_thread(remove_cdi_spec, self._cdi_root, uid, cdi_kind=self._cdi_kind)
        await asyncio.to_thread(self._sweep_temp_files)
        self.metrics.prepared_claims.set(len(self._checkpoint.claims))

    def _sweep_temp_files(self) -> None:
        spec_prefix = "." + spec_file_name("", cdi_kind=self._cdi_kind).removesuffix(".json")
        for directory, prefix in (
            (self._cdi_root, spec_prefix),
            (self._ckpt_path.parent, f".{self._ckpt_path.name}."),
        ):
            try:
                names = os.listdir(directory)
            except FileNotFoundError:
                continue
            for name in names:
                if name.startswith(prefix) and name.endswith(".tmp"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(directory / name)

    # -- Prepare ----------------------------------------------------------------------------

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        await self.start()
        deadline = self._clock.now() + self._limits.budget
        results = await asyncio.gather(*(self._prepare_one(ref, deadline) for ref in claims))
        return {ref.uid: result for ref, result in zip(claims, results, strict=True)}

    async def _prepare_one(self, ref: ClaimRef, deadline: float) -> PrepareResult:
        started = self._clock.now()
        try:
            result = await self._prepare_claim(ref, deadline)
        except PrepareFailure as exc:
            self.metrics.prepare_errors.labels(reason=exc.reason).inc()
            log.warning(
                "prepare of ResourceClaim %s/%s (uid %s) failed: %s",
                ref.namespace,
                ref.name,
                ref.uid,
                exc.message,
            )
            if exc.event:
                await self._events.record(
                    ObjectRef.resource_claim(ref.namespace, ref.name, ref.uid),
                    type_=EventType.WARNING,
                    reason=REASON_PREPARE_FAILED,
                    note=exc.message,
                    action="Prepare",
                )
            return PrepareResult(error=exc.message)
        except Exception as exc:
            # A bug must not take the other claims of the call down with it.
            self.metrics.prepare_errors.labels(reason="Internal").inc()
            log.exception(
                "prepare of ResourceClaim %s/%s failed unexpectedly", ref.namespace, ref.name
            )
            return PrepareResult(
                error=f"internal error preparing ResourceClaim {ref.namespace}/{ref.name}: {exc}"
            )
        finally:
            self.metrics.prepare_seconds.observe(max(0.0, self._clock.now() - started))
        return result

    async def _prepare_claim(self, ref: ClaimRef, deadline: float) -> PrepareResult:
        done = self._checkpoint.claims.get(ref.uid)
        if done is not None:
            return await self._already_prepared(done)

        claim = await self._get_claim(ref, deadline)
        plan = self._plan(ref, claim)
        async with self._locked(plan.device_indices):
            # Re-check under the locks: a concurrent call may have prepared this very claim
            # while we were reading it.
            done = self._checkpoint.claims.get(ref.uid)
            if done is not None:
                return await self._already_prepared(done)
            conflict = ckpt.find_conflict(self._checkpoint, ref.uid, plan.device_indices)
            if conflict is not None:
                raise PrepareFailure(
                    conflict_message(*conflict),
                    reason="DeviceInUse",
                    permanent=False,
                    event=True,
                )
            spec = self._spec(plan)
            try:
                await asyncio.to_thread(self._write_spec, spec, ref.uid)
            except OSError as exc:
                raise PrepareFailure(
                    f"cannot write CDI spec for ResourceClaim {plan.key}: {exc}",
                    reason="CDIWriteFailed",
                    permanent=False,
                    event=True,
                ) from exc
            entry = ckpt.ClaimEntry(
                uid=ref.uid,
                namespace=plan.namespace,
                name=plan.name,
                devices=prepared_devices(plan, pool=self._node, cdi_kind=self._cdi_kind),
                device_indices=plan.device_indices,
                cdi_spec=spec,
                prepared_at=self._clock.wall().strftime("%Y-%m-%dT%H:%M:%SZ"),
            )

            def add(current: ckpt.Checkpoint) -> ckpt.Checkpoint:
                # Checked again at commit time: the device locks are released if this call is
                # cancelled (the kubelet's deadline) while its commit still runs, and the
                # checkpoint is the one place where two claims must never both land.
                clash = ckpt.find_conflict(current, ref.uid, plan.device_indices)
                if clash is not None:
                    raise PrepareFailure(
                        conflict_message(*clash),
                        reason="DeviceInUse",
                        permanent=False,
                        event=True,
                    )
                return current.with_claim(entry)

            try:
                await self._commit(add)
            except (OSError, PrepareFailure) as exc:
                # Not recorded means not prepared: take the spec back so no orphan is left.
                with contextlib.suppress(OSError):
                    await asyncio.to_thread(
                        remove_cdi_spec, self._cdi_root, ref.uid, cdi_kind=self._cdi_kind
                    )
                if isinstance(exc, PrepareFailure):
                    raise
                raise PrepareFailure(
                    f"cannot record ResourceClaim {plan.key} in the checkpoint: {exc}",
                    reason="CheckpointWriteFailed",
                    permanent=False,
                ) from exc
        log.info(
            "prepared ResourceClaim %s (uid %s): %s",
            plan.key,
            ref.uid,
            ", ".join(plan.device_names),
        )
        return _answer(entry)

    async def _already_prepared(self, entry: ckpt.ClaimEntry) -> PrepareResult:
        path = self._cdi_root / spec_file_name(entry.uid, cdi_kind=self._cdi_kind)
        if not await asyncio.to_thread(path.exists):
            # Someone emptied the CDI dir: the answer would name devices the runtime cannot
            # resolve, so put the recorded spec back first.
            log.warning("CDI spec of prepared ResourceClaim %s is missing; rewriting", entry.key)
            try:
                await asyncio.to_thread(self._write_spec, entry.cdi_spec, entry.uid)
            except OSError as exc:
                raise PrepareFailure(
                    f"cannot rewrite CDI spec for ResourceClaim {entry.key}: {exc}",
                    reason="CDIWriteFailed",
                    permanent=False,
                ) from exc
        return _answer(entry)

    async def _get_claim(self, ref: ClaimRef, deadline: float) -> dict[str, Any]:
        """GET the claim, retrying retryable errors within the attempts and the budget."""
        key = f"{ref.namespace}/{ref.name}"
        api = self._kube.resource(RESOURCE_CLAIMS)
        limits = self._limits
        last: KubeError | None = None
        for attempt in range(limits.attempts):
            remaining = deadline - self._clock.now()
            if remaining <= 0:
                break
            try:
                claim = await api.get(
                    ref.name,
                    ref.namespace,
                    request_timeout=max(0.1, min(limits.request_timeout, remaining)),
                )
            except NotFoundError:
                raise PrepareFailure(
                    f"ResourceClaim {key} not found", reason="NotFound", permanent=True
                ) from None
            except KubeError as exc:
                if not exc.retryable:
                    raise PrepareFailure(
                        f"cannot read ResourceClaim {key}: {exc.message}",
                        reason="APIError",
                        permanent=True,
                    ) from exc
                last = exc
                if attempt + 1 >= limits.attempts:
                    break
                delay = min(limits.backoff_cap, limits.backoff_base * 2**attempt)
                delay *= 1.0 + 0.2 * self._rng.random()  # jitter: claims of a batch spread out
                if exc.retry_after is not None:
                    delay = max(delay, exc.retry_after)
                if delay >= deadline - self._clock.now():
                    break  # sleeping past the budget would only make the answer late
                log.debug(
                    "reading ResourceClaim %s failed (%s); retrying in %.2fs", key, exc, delay
                )
                await self._clock.sleep(delay)
                continue
            return claim
        raise PrepareFailure(
            f"cannot read ResourceClaim {key} within the prepare budget "
            f"({limits.budget:g}s, {limits.attempts} attempts): "
            f"{last.message if last else 'budget exhausted'}",
            reason="APIUnavailable",
            permanent=False,
        )

    def _plan(self, ref: ClaimRef, claim: Mapping[str, Any]) -> ClaimPlan:
        key = f"{ref.namespace}/{ref.name}"
        uid = str((claim.get("metadata") or {}).get("uid") or "")
        if uid != ref.uid:
            raise PrepareFailure(
                f"ResourceClaim {key} has uid {uid}, but the kubelet asked for uid {ref.uid}: "
                "the claim was deleted and recreated under the same name, so this request is "
                "stale",
                reason="UIDMismatch",
                permanent=True,
            )
        if not (claim.get("status") or {}).get("allocation"):
            # The kubelet only asks for allocated claims: our read is older than its.
            raise PrepareFailure(
                f"ResourceClaim {key} is not allocated", reason="NotAllocated", permanent=False
            )
        try:
            return plan_claim(
                claim,
                inventory=self._inventory(),
                published=self._published(),
                node_name=self._node,
                driver_name=self._driver,
            )
        except ClaimError as exc:
            raise PrepareFailure(
                exc.message,
                reason="InvalidClaim" if exc.permanent else "NotReady",
                permanent=exc.permanent,
                event=True,
            ) from None

    def _spec(self, plan: ClaimPlan) -> dict[str, Any]:
        try:
            return cdi_spec_for(
                plan, self._inventory(), cdi_kind=self._cdi_kind, topology=self._topology(plan)
            )
        except CdiError as exc:
            # plan_claim should have refused whatever cannot be expressed; say so plainly.
            raise PrepareFailure(
                f"ResourceClaim {plan.key}: cannot build its CDI spec: {exc}",
                reason="InvalidClaim",
                permanent=True,
                event=True,
            ) from None

    def _write_spec(self, spec: Mapping[str, Any], uid: str) -> None:
        write_cdi_spec(self._cdi_root, spec, uid, cdi_kind=self._cdi_kind)

    # -- Unprepare --------------------------------------------------------------------------

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareResult]:
        await self.start()
        results = await asyncio.gather(*(self._unprepare_one(ref) for ref in claims))
        return {ref.uid: result for ref, result in zip(claims, results, strict=True)}

    async def _unprepare_one(self, ref: ClaimRef) -> UnprepareResult:
        entry = self._checkpoint.claims.get(ref.uid)
        indices = entry.device_indices if entry is not None else ()
        try:
            async with self._locked(indices):
                # Spec first, entry second: a crash in between leaves an entry whose spec is
                # gone, which the kubelet's Unprepare retry then removes. Also done for unknown
                # claims: an orphan spec from a crash mid-Prepare is cleaned up here too.
                await asyncio.to_thread(
                    remove_cdi_spec, self._cdi_root, ref.uid, cdi_kind=self._cdi_kind
                )
                if ref.uid in self._checkpoint.claims:
                    await self._commit(lambda c: c.without_claim(ref.uid))
        except OSError as exc:
            log.error("unprepare of ResourceClaim %s/%s failed: %s", ref.namespace, ref.name, exc)
            return UnprepareResult(
                error=f"cannot unprepare ResourceClaim {ref.namespace}/{ref.name}: {exc}"
            )
        if entry is not None:
            log.info("unprepared ResourceClaim %s (uid %s)", entry.key, ref.uid)
        return UnprepareResult()

    # -- helpers ----------------------------------------------------------------------------

    async def drain(self) -> None:
        """Wait for checkpoint writes whose callers were cancelled (call before exiting)."""
        while self._commits:
            await asyncio.gather(*self._commits, return_exceptions=True)

    async def _commit(self, change: Callable[[ckpt.Checkpoint], ckpt.Checkpoint]) -> None:
        """Apply ``change`` to the checkpoint, persist it, then publish it in memory.

        Shielded: the kubelet-facing layer cancels calls that run out of time, and a save
        that finishes on disk (it runs in a thread) must also finish in memory, or memory and
        file disagree until the next restart.
        """
        task = asyncio.ensure_future(self._commit_locked(change))
        self._commits.add(task)
        task.add_done_callback(self._commits.discard)
        await asyncio.shield(task)

    async def _commit_locked(self, change: Callable[[ckpt.Checkpoint], ckpt.Checkpoint]) -> None:
        async with self._ckpt_lock:
            new = change(self._checkpoint)
            await asyncio.to_thread(ckpt.save, self._ckpt_path, new)
            self._checkpoint = new
            self.metrics.prepared_claims.set(len(new.claims))

    @contextlib.asynccontextmanager
    async def _locked(self, indices: Iterable[int]) -> AsyncIterator[None]:
        """Hold the locks of ``indices``, acquired in ascending order (no lock-order cycles)."""
        async with contextlib.AsyncExitStack() as stack:
            for index in sorted(set(indices)):
                lock = self._device_locks.setdefault(index, asyncio.Lock())
                await stack.enter_async_context(lock)
            yield

    async def _node_event(self, type_: EventType, reason: str, note: str) -> None:
        if self._node_uid is None:
            # Best effort: an Event without the Node's uid still shows in `kubectl describe`.
            try:
                node = await self._kube.resource(NODES).get(self._node, request_timeout=5.0)
                self._node_uid = str((node.get("metadata") or {}).get("uid") or "")
            except KubeError as exc:
                log.debug("cannot read Node %s for its uid: %s", self._node, exc)
        await self._events.record(
            ObjectRef.node(self._node, self._node_uid or None),
            type_=type_,
            reason=reason,
            note=note,
            action="Recover",
        )


def _implements_backend(preparer: Preparer) -> DriverBackend:
    # Static check only: mypy verifies that Preparer satisfies the kubelet layer's protocol.
    return preparer
