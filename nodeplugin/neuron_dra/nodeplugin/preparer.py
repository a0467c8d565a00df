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

Claims of one call are read and planned concurrently, then decided one after the other in
call order (so of two claims of a call wanting one device, the first wins) and recorded
together: one worker-thread call writes the accepted claims' CDI specs and then the
checkpoint once for the whole batch (group commit). A claim refused or whose spec cannot be
written fails alone; if the checkpoint write fails, every claim of the batch fails and their
specs are taken back.

Several plugin instances (reference/kubelet-dra.md §4.4): during a rolling update the old and
the new pod serve the kubelet side by side, and it may send any call to either. They share
the checkpoint and the CDI directory, so everything that reads or changes them runs under the
node lock (:mod:`.nodelock`, ``serialize.lock`` next to the checkpoint), and each holder first
re-reads the checkpoint if the other instance changed it. A Prepare batch has three steps:

1. to answer the claims already prepared on this node (by either instance), without an API
   call, from the checkpoint as it is now. Under the node lock; skipped when one read of the
   file (saves replace it atomically) shows the version we know and none of the claims in it;
2. (no lock) to read and plan the other claims: API calls may take the whole budget, and
   holding the lock through them would stall every call of the other instance;
3. to check conflicts, write the CDI specs and record the entries, for the whole batch at
   once: one short hold of local file work, one checkpoint write.

Unprepare and the start-up recovery hold it throughout (local file work only). API calls
(Events) never run under it. Waiting for it is bounded by ``PrepareLimits.lock_timeout``;
if it passes, each claim gets a retryable error and the kubelet calls again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from neuron_dra.common.constants import DRIVER_NAME, NODE_DEVICE_NAME, device_name
from neuron_dra.common.events import EventRecorder, EventType, ObjectRef
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
from neuron_dra.nodeplugin.kubeletapi import (
    ClaimRef,
    DriverBackend,
    PreparedDevice,
    PrepareResult,
    UnprepareResult,
)
from neuron_dra.nodeplugin.nodelock import NodeLock, NodeLockTimeout, lock_path
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
    #: Seconds (real time) a Prepare or Unprepare waits for the node lock each time it needs
    #: it; then its claims get retryable errors. The other instance holds it only for local
    #: file work. A Prepare can wait once within ``budget`` and once after it, so keep
    #: ``budget + lock_timeout`` below the gRPC layer's budget (40 s).
    lock_timeout: float = 5.0
    #: The wait for the node lock of the recovery at plugin start (nobody is waiting on the
    #: plugin yet; a lock still busy after this long means something is stuck).
    start_lock_timeout: float = 60.0

    def __post_init__(self) -> None:
        if self.budget <= 0 or self.attempts < 1 or self.backoff_base <= 0:
            raise ValueError("need budget > 0, attempts >= 1 and backoff_base > 0")
        if self.lock_timeout <= 0 or self.start_lock_timeout <= 0:
            raise ValueError("need lock_timeout > 0 and start_lock_timeout > 0")


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


_T = TypeVar("_T")


@dataclass(frozen=True)
class _Planned:
    """A claim read and planned (step 2), ready for step 3."""

    plan: ClaimPlan
    spec: dict[str, Any]


@dataclass(frozen=True)
class _Outcome:
    """How one claim of a Prepare batch ended: its answer, or why not (reported once the
    node lock is released), and when (for the duration metric)."""

    value: PrepareResult | Exception
    at: float


def _state_failure(exc: NodeLockTimeout | OSError, verb: str) -> PrepareFailure:
    if isinstance(exc, NodeLockTimeout):
        return PrepareFailure(f"cannot {verb} now: {exc}", reason="NodeLockBusy", permanent=False)
    return PrepareFailure(
        f"cannot {verb} now: the plugin's checkpoint or lock file is not accessible: {exc}",
        reason="StateUnavailable",
        permanent=False,
    )


def _consume_outcome(task: asyncio.Future[Any]) -> None:
    # The caller may have been cancelled and never look; drain() still does.
    if not task.cancelled():
        task.exception()


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
        # The checkpoint file's bytes as we last read or wrote them (None: no file), to tell
        # whether another plugin instance changed it since.
        self._ckpt_raw: bytes | None = None
        self._loaded = False
        self._boot_id: str | None = None
        self._started = False
        self._start_lock = asyncio.Lock()
        # Across the plugin instances of this node (rolling update) and the calls of this one.
        self._node_lock = NodeLock(lock_path(checkpoint_path.parent))
        self._node_uid: str | None = None
        # Node-locked sections still running after their caller was cancelled (kept so they
        # are not garbage-collected mid-flight).
        self._background: set[asyncio.Future[Any]] = set()
        # (reason, note) of Node Events noted under the node lock, sent after it.
        self._deferred_events: list[tuple[str, str]] = []

    @property
    def checkpoint(self) -> ckpt.Checkpoint:
        """The current state (read-only snapshot; for the health server and tests)."""
        return self._checkpoint

    # -- the node lock ----------------------------------------------------------------------

    async def _exclusive(
        self, body: Callable[[], Awaitable[_T]], *, within: float, reload: bool = False
    ) -> _T:
        """Run ``body`` holding the node lock, on the checkpoint as the file holds it now.

        Waiting for the lock is cancellable (nothing is held then). Once the lock is held,
        ``body`` runs to its end even if our caller is cancelled, and the lock is released
        only then: it does local file work only (never an API call, so it is short), and
        letting go halfway, say between a CDI spec write and its checkpoint entry, would let
        the other instance's sweep delete the spec or its save overwrite ours.
        :meth:`drain` waits for such bodies.
        """
        await self._node_lock.acquire(within)

        async def run() -> _T:
            try:
                await self._refresh(force=reload)
                return await body()
            finally:
                self._node_lock.release()

        task = asyncio.ensure_future(run())
        self._background.add(task)
        task.add_done_callback(_consume_outcome)
        task.add_done_callback(self._background.discard)
        return await asyncio.shield(task)

    async def _refresh(self, *, force: bool) -> None:
        """Under the node lock: make ``self._checkpoint`` what the file holds now.

        The file changes behind our back only when another plugin instance writes it. We
        compare its bytes with the version we last read or wrote rather than its stat: every
        save replaces the file, and the next save (by the other instance) may reuse the freed
        inode number within one mtime tick (coarse on many filesystems) at the same size, so
        (inode, mtime, size) can repeat for different content. The file is small.
        An untrustworthy file is handled as at start-up: moved aside, Node Warning Event.
        """
        if self._boot_id is None:
            self._boot_id = await asyncio.to_thread(ckpt.read_boot_id, self._boot_id_path)
        # Read on the event loop: the file is small and bounded (one entry per prepared
        # claim, at most one claim per device) and in the page cache (just written, by us or
        # the other instance); a worker-thread hop costs more than the read.
        raw = ckpt.read_raw(self._ckpt_path)
        if self._loaded and not force and raw == self._ckpt_raw:
            return
        result = await asyncio.to_thread(
            ckpt.load_raw, self._ckpt_path, raw, boot_id=self._boot_id, now=self._clock.wall()
        )
        if self._loaded and not force:
            log.info(
                "checkpoint %s was changed by another plugin instance; reloaded it "
                "(%d prepared claims)",
                self._ckpt_path,
                len(result.checkpoint.claims),
            )
        for note in result.notes:
            log.warning("%s", note)
        for warning in result.warnings:
            log.warning("%s", warning)
            self._deferred_events.append((REASON_CHECKPOINT_RESET, warning))
        self._checkpoint = result.checkpoint
        self._ckpt_raw = None if result.moved_to is not None else raw
        self._loaded = True
        self.metrics.prepared_claims.set(len(result.checkpoint.claims))
        if result.dirty:
            self._ckpt_raw = await asyncio.to_thread(ckpt.save, self._ckpt_path, result.checkpoint)

    async def _emit_deferred_events(self) -> None:
        """Node Events noted under the node lock, sent after it (no API calls under it)."""
        pending, self._deferred_events = self._deferred_events, []
        for reason, note in pending:
            await self._node_event(EventType.WARNING, reason, note)

    # -- start-up ---------------------------------------------------------------------------

    async def start(self, *, lock_timeout: float | None = None) -> None:
        """Recover once; Prepare/Unprepare call it too, so ordering mistakes are harmless.

        ``lock_timeout`` bounds the wait for the node lock (default: the limits'
        ``start_lock_timeout``); :class:`NodeLockTimeout` if it passes (nothing recovered,
        the next call tries again).
        """
        if self._started:  # every call after the first: no lock round trip
            return
        async with self._start_lock:
            if not self._started:
                await self.recover(lock_timeout=lock_timeout)
                self._started = True

    async def recover(self, *, lock_timeout: float | None = None) -> None:
        """Make disk consistent with the checkpoint after a (re)start, under the node lock.

        * load it (untrusted file: moved aside + Node Warning Event; reboot: entries dropped);
        * recreate missing CDI specs of claims still prepared: ``/var/run/cdi`` may have been
          emptied while the containers using them still need restarts to find their devices;
        * delete our CDI specs that no entry references: left by a crash between the spec
          write and the checkpoint write, or by claims dropped after a reboot;
        * delete leftover temp files of interrupted atomic writes.

        The node lock matters most here: during a rolling update the other instance may have
        just written a spec for a claim it is about to record. Under the lock its spec write
        and its checkpoint write are never split, and the sweep compares against the
        checkpoint as re-read under the same lock, so it only removes true orphans.
        """
        self._boot_id = await asyncio.to_thread(ckpt.read_boot_id, self._boot_id_path)
        timeout = self._limits.start_lock_timeout if lock_timeout is None else lock_timeout
        await self._exclusive(self._recover_locked, within=timeout, reload=True)
        await self._emit_deferred_events()

    async def _recover_locked(self) -> None:
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
                self._deferred_events.append((REASON_CDI_RESTORE_FAILED, msg))
            else:
                log.info("restored missing CDI spec of ResourceClaim %s (uid %s)", entry.key, uid)
        for uid in sorted(present - set(self._checkpoint.claims)):
            log.info("removing orphan CDI spec for claim uid %s (not in the checkpoint)", uid)
            await asyncio.to_thread(remove_cdi_spec, self._cdi_root, uid, cdi_kind=self._cdi_kind)
        await asyncio.to_thread(self._sweep_temp_files)

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
        """Prepare a batch in three steps (see the module docstring for why)."""
        started = self._clock.now()
        deadline = started + self._limits.budget
        lock_timeout = self._limits.lock_timeout
        outcomes: dict[str, _Outcome] = {}
        try:
            await self.start(lock_timeout=lock_timeout)
            # 1. Node lock: claims this node has prepared already, by us or another instance
            #    (skipped when the file shows that none of them is).
            if not self._none_prepared(claims):
                outcomes.update(
                    await self._exclusive(
                        lambda: self._answer_prepared(claims), within=lock_timeout
                    )
                )
            # 2. No lock: read and plan the others (API calls, up to the whole budget).
            todo = [ref for ref in claims if ref.uid not in outcomes]
            if len(todo) == 1:  # the usual call: no task (and loop round) for the one claim
                planned = [await self._read_and_plan(todo[0], deadline)]
            else:
                planned = await asyncio.gather(
                    *(self._read_and_plan(ref, deadline) for ref in todo)
                )
            ready: list[tuple[ClaimRef, _Planned]] = []
            for ref, item in zip(todo, planned, strict=True):
                if isinstance(item, _Planned):
                    ready.append((ref, item))
                else:
                    outcomes[ref.uid] = item
            # 3. Node lock: conflict checks, CDI spec writes and checkpoint entries.
            if ready:
                outcomes.update(
                    await self._exclusive(lambda: self._prepare_planned(ready), within=lock_timeout)
                )
        except (NodeLockTimeout, OSError) as exc:
            # The node's state cannot be consulted now: every claim not settled yet gets a
            # retryable error of its own (never a hang, never a failed call).
            failure = _state_failure(exc, "prepare")
            for ref in claims:
                outcomes.setdefault(ref.uid, _Outcome(failure, self._clock.now()))
        await self._emit_deferred_events()
        answers: dict[str, PrepareResult] = {}
        warnings = []
        for ref in claims:
            outcome = outcomes[ref.uid]
            answers[ref.uid] = self._report(ref, outcome, started)
            if isinstance(outcome.value, PrepareFailure) and outcome.value.event:
                warnings.append(self._claim_warning(ref, outcome.value))
        if warnings:
            await asyncio.gather(*warnings)
        return answers

    async def _settle(self, work: Awaitable[PrepareResult]) -> _Outcome:
        try:
            value: PrepareResult | Exception = await work
        except Exception as exc:
            value = exc
        return _Outcome(value, self._clock.now())

    def _none_prepared(self, claims: Sequence[ClaimRef]) -> bool:
        """Whether the checkpoint file, as it is now, records none of ``claims``: then step 1
        has nothing to answer and its node-lock round trip is skipped.

        No lock is needed to know that: saves replace the file atomically, so one read gives
        one complete version. If its bytes are those we last read or wrote, our in-memory
        checkpoint is that version, and a claim missing from it was not prepared at the time
        of the read (step 3 re-checks under the lock anyway). Any doubt (file changed, claim
        known, unreadable file) takes the locked path, which also reloads the file.
        """
        if not self._loaded or any(ref.uid in self._checkpoint.claims for ref in claims):
            return False
        try:
            raw = ckpt.read_raw(self._ckpt_path)
        except OSError:
            return False
        return raw == self._ckpt_raw

    async def _answer_prepared(self, claims: Sequence[ClaimRef]) -> dict[str, _Outcome]:
        out: dict[str, _Outcome] = {}
        for ref in claims:
            entry = self._checkpoint.claims.get(ref.uid)
            if entry is not None:
                out[ref.uid] = await self._settle(self._already_prepared(entry))
        return out

    async def _read_and_plan(self, ref: ClaimRef, deadline: float) -> _Planned | _Outcome:
        try:
            claim = await self._get_claim(ref, deadline)
            plan = self._plan(ref, claim)
            return _Planned(plan, self._spec(plan))
        except Exception as exc:
            return _Outcome(exc, self._clock.now())

    async def _prepare_planned(
        self, ready: Sequence[tuple[ClaimRef, _Planned]]
    ) -> dict[str, _Outcome]:
        """Step 3 (node lock held, checkpoint fresh): decide every claim of the batch against
        the checkpoint and the claims accepted before it in the batch (batch order wins a
        device two of them want), then write the accepted claims' CDI specs and record them
        with one checkpoint write (:meth:`_write_prepared`, one thread call).

        Nothing else touching the checkpoint or the CDI directory runs meanwhile: every such
        section of this process and of the other instance holds the node lock.
        """
        outcomes: dict[str, _Outcome] = {}
        pending = self._checkpoint  # plus the entries accepted so far (conflict checks)
        accepted: list[ckpt.ClaimEntry] = []
        for ref, item in ready:
            if ref.uid in outcomes or any(e.uid == ref.uid for e in accepted):
                continue  # the same claim twice in one call: answered once
            done = self._checkpoint.claims.get(ref.uid)
            if done is not None:
                # Prepared by another call, or the other instance, while we were reading it.
                outcomes[ref.uid] = await self._settle(self._already_prepared(done))
                continue
            plan = item.plan
            conflict = ckpt.find_conflict(pending, ref.uid, plan.device_indices)
            if conflict is not None:
                failure = PrepareFailure(
                    conflict_message(*conflict), reason="DeviceInUse", permanent=False, event=True
                )
                outcomes[ref.uid] = _Outcome(failure, self._clock.now())
                continue
            entry = ckpt.ClaimEntry(
                uid=ref.uid,
                namespace=plan.namespace,
                name=plan.name,
                devices=prepared_devices(plan, pool=self._node, cdi_kind=self._cdi_kind),
                device_indices=plan.device_indices,
                cdi_spec=item.spec,
                prepared_at=self._clock.wall().strftime("%Y-%m-%dT%H:%M:%SZ"),
            )
            pending = pending.with_claim(entry)
            accepted.append(entry)
        if not accepted:
            return outcomes
        failures = await self._commit(lambda current: self._write_prepared(current, accepted))
        now = self._clock.now()
        for entry in accepted:
            refused = failures.get(entry.uid)
            if refused is not None:
                outcomes[entry.uid] = _Outcome(refused, now)
                continue
            log.info(
                "prepared ResourceClaim %s (uid %s): %s",
                entry.key,
                entry.uid,
                ", ".join(d.device_name for d in entry.devices),
            )
            outcomes[entry.uid] = _Outcome(_answer(entry), now)
        return outcomes

    def _write_prepared(
        self, current: ckpt.Checkpoint, entries: Sequence[ckpt.ClaimEntry]
    ) -> tuple[ckpt.Checkpoint, bytes | None, dict[str, PrepareFailure]]:
        """In a worker thread: write the CDI specs of ``entries``, then record the claims
        whose spec is written in one checkpoint save (group commit). A claim whose spec
        cannot be written fails alone. If the save fails, none of them is prepared: each gets
        the error and the specs written here are taken back (no orphans).

        Spec first, entries second: a crash in between leaves orphan specs that the
        start-up sweep deletes, never an entry whose spec was never written.
        """
        failures: dict[str, PrepareFailure] = {}
        new = current
        for entry in entries:
            # Checked again at commit time: the checkpoint is the one place where two claims
            # must never both land, whatever the checks before decided.
            clash = ckpt.find_conflict(new, entry.uid, entry.device_indices)
            if clash is not None:
                failures[entry.uid] = PrepareFailure(
                    conflict_message(*clash), reason="DeviceInUse", permanent=False, event=True
                )
                continue
            try:
                self._write_spec(entry.cdi_spec, entry.uid)
            except OSError as exc:
                failures[entry.uid] = PrepareFailure(
                    f"cannot write CDI spec for ResourceClaim {entry.key}: {exc}",
                    reason="CDIWriteFailed",
                    permanent=False,
                    event=True,
                )
                continue
            new = new.with_claim(entry)
        if new is current:
            return current, None, failures
        try:
            raw = ckpt.save(self._ckpt_path, new)
        except OSError as exc:
            # Not recorded means not prepared: take the specs back so no orphan is left.
            for entry in entries:
                if entry.uid not in failures:
                    with contextlib.suppress(OSError):
                        remove_cdi_spec(self._cdi_root, entry.uid, cdi_kind=self._cdi_kind)
                    failures[entry.uid] = PrepareFailure(
                        f"cannot record ResourceClaim {entry.key} in the checkpoint: {exc}",
                        reason="CheckpointWriteFailed",
                        permanent=False,
                    )
            return current, None, failures
        return new, raw, failures

    def _report(self, ref: ClaimRef, outcome: _Outcome, started: float) -> PrepareResult:
        """Metrics and logs for one settled claim; its answer."""
        self.metrics.prepare_seconds.observe(max(0.0, outcome.at - started))
        exc = outcome.value
        if isinstance(exc, PrepareResult):
            return exc
        if isinstance(exc, PrepareFailure):
            self.metrics.prepare_errors.labels(reason=exc.reason).inc()
            log.warning(
                "prepare of ResourceClaim %s/%s (uid %s) failed: %s",
                ref.namespace,
                ref.name,
                ref.uid,
                exc.message,
            )
            return PrepareResult(error=exc.message)
        # A bug must not take the other claims of the call down with it.
        self.metrics.prepare_errors.labels(reason="Internal").inc()
        log.error(
            "prepare of ResourceClaim %s/%s failed unexpectedly",
            ref.namespace,
            ref.name,
            exc_info=exc,
        )
        return PrepareResult(
            error=f"internal error preparing ResourceClaim {ref.namespace}/{ref.name}: {exc}"
        )

    async def _claim_warning(self, ref: ClaimRef, failure: PrepareFailure) -> None:
        """The Warning Event on the claim for a failure its user can act on."""
        await self._events.record(
            ObjectRef.resource_claim(ref.namespace, ref.name, ref.uid),
            type_=EventType.WARNING,
            reason=REASON_PREPARE_FAILED,
            note=failure.message,
            action="Prepare",
        )

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
        """All of the batch under the node lock: it is local file work only."""
        lock_timeout = self._limits.lock_timeout
        try:
            await self.start(lock_timeout=lock_timeout)
            results = await self._exclusive(
                lambda: self._unprepare_batch(claims), within=lock_timeout
            )
        except (NodeLockTimeout, OSError) as exc:
            failure = _state_failure(exc, "unprepare")
            log.warning("unprepare of %d claim(s) postponed: %s", len(claims), failure.message)
            results = {ref.uid: UnprepareResult(error=failure.message) for ref in claims}
        await self._emit_deferred_events()
        return results

    async def _unprepare_batch(self, claims: Sequence[ClaimRef]) -> dict[str, UnprepareResult]:
        known = {ref.uid: self._checkpoint.claims.get(ref.uid) for ref in claims}
        errors = await self._commit(lambda current: self._write_unprepared(current, claims))
        results: dict[str, UnprepareResult] = {}
        for ref in claims:
            error = errors.get(ref.uid)
            if error is not None:
                log.error(
                    "unprepare of ResourceClaim %s/%s failed: %s", ref.namespace, ref.name, error
                )
                results[ref.uid] = UnprepareResult(
                    error=f"cannot unprepare ResourceClaim {ref.namespace}/{ref.name}: {error}"
                )
                continue
            entry = known[ref.uid]
            if entry is not None:
                log.info("unprepared ResourceClaim %s (uid %s)", entry.key, ref.uid)
            results[ref.uid] = UnprepareResult()
        return results

    def _write_unprepared(
        self, current: ckpt.Checkpoint, claims: Sequence[ClaimRef]
    ) -> tuple[ckpt.Checkpoint, bytes | None, dict[str, OSError]]:
        """In a worker thread: remove the claims' CDI specs, then their entries with one
        checkpoint save. Spec first, entry second: a crash in between leaves an entry whose
        spec is gone, which the kubelet's Unprepare retry then removes. Also done for unknown
        claims: an orphan spec from a crash mid-Prepare is cleaned up here too. A claim whose
        spec cannot be removed keeps its entry and fails alone."""
        errors: dict[str, OSError] = {}
        gone: list[str] = []
        for ref in claims:
            try:
                remove_cdi_spec(self._cdi_root, ref.uid, cdi_kind=self._cdi_kind)
            except OSError as exc:
                errors[ref.uid] = exc
                continue
            if ref.uid in current.claims:
                gone.append(ref.uid)
        if not gone:
            return current, None, errors
        new = current.without_claims(gone)
        try:
            raw = ckpt.save(self._ckpt_path, new)
        except OSError as exc:
            # The specs are gone, the entries stay: the kubelet's retry removes them.
            errors.update((uid, exc) for uid in gone)
            return current, None, errors
        return new, raw, errors

    # -- helpers ----------------------------------------------------------------------------

    async def drain(self) -> None:
        """Wait for node-locked work (checkpoint writes included) whose callers were
        cancelled (call before exiting)."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    async def _commit(
        self, work: Callable[[ckpt.Checkpoint], tuple[ckpt.Checkpoint, bytes | None, _T]]
    ) -> _T:
        """Run ``work`` on the current checkpoint in a worker thread, then publish in memory
        the checkpoint it saved (``work`` returns it with the bytes written, or None for the
        bytes if it saved nothing) and hand back its result.

        ``work`` does all of a batch's file work in one thread call: CDI spec writes or
        removals and at most one checkpoint save. Only bodies run by :meth:`_exclusive` call
        this: the node lock serializes the read-modify-write, and those bodies run to their
        end even when the kubelet-facing layer cancels the call, so a save that finishes on
        disk (in the thread) also finishes in memory; otherwise memory and file would
        disagree until the next restart.
        """
        if not self._node_lock.held:
            raise RuntimeError("checkpoint commits must run under the node lock")
        new, raw, result = await asyncio.to_thread(work, self._checkpoint)
        if raw is not None:
            self._checkpoint = new
            self._ckpt_raw = raw
            self.metrics.prepared_claims.set(len(new.claims))
        return result

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
