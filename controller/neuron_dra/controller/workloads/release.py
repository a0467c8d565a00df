"""The release step of a workload being deleted.

``Deallocating`` → evict its pods and claims → mark its entries ``Releasing`` (the node
plugins untag their slices for releasing entries) → wait for the tags to clear (bounded) →
remove the entries → delete the template, evict once more → drop the finalizer. So a node is
never handed to another workload while its slice still advertises the old workload id, and
no pod of a deleted workload keeps running on nodes another workload is given.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from neuron_dra.common.constants import FINALIZER_WORKLOAD
from neuron_dra.common.events import EventType
from neuron_dra.common.k8s.writes import has_finalizer

from .fleet import Fleet
from .generated import delete_claims, delete_template
from .health import carries_tag, node_ready
from .model import (
    COND_ALLOCATED,
    COND_READY,
    DEALLOCATING,
    Cond,
    Held,
    JsonDict,
    ReconcileResult,
    Workload,
)
from .status import StatusUpdate
from .tools import Tools

log = logging.getLogger(__name__)


async def deallocate(t: Tools, obj: JsonDict, wl: Workload, held: list[Held]) -> ReconcileResult:
    if not has_finalizer(obj, FINALIZER_WORKLOAD):
        # Not ours to hold up (the finalizer was removed by hand); still free the nodes.
        await t.write.remove_entries(held)
        return ReconcileResult(None)
    deleting = "workload is being deleted"
    obj = await t.write.set_status(
        wl,
        obj,
        StatusUpdate(
            DEALLOCATING,
            wl.wid,
            (
                Cond(COND_ALLOCATED, False, "Deallocating", deleting),
                Cond(COND_READY, False, "Deallocating", deleting),
            ),
        ),
    )
    # The seed's cascade: deleting the workload removes its pods. Evict them (and delete
    # their claims) before the nodes are released, so no pod of a deleted workload keeps
    # running on nodes another workload is given.
    await delete_claims(t.ctx, wl.namespace, wl.wid, on_nodes=None)
    if held:
        await t.write.mark_releasing(held)
        waiting = waiting_for_tags(t.fleet, held)
        if waiting:
            started = t.releasing_since.setdefault(wl.key, t.ctx.clock.now())
            if t.ctx.clock.now() - started < t.timing.tag_clear_timeout:
                log.info("release of %s waits for tags to clear on %s", wl.key, waiting)
                return ReconcileResult(t.timing.tag_poll)
            await t.write.event(
                wl,
                EventType.WARNING,
                "TagsNotCleared",
                f"gave up waiting after {t.timing.tag_clear_timeout:.0f}s for the node plugins "
                f"to clear workloadId {wl.wid} on {', '.join(waiting)}; releasing anyway",
            )
        await t.write.remove_entries(held)
    t.releasing_since.pop(wl.key, None)
    await delete_template(t.ctx, obj)
    # Again after the template is gone: a workload controller may have recreated a pod
    # (and the claim controller its claim) from the template in the meantime.
    await delete_claims(t.ctx, wl.namespace, wl.wid, on_nodes=None)
    await t.write.event(wl, EventType.NORMAL, "Deallocated", f"released workloadId {wl.wid}")
    await t.write.remove_finalizer(wl)
    return ReconcileResult(None)


def waiting_for_tags(fleet: Fleet, held: Sequence[Held]) -> list[str]:
    """Nodes of ``held`` whose slices still carry the entry's workload id.

    Nodes that cannot answer are not waited for: no slice (node gone or plugin gone), or
    Node missing/NotReady (a dead plugin cannot clear anything; once back it republishes
    from the record, which by then no longer names the node)."""
    waiting = []
    for h in held:
        for n in h.nodes:
            slices = fleet.slices_of(n)
            if not slices or not node_ready(fleet.ctx.nodes.get(n)):
                continue
            if carries_tag(slices, h.workload_id):
                waiting.append(n)
    return sorted(set(waiting))
