"""Which cores of a shared device a core claim gets (core sharing: ``shares.py`` reads what a
claim holds, ``publish/coresharing.py`` how devices are offered; pure).

The scheduler counts a shared device's ``logicalCores`` but does not say which cores a share
is; the runtime needs them as one contiguous range (``NEURON_RT_VISIBLE_CORES``, global ids:
device index x logical cores per device + local id). So Prepare picks them, in step 3 under
the node lock, from the shares the checkpoint records on the device, and records its choice
there (``ClaimEntry.share``):

- buddy placement: a share's size is a power of two (the slice's request policy rounds every
  request up to one), and it goes on a free block aligned to its size, inside the smallest
  free aligned block that holds it (best fit), lowest first: big blocks stay whole for big
  shares as long as possible;
- a device held whole (by a claim without a share, ``neuronnode`` too) has no cores to share,
  and a device with shares is not given whole: :func:`~.checkpoint.find_conflict`;
- enough free cores but no aligned block of them (shares ended in between) is the one case the
  scheduler's count cannot see: the claim is refused retryably, saying the device's cores are
  fragmented, and waits until a share of the device ends.

The files of a share, built before the node lock like every claim's, get the chosen cores
here: ``NEURON_RT_VISIBLE_CORES`` in the CDI spec (:func:`with_visible_cores`) and the
device's ``visibleCores`` and ``logicalCoreCount`` in its device metadata documents
(:func:`with_share_metadata`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from neuron_dra.common.constants import (
    ATTR_LOGICAL_CORE_COUNT,
    METADATA_ATTR_VISIBLE_CORES,
    device_name,
)
from neuron_dra.nodeplugin.kubeletapi import ClaimRef
from neuron_dra.nodeplugin.prepare import checkpoint as ckpt
from neuron_dra.nodeplugin.prepare import decide
from neuron_dra.nodeplugin.prepare.budget import PrepareFailure
from neuron_dra.nodeplugin.prepare.cdi import ENV_VISIBLE_CORES
from neuron_dra.nodeplugin.prepare.claimfiles import ClaimContent
from neuron_dra.nodeplugin.prepare.claims import ClaimPlan
from neuron_dra.nodeplugin.prepare.shares import ShareRequest


def _alignment(size: int) -> int:
    # Powers of two align to themselves; any other size (not from our policy) anywhere.
    return size if size & (size - 1) == 0 else 1


def _free(used: set[int], first: int, size: int) -> bool:
    return not any(c in used for c in range(first, first + size))


def _enclosing_free(used: set[int], first: int, size: int, total: int) -> int:
    """The size of the largest free aligned block around ``first`` .. ``first + size - 1``."""
    while size * 2 <= total and _free(used, first // (size * 2) * size * 2, size * 2):
        size *= 2
    return size


def pick_cores(used: set[int], size: int, total: int) -> int | None:
    """The first local core of a free aligned block of ``size`` of ``total`` cores (``used``
    taken), by buddy best fit; None when there is none."""
    align = _alignment(size)
    candidates = [first for first in range(0, total - size + 1, align) if _free(used, first, size)]
    if not candidates:
        return None
    return min(candidates, key=lambda first: (_enclosing_free(used, first, size, total), first))


def _on_device(checkpoint: ckpt.Checkpoint, uid: str, device: int) -> list[ckpt.ClaimEntry]:
    """The claims other than ``uid`` holding device ``device``, whole or some of its cores."""
    return ckpt.holders(checkpoint, uid, (device,))


def _local(share: ckpt.CoreShare) -> range:
    return range(share.first, share.first + share.count)


def _cores(entries: Sequence[ckpt.ClaimEntry]) -> str:
    return "; ".join(
        f"{e.key}: cores {e.share.first}-{e.share.first + e.share.count - 1}"
        if e.share is not None and e.share.count > 1
        else f"{e.key}: core {e.share.first}"
        if e.share is not None
        else f"{e.key}: the whole device"
        for e in sorted(entries, key=lambda e: e.share.first if e.share else -1)
    )


def place(
    checkpoint: ckpt.Checkpoint, uid: str, share: ShareRequest
) -> ckpt.CoreShare | PrepareFailure:
    """The cores claim ``uid`` gets for ``share``, given the claims ``checkpoint`` records on
    the device; or why not now (retryable: the claims holding the device end)."""
    holders = _on_device(checkpoint, uid, share.device)
    whole = [e for e in holders if e.share is None]
    if whole:
        return PrepareFailure(
            decide.conflict_message(share.device, whole[0]),
            reason="DeviceInUse",
            permanent=False,
            event=True,
        )
    used = {c for e in holders if e.share is not None for c in _local(e.share)}
    total = share.device_cores
    first = pick_cores(used, share.cores, total)
    if first is not None:
        return ckpt.CoreShare(share.device, first, share.cores, total)
    free = total - len(used)
    name = device_name(share.device)
    if free >= share.cores:
        return PrepareFailure(
            f"{name} has {free} free logical cores but not {share.cores} adjacent ones on an "
            f"aligned block ({_cores(holders)}): the device's cores are fragmented, and the "
            "claim waits until a share of the device ends",
            reason="CoresFragmented",
            permanent=False,
            event=True,
        )
    return PrepareFailure(
        f"{name} has {free} free logical cores, fewer than the {share.cores} the claim was "
        f"allocated ({_cores(holders)}); the claim waits until a share of the device ends",
        reason="DeviceInUse",
        permanent=False,
        event=True,
    )


def visible_cores(share: ckpt.CoreShare) -> str:
    """``NEURON_RT_VISIBLE_CORES`` for a share: its global logical core ids as one range."""
    first, last = share.global_range
    return str(first) if first == last else f"{first}-{last}"


def with_visible_cores(spec: Mapping[str, Any], share: ckpt.CoreShare) -> dict[str, Any]:
    """CDI spec ``spec`` with the share's cores as ``NEURON_RT_VISIBLE_CORES``."""
    edits = dict(spec.get("containerEdits") or {})
    env = [str(e) for e in edits.get("env") or [] if not str(e).startswith(f"{ENV_VISIBLE_CORES}=")]
    edits["env"] = [f"{ENV_VISIBLE_CORES}={visible_cores(share)}", *env]
    return {**spec, "containerEdits": edits}


def with_share_metadata(
    metadata: Mapping[str, Mapping[str, Any]], share: ckpt.CoreShare
) -> dict[str, Mapping[str, Any]]:
    """Device metadata documents (per request, :mod:`.metadata`) with the shared device's
    ``visibleCores`` and ``logicalCoreCount`` those of the share (the names in any domain)."""
    name = device_name(share.device)
    values = {
        METADATA_ATTR_VISIBLE_CORES: {"string": visible_cores(share)},
        ATTR_LOGICAL_CORE_COUNT: {"int": share.count},
    }
    out: dict[str, Mapping[str, Any]] = {}
    for request, doc in metadata.items():
        requests = []
        for req in doc.get("requests") or []:
            devices = []
            for dev in req.get("devices") or []:
                attrs = dev.get("attributes")
                if dev.get("name") == name and isinstance(attrs, Mapping):
                    attrs = {k: values.get(k.rsplit("/", 1)[-1], v) for k, v in attrs.items()}
                    dev = {**dev, "attributes": attrs}
                devices.append(dev)
            requests.append({**req, "devices": devices})
        out[request] = {**doc, "requests": requests}
    return out


def blockers(checkpoint: ckpt.Checkpoint, uid: str, plan: ClaimPlan) -> list[ckpt.ClaimEntry]:
    """The prepared claims that stand in the way of claim ``uid`` (``plan``): the holders of
    its devices, or for a share the device's whole holder, or its shares when they leave it
    no place. Prepare reads them to release those that gave their devices back."""
    if plan.share is None:
        return ckpt.holders(checkpoint, uid, plan.held_indices)
    holders = _on_device(checkpoint, uid, plan.share.device)
    if any(e.share is None for e in holders):
        return [e for e in holders if e.share is None]
    placed = place(checkpoint, uid, plan.share)
    return [] if isinstance(placed, ckpt.CoreShare) else holders


def admit(
    pending: ckpt.Checkpoint,
    ref: ClaimRef,
    plan: ClaimPlan,
    content: ClaimContent,
    *,
    pool: str,
    cdi_kind: str,
    prepared_at: str,
) -> ckpt.ClaimEntry | PrepareFailure:
    """Claim ``ref`` (``plan``, its files' ``content``) as it is recorded once prepared,
    given the claims ``pending`` holds; or why it cannot be now. A share gets its cores
    here."""
    share = None
    if plan.share is not None:
        placed = place(pending, ref.uid, plan.share)
        if isinstance(placed, PrepareFailure):
            return placed
        share = placed
        content = ClaimContent(
            with_visible_cores(content.spec, share),
            with_share_metadata(content.metadata, share),
        )
    refused = decide.conflict(pending, ref.uid, plan.held_indices, share)
    if refused is not None:
        return refused
    return decide.new_entry(
        ref, plan, content, pool=pool, cdi_kind=cdi_kind, prepared_at=prepared_at, share=share
    )
