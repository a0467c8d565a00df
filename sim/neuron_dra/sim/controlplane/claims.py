"""The ResourceClaim controller: claims generated from templates, and their release.

What kube-controller-manager's resourceclaim controller does, in its simplest form.

Creating claims for pods:

- the claim's spec is the template's ``spec.spec``, its labels and annotations the template's
  ``spec.metadata``; it is named by the server from ``generateName`` ``<pod>-<claim>-`` and is
  controlled by the pod (so the server's garbage collector deletes it with the pod);
- the pod's ``status.resourceClaimStatuses`` records which claim belongs to which entry;
- idempotent: an existing claim owned by the pod with the annotation
  ``resource.kubernetes.io/pod-claim-name`` is reused, and claims this controller created that
  its cache has not seen yet are remembered (the controller's "expectations"), so a retry never
  creates a second claim.

Releasing claims (keys ``("claim", namespace/name)``):

- a ``status.reservedFor`` entry is dropped once its pod is gone (deleted, or replaced by a
  pod of the same name), terminal, or deleted before it was bound. A bound pod being deleted
  keeps its reservation until it is gone: its kubelet may still be stopping it. A pod missing
  from the cache is looked up in the API before its entry is dropped (it may be newer than
  the cache), unless the cache saw it deleted;
- a claim left without consumers is deallocated, and the
  ``resource.kubernetes.io/delete-protection`` finalizer the scheduler put on it when it
  allocated it is removed: a claim deleted while in use stays Terminating until then;
- a claim generated for a pod that is done (or replaced) is deleted, without waiting for the
  garbage collector (the pod itself may stay around).
"""

from __future__ import annotations

import copy
import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final

from neuron_dra.common.events import EventRecorder, EventType, ObjectRef
from neuron_dra.common.k8s.client import (
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    KubeClient,
    object_key,
    resource_version,
)
from neuron_dra.common.k8s.errors import ConflictError, NotFoundError

from .base import (
    DELETE_PROTECTION_FINALIZER,
    POD_CLAIM_NAME_ANNOTATION,
    JsonDict,
    Loop,
    PodClaim,
    Waiting,
    controller_owner_index,
    controller_owner_uid,
    is_pod_done,
    meta,
    pod_claims,
    reserved_for,
    uid_index,
    uid_of,
)

log = logging.getLogger(__name__)

REPORTING_CONTROLLER: Final = "resourceclaim-controller"
#: Names are at most 63 characters here (like the real controller): the prefix leaves room
#: for the 5 random characters the server appends.
MAX_PREFIX: Final = 57
#: How many deleted pods' uids are remembered (an LRU, like the real controller's).
DELETED_PODS_REMEMBERED: Final = 10_000

Key = tuple[str, str]  # ("pod" | "claim", namespace/name)


def generate_name(pod_name: str, pod_claim_name: str) -> str:
    """``<pod>-<claim>-``, shortened in the middle when too long for a 63-character name."""
    prefix = f"{pod_name}-{pod_claim_name}-"
    if len(prefix) <= MAX_PREFIX:
        return prefix
    half = MAX_PREFIX // 2
    return prefix[:half] + prefix[len(prefix) - half :]


def claim_from_template(pod: JsonDict, pc: PodClaim, template: JsonDict) -> JsonDict:
    """The ResourceClaim to create for ``pc`` of ``pod`` (pure)."""
    tspec = template.get("spec") or {}
    tmeta = tspec.get("metadata") or {}
    pmeta = meta(pod)
    annotations = dict(tmeta.get("annotations") or {})
    annotations[POD_CLAIM_NAME_ANNOTATION] = pc.pod_claim_name
    claim_meta: JsonDict = {
        "generateName": generate_name(str(pmeta.get("name")), pc.pod_claim_name),
        "namespace": pmeta.get("namespace"),
        "annotations": annotations,
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pmeta.get("name"),
                "uid": pmeta.get("uid"),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if tmeta.get("labels"):
        claim_meta["labels"] = dict(tmeta["labels"])
    return {
        "apiVersion": RESOURCE_CLAIMS.api_version,
        "kind": RESOURCE_CLAIMS.kind,
        "metadata": claim_meta,
        "spec": copy.deepcopy(tspec.get("spec") or {}),
    }


class ClaimController(Loop[Key]):
    """Creates the template claims of pods and releases claims whose consumers are gone."""

    def __init__(self, kube: KubeClient) -> None:
        super().__init__("sim-claims")
        self.kube = kube
        self.pods = self.reflector(kube.resource(PODS))
        self.claims = self.reflector(kube.resource(RESOURCE_CLAIMS))
        self.pods.store.add_index("uid", uid_index)
        self.claims.store.add_index("owner", controller_owner_index)
        self.events = EventRecorder(
            kube, reporting_instance="sim", reporting_controller=REPORTING_CONTROLLER
        )
        # (pod uid, pod claim name) -> name of a claim we created that the cache lacks.
        self._expected: dict[tuple[str, str], str] = {}
        # Uids of pods the cache saw deleted: their reservations go without an API lookup.
        self._deleted: OrderedDict[str, None] = OrderedDict()
        self.pods.add_handler(
            on_add=self._on_pod,
            on_update=lambda _old, new: self._on_pod(new),
            on_delete=self._on_pod_deleted,
        )
        self.claims.add_handler(
            on_add=self._on_claim,
            on_update=lambda _old, new: self._on_claim(new),
            on_delete=self._poke_owner,
        )

    # --- event handlers --------------------------------------------------------------------

    def _on_pod(self, pod: JsonDict) -> None:
        if any(pc.generated and pc.claim_name is None for pc in pod_claims(pod)):
            self.queue.add(("pod", object_key(pod)))
        if is_pod_done(pod):
            self._release_claims_of(pod)

    def _on_pod_deleted(self, pod: JsonDict) -> None:
        uid = uid_of(pod)
        for k in [k for k in self._expected if k[0] == uid]:
            del self._expected[k]
        self._deleted[uid] = None
        while len(self._deleted) > DELETED_PODS_REMEMBERED:
            self._deleted.popitem(last=False)
        self._release_claims_of(pod)

    def _release_claims_of(self, pod: JsonDict) -> None:
        ns = meta(pod).get("namespace")
        for pc in pod_claims(pod):
            if pc.claim_name:
                self.queue.add(("claim", f"{ns}/{pc.claim_name}"))

    def _on_claim(self, claim: JsonDict) -> None:
        self._poke_owner(claim)
        if reserved_for(claim) or DELETE_PROTECTION_FINALIZER in _finalizers(claim):
            self.queue.add(("claim", object_key(claim)))

    def _poke_owner(self, claim: JsonDict) -> None:
        """The pod a claim was generated for may be waiting for it (or for it to go)."""
        owner = controller_owner_uid(claim)
        if not owner:
            return
        for key in self.pods.store.index_keys("uid", owner):
            self.queue.add(("pod", key))

    async def sync(self, key: Key) -> None:
        kind, name = key
        if kind == "pod":
            await self._sync_pod(name)
        else:
            await self._sync_claim(name)

    # --- creating claims -------------------------------------------------------------------

    def _find(self, pod: JsonDict, pc: PodClaim) -> str | None:
        """Name of the claim already made for ``pc`` (cache first, then our own creations)."""
        uid = uid_of(pod)
        for claim in self.claims.store.by_index("owner", uid):
            if meta(claim).get("annotations", {}).get(POD_CLAIM_NAME_ANNOTATION) == (
                pc.pod_claim_name
            ):
                self._expected.pop((uid, pc.pod_claim_name), None)
                return str(meta(claim)["name"])
        return self._expected.get((uid, pc.pod_claim_name))

    async def _sync_pod(self, key: str) -> None:
        pod = self.pods.store.get(key)
        if pod is None or meta(pod).get("deletionTimestamp"):
            return
        missing = [pc for pc in pod_claims(pod) if pc.generated and pc.claim_name is None]
        if not missing:
            return
        ns = str(meta(pod).get("namespace"))
        statuses: list[JsonDict] = list(
            (pod.get("status") or {}).get("resourceClaimStatuses") or []
        )
        for pc in missing:
            name = self._find(pod, pc)
            if name is None:
                name = await self._create(pod, pc, ns)
            statuses = [s for s in statuses if s.get("name") != pc.pod_claim_name]
            statuses.append({"name": pc.pod_claim_name, "resourceClaimName": name})
        body: JsonDict = {
            "metadata": {"resourceVersion": resource_version(pod)},
            "status": {"resourceClaimStatuses": statuses},
        }
        try:
            await self.kube.resource(PODS).merge_patch(
                str(meta(pod)["name"]), body, ns, subresource="status"
            )
        except ConflictError as exc:
            # Usually our own earlier write that the cache has not shown yet.
            raise Waiting(str(exc)) from exc

    # --- releasing claims ------------------------------------------------------------------

    async def _keeps(self, namespace: str, ref: Mapping[str, Any]) -> bool:
        """Whether the ``reservedFor`` entry ``ref`` still stands."""
        if ref.get("resource") != "pods" or ref.get("apiGroup"):
            return True  # not a consumer this controller knows how to check
        uid = str(ref.get("uid") or "")
        if uid in self._deleted:
            return False
        pod = self.pods.store.get(f"{namespace}/{ref.get('name')}")
        if pod is None:
            # Not in the cache (yet?): the scheduler may have reserved the claim for a pod
            # newer than our cache; only the API server can tell it is really gone.
            try:
                pod = await self.kube.resource(PODS).get(str(ref.get("name")), namespace)
            except NotFoundError:
                return False
            return uid_of(pod) == uid
        return uid_of(pod) == uid and not is_pod_done(pod)

    async def _sync_claim(self, key: str) -> None:
        claim = self.claims.store.get(key)
        if claim is None:
            return
        ns = str(meta(claim).get("namespace"))
        entries = reserved_for(claim)
        valid = [r for r in entries if await self._keeps(ns, r)]
        protected = DELETE_PROTECTION_FINALIZER in _finalizers(claim)
        api = self.kube.resource(RESOURCE_CLAIMS)
        try:
            if len(valid) < len(entries):
                status = copy.deepcopy(claim.get("status") or {})
                if valid:
                    status["reservedFor"] = valid
                else:
                    status.pop("reservedFor", None)
                    if protected:
                        # Allocated by the scheduler, used by nobody now: free the devices
                        # (a later consumer may then be placed anywhere).
                        status.pop("allocation", None)
                claim = await api.replace({**claim, "status": status}, subresource="status")
                log.info("released ResourceClaim %s (%d consumers left)", key, len(valid))
                if protected and not (claim.get("status") or {}).get("allocation"):
                    await self._unprotect(claim)
            elif protected and not valid and meta(claim).get("deletionTimestamp"):
                if (claim.get("status") or {}).get("allocation"):
                    status = {k: v for k, v in claim["status"].items() if k != "allocation"}
                    claim = await api.replace({**claim, "status": status}, subresource="status")
                await self._unprotect(claim)
        except ConflictError as exc:
            raise Waiting(f"claim {key} changed meanwhile: {exc}") from exc
        except NotFoundError:
            return
        if not valid:
            await self._delete_if_unused(claim)

    async def _unprotect(self, claim: JsonDict) -> None:
        finalizers = [f for f in _finalizers(claim) if f != DELETE_PROTECTION_FINALIZER]
        body = copy.deepcopy(claim)
        body["metadata"]["finalizers"] = finalizers
        await self.kube.resource(RESOURCE_CLAIMS).replace(body)

    async def _delete_if_unused(self, claim: JsonDict) -> None:
        """Delete a claim generated for a pod that will not run (again)."""
        m = meta(claim)
        owner = next(
            (
                r
                for r in m.get("ownerReferences") or []
                if r.get("controller") and r.get("kind") == "Pod" and r.get("apiVersion") == "v1"
            ),
            None,
        )
        if owner is None or m.get("deletionTimestamp"):
            return
        ns = str(m.get("namespace"))
        pod = self.pods.store.get(f"{ns}/{owner.get('name')}")
        if pod is None:
            return  # maybe not in our cache yet; the garbage collector handles a gone pod
        if uid_of(pod) != owner.get("uid") or is_pod_done(pod):
            log.info("deleting unused generated claim %s/%s", ns, m.get("name"))
            try:
                await self.kube.resource(RESOURCE_CLAIMS).delete(str(m.get("name")), ns)
            except NotFoundError:
                return

    async def _create(self, pod: JsonDict, pc: PodClaim, ns: str) -> str:
        assert pc.template_name is not None
        try:
            template = await self.kube.resource(RESOURCE_CLAIM_TEMPLATES).get(pc.template_name, ns)
        except NotFoundError:
            await self._event(
                pod,
                "FailedResourceClaimCreation",
                f"PodResourceClaim {pc.pod_claim_name}: ResourceClaimTemplate "
                f"{pc.template_name} not found",
            )
            raise
        created = await self.kube.resource(RESOURCE_CLAIMS).create(
            claim_from_template(pod, pc, template), ns
        )
        name = str(meta(created)["name"])
        self._expected[(uid_of(pod), pc.pod_claim_name)] = name
        log.info("created ResourceClaim %s/%s for pod %s", ns, name, meta(pod).get("name"))
        return name

    async def _event(self, pod: JsonDict, reason: str, note: str) -> None:
        m = meta(pod)
        ref = ObjectRef("v1", "Pod", str(m.get("name")), str(m.get("namespace")), uid_of(pod))
        await self.events.record(
            ref, type_=EventType.WARNING, reason=reason, note=note, action="CreateResourceClaim"
        )


def _finalizers(obj: Mapping[str, Any]) -> list[str]:
    return list(meta(obj).get("finalizers") or [])
