"""Clean-up of what a workload left behind when it is gone: allocation entries that still
name it (its finalizer was removed by hand, or it was deleted while no controller ran) and
claims labelled with its workloadId that were made after its release."""

from __future__ import annotations

import logging

from neuron_dra.common.k8s.client import NEURON_ULTRASERVER_WORKLOADS
from neuron_dra.common.k8s.errors import NotFoundError
from neuron_dra.common.ultraserver import workload_id, workload_ref

from .entries import holdings
from .generated import delete_claims
from .model import meta_of
from .tools import Tools

log = logging.getLogger(__name__)


async def release_orphans(t: Tools, namespace: str, name: str) -> None:
    """Entries naming a workload that no longer exists. The cache may simply not have seen
    a new workload yet, so absence is confirmed with a GET before anything is freed."""
    key = workload_ref(namespace, name)
    entries = holdings(t.fleet.nus_holding(key), key)
    if not entries:
        return
    try:
        live = await t.ctx.kube.resource(NEURON_ULTRASERVER_WORKLOADS).get(name, namespace)
    except NotFoundError:
        live = None
    if live is not None:
        return  # it exists: its own add event brings it here again
    log.info("releasing %d entries of deleted workload %s", len(entries), key)
    await t.write.remove_entries(entries)


async def delete_orphan_claims(t: Tools, namespace: str, wid: str) -> None:
    """Claims (and their pods) labelled with a workloadId no workload holds any more.

    Deleting a workload evicts its pods and claims, deletes the template, and evicts once
    more; but the resourceclaim controller works from its own cache, so it may still make a
    claim from the deleted template for a pod its workload controller recreated. Such a claim
    would be allocated on released devices that the plugin refuses (they are not reserved for
    that workload), and its pod would wait forever."""
    for obj in t.ctx.workloads.list():
        meta = meta_of(obj)
        if meta.get("namespace") == namespace and (
            workload_id(str(meta.get("name")), str(meta.get("uid") or "")) == wid
        ):
            return  # a live workload's claims: its own reconcile looks after them
    deleted = await delete_claims(t.ctx, namespace, wid, on_nodes=None)
    if deleted:
        log.info("deleted claims %s of workloadId %s, whose workload is gone", deleted, wid)
