"""Claim preparation behind the kubelet's NodePrepareResources / NodeUnprepareResources.

What the kubelet expects (docs/architecture.md, "What the kubelet expects"):

* an answer for every claim of the call within its 45 s deadline, each claim on its own:
  one claim's failure is that claim's ``error`` and never affects the others;
* Prepare is idempotent (the kubelet forgets what it prepared when it restarts) and answers a
  repeat with the same CDI ids; Unprepare is idempotent and may name claims we never saw or
  that no longer exist in the API server, so it works from local state only (:mod:`.unprepare`);
* the CDI spec exists before Prepare returns.

For one claim, Prepare: answers from the checkpoint if already prepared; else reads the claim
(bounded retries within the call's budget, :mod:`.budget`), checks that it is the claim the
kubelet means (same uid) and is allocated, plans it (:mod:`.decide`, pure), refuses devices
another prepared claim holds, computes its files (the CDI spec and, with device metadata on,
the metadata files it mounts: :mod:`.claimfiles`, pure), writes them, then records the claim
in the checkpoint. That order matters for crashes: a crash after the file writes leaves
orphan files that the start-up sweep deletes; the reverse order could leave a checkpoint
entry whose files never existed, which a repeated Prepare would then report as done.

Claims of one call are read and planned concurrently, then decided one after the other in
call order (so of two claims of a call wanting one device, the first wins) and recorded
together: one worker-thread call writes the accepted claims' CDI specs and then the
checkpoint once for the whole batch (group commit). A claim refused or whose spec cannot be
written fails alone; if the checkpoint write fails, every claim of the batch fails and their
specs are taken back.

The checkpoint and the CDI directory are shared with the other plugin instance of a rolling
update, under the node lock (:mod:`.nodestate`). A Prepare batch has three steps:

1. to answer the claims already prepared on this node (by either instance), without an API
   call, from the checkpoint as it is now. Under the node lock; skipped when one read of the
   file (saves replace it atomically) shows the version we know and none of the claims in it;
2. (no lock) to read and plan the other claims: API calls may take the whole budget, and
   holding the lock through them would stall every call of the other instance; and, where
   a claim's devices are still held by a claim prepared here, to read that holder too: one
   the API server shows deleted or deallocated is *released* in step 3
   (:func:`.decide.holder_released`) instead of refusing the new claim until the kubelet's
   Unprepare of the old one comes;
3. to check conflicts, write the CDI specs and record the entries, for the whole batch at
   once (released holders' specs removed, their entries dropped in the same write): one
   short hold of local file work, one checkpoint write.

Waiting for the node lock is bounded by ``PrepareLimits.lock_timeout``; if it passes, each
claim gets a retryable error and the kubelet calls again.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from neuron_dra.common.constants import DRIVER_NAME
from neuron_dra.common.events import EventRecorder, EventType, ObjectRef
from neuron_dra.common.k8s.client import PODS, RESOURCE_CLAIMS, KubeClient
from neuron_dra.common.k8s.clock import Clock, SystemClock
from neuron_dra.common.ultraserver import ReservationError, UltraServerPeers
from neuron_dra.nodeplugin.kubeletapi import (
    ClaimRef,
    DriverBackend,
    PrepareResult,
    UnprepareResult,
)
from neuron_dra.nodeplugin.prepare import checkpoint as ckpt
from neuron_dra.nodeplugin.prepare import containers, cores, decide, holders, metadata, record
from neuron_dra.nodeplugin.prepare.budget import (
    PrepareFailure,
    PrepareLimits,
    read_claim,
    read_object,
    state_failure,
)
from neuron_dra.nodeplugin.prepare.cdi import CDI_KIND, CdiError, claim_env
from neuron_dra.nodeplugin.prepare.claimfiles import ClaimContent, ClaimFiles, build
from neuron_dra.nodeplugin.prepare.claims import ClaimPlan
from neuron_dra.nodeplugin.prepare.metrics import PreparerMetrics
from neuron_dra.nodeplugin.prepare.node import PrepareNode
from neuron_dra.nodeplugin.prepare.nodelock import NodeLockTimeout
from neuron_dra.nodeplugin.prepare.nodestate import NodeState
from neuron_dra.nodeplugin.prepare.unprepare import unprepare
from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)

#: The node as Prepare reads it, from the newest inventory (read anew for every claim).
NodeProvider = Callable[[], PrepareNode]
PublishedProvider = Callable[[], Mapping[str, Mapping[str, Any]]]
TopologyProvider = Callable[[str | None], UltraServerPeers | None]

REASON_PREPARE_FAILED: Final = "PrepareFailed"


def _no_topology(workload_id: str | None) -> UltraServerPeers | None:
    return None


@dataclass(frozen=True)
class _Planned:
    """A claim read and planned (step 2); its CDI spec comes once every claim of the batch
    is planned (a container may use several)."""

    plan: ClaimPlan
    #: The pods the claim is reserved for: (name, uid).
    consumers: tuple[tuple[str, str], ...]
    #: Where its device metadata files go in the container (:func:`.metadata.pod_claim_name`).
    pod_claim_name: str | None = None


@dataclass(frozen=True)
class _Specced:
    """A claim planned, with its files' content: ready for step 3."""

    plan: ClaimPlan
    content: ClaimContent


@dataclass(frozen=True)
class _Outcome:
    """How one claim of a Prepare batch ended: its answer, or why not (reported once the
    node lock is released), and when (for the duration metric)."""

    value: PrepareResult | Exception
    at: float


class Preparer:
    """The :class:`DriverBackend` of the Neuron kubelet plugin."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        node_name: str,
        cdi_root: Path,
        checkpoint_path: Path,
        node: NodeProvider,
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
        device_metadata: bool = False,
    ) -> None:
        self._kube = kube
        self._node = node_name
        self._driver = driver_name
        self._cdi_root = cdi_root
        self._ckpt_path = checkpoint_path
        self._node_view = node
        self._published = published
        self._topology = topology
        self._clock: Clock = clock or SystemClock()
        self._events = events or EventRecorder(
            kube, reporting_instance=node_name, clock=self._clock
        )
        self._limits = limits or PrepareLimits()
        self._cdi_kind = cdi_kind
        self._rng = rng or random.Random()
        self.metrics = PreparerMetrics(registry)
        # Device metadata files (KEP-5304) live next to the checkpoint, as the upstream
        # helper keeps them in the plugin's data directory.
        self._metadata_root = checkpoint_path.parent / metadata.HOST_SUBDIR
        self._device_metadata = device_metadata
        self._files = ClaimFiles(cdi_root, cdi_kind=cdi_kind, metadata_root=self._metadata_root)
        self._state = NodeState(
            kube,
            node_name=node_name,
            files=self._files,
            checkpoint_path=checkpoint_path,
            boot_id_path=boot_id_path,
            start_lock_timeout=self._limits.start_lock_timeout,
            clock=self._clock,
            events=self._events,
            prepared_claims=self.metrics.prepared_claims,
        )

    @property
    def checkpoint(self) -> ckpt.Checkpoint:
        """The current state (read-only snapshot; for the health server and tests)."""
        return self._state.checkpoint

    async def start(self, *, lock_timeout: float | None = None) -> None:
        """Recover once (:meth:`NodeState.start`); Prepare/Unprepare call it too."""
        await self._state.start(lock_timeout=lock_timeout)

    async def drain(self) -> None:
        """Wait for node-locked work whose callers were cancelled (call before exiting)."""
        await self._state.drain()

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareResult]:
        return await unprepare(self._state, claims, lock_timeout=self._limits.lock_timeout)

    # -- Prepare ----------------------------------------------------------------------------

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        """Prepare a batch in three steps (see the module docstring for why)."""
        started = self._clock.now()
        deadline = started + self._limits.budget
        lock_timeout = self._limits.lock_timeout
        state = self._state
        outcomes: dict[str, _Outcome] = {}
        try:
            await state.start(lock_timeout=lock_timeout)
            # 1. Node lock: claims this node has prepared already, by us or another instance
            #    (skipped when the file shows that none of them is).
            if not state.records_none_of(ref.uid for ref in claims):
                outcomes.update(
                    await state.exclusive(
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
            read: list[tuple[ClaimRef, _Planned]] = []
            for ref, item in zip(todo, planned, strict=True):
                if isinstance(item, _Planned):
                    read.append((ref, item))
                else:
                    outcomes[ref.uid] = item
            ready = await self._with_specs(read, deadline, outcomes) if read else []
            released = await self._released_holders(ready, deadline) if ready else frozenset()
            # 3. Node lock: conflict checks, CDI spec writes and checkpoint entries.
            if ready:
                outcomes.update(
                    await state.exclusive(
                        lambda: self._prepare_planned(ready, released), within=lock_timeout
                    )
                )
        except (NodeLockTimeout, OSError) as exc:
            # The node's state cannot be consulted now: every claim not settled yet gets a
            # retryable error of its own (never a hang, never a failed call).
            failure = state_failure(exc, "prepare")
            for ref in claims:
                outcomes.setdefault(ref.uid, _Outcome(failure, self._clock.now()))
        await state.emit_deferred_events()
        return await self._answer_all(claims, outcomes, started)

    # step 1

    async def _answer_prepared(self, claims: Sequence[ClaimRef]) -> dict[str, _Outcome]:
        out: dict[str, _Outcome] = {}
        for ref in claims:
            entry = self._state.checkpoint.claims.get(ref.uid)
            if entry is not None:
                out[ref.uid] = await self._settle(self._already_prepared(entry))
        return out

    async def _already_prepared(self, entry: ckpt.ClaimEntry) -> PrepareResult:
        if not await asyncio.to_thread(self._files.complete, entry):
            # Someone emptied the CDI dir: the answer would name devices the runtime cannot
            # resolve (or mounts it cannot find), so put the recorded files back first.
            log.warning("files of prepared ResourceClaim %s are missing; rewriting", entry.key)
            try:
                await asyncio.to_thread(self._files.write, entry)
            except OSError as exc:
                raise PrepareFailure(
                    f"cannot rewrite CDI spec for ResourceClaim {entry.key}: {exc}",
                    reason="CDIWriteFailed",
                    permanent=False,
                ) from exc
        return decide.answer(entry)

    async def _settle(self, work: Awaitable[PrepareResult]) -> _Outcome:
        try:
            value: PrepareResult | Exception = await work
        except Exception as exc:
            value = exc
        return _Outcome(value, self._clock.now())

    # step 2

    async def _read_and_plan(self, ref: ClaimRef, deadline: float) -> _Planned | _Outcome:
        try:
            claim = await read_claim(
                self._kube.resource(RESOURCE_CLAIMS),
                ref,
                deadline=deadline,
                limits=self._limits,
                clock=self._clock,
                rng=self._rng,
            )
            decide.check_claim(ref, claim)
            plan = decide.plan(
                claim,
                node=self._node_view(),
                published=self._published(),
                node_name=self._node,
                driver_name=self._driver,
            )
            return _Planned(plan, containers.consumer_pods(claim), metadata.pod_claim_name(claim))
        except Exception as exc:
            return _Outcome(exc, self._clock.now())

    async def _with_specs(
        self,
        read: Sequence[tuple[ClaimRef, _Planned]],
        deadline: float,
        outcomes: dict[str, _Outcome],
    ) -> list[tuple[ClaimRef, _Specced]]:
        """The CDI spec of each claim read, its environment describing the Neuron devices of
        the containers that use it (prepare/containers.py); the consumer pods are read only
        when a container could get more or fewer devices than the claim holds. A claim no
        environment can be right for fails (``outcomes``), alone."""
        out: list[tuple[ClaimRef, _Specced]] = []
        # Each claim's place in its workload, asked once: its environment and its spec are
        # built from the same answer.
        peers: dict[str, UltraServerPeers | None] = {}
        namespaces = dict.fromkeys(item.plan.namespace for _, item in read)
        for ns in namespaces:
            items = []
            for ref, item in read:
                if item.plan.namespace != ns:
                    continue
                # The workload's record first: refused (retryably, while the controller
                # completes it) before any environment is computed from it.
                try:
                    peers[item.plan.claim_uid] = self._peers(item.plan)
                except PrepareFailure as exc:
                    outcomes[ref.uid] = _Outcome(exc, self._clock.now())
                    continue
                items.append((ref, item))
            # Admin-access claims carry no environment, and add none to their containers'.
            plans = [item.plan for _, item in items if not item.plan.admin_access]
            batch = {item.plan.claim_uid for _, item in items}
            entries = [
                e
                for e in self._state.checkpoint.claims.values()
                if e.namespace == ns and e.uid not in batch and e.device_indices
            ]
            pods: list[dict[str, Any]] = []
            if plans and containers.needs_pods(plans, len(entries)):
                try:
                    pods = await self._read_pods(ns, items, deadline)
                except PrepareFailure as exc:
                    for ref, _ in items:
                        outcomes[ref.uid] = _Outcome(exc, self._clock.now())
                    continue
            decided = containers.env_indices(
                plans,
                entries,
                pods,
                lambda plan, indices: self._env_of(plan, indices, peers[plan.claim_uid]),
            )
            for ref, item in items:
                indices = decided.get(ref.uid, item.plan.device_indices)
                try:
                    if isinstance(indices, str):
                        raise PrepareFailure(
                            f"ResourceClaim {item.plan.key}: {indices}",
                            reason="ContainerDevices",
                            permanent=True,
                            event=True,
                        )
                    content = self._content(item, indices, peers[item.plan.claim_uid])
                except PrepareFailure as exc:
                    outcomes[ref.uid] = _Outcome(exc, self._clock.now())
                    continue
                out.append((ref, _Specced(item.plan, content)))
        return out

    async def _read_pods(
        self, namespace: str, items: Sequence[tuple[ClaimRef, _Planned]], deadline: float
    ) -> list[dict[str, Any]]:
        """The claims' consumer pods as they are now (one that is gone uses nothing)."""
        wanted = dict.fromkeys(c for _, item in items for c in item.consumers)
        pods = await asyncio.gather(
            *(
                read_object(
                    self._kube.resource(PODS), "Pod", name, namespace,
                    deadline=deadline, limits=self._limits, clock=self._clock, rng=self._rng,
                    missing_ok=True,
                )
                for name, _ in wanted
            )
        )  # fmt: skip
        return [
            pod
            for pod, (_, uid) in zip(pods, wanted, strict=True)
            if pod is not None and (pod.get("metadata") or {}).get("uid") == uid
        ]

    def _peers(self, plan: ClaimPlan) -> UltraServerPeers | None:
        """This node's place in the claim's workload (the topology provider's answer); a
        refusal as the kubelet and the user should see it."""
        try:
            return self._topology(plan.workload_id)
        except ReservationError as exc:
            raise decide.reservation_failure(plan, str(exc), retryable=exc.retryable) from None

    def _env_of(
        self, plan: ClaimPlan, indices: tuple[int, ...], topology: UltraServerPeers | None
    ) -> Mapping[str, str]:
        try:
            return claim_env(
                replace(plan, device_indices=indices), self._node_view(), topology=topology
            )
        except CdiError as exc:
            raise ValueError(str(exc)) from None

    def _content(
        self, item: _Planned, env_indices: Sequence[int], topology: UltraServerPeers | None
    ) -> ClaimContent:
        """The claim's CDI spec and, with device metadata on, its metadata documents."""
        plan = item.plan
        try:
            return build(
                plan,
                self._node_view(),
                cdi_kind=self._cdi_kind,
                topology=topology,
                env_indices=None if tuple(env_indices) == plan.device_indices else env_indices,
                published=self._published() if self._device_metadata else None,
                driver=self._driver,
                pool=self._node,
                metadata_root=self._metadata_root,
                pod_claim_name=item.pod_claim_name,
            )
        except (CdiError, ValueError) as exc:
            # plan_claim should have refused whatever cannot be expressed; say so plainly.
            raise PrepareFailure(
                f"ResourceClaim {plan.key}: cannot build its CDI spec: {exc}",
                reason="InvalidClaim",
                permanent=True,
                event=True,
            ) from None

    async def _released_holders(
        self, ready: Sequence[tuple[ClaimRef, _Specced]], deadline: float
    ) -> frozenset[str]:
        wanted = [(ref.uid, item.plan) for ref, item in ready]
        return await holders.released_holders(
            self._state.checkpoint,
            wanted,
            lambda entry: read_object(
                self._kube.resource(RESOURCE_CLAIMS), "ResourceClaim", entry.name,
                entry.namespace, deadline=deadline, limits=self._limits,
                clock=self._clock, rng=self._rng, missing_ok=True,
            ),
        )  # fmt: skip

    # step 3

    async def _prepare_planned(
        self, ready: Sequence[tuple[ClaimRef, _Specced]], released: frozenset[str] = frozenset()
    ) -> dict[str, _Outcome]:
        """Step 3 (node lock held, checkpoint fresh): decide every claim of the batch against
        the checkpoint and the claims accepted before it in the batch (batch order wins a
        device two of them want), then write the accepted claims' CDI specs and record them
        with one checkpoint write (:meth:`_write_prepared`, one thread call).

        Nothing else touching the checkpoint or the CDI directory runs meanwhile: every such
        section of this process and of the other instance holds the node lock.
        """
        outcomes: dict[str, _Outcome] = {}
        current = self._state.checkpoint
        # Minus the released holders, plus the entries accepted so far (conflict checks).
        pending = current.without_claims(released)
        accepted: list[ckpt.ClaimEntry] = []
        for ref, item in ready:
            if ref.uid in outcomes or any(e.uid == ref.uid for e in accepted):
                continue  # the same claim twice in one call: answered once
            done = current.claims.get(ref.uid)
            if done is not None:
                # Prepared by another call, or the other instance, while we were reading it.
                outcomes[ref.uid] = await self._settle(self._already_prepared(done))
                continue
            # Device conflicts; a core share gets its cores (prepare/cores.py).
            entry = cores.admit(
                pending,
                ref,
                item.plan,
                item.content,
                pool=self._node,
                cdi_kind=self._cdi_kind,
                prepared_at=self._clock.wall().strftime("%Y-%m-%dT%H:%M:%SZ"),
            )
            if isinstance(entry, PrepareFailure):
                outcomes[ref.uid] = _Outcome(entry, self._clock.now())
                continue
            pending = pending.with_claim(entry)
            accepted.append(entry)
        if not accepted:
            return outcomes
        failures = await self._state.commit(
            lambda checkpoint: self._write_prepared(checkpoint, accepted, released)
        )
        now = self._clock.now()
        for entry in accepted:
            failed = failures.get(entry.uid)
            if failed is not None:
                outcomes[entry.uid] = _Outcome(failed, now)
                continue
            log.info(
                "prepared ResourceClaim %s (uid %s): %s",
                entry.key,
                entry.uid,
                ", ".join(d.device_name for d in entry.devices),
            )
            outcomes[entry.uid] = _Outcome(decide.answer(entry), now)
        return outcomes

    def _write_prepared(
        self,
        current: ckpt.Checkpoint,
        entries: Sequence[ckpt.ClaimEntry],
        released: frozenset[str] = frozenset(),
    ) -> tuple[ckpt.Checkpoint, bytes | None, dict[str, PrepareFailure]]:
        return record.write_prepared(
            current,
            entries,
            released,
            checkpoint_path=self._ckpt_path,
            write_files=self._files.write,
            remove_files=self._files.remove,
        )

    # the answers

    async def _answer_all(
        self, claims: Sequence[ClaimRef], outcomes: Mapping[str, _Outcome], started: float
    ) -> dict[str, PrepareResult]:
        """Every claim's answer, in call order; then the Warning Events on the claims whose
        failure their users can act on (API calls: after every node-locked step)."""
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


def _implements_backend(preparer: Preparer) -> DriverBackend:
    # Static check only: mypy verifies that Preparer satisfies the kubelet layer's protocol.
    return preparer
