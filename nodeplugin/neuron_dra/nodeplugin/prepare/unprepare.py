"""NodeUnprepareResources: remove the claims' files (CDI spec, then metadata files), then
their checkpoint entries.

Unprepare may name claims we never saw or that no longer exist in the API server
(docs/architecture.md, "What the kubelet expects"), so it works from local state only: the
whole batch runs under the node lock (local file work only, no API call) and is idempotent.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from neuron_dra.nodeplugin.kubeletapi import ClaimRef, UnprepareResult
from neuron_dra.nodeplugin.prepare import checkpoint as ckpt
from neuron_dra.nodeplugin.prepare.budget import state_failure
from neuron_dra.nodeplugin.prepare.nodelock import NodeLockTimeout
from neuron_dra.nodeplugin.prepare.nodestate import NodeState

log = logging.getLogger(__name__)


async def unprepare(
    state: NodeState, claims: Sequence[ClaimRef], *, lock_timeout: float
) -> Mapping[str, UnprepareResult]:
    """All of the batch under the node lock; if it cannot be had (or the state files cannot
    be read), every claim gets a retryable error and the kubelet calls again."""
    try:
        await state.start(lock_timeout=lock_timeout)
        results = await state.exclusive(
            lambda: _unprepare_batch(state, claims), within=lock_timeout
        )
    except (NodeLockTimeout, OSError) as exc:
        failure = state_failure(exc, "unprepare")
        log.warning("unprepare of %d claim(s) postponed: %s", len(claims), failure.message)
        results = {ref.uid: UnprepareResult(error=failure.message) for ref in claims}
    await state.emit_deferred_events()
    return results


async def _unprepare_batch(
    state: NodeState, claims: Sequence[ClaimRef]
) -> dict[str, UnprepareResult]:
    known = {ref.uid: state.checkpoint.claims.get(ref.uid) for ref in claims}
    errors = await state.commit(lambda current: _write_unprepared(state, current, claims))
    results: dict[str, UnprepareResult] = {}
    for ref in claims:
        error = errors.get(ref.uid)
        if error is not None:
            log.error("unprepare of ResourceClaim %s/%s failed: %s", ref.namespace, ref.name, error)
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
    state: NodeState, current: ckpt.Checkpoint, claims: Sequence[ClaimRef]
) -> tuple[ckpt.Checkpoint, bytes | None, dict[str, OSError]]:
    """In a worker thread: remove the claims' files, then their entries with one
    checkpoint save. Files first, entry second: a crash in between leaves an entry whose
    files are gone, which the kubelet's Unprepare retry then removes. Also done for unknown
    claims: orphan files from a crash mid-Prepare are cleaned up here too. A claim whose
    files cannot be removed keeps its entry and fails alone."""
    errors: dict[str, OSError] = {}
    gone: list[str] = []
    for ref in claims:
        try:
            state.files.remove(ref.uid)
        except OSError as exc:
            errors[ref.uid] = exc
            continue
        if ref.uid in current.claims:
            gone.append(ref.uid)
    if not gone:
        return current, None, errors
    new = current.without_claims(gone)
    try:
        raw = ckpt.save(state.checkpoint_path, new)
    except OSError as exc:
        # The files are gone, the entries stay: the kubelet's retry removes them.
        errors.update((uid, exc) for uid in gone)
        return current, None, errors
    return new, raw, errors
