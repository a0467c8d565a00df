"""The node's record of prepared claims (checkpoint + CDI directory), shared by plugin instances.

Several plugin instances (kubelet 1.33+): during a rolling update the old and
the new pod serve the kubelet side by side, and it may send any call to either. They share
the checkpoint and the CDI directory, so everything that reads or changes them runs under the
node lock (:mod:`.nodelock`, ``serialize.lock`` next to the checkpoint), and each holder first
re-reads the checkpoint if the other instance changed it (:meth:`NodeState.exclusive`).
Changes are made by one worker-thread call per batch (:meth:`NodeState.commit`): its CDI
spec writes or removals and at most one checkpoint save.

API calls (Events) never run under the lock: Node Warning Events noted under it are sent
after it (:meth:`NodeState.emit_deferred_events`). At start-up, :meth:`NodeState.recover`
makes the disk agree with the checkpoint (missing files restored, orphans swept).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, Final, TypeVar

from neuron_dra.common.events import EventRecorder, EventType, ObjectRef
from neuron_dra.common.k8s.client import NODES, KubeClient
from neuron_dra.common.k8s.clock import Clock
from neuron_dra.common.k8s.errors import KubeError
from neuron_dra.nodeplugin.prepare import checkpoint as ckpt
from neuron_dra.nodeplugin.prepare.cdi import spec_file_name
from neuron_dra.nodeplugin.prepare.claimfiles import ClaimFiles
from neuron_dra.nodeplugin.prepare.nodelock import NodeLock, lock_path
from prometheus_client import Gauge

log = logging.getLogger(__name__)

REASON_CHECKPOINT_RESET: Final = "CheckpointReset"
REASON_CDI_RESTORE_FAILED: Final = "CDISpecRestoreFailed"

_T = TypeVar("_T")

#: A batch's file work, run in a worker thread on the current checkpoint: returns the
#: checkpoint it saved with the bytes written (None: saved nothing) and its result.
Work = Callable[[ckpt.Checkpoint], tuple[ckpt.Checkpoint, bytes | None, _T]]


def _consume_outcome(task: asyncio.Future[Any]) -> None:
    # The caller may have been cancelled and never look; drain() still does.
    if not task.cancelled():
        task.exception()


class NodeState:
    """The checkpoint as the file holds it, and the node lock under which it changes."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        node_name: str,
        files: ClaimFiles,
        checkpoint_path: Path,
        boot_id_path: Path,
        start_lock_timeout: float,
        clock: Clock,
        events: EventRecorder,
        prepared_claims: Gauge,
    ) -> None:
        self._kube = kube
        self._node = node_name
        #: The claims' CDI specs and metadata files.
        self.files = files
        self.checkpoint_path = checkpoint_path
        self._boot_id_path = boot_id_path
        self._start_lock_timeout = start_lock_timeout
        self._clock = clock
        self._events = events
        self._prepared_claims = prepared_claims

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
        """The current state (read-only snapshot)."""
        return self._checkpoint

    # -- the node lock ----------------------------------------------------------------------

    async def exclusive(
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
        raw = ckpt.read_raw(self.checkpoint_path)
        if self._loaded and not force and raw == self._ckpt_raw:
            return
        result = await asyncio.to_thread(
            ckpt.load_raw, self.checkpoint_path, raw, boot_id=self._boot_id, now=self._clock.wall()
        )
        if self._loaded and not force:
            log.info(
                "checkpoint %s was changed by another plugin instance; reloaded it "
                "(%d prepared claims)",
                self.checkpoint_path,
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
        self._prepared_claims.set(len(result.checkpoint.claims))
        if result.dirty:
            self._ckpt_raw = await asyncio.to_thread(
                ckpt.save, self.checkpoint_path, result.checkpoint
            )

    def records_none_of(self, uids: Iterable[str]) -> bool:
        """Whether the checkpoint file, as it is now, records none of ``uids``: then a caller
        has nothing to answer from it and can skip a node-lock round trip.

        No lock is needed to know that: saves replace the file atomically, so one read gives
        one complete version. If its bytes are those we last read or wrote, our in-memory
        checkpoint is that version, and a claim missing from it was not prepared at the time
        of the read (a locked section re-checks anyway). Any doubt (file changed, claim
        known, unreadable file) answers False, and the locked path also reloads the file.
        """
        if not self._loaded or any(uid in self._checkpoint.claims for uid in uids):
            return False
        try:
            raw = ckpt.read_raw(self.checkpoint_path)
        except OSError:
            return False
        return raw == self._ckpt_raw

    async def commit(self, work: Work[_T]) -> _T:
        """Run ``work`` on the current checkpoint in a worker thread, then publish in memory
        the checkpoint it saved (``work`` returns it with the bytes written, or None for the
        bytes if it saved nothing) and hand back its result.

        ``work`` does all of a batch's file work in one thread call: CDI spec writes or
        removals and at most one checkpoint save. Only bodies run by :meth:`exclusive` call
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
            self._prepared_claims.set(len(new.claims))
        return result

    async def drain(self) -> None:
        """Wait for node-locked work (checkpoint writes included) whose callers were
        cancelled (call before exiting)."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    # -- Node Events ------------------------------------------------------------------------

    async def emit_deferred_events(self) -> None:
        """Node Events noted under the node lock, sent after it (no API calls under it)."""
        pending, self._deferred_events = self._deferred_events, []
        for reason, note in pending:
            await self._node_event(EventType.WARNING, reason, note)

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
        * recreate missing files (CDI specs, metadata files) of claims still prepared:
          ``/var/run/cdi`` may have been emptied while the containers using them still need
          restarts to find their devices;
        * delete our files that no entry references: left by a crash between the files'
          write and the checkpoint write, or by claims dropped after a reboot;
        * delete leftover temp files of interrupted atomic writes.

        The node lock matters most here: during a rolling update the other instance may have
        just written a spec for a claim it is about to record. Under the lock its spec write
        and its checkpoint write are never split, and the sweep compares against the
        checkpoint as re-read under the same lock, so it only removes true orphans.
        """
        self._boot_id = await asyncio.to_thread(ckpt.read_boot_id, self._boot_id_path)
        timeout = self._start_lock_timeout if lock_timeout is None else lock_timeout
        await self.exclusive(self._recover_locked, within=timeout, reload=True)
        await self.emit_deferred_events()

    async def _recover_locked(self) -> None:
        files = self.files
        entries = sorted(self._checkpoint.claims.items())
        incomplete = await asyncio.to_thread(
            lambda: [(uid, e) for uid, e in entries if not files.complete(e)]
        )
        for uid, entry in incomplete:
            try:
                await asyncio.to_thread(files.write, entry)
            except OSError as exc:
                # Keep going: other claims' specs and the sweep still matter. The claim stays
                # recorded; a repeated Prepare tries the write again.
                msg = f"cannot restore the files of ResourceClaim {entry.key} (uid {uid}): {exc}"
                log.error("%s", msg)
                self._deferred_events.append((REASON_CDI_RESTORE_FAILED, msg))
            else:
                log.info("restored missing files of ResourceClaim %s (uid %s)", entry.key, uid)
        present = await asyncio.to_thread(files.present)
        for uid in sorted(present - set(self._checkpoint.claims)):
            log.info("removing orphan CDI spec and metadata of claim uid %s (no entry)", uid)
            await asyncio.to_thread(files.remove, uid)
        await asyncio.to_thread(self._sweep_temp_files)

    def _sweep_temp_files(self) -> None:
        self.files.sweep_temp_files()
        spec_prefix = "." + spec_file_name("", cdi_kind=self.files.cdi_kind).removesuffix(".json")
        for directory, prefix in (
            (self.files.cdi_root, spec_prefix),
            (self.checkpoint_path.parent, f".{self.checkpoint_path.name}."),
        ):
            try:
                names = os.listdir(directory)
            except FileNotFoundError:
                continue
            for name in names:
                if name.startswith(prefix) and name.endswith(".tmp"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(directory / name)
