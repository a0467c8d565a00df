"""Prepare's step 3 on disk (in a worker thread, the node lock held): the accepted claims'
files (CDI spec and metadata files, claimfiles.py) written, released holders' files
removed, and the checkpoint saved once for the whole batch (group commit)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from neuron_dra.nodeplugin.prepare import checkpoint as ckpt
from neuron_dra.nodeplugin.prepare import decide
from neuron_dra.nodeplugin.prepare.budget import PrepareFailure

log = logging.getLogger(__name__)


def write_prepared(
    current: ckpt.Checkpoint,
    entries: Sequence[ckpt.ClaimEntry],
    released: frozenset[str],
    *,
    checkpoint_path: Path,
    write_files: Callable[[ckpt.ClaimEntry], None],
    remove_files: Callable[[str], None],
) -> tuple[ckpt.Checkpoint, bytes | None, dict[str, PrepareFailure]]:
    """Write the files of ``entries``, then record the claims whose files are written in
    one checkpoint save, with the ``released`` holders' entries dropped (their files removed
    first). A claim whose files cannot be written fails alone. If the save fails, none of
    them is prepared: each gets the error and the files written here are taken back (no
    orphans).

    Files first, entries second: a crash in between leaves orphan files that the start-up
    sweep deletes, never an entry whose files were never written.
    """
    failures: dict[str, PrepareFailure] = {}
    new = _release(current, released, remove_files)
    for entry in entries:
        # Checked again at commit time: the checkpoint is the one place where two claims
        # must never both land, whatever the checks before decided.
        refused = decide.conflict(new, entry.uid, entry.device_indices, entry.share)
        if refused is not None:
            failures[entry.uid] = refused
            continue
        try:
            write_files(entry)
        except OSError as exc:
            failures[entry.uid] = PrepareFailure(
                f"cannot write CDI spec or device metadata for ResourceClaim {entry.key}: {exc}",
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
        # Not recorded means not prepared: take the files back so no orphan is left.
        for entry in entries:
            if entry.uid not in failures:
                with contextlib.suppress(OSError):
                    remove_files(entry.uid)
                failures[entry.uid] = PrepareFailure(
                    f"cannot record ResourceClaim {entry.key} in the checkpoint: {exc}",
                    reason="CheckpointWriteFailed",
                    permanent=False,
                )
        return current, None, failures
    return new, raw, failures


def _release(
    current: ckpt.Checkpoint, released: frozenset[str], remove_files: Callable[[str], None]
) -> ckpt.Checkpoint:
    """``current`` without the released holders whose files could be removed. As Unprepare
    does it: files first, entry second (in the save that follows). Files that cannot be
    removed keep their entry, and the claims wanting its devices are refused (retryably) by
    the conflict check."""
    new = current
    for uid in sorted(released & current.claims.keys()):
        old = current.claims[uid]
        try:
            remove_files(uid)
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
