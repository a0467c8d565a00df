"""Prepare's step 3 on disk (in a worker thread, the node lock held): the accepted claims'
CDI specs written, released holders' specs removed, and the checkpoint saved once for the
whole batch (group commit)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from neuron_dra.nodeplugin import checkpoint as ckpt
from neuron_dra.nodeplugin.prepare import decide
from neuron_dra.nodeplugin.prepare.budget import PrepareFailure

log = logging.getLogger(__name__)


def write_prepared(
    current: ckpt.Checkpoint,
    entries: Sequence[ckpt.ClaimEntry],
    released: frozenset[str],
    *,
    checkpoint_path: Path,
    write_spec: Callable[[Mapping[str, Any], str], None],
    remove_spec: Callable[[str], None],
) -> tuple[ckpt.Checkpoint, bytes | None, dict[str, PrepareFailure]]:
    """Write the CDI specs of ``entries``, then record the claims whose spec is written in
    one checkpoint save, with the ``released`` holders' entries dropped (their specs removed
    first). A claim whose spec cannot be written fails alone. If the save fails, none of
    them is prepared: each gets the error and the specs written here are taken back (no
    orphans).

    Spec first, entries second: a crash in between leaves orphan specs that the start-up
    sweep deletes, never an entry whose spec was never written.
    """
    failures: dict[str, PrepareFailure] = {}
    new = _release(current, released, remove_spec)
    for entry in entries:
        # Checked again at commit time: the checkpoint is the one place where two claims
        # must never both land, whatever the checks before decided.
        refused = decide.conflict(new, entry.uid, entry.device_indices)
        if refused is not None:
            failures[entry.uid] = refused
            continue
        try:
            write_spec(entry.cdi_spec, entry.uid)
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
        raw = ckpt.save(checkpoint_path, new)
    except OSError as exc:
        # Not recorded means not prepared: take the specs back so no orphan is left.
        for entry in entries:
            if entry.uid not in failures:
                with contextlib.suppress(OSError):
                    remove_spec(entry.uid)
                failures[entry.uid] = PrepareFailure(
                    f"cannot record ResourceClaim {entry.key} in the checkpoint: {exc}",
                    reason="CheckpointWriteFailed",
                    permanent=False,
                )
        return current, None, failures
    return new, raw, failures


def _release(
    current: ckpt.Checkpoint, released: frozenset[str], remove_spec: Callable[[str], None]
) -> ckpt.Checkpoint:
    """``current`` without the released holders whose specs could be removed. As Unprepare
    does it: spec first, entry second (in the save that follows). A spec that cannot be
    removed keeps its entry, and the claims wanting its devices are refused (retryably) by
    the conflict check."""
    new = current
    for uid in sorted(released & current.claims.keys()):
        old = current.claims[uid]
        try:
            remove_spec(uid)
        except OSError as exc:
            log.warning("cannot release ResourceClaim %s (uid %s): %s", old.key, uid, exc)
            continue
        new = new.without_claim(uid)
        log.info(
            "released ResourceClaim %s (uid %s): deallocated or deleted, its devices "
            "allocated again before the kubelet unprepared it",
            old.key,
            uid,
        )
    return new
