"""Which claims prepared on this node gave back the devices a new claim was allocated.

The scheduler may give a device to a new claim as soon as the old claim is deallocated,
while the kubelet unprepares the old claim only when it cleans the old pod up, seconds
later. Rather than refuse the new claim until then, Prepare reads each holder: one the API
server shows deleted, recreated or deallocated (:func:`.decide.holder_released`) is
released in the same checkpoint write that records the new claim (:mod:`.record`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from neuron_dra.nodeplugin.prepare import checkpoint as ckpt
from neuron_dra.nodeplugin.prepare import cores, decide
from neuron_dra.nodeplugin.prepare.budget import PrepareFailure
from neuron_dra.nodeplugin.prepare.claims import ClaimPlan

#: GET of a holder claim: the object, None when it is gone; PrepareFailure when unreadable.
ReadClaim = Callable[[ckpt.ClaimEntry], Awaitable[Mapping[str, Any] | None]]


async def released_holders(
    checkpoint: ckpt.Checkpoint,
    wanted: Iterable[tuple[str, ClaimPlan]],
    read: ReadClaim,
) -> frozenset[str]:
    """The uids of the claims in ``checkpoint`` that stand in the way of the claims of the
    batch (claim uid, plan: :func:`.cores.blockers`) and have given their devices back. A
    holder that cannot be read now counts as holding: the new claim's refusal is retryable."""
    found = {e.uid: e for uid, plan in wanted for e in cores.blockers(checkpoint, uid, plan)}
    if not found:
        return frozenset()

    async def released(entry: ckpt.ClaimEntry) -> bool:
        try:
            claim = await read(entry)
        except PrepareFailure:
            return False
        return decide.holder_released(entry, claim)

    verdicts = await asyncio.gather(*(released(e) for e in found.values()))
    return frozenset(uid for uid, yes in zip(found, verdicts, strict=True) if yes)
