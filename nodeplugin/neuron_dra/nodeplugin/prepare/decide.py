"""Prepare's pure decisions: from the claim as read to its checkpoint entry and the answer.

No I/O here: the caller reads the claim, the node and what is published, and writes
what is decided. Every refusal is a :class:`~.budget.PrepareFailure` saying whether the
kubelet's retry can help.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from neuron_dra.common.constants import NODE_DEVICE_NAME, device_name
from neuron_dra.nodeplugin.kubeletapi import ClaimRef, PreparedDevice, PrepareResult
from neuron_dra.nodeplugin.prepare import checkpoint as ckpt
from neuron_dra.nodeplugin.prepare.budget import PrepareFailure
from neuron_dra.nodeplugin.prepare.cdi import cdi_device_ids
from neuron_dra.nodeplugin.prepare.claimfiles import ClaimContent
from neuron_dra.nodeplugin.prepare.claims import ClaimError, ClaimPlan, plan_claim
from neuron_dra.nodeplugin.prepare.node import PrepareNode


def check_claim(ref: ClaimRef, claim: Mapping[str, Any]) -> None:
    """That ``claim`` as read is the claim the kubelet means, and is allocated."""
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


def plan(
    claim: Mapping[str, Any],
    *,
    node: PrepareNode,
    published: Mapping[str, Mapping[str, Any]],
    node_name: str,
    driver_name: str,
) -> ClaimPlan:
    """What to prepare for a checked ``claim`` on this node (:func:`~.claims.plan_claim`)."""
    try:
        return plan_claim(
            claim,
            node=node,
            published=published,
            node_name=node_name,
            driver_name=driver_name,
        )
    except ClaimError as exc:
        raise PrepareFailure(
            exc.message,
            reason="InvalidClaim" if exc.permanent else "NotReady",
            permanent=exc.permanent,
            event=True,
        ) from None


def _base_request(name: str) -> str:
    # The kubelet matches containers' resources.claims[].request against base names; a
    # "req/sub" name would leave the container without its devices.
    return name.split("/", 1)[0]


def prepared_devices(plan: ClaimPlan, *, pool: str, cdi_kind: str) -> tuple[ckpt.DeviceRecord, ...]:
    """The kubelet's answer for a planned claim (pure)."""
    ids = cdi_device_ids(plan, cdi_kind=cdi_kind)
    share_ids = dict(plan.share_ids)
    out = []
    for (requests, device), cdi_id in zip(plan.devices, ids, strict=True):
        bases = tuple(dict.fromkeys(_base_request(r) for r in requests))
        out.append(ckpt.DeviceRecord(bases, pool, device, (cdi_id,), share_ids.get(device)))
    return tuple(out)


def new_entry(
    ref: ClaimRef,
    plan: ClaimPlan,
    content: ClaimContent,
    *,
    pool: str,
    cdi_kind: str,
    prepared_at: str,
    share: ckpt.CoreShare | None = None,
) -> ckpt.ClaimEntry:
    """The checkpoint entry recording ``plan`` as prepared with its files' ``content`` (and
    the cores ``share`` of a device it shares: prepare/cores.py)."""
    return ckpt.ClaimEntry(
        uid=ref.uid,
        namespace=plan.namespace,
        name=plan.name,
        devices=prepared_devices(plan, pool=pool, cdi_kind=cdi_kind),
        # What the claim holds: an admin-access claim holds nothing, so it neither blocks
        # nor is blocked by the claims using its devices.
        device_indices=plan.held_indices,
        cdi_spec=content.spec,
        prepared_at=prepared_at,
        metadata=content.metadata,
        share=share,
    )


def conflict_message(index: int, holder: ckpt.ClaimEntry) -> str:
    via = (
        f" (through {NODE_DEVICE_NAME})"
        if any(d.device_name == NODE_DEVICE_NAME for d in holder.devices)
        else ""
    )
    if holder.share is not None:
        return (
            f"device {device_name(index)} has cores prepared for ResourceClaim {holder.key} "
            f"(uid {holder.uid}); a device serves one claim whole, or claims on cores of "
            "their own, and the claim waits until the device's shares end"
        )
    return (
        f"device {device_name(index)} is already prepared for ResourceClaim {holder.key} "
        f"(uid {holder.uid}){via}; a Neuron device can serve one claim at a time"
    )


def conflict(
    checkpoint: ckpt.Checkpoint,
    uid: str,
    device_indices: Iterable[int],
    share: ckpt.CoreShare | None = None,
) -> PrepareFailure | None:
    """Why claim ``uid`` cannot have ``device_indices`` (of a shared device: the cores
    ``share``) now, if another claim holds one.

    Retryable: the holder's Unprepare frees the device, and the user can act on it (Event).
    """
    clash = ckpt.find_conflict(checkpoint, uid, device_indices, share)
    if clash is None:
        return None
    return PrepareFailure(
        conflict_message(*clash), reason="DeviceInUse", permanent=False, event=True
    )


def holder_released(entry: ckpt.ClaimEntry, claim: Mapping[str, Any] | None) -> bool:
    """Whether the prepared claim ``entry``, as the API server has it now (``claim``; None:
    gone), gave its devices back: deleted, recreated under its name, or deallocated.

    Then the scheduler may already have given its devices to another claim while the
    kubelet has not called Unprepare for it yet (it does so when it cleans the old pod up,
    which can come seconds after the new pod's Prepare). Its containers have all stopped:
    a claim is deallocated only once no pod that may run holds it (the resourceclaim
    controller's rule: the pod is gone from the API or terminal). So its devices can be
    released for the new claim instead of refusing it until that Unprepare comes.
    """
    if claim is None:
        return True
    if str((claim.get("metadata") or {}).get("uid") or "") != entry.uid:
        return True
    return not (claim.get("status") or {}).get("allocation")


def reservation_failure(plan: ClaimPlan, why: str, *, retryable: bool) -> PrepareFailure:
    """How a claim whose place in its workload cannot be told (``why``) fails: retryably,
    saying to wait, while the controller completes the record; for good when the tag is
    stale (the reservation provider says which)."""
    if retryable:
        return PrepareFailure(
            f"ResourceClaim {plan.key}: {why}; the controller completes the record "
            "shortly and the kubelet's next try prepares the claim: wait",
            reason="ReservationIncomplete",
            permanent=False,
            event=True,
        )
    return PrepareFailure(
        f"ResourceClaim {plan.key}: {why}; the controller moves the claim",
        reason="StaleReservation",
        permanent=True,
        event=True,
    )


def answer(entry: ckpt.ClaimEntry) -> PrepareResult:
    """The kubelet's answer for a prepared claim: the same for every repeat."""
    return PrepareResult(
        devices=tuple(
            PreparedDevice(
                d.request_names, d.pool_name, d.device_name, d.cdi_device_ids, d.share_id
            )
            for d in entry.devices
        )
    )
