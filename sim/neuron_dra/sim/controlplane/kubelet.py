"""A simulated kubelet: registers the node's DRA plugins and prepares claims of its pods.

It follows what the kubelet does for DRA (docs/architecture.md, "What the kubelet expects"),
over the plugin's real gRPC sockets through
:class:`~neuron_dra.sim.kubeletclient.KubeletClient`:

- registration: scan the registration directory until a plugin registers;
- a pod bound to the node (watched with ``fieldSelector=spec.nodeName=<node>``): resolve its
  claims, GET each one, require an allocation and the pod in ``reservedFor``, then one
  ``NodePrepareResources`` per driver with all of the pod's claims of that driver (once every
  driver has a registered plugin: else none is called). On success
  the pod is marked Running (no containers are run) and the CDI device ids each container got
  are recorded in the pod annotation ``sim.neuron.aws.com/cdi-devices`` (JSON
  ``{container: [ids]}``, matched by ``resources.claims[].name/request`` as the kubelet does).
  On failure a Warning Event ``FailedPrepareDynamicResources`` with the plugin's message, and
  a retry with backoff;
- a pod deleted, being deleted or finished: ``NodeUnprepareResources`` for its claims that no
  other pod on the node still uses (the claims may be gone from the API server by then, so
  what was prepared is remembered here), then, for a pod being deleted, the final delete the
  kubelet issues once its containers have stopped (grace period 0, with the pod's uid as
  precondition): the API server keeps a bound pod Terminating until then. A stopped kubelet
  (a dead node) never sends it, so its pods stay Terminating, as in Kubernetes.

Keys are pod UIDs, not names: a controller may recreate a pod under the same name while the
old one is still being unprepared.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from neuron_dra.common.events import EventRecorder, EventType, ObjectRef
from neuron_dra.common.k8s.client import PODS, RESOURCE_CLAIMS, KubeClient
from neuron_dra.common.k8s.errors import ConflictError, NotFoundError
from neuron_dra.nodeplugin.kubeletapi.model import (
    ClaimRef,
    PluginCallError,
    PreparedDevice,
)
from neuron_dra.sim.kubeletclient import KubeletClient

from .base import (
    CDI_DEVICES_ANNOTATION,
    JsonDict,
    Loop,
    Waiting,
    controller_owner_uid,
    is_reserved_for,
    meta,
    now_rfc3339,
    pod_claims,
    uid_index,
    uid_of,
)

log = logging.getLogger(__name__)

REPORTING_CONTROLLER: Final = "kubelet"
_TERMINAL: Final = ("Succeeded", "Failed")
_READY_CONDITIONS: Final = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


class PrepareError(Exception):
    """Preparation failed in a way the user should see (an Event on the pod)."""


@dataclass
class PreparedClaim:
    ref: ClaimRef
    pod_claim_name: str
    drivers: frozenset[str]
    by_driver: dict[str, tuple[PreparedDevice, ...]] = field(default_factory=dict)

    @property
    def devices(self) -> tuple[PreparedDevice, ...]:
        return tuple(d for driver in sorted(self.by_driver) for d in self.by_driver[driver])

    @property
    def complete(self) -> bool:
        return set(self.by_driver) >= self.drivers


@dataclass
class PodState:
    """What this kubelet prepared for one pod (kept until it is unprepared)."""

    namespace: str
    name: str
    claims: dict[str, PreparedClaim] = field(default_factory=dict)  # by claim uid
    #: The pod was reported Running (with its CDI ids) by this kubelet.
    running: bool = False


def container_cdi_devices(
    pod: Mapping[str, Any], prepared: Mapping[str, Sequence[PreparedDevice]]
) -> dict[str, list[str]]:
    """``{container: [CDI ids]}`` from ``resources.claims[]`` (pure).

    ``prepared`` maps pod claim names (``spec.resourceClaims[].name``) to their prepared
    devices. A reference with a ``request`` gets the devices whose request names include it
    (exact match, as the kubelet does); one without gets every device of the claim.
    """
    spec = pod.get("spec") or {}
    out: dict[str, list[str]] = {}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        refs = (container.get("resources") or {}).get("claims") or []
        if not refs:
            continue
        ids: list[str] = []
        for ref in refs:
            request = ref.get("request") or ""
            for device in prepared.get(str(ref.get("name")), ()):
                if request and request not in device.request_names:
                    continue
                ids.extend(i for i in device.cdi_device_ids if i not in ids)
        out[str(container.get("name"))] = ids
    return out


class SimKubelet(Loop[str]):
    """One simulated node's kubelet (DRA part only)."""

    def __init__(
        self,
        kube: KubeClient,
        node_name: str,
        registrar_dir: Path | str,
        *,
        rescan_interval: float = 1.0,
    ) -> None:
        super().__init__(f"sim-kubelet-{node_name}", backoff_base=0.1, backoff_cap=5.0)
        self.kube = kube
        self.node_name = node_name
        self.client = KubeletClient(registrar_dir)
        self.rescan_interval = rescan_interval
        self.registered = asyncio.Event()
        self.pods = self.reflector(kube.resource(PODS), field_selector=f"spec.nodeName={node_name}")
        self.pods.store.add_index("uid", uid_index)
        self.events = EventRecorder(
            kube, reporting_instance=node_name, reporting_controller=REPORTING_CONTROLLER
        )
        #: Pods with prepared claims, by pod uid.
        self.prepared: dict[str, PodState] = {}
        self._register_task: asyncio.Task[None] | None = None
        self.pods.add_handler(
            on_add=self._on_pod,
            on_update=lambda _old, new: self._on_pod(new),
            on_delete=self._on_pod,
        )

    def _on_pod(self, pod: JsonDict) -> None:
        uid = uid_of(pod)
        if uid:
            self.queue.add(uid)

    async def start(self) -> None:
        await super().start()
        if self._register_task is None:
            self._register_task = asyncio.get_running_loop().create_task(
                self._register(), name=f"{self.name}-registration"
            )

    async def stop(self) -> None:
        if self._register_task is not None:
            self._register_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._register_task
            self._register_task = None
        await super().stop()
        await self.client.close()

    async def _register(self) -> None:
        delay = 0.05
        while not self.client.plugins:
            try:
                await self.client.register_all()
            except Exception as exc:  # a half-started plugin; scan again
                log.info("%s: registration failed: %s", self.name, exc)
            if self.client.plugins:
                break
            await asyncio.sleep(delay)
            delay = min(self.rescan_interval, delay * 2)
        self.registered.set()
        for key in self.pods.store.index_values("uid"):
            self.queue.add(key)

    # --- sync ------------------------------------------------------------------------------

    async def sync(self, key: str) -> None:
        pods = self.pods.store.by_index("uid", key)
        pod = pods[0] if pods else None
        if (
            pod is None
            or meta(pod).get("deletionTimestamp")
            or (pod.get("status") or {}).get("phase") in _TERMINAL
        ):
            await self._terminate(key, pod)
            return
        await self._run(pod)

    async def _run(self, pod: JsonDict) -> None:
        try:
            state = await self._prepare(pod)
        except PrepareError as exc:
            await self._event(pod, "FailedPrepareDynamicResources", str(exc))
            # The kubelet retries with back-off; the Event is the report, not a traceback.
            raise Waiting(str(exc)) from exc
        if state.running:
            return
        prepared = {c.pod_claim_name: c.devices for c in state.claims.values()}
        await self._mark_running(pod, container_cdi_devices(pod, prepared))
        state.running = True

    async def _prepare(self, pod: JsonDict) -> PodState:
        m = meta(pod)
        ns, name, uid = str(m.get("namespace")), str(m.get("name")), uid_of(pod)
        state = self.prepared.setdefault(uid, PodState(ns, name))
        wanted: list[PreparedClaim] = []
        for pc in pod_claims(pod):
            if pc.claim_name is None:
                raise Waiting(f"pod {name}: claim {pc.pod_claim_name} not created yet")
            try:
                claim = await self.kube.resource(RESOURCE_CLAIMS).get(pc.claim_name, ns)
            except NotFoundError:
                raise PrepareError(
                    f'failed to fetch ResourceClaim "{pc.claim_name}": not found'
                ) from None
            if pc.generated and controller_owner_uid(claim) != uid:
                raise PrepareError(f"ResourceClaim {pc.claim_name} was not created for the pod")
            if not is_reserved_for(claim, uid):
                raise PrepareError(
                    f"pod {name} is not allowed to use ResourceClaim {pc.claim_name}"
                )
            allocation = (claim.get("status") or {}).get("allocation")
            if not allocation:
                raise PrepareError(f"ResourceClaim {pc.claim_name} is not allocated")
            drivers = frozenset(
                str(r.get("driver")) for r in (allocation.get("devices") or {}).get("results") or []
            )
            ref = ClaimRef(namespace=ns, uid=uid_of(claim), name=pc.claim_name)
            known = state.claims.get(ref.uid)
            wanted.append(known or PreparedClaim(ref, pc.pod_claim_name, drivers))
        by_driver: dict[str, list[PreparedClaim]] = {}
        for pcl in wanted:
            for driver in sorted(pcl.drivers - set(pcl.by_driver)):
                by_driver.setdefault(driver, []).append(pcl)
        plugins = {}
        # Every driver's plugin first, as the kubelet does: a claim with devices of a driver
        # that has no plugin on the node is not prepared with any driver (nothing would
        # have to be unprepared when the pod goes).
        for driver in by_driver:
            try:
                plugins[driver] = self.client.plugin(driver)
            except KeyError:
                raise PrepareError(f"DRA driver {driver} is not registered") from None
        for driver, claims in by_driver.items():
            plugin = plugins[driver]
            try:
                results = await plugin.prepare([c.ref for c in claims])
            except PluginCallError as exc:
                raise PrepareError(f"NodePrepareResources: {exc}") from exc
            skipped = [c for c in claims if c.ref.uid not in results]
            for c in claims:
                result = results.get(c.ref.uid)
                if result is None:
                    continue
                if result.error:
                    raise PrepareError(
                        f"NodePrepareResources failed for ResourceClaim {c.ref.name}: "
                        f"{result.error}"
                    )
                c.by_driver[driver] = result.devices
                state.claims[c.ref.uid] = c
            if skipped:
                raise PrepareError(f"NodePrepareResources skipped {len(skipped)} ResourceClaims")
        return state

    async def _mark_running(self, pod: JsonDict, cdi: dict[str, list[str]]) -> None:
        m = meta(pod)
        ns, name = str(m.get("namespace")), str(m.get("name"))
        api = self.kube.resource(PODS)
        encoded = json.dumps(cdi, sort_keys=True)
        if (m.get("annotations") or {}).get(CDI_DEVICES_ANNOTATION) != encoded:
            await api.merge_patch(
                name, {"metadata": {"annotations": {CDI_DEVICES_ANNOTATION: encoded}}}, ns
            )
        status = pod.get("status") or {}
        if status.get("phase") == "Running":
            return
        now = now_rfc3339()
        conditions = [
            c for c in status.get("conditions") or [] if c.get("type") not in (_READY_CONDITIONS)
        ]
        conditions += [
            {"type": t, "status": "True", "lastTransitionTime": now} for t in _READY_CONDITIONS
        ]
        containers = [
            {
                "name": c.get("name"),
                "image": c.get("image", ""),
                "imageID": "",
                "containerID": f"sim://{uid_of(pod)}/{c.get('name')}",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            }
            for c in (pod.get("spec") or {}).get("containers") or []
        ]
        await api.merge_patch(
            name,
            {
                "status": {
                    "phase": "Running",
                    "conditions": conditions,
                    "containerStatuses": containers,
                    "startTime": status.get("startTime") or now,
                }
            },
            ns,
            subresource="status",
        )
        log.info("%s: pod %s/%s is running", self.name, ns, name)

    async def _terminate(self, uid: str, pod: JsonDict | None) -> None:
        state = self.prepared.get(uid)
        if state is not None:
            await self._unprepare(uid, state, pod)
            del self.prepared[uid]
        m = meta(pod) if pod is not None else {}
        if m.get("deletionTimestamp") and m.get("deletionGracePeriodSeconds") != 0:
            # Its containers have stopped: end the grace period. The API server removes the
            # pod now, or once its finalizers are gone. (A 409 is another pod of that name.)
            with contextlib.suppress(NotFoundError, ConflictError):
                await self.kube.resource(PODS).delete(
                    str(m["name"]), str(m["namespace"]), uid=uid, grace_period_seconds=0
                )

    async def _unprepare(self, uid: str, state: PodState, pod: JsonDict | None) -> None:
        in_use = {c for other, s in self.prepared.items() if other != uid for c in s.claims}
        by_driver: dict[str, list[ClaimRef]] = {}
        for claim_uid, c in state.claims.items():
            if claim_uid in in_use:
                continue
            for driver in sorted(c.drivers):
                by_driver.setdefault(driver, []).append(c.ref)
        for driver, refs in by_driver.items():
            try:
                plugin = self.client.plugin(driver)
                results = await plugin.unprepare(refs)
                errors = [
                    f"NodeUnprepareResources failed for ResourceClaim {r.name}: "
                    f"{results[r.uid].error}"
                    for r in refs
                    if r.uid in results and results[r.uid].error
                ]
                if len(results) < len(refs):
                    errors.append(f"NodeUnprepareResources skipped {len(refs) - len(results)}")
            except KeyError:
                errors = [f"DRA driver {driver} is not registered"]
            except PluginCallError as exc:
                errors = [f"NodeUnprepareResources: {exc}"]
            if errors:
                message = "; ".join(errors)
                if pod is not None:
                    await self._event(pod, "FailedUnprepareDynamicResources", message)
                raise PrepareError(message)
        log.info("%s: unprepared the claims of pod %s/%s", self.name, state.namespace, state.name)

    async def _event(self, pod: JsonDict, reason: str, note: str) -> None:
        m = meta(pod)
        ref = ObjectRef("v1", "Pod", str(m.get("name")), str(m.get("namespace")), uid_of(pod))
        await self.events.record(
            ref, type_=EventType.WARNING, reason=reason, note=note, action="PrepareResources"
        )
