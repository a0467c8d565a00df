"""ResourceClaim ``status.devices`` for the claims prepared on this node (KEP-4817).

For each prepared claim the plugin reports, per allocated device of ours, a ``Ready``
condition and ``data`` a user or a tool reads with ``kubectl get resourceclaim -o yaml``
instead of exec-ing into the pod: the device's index, the visible cores, the LNC, and for
UltraServer claims the UltraServer id, mode, node id and the node's rank (global topology id)
— the values the container's environment carries. When the claim is unprepared the entries
are taken away again.

The writes are server-side apply of ``status.devices`` under this plugin's field manager: the
list is keyed by (driver, pool, device), so other drivers' entries of a claim are not
touched. They happen off the kubelet's path, after Prepare has answered, and are
level-triggered on the checkpoint: on start and after every Prepare or Unprepare the writer
compares what the checkpoint holds with what it has written and converges, so a plugin
restart rewrites nothing it does not have to and misses nothing.

Permission: writing ``status.devices`` takes ``patch`` of ``resourceclaims/status`` and, from
Kubernetes 1.36 (``DRAResourceClaimGranularStatusAuthorization``), the per-driver verb
``associated-node:patch`` of ``resourceclaims/driver``. The chart grants them only there:
before 1.36 ``resourceclaims/status`` would also let a node's token rewrite any claim's
allocation. Without the permission the first write is refused (403); the writer then logs
once and stops, and nothing else fails.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from neuron_dra.common.constants import (
    DRIVER_NAME,
    METADATA_ATTR_GLOBAL_TOPOLOGY_ID,
    METADATA_ATTR_LOGICAL_NEURON_CORE,
    METADATA_ATTR_ULTRASERVER_RUNTIME_MODE,
    METADATA_ATTR_ULTRASERVER_SERVER_ID,
    METADATA_ATTR_ULTRASERVER_SERVER_NODE_ID,
    METADATA_ATTR_VISIBLE_CORES,
    device_index,
)
from neuron_dra.common.k8s.client import RESOURCE_CLAIMS, KubeClient, PatchType
from neuron_dra.common.k8s.clock import Clock, SystemClock
from neuron_dra.common.k8s.errors import (
    ConflictError,
    ForbiddenError,
    InvalidError,
    NotFoundError,
)
from neuron_dra.common.k8s.workqueue import RateLimiter
from neuron_dra.nodeplugin.kubeletapi.model import (
    ClaimRef,
    DriverBackend,
    PrepareResult,
    UnprepareResult,
)
from neuron_dra.nodeplugin.prepare import checkpoint as ckpt
from neuron_dra.nodeplugin.prepare.cdi import (
    ENV_GLOBAL_TOPOID,
    ENV_LNC,
    ENV_US_MODE,
    ENV_US_NODE_ID,
    ENV_US_SERVER_ID,
    ENV_VISIBLE_CORES,
)
from neuron_dra.nodeplugin.prepare.containers import recorded_env
from neuron_dra.nodeplugin.publish.syncworker import SyncWorker, log_failure

log = logging.getLogger(__name__)

#: The field manager of our entries (server-side apply owns them per manager).
FIELD_MANAGER: Final = f"{DRIVER_NAME}/kubelet-plugin"
CONDITION_READY: Final = "Ready"
REASON_PREPARED: Final = "Prepared"

#: ``data`` keys and the runtime variable each repeats (integers where the value is one). The
#: keys are the device metadata file's attribute names (prepare/metadata.py), so a tool reads
#: the same words in both places.
_DATA_FROM_ENV: Final = (
    (METADATA_ATTR_VISIBLE_CORES, ENV_VISIBLE_CORES, False),
    (METADATA_ATTR_LOGICAL_NEURON_CORE, ENV_LNC, True),
    (METADATA_ATTR_ULTRASERVER_RUNTIME_MODE, ENV_US_MODE, True),
    (METADATA_ATTR_ULTRASERVER_SERVER_ID, ENV_US_SERVER_ID, False),
    (METADATA_ATTR_ULTRASERVER_SERVER_NODE_ID, ENV_US_NODE_ID, True),
    (METADATA_ATTR_GLOBAL_TOPOLOGY_ID, ENV_GLOBAL_TOPOID, True),
)

CheckpointProvider = Callable[[], ckpt.Checkpoint]


# --- pure --------------------------------------------------------------------------------------


def _data(env: Mapping[str, str], device_name: str) -> dict[str, Any]:
    data: dict[str, Any] = {}
    index = device_index(device_name)
    if index is not None:
        data["deviceId"] = index
    for key, var, integer in _DATA_FROM_ENV:
        value = env.get(var)
        if value is not None:
            data[key] = int(value) if integer and value.lstrip("-").isdigit() else value
    return data


def device_statuses(entry: ckpt.ClaimEntry, *, driver: str = DRIVER_NAME) -> list[dict[str, Any]]:
    """``status.devices`` entries for one prepared claim, one per device of ours, in the
    order the kubelet was answered. Admin-access claims carry no environment, so their data
    is the device only."""
    env = recorded_env(entry)
    out = []
    for device in entry.devices:
        out.append(
            {
                "driver": driver,
                "pool": device.pool_name,
                "device": device.device_name,
                # The allocation's key has it, and the API server checks every entry names
                # an allocated device (core sharing: prepare/cores.py).
                **({"shareID": device.share_id} if device.share_id else {}),
                "conditions": [
                    {
                        "type": CONDITION_READY,
                        "status": "True",
                        "reason": REASON_PREPARED,
                        "message": "prepared by the Neuron kubelet plugin; the container gets "
                        "its device nodes and runtime environment",
                        "lastTransitionTime": entry.prepared_at,
                    }
                ],
                "data": _data(env, device.device_name),
            }
        )
    return out


def apply_body(
    namespace: str, name: str, uid: str, devices: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The apply configuration of our ``status.devices`` entries (none: remove ours). The uid
    makes the write fail (409) on a claim deleted and re-created under the same name."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "status": {"devices": list(devices)},
    }


# --- the writer ------------------------------------------------------------------------------


class DeviceStatusWriter:
    """Converges ``status.devices`` of the claims in the checkpoint (see the module doc)."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        checkpoint: CheckpointProvider,
        driver_name: str = DRIVER_NAME,
        clock: Clock | None = None,
        rate_limiter: RateLimiter[str] | None = None,
    ) -> None:
        self._api = kube.resource(RESOURCE_CLAIMS)
        self._checkpoint = checkpoint
        self._driver = driver_name
        #: uid -> (namespace, name, entries) as written.
        self.written: dict[str, tuple[str, str, list[dict[str, Any]]]] = {}
        #: False once the API server refused us the permission: nothing more is tried.
        self.permitted = True
        self._invalid_logged = False
        self._worker = SyncWorker(
            "claim-device-status",
            self._sync,
            self._on_error,
            clock=clock or SystemClock(),
            rate_limiter=rate_limiter,
            queue_metrics=None,
        )

    def start(self) -> None:
        self._worker.start()
        self._worker.request()

    async def stop(self) -> None:
        await self._worker.stop()

    def request(self) -> None:
        if self.permitted:
            self._worker.request()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        await self._worker.wait_until(predicate)

    async def _apply(
        self, namespace: str, name: str, uid: str, devices: list[dict[str, Any]]
    ) -> None:
        """Apply our entries. A claim gone, or another one under the name now (409 on the
        uid), has nothing of ours to report on."""
        try:
            await self._api.patch(
                name,
                apply_body(namespace, name, uid, devices),
                patch_type=PatchType.APPLY,
                namespace=namespace,
                subresource="status",
                field_manager=FIELD_MANAGER,
                force=True,
            )
        except (NotFoundError, ConflictError):
            pass
        except InvalidError as exc:
            # The API server refuses this report for good: retrying cannot help, and the
            # claim is prepared all the same. Said once, not per claim. (One such refusal,
            # "status.allocation ... field is immutable" on claims whose opaque config our
            # own client had written with JSON's spaces, is gone: request bodies are written
            # as Go writes them, client/transport.py go_json.)
            if not self._invalid_logged:
                self._invalid_logged = True
                log.warning(
                    "the API server refused status.devices of ResourceClaim %s/%s (%s); such "
                    "reports are dropped, the claims work as prepared",
                    namespace,
                    name,
                    exc,
                )

    async def _sync(self) -> None:
        if not self.permitted:
            return
        claims = self._checkpoint().claims
        try:
            for uid, entry in claims.items():
                want = device_statuses(entry, driver=self._driver)
                if self.written.get(uid) == (entry.namespace, entry.name, want):
                    continue
                await self._apply(entry.namespace, entry.name, uid, want)
                self.written[uid] = (entry.namespace, entry.name, want)
            for uid in [u for u in self.written if u not in claims]:
                namespace, name, _ = self.written[uid]
                await self._apply(namespace, name, uid, [])
                del self.written[uid]
        except ForbiddenError as exc:
            self.permitted = False
            log.warning(
                "not permitted to write ResourceClaim status.devices (%s); the claims' device "
                "status is not reported. It needs Kubernetes 1.36+ and the chart's "
                "resourceclaims/status and resourceclaims/driver rules",
                exc,
            )

    def _on_error(self, exc: Exception) -> None:
        log_failure("ResourceClaim status.devices", exc, self._worker.failures)


#: How long after a Prepare or Unprepare the writer is asked to converge. Asked at once, its
#: PATCH (JSON, the TLS write) ran on the event loop while gRPC was still sending the answer,
#: and the kubelet waited for it; a moment later the answer is out, and the calls of one
#: burst (a pod's claims, a node's pods) share one convergence.
STATUS_DELAY = 0.05


class StatusReportingBackend:
    """The preparer as the kubelet sees it, asking the writer to converge shortly after each
    call (whatever its outcome: the checkpoint says what is prepared)."""

    def __init__(
        self, backend: DriverBackend, writer: DeviceStatusWriter, *, delay: float = STATUS_DELAY
    ) -> None:
        self._backend = backend
        self._writer = writer
        self._delay = delay
        self._pending: asyncio.TimerHandle | None = None

    def _request_soon(self) -> None:
        if self._pending is None:  # one request per burst: the timer's own clears it
            self._pending = asyncio.get_running_loop().call_later(self._delay, self._request)

    def _request(self) -> None:
        self._pending = None
        self._writer.request()

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        try:
            return await self._backend.prepare(claims)
        finally:
            self._request_soon()

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareResult]:
        try:
            return await self._backend.unprepare(claims)
        finally:
            self._request_soon()
