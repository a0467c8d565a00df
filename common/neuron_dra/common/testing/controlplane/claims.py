"""The ResourceClaim controller: one ResourceClaim per pod claim that names a template.

What kube-controller-manager's resourceclaim controller does for pods, in its simplest form:

- the claim's spec is the template's ``spec.spec``, its labels and annotations the template's
  ``spec.metadata``; it is named by the server from ``generateName`` ``<pod>-<claim>-`` and is
  controlled by the pod (so the server's garbage collector deletes it with the pod);
- the pod's ``status.resourceClaimStatuses`` records which claim belongs to which entry;
- idempotent: an existing claim owned by the pod with the annotation
  ``resource.kubernetes.io/pod-claim-name`` is reused, and claims this controller created that
  its cache has not seen yet are remembered (the controller's "expectations"), so a retry never
  creates a second claim.

Releasing claims (``reservedFor``, deallocation) is the scheduler's part here, see
:mod:`.scheduler`.
"""

from __future__ import annotations

import copy
import logging
from typing import Final

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
    POD_CLAIM_NAME_ANNOTATION,
    JsonDict,
    Loop,
    PodClaim,
    Waiting,
    controller_owner_index,
    controller_owner_uid,
    meta,
    pod_claims,
    uid_index,
    uid_of,
)

log = logging.getLogger(__name__)

REPORTING_CONTROLLER: Final = "resourceclaim-controller"
#: Names are at most 63 characters here (like the real controller): the prefix leaves room
#: for the 5 random characters the server appends.
MAX_PREFIX: Final = 57


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


class ClaimController(Loop[str]):
    """Creates the template claims of pods; keys are pod ``namespace/name``."""

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
        self.pods.add_handler(
            on_add=self._on_pod,
            on_update=lambda _old, new: self._on_pod(new),
            on_delete=self._on_pod_deleted,
        )
        self.claims.add_handler(
            on_add=self._on_claim,
            on_update=lambda _old, new: self._on_claim(new),
            on_delete=self._on_claim,
        )

    def _on_pod(self, pod: JsonDict) -> None:
        if any(pc.generated and pc.claim_name is None for pc in pod_claims(pod)):
            self.queue.add(object_key(pod))

    def _on_pod_deleted(self, pod: JsonDict) -> None:
        uid = uid_of(pod)
        for k in [k for k in self._expected if k[0] == uid]:
            del self._expected[k]

    def _on_claim(self, claim: JsonDict) -> None:
        owner = controller_owner_uid(claim)
        if not owner:
            return
        for key in self.pods.store.index_keys("uid", owner):
            self.queue.add(key)

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

    async def sync(self, key: str) -> None:
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
