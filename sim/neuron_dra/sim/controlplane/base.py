"""What every simulated control-plane loop shares: a worker over a work queue fed by reflectors,
and small readers of Pod and ResourceClaim dicts.

Each loop (claim controller, scheduler, kubelet, workload controllers) is a :class:`Loop`:
reflectors keep caches of what it watches, their handlers put keys into one de-duplicating
queue, and one worker calls :meth:`Loop.sync` for each key. ``sync`` raising means "try this
key again after its backoff"; returning means done (until the next event adds the key again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Generic, TypeVar

from neuron_dra.common.k8s.client import ResourceClient
from neuron_dra.common.k8s.errors import classify
from neuron_dra.common.k8s.reflector import Reflector
from neuron_dra.common.k8s.workqueue import ExponentialBackoff, QueueShutDown, WorkQueue
from neuron_dra.sim.cancellation import being_cancelled

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]
K = TypeVar("K", bound=Hashable)

#: Set by Kubernetes' resourceclaim controller on claims it generates from a template.
POD_CLAIM_NAME_ANNOTATION: Final = "resource.kubernetes.io/pod-claim-name"
#: Where the simulated kubelet records the CDI device ids each container got (JSON).
CDI_DEVICES_ANNOTATION: Final = "sim.neuron.aws.com/cdi-devices"
#: The finalizer the scheduler puts on a claim it allocates and the resourceclaim controller
#: removes once the claim is neither reserved nor allocated: a claim deleted while pods use
#: it stays (Terminating) until they are gone.
DELETE_PROTECTION_FINALIZER: Final = "resource.kubernetes.io/delete-protection"
TERMINAL_PHASES: Final = ("Succeeded", "Failed")


class Waiting(Exception):
    """A key cannot make progress yet for an expected reason (retried quietly)."""


class Loop(Generic[K]):
    """Reflectors + one work queue + one worker. Subclasses implement :meth:`sync`."""

    def __init__(self, name: str, *, backoff_base: float = 0.05, backoff_cap: float = 5.0) -> None:
        self.name = name
        self.queue: WorkQueue[K] = WorkQueue(
            name, rate_limiter=ExponentialBackoff(backoff_base, backoff_cap)
        )
        self.reflectors: list[Reflector] = []
        self._worker: asyncio.Task[None] | None = None
        #: Keys synced (successfully or not): lets tests and users see the loop move.
        self.syncs = 0
        #: Called after every sync (done or failed): lets waiters re-check state this loop
        #: changes outside the API server (prepared claims, CDI files).
        self.listeners: list[Callable[[], None]] = []

    def reflector(self, api: ResourceClient, **kwargs: Any) -> Reflector:
        r = Reflector(api, name=f"{self.name}-{api.resource.plural}", **kwargs)
        self.reflectors.append(r)
        return r

    async def start(self) -> None:
        """Start the reflectors, wait until their caches are synced, then the worker."""
        if self._worker is not None:
            return
        for r in self.reflectors:
            r.start()
        await asyncio.gather(*(r.wait_synced() for r in self.reflectors))
        self._worker = asyncio.get_running_loop().create_task(self._work(), name=self.name)

    async def stop(self) -> None:
        self.queue.shutdown()
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None
        for r in self.reflectors:
            await r.stop()

    async def sync(self, key: K) -> None:
        raise NotImplementedError

    async def _work(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except QueueShutDown:
                return
            try:
                await self.sync(key)
            except asyncio.CancelledError:
                if being_cancelled():
                    raise
                # Something the sync awaited was cancelled under it, not this worker (a gRPC
                # channel closed with a call in flight): the key is retried; the worker must
                # not end, or every later key of the loop would wait for ever.
                log.info("%s: syncing %s was cancelled under it; retrying", self.name, key)
                self.queue.add_rate_limited(key)
            except Waiting as exc:
                log.debug("%s: %s: %s", self.name, key, exc)
                self.queue.add_rate_limited(key)
            except Exception as exc:
                if classify(exc) is None:
                    log.exception("%s: syncing %s failed", self.name, key)
                else:
                    log.info("%s: syncing %s failed: %s", self.name, key, exc)
                self.queue.add_rate_limited(key)
            else:
                self.queue.forget(key)
            finally:
                self.syncs += 1
                self.queue.done(key)
                for listener in self.listeners:
                    listener()


# --- object readers -------------------------------------------------------------------------


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    m = obj.get("metadata")
    return m if isinstance(m, Mapping) else {}


def uid_of(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("uid") or "")


def uid_index(obj: JsonDict) -> list[str]:
    uid = uid_of(obj)
    return [uid] if uid else []


def controller_owner_uid(obj: Mapping[str, Any]) -> str:
    for ref in meta(obj).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            return str(ref.get("uid") or "")
    return ""


def controller_owner_index(obj: JsonDict) -> list[str]:
    uid = controller_owner_uid(obj)
    return [uid] if uid else []


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class PodClaim:
    """One ``pod.spec.resourceClaims[]`` entry and the ResourceClaim it resolves to.

    ``claim_name`` is None while a template's claim has not been recorded in the pod's
    ``status.resourceClaimStatuses`` yet.
    """

    pod_claim_name: str
    claim_name: str | None
    template_name: str | None

    @property
    def generated(self) -> bool:
        return self.template_name is not None


def pod_claims(pod: Mapping[str, Any]) -> list[PodClaim]:
    status = pod.get("status") or {}
    recorded = {
        str(s.get("name")): s.get("resourceClaimName")
        for s in status.get("resourceClaimStatuses") or []
        if isinstance(s, Mapping)
    }
    out: list[PodClaim] = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = str(entry.get("name") or "")
        if entry.get("resourceClaimName"):
            out.append(PodClaim(name, str(entry["resourceClaimName"]), None))
        elif entry.get("resourceClaimTemplateName"):
            claim = recorded.get(name)
            template = str(entry["resourceClaimTemplateName"])
            out.append(PodClaim(name, str(claim) if claim else None, template))
    return out


def is_terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


def is_terminating(obj: Mapping[str, Any]) -> bool:
    return bool(meta(obj).get("deletionTimestamp"))


def is_pod_done(pod: Mapping[str, Any]) -> bool:
    """The pod will not run (again): terminal, or deleted before it was bound to a node. A
    bound pod being deleted is not done: it runs until its kubelet has stopped it."""
    return is_terminal(pod) or (is_terminating(pod) and not (pod.get("spec") or {}).get("nodeName"))


def is_active(pod: Mapping[str, Any]) -> bool:
    """Counted by a workload controller: neither terminal nor being deleted."""
    return not is_terminal(pod) and not is_terminating(pod)


def pod_ref(pod: Mapping[str, Any]) -> JsonDict:
    """A ``status.reservedFor`` entry for ``pod``."""
    return {"resource": "pods", "name": str(meta(pod).get("name")), "uid": uid_of(pod)}


def reserved_for(claim: Mapping[str, Any]) -> list[JsonDict]:
    return list((claim.get("status") or {}).get("reservedFor") or [])


def is_reserved_for(claim: Mapping[str, Any], pod_uid: str) -> bool:
    return any(r.get("resource") == "pods" and r.get("uid") == pod_uid for r in reserved_for(claim))


def allocation_node(allocation: Mapping[str, Any]) -> str | None:
    """The node an allocation is restricted to (the allocator writes ``metadata.name In``)."""
    selector = allocation.get("nodeSelector") or {}
    for term in selector.get("nodeSelectorTerms") or []:
        for req in list(term.get("matchFields") or []) + list(term.get("matchExpressions") or []):
            key = req.get("key")
            values = req.get("values") or []
            if (
                key in ("metadata.name", "kubernetes.io/hostname")
                and req.get("operator") == "In"
                and len(values) == 1
            ):
                return str(values[0])
    return None
