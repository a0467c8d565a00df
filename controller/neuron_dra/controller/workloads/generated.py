"""The objects a workload brings into being besides its reservation, and their clean-up: the
generated ResourceClaimTemplate (created, repaired, deleted with the workload) and the
ResourceClaims made from it (deleted with their pods when the workload moves or goes)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from neuron_dra.common.constants import KIND_WORKLOAD, LABEL_WORKLOAD_ID
from neuron_dra.common.k8s.client import (
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    resource_version,
)
from neuron_dra.common.k8s.errors import AlreadyExistsError, ConflictError, NotFoundError
from neuron_dra.common.k8s.writes import merge_patch
from neuron_dra.controller.context import ControllerContext
from neuron_dra.controller.templates import claim_template_for, template_matches

from .fleet import Fleet
from .model import (
    CLAIMS_BY_WORKLOAD,
    AllocationRaceError,
    Held,
    JsonDict,
    Workload,
    meta_of,
    status_of,
)

# --- the ResourceClaimTemplate --------------------------------------------------------------


async def ensure_template(fleet: Fleet, obj: JsonDict, wl: Workload) -> str | None:
    """Create or fix the generated ResourceClaimTemplate; a message when a same-named
    template we must not touch is in the way."""
    desired = claim_template_for(obj, wl.wid)
    tmeta = desired["metadata"]
    namespace, name = str(tmeta["namespace"]), str(tmeta["name"])
    api = fleet.ctx.kube.resource(RESOURCE_CLAIM_TEMPLATES)
    key = f"{namespace}/{name}"
    existing = fleet.template(key)
    if existing is not None and template_matches(existing, desired):
        return None
    if existing is None:
        try:
            fleet.remember_template(key, await api.create(desired))
            return None
        except AlreadyExistsError:
            existing = await api.get(name, namespace)
    if template_matches(existing, desired):
        return None
    owner = next(
        (r for r in meta_of(existing).get("ownerReferences") or [] if r.get("controller")),
        None,
    )
    ours = owner is not None and owner.get("uid") == str(meta_of(obj).get("uid"))
    previous = (
        owner is not None and owner.get("kind") == KIND_WORKLOAD and owner.get("name") == wl.name
    )
    if not (ours or previous):
        return (
            f"ResourceClaimTemplate {namespace}/{name} exists and is not managed by this "
            "workload; delete it or recreate the workload with another "
            "spec.resourceClaimTemplate.name"
        )
    if ours and existing.get("spec") == desired["spec"]:
        # Only our labels drifted: patch them back, guarded so we do not undo a
        # concurrent change.
        await merge_patch(
            api,
            name,
            {"metadata": {"labels": tmeta["labels"]}},
            namespace,
            resource_version=resource_version(existing),
        )
        return None
    # The spec is immutable: a wrong one (or a previous incarnation's) is replaced.
    with contextlib.suppress(NotFoundError):
        await api.delete(
            name,
            namespace,
            uid=str(meta_of(existing).get("uid") or "") or None,
            resource_version=resource_version(existing) or None,
        )
    try:
        fleet.remember_template(key, await api.create(desired))
    except AlreadyExistsError as exc:
        raise AllocationRaceError(f"template {namespace}/{name} re-created meanwhile") from exc
    return None


async def delete_template(ctx: ControllerContext, obj: JsonDict) -> None:
    """Delete the templates ``obj`` controls (found by owner uid, whatever their name)."""
    uid = str(meta_of(obj).get("uid"))
    namespace = str(meta_of(obj).get("namespace"))
    api = ctx.kube.resource(RESOURCE_CLAIM_TEMPLATES)
    for template in ctx.templates.list():
        tmeta = meta_of(template)
        if tmeta.get("namespace") != namespace:
            continue
        if not any(
            r.get("uid") == uid and r.get("controller") for r in tmeta.get("ownerReferences") or []
        ):
            continue
        with contextlib.suppress(NotFoundError):
            await api.delete(
                str(tmeta.get("name")), namespace, uid=str(tmeta.get("uid") or "") or None
            )


# --- the ResourceClaims ---------------------------------------------------------------------


def claim_pools(claim: Mapping[str, Any]) -> set[str]:
    """Pools (= node names for our driver) the claim's devices were allocated from."""
    allocation = status_of(claim).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return {str(r.get("pool")) for r in results if isinstance(r, Mapping) and r.get("pool")}


def stray_nodes(ctx: ControllerContext, wl: Workload, held: Sequence[Held]) -> set[str]:
    """Nodes outside the workload's units where its claims were allocated anyway.

    After a move (RestartAll, ReplaceAffected) a released node keeps the workload's tag
    until its plugin republishes, and the scheduler may place a new claim there; the
    plugin refuses to prepare it, so without a move the pod would wait forever."""
    ours = {n for h in held for n in h.nodes}
    stray: set[str] = set()
    for claim in ctx.claims.by_index(CLAIMS_BY_WORKLOAD, f"{wl.namespace}/{wl.wid}"):
        if not meta_of(claim).get("deletionTimestamp"):
            stray |= claim_pools(claim) - ours
    return stray


async def delete_claims(
    ctx: ControllerContext, namespace: str, wid: str, *, on_nodes: set[str] | None
) -> list[str]:
    """Delete the ResourceClaims labelled with ``wid`` (all, or those allocated on
    ``on_nodes``) and the pods using them: a claim in use is only removed once its pods are
    gone, so deleting the claim alone would not restart (or stop) anything."""
    claims_api = ctx.kube.resource(RESOURCE_CLAIMS)
    pods_api = ctx.kube.resource(PODS)
    listed = await claims_api.list_all(namespace, label_selector=f"{LABEL_WORKLOAD_ID}={wid}")
    deleted: list[str] = []
    for claim in listed.items:
        if on_nodes is not None and not (claim_pools(claim) & on_nodes):
            continue
        cmeta = meta_of(claim)
        cname = str(cmeta.get("name"))
        for user in status_of(claim).get("reservedFor") or []:
            if user.get("resource") != "pods" or not user.get("name"):
                continue
            # Gone already, or a new pod of the same name (uid precondition): not ours.
            with contextlib.suppress(NotFoundError, ConflictError):
                await pods_api.delete(
                    str(user["name"]), namespace, uid=str(user.get("uid") or "") or None
                )
        try:
            await claims_api.delete(cname, namespace, uid=str(cmeta.get("uid") or "") or None)
            deleted.append(cname)
        except (NotFoundError, ConflictError):
            pass
    return sorted(deleted)
