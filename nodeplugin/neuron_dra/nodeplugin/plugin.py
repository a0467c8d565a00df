"""The kubelet plugin process: discovery, slice publishing, claim preparation, sockets.

``KubeletPlugin`` wires the parts together and owns their lifecycle; each part is its own
module and is tested on its own. Start-up order matters to the kubelet:

1. discover devices (emulated tree or the host's sysfs/dev) so that nothing is published or
   served before we know what this node has (the watches the publish needs start listing
   meanwhile);
2. recover prepared claims from the checkpoint (CDI specs of running pods must exist before
   the kubelet talks to us again);
3. publish the ResourceSlice and the Node labels (the publisher keeps them published); what
   only serving needs (Prepare's config models, the gRPC stack, aiohttp's server side: a
   third of the process's imports) is imported after the first publish, before 4;
4. serve the DRA socket, and only then create the registration socket (``PluginServer``);
5. serve ``/healthz``, ``/readyz`` (registered and slice published) and ``/metrics``.

Stop runs the other way round; the registration socket goes first so the kubelet stops
sending work before the DRA server drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from neuron_dra.common.constants import (
    DRIVER_NAME,
    DRIVER_NAMESPACE,
    TAINT_EFFECT_NO_SCHEDULE,
    device_name,
)
from neuron_dra.common.httpserver import HttpServer, load_web
from neuron_dra.common.k8s.client import NODES, KubeClient
from neuron_dra.common.k8s.errors import NotFoundError
from neuron_dra.nodeplugin.discovery.emulation import (
    EmulatedPaths,
    scan_emulated,
    write_emulated_tree,
)
from neuron_dra.nodeplugin.discovery.model import NodeInventory
from neuron_dra.nodeplugin.discovery.pci import PciSources, locate
from neuron_dra.nodeplugin.discovery.udev import scan_udev
from neuron_dra.nodeplugin.kubeletapi import (
    DeviceHealthReport,
    HealthBoard,
    PluginServer,
    load_grpc_stack,
)
from neuron_dra.nodeplugin.prepare.claims import load_config_models
from neuron_dra.nodeplugin.prepare.devicestatus import DeviceStatusWriter, StatusReportingBackend
from neuron_dra.nodeplugin.prepare.node import PrepareNode
from neuron_dra.nodeplugin.prepare.preparer import Preparer
from neuron_dra.nodeplugin.publish.metrics import PublisherMetrics
from neuron_dra.nodeplugin.publish.nodelabels import NodeLabeller
from neuron_dra.nodeplugin.publish.publisher import SlicePublisher
from neuron_dra.nodeplugin.reservations import ReservationWatcher
from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)

#: How often discovery runs again: device health, a finished UltraServer election, a new
#: driver version. Hot-plug of Neuron devices does not happen on these instances, so polling
#: is simpler and more portable than udev monitoring (which needs udevd and netlink).
DEFAULT_RESCAN_INTERVAL = 30.0
#: How long start-up lets the first publish go ahead of the remaining imports (then serves
#: anyway: an API server that does not take the slice must not keep the kubelet waiting).
PUBLISH_BEFORE_IMPORT_WAIT = 1.0
#: How long start-up waits for the NeuronUltraServer list before publishing anyway.
RESERVATIONS_SYNC_TIMEOUT = 30.0


def load_serving_stack() -> None:
    """Import what only serving needs (safe in a worker thread): Prepare's opaque-config
    models (pydantic), the gRPC stack and aiohttp's server side."""
    load_config_models()
    load_grpc_stack()
    load_web()


def dra_driver_version() -> str:
    """Our version as strict semver (the ``draDriverVersion`` attribute must be semver)."""
    try:
        raw = metadata.version("neuron-dra")
    except metadata.PackageNotFoundError:
        return "0.0.0"
    core = raw.split("+", 1)[0]
    parts = [p for p in core.split(".")[:3] if p.isdigit()]
    while len(parts) < 3:
        parts.append("0")
    return ".".join(str(int(p)) for p in parts)


@dataclass(frozen=True)
class PluginConfig:
    node_name: str
    cdi_root: Path
    registrar_dir: Path
    plugins_dir: Path
    pod_uid: str | None = None
    sysfs_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    #: The host's /opt (node-wide LNC file); None skips it.
    opt_root: Path | None = Path("/opt")
    #: Where the device index -> PCI address pairing is read (not used under emulation,
    #: whose tree carries its own captures).
    pci_sources: PciSources = field(default_factory=PciSources)
    emulation_mode: str | None = None
    emulated_ultraserver_id: str | None = None
    emulated_ultraserver_node_id: int | None = None
    #: Where an emulated tree is written (default: under the plugin's data dir).
    emulation_root: Path | None = None
    http_host: str = "0.0.0.0"
    http_port: int = 8081
    rescan_interval: float = DEFAULT_RESCAN_INTERVAL
    #: Effect of the taints on devices found unhealthy (NoSchedule, or NoExecute to evict
    #: their pods too); None publishes no taints (the ``healthy`` attribute stays either way).
    device_taint_effect: str | None = TAINT_EFFECT_NO_SCHEDULE
    #: Publish the devices for claims on some of their cores (consumable capacity; opt-in,
    #: since every allocation of such a device then carries a shareID): publish/coresharing.py.
    core_sharing: bool = False
    driver_name: str = DRIVER_NAME
    #: Where the controller keeps the NeuronUltraServers (its release namespace).
    namespace: str = DRIVER_NAMESPACE
    boot_id_path: Path = Path("/proc/sys/kernel/random/boot_id")
    #: Write each prepared claim's device metadata file (KEP-5304) and mount it.
    device_metadata: bool = True

    @property
    def data_dir(self) -> Path:
        return self.plugins_dir / self.driver_name


class KubeletPlugin:
    """One node's Neuron DRA kubelet plugin."""

    def __init__(
        self,
        config: PluginConfig,
        kube: KubeClient,
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.config = config
        self.kube = kube
        self.registry = registry if registry is not None else CollectorRegistry()
        self.inventory: NodeInventory | None = None
        self._node_labels: dict[str, str] = {}
        self._emulated: EmulatedPaths | None = None
        #: Device index -> PCI address learned so far: the kernel log's probe lines may rotate
        #: out of its ring buffer while the devices stay where they are.
        self._pci_known: dict[int, str] = {}
        self.health = HealthBoard()
        publisher_metrics = PublisherMetrics(self.registry)
        # UltraServer reservations (NeuronUltraServer allocations naming this node) become
        # workloadId tags on our slice and ranks in the containers' environment.
        self.reservations = ReservationWatcher(
            kube,
            node_name=config.node_name,
            namespace=config.namespace,
            on_change=lambda: self.publisher.request_sync(),
            registry=self.registry,
        )
        self.publisher = SlicePublisher(
            kube,
            node_name=config.node_name,
            dra_driver_version=dra_driver_version(),
            inventory=lambda: self.inventory,
            workload_ids=self.reservations.workload_ids,
            driver_name=config.driver_name,
            metrics=publisher_metrics,
            taint_effect=config.device_taint_effect,
            core_sharing=config.core_sharing,
        )
        self.labeller = NodeLabeller(
            kube,
            node_name=config.node_name,
            inventory=lambda: self.inventory,
            metrics=publisher_metrics,
        )
        self.preparer = Preparer(
            kube,
            node_name=config.node_name,
            cdi_root=config.cdi_root,
            checkpoint_path=config.data_dir / "checkpoint.json",
            node=lambda: PrepareNode(self._require_inventory()),
            published=self.publisher.published_devices,
            topology=self.reservations.topology,
            driver_name=config.driver_name,
            registry=self.registry,
            boot_id_path=config.boot_id_path,
            device_metadata=config.device_metadata,
        )
        self.device_status = DeviceStatusWriter(
            kube,
            checkpoint=lambda: self.preparer.checkpoint,
            driver_name=config.driver_name,
        )
        self.server = PluginServer(
            driver_name=config.driver_name,
            plugins_dir=config.plugins_dir,
            registrar_dir=config.registrar_dir,
            backend=StatusReportingBackend(self.preparer, self.device_status),
            pod_uid=config.pod_uid,
            health_source=self.health,
        )
        self.http = HttpServer(registry=self.registry)
        self.http.add_liveness("grpc", self._serving_check)
        self.http.add_readiness("registered", self._registered_check)
        self.http.add_readiness("resourceslice", self.publisher.readiness_check)
        self.http.add_readiness("reservations", self._reservations_check)
        self._rescan_task: asyncio.Task[None] | None = None
        self._started = False

    # -- discovery ------------------------------------------------------------------------

    def _require_inventory(self) -> NodeInventory:
        if self.inventory is None:
            raise RuntimeError("device discovery has not completed yet")
        return self.inventory

    async def _read_node_labels(self) -> dict[str, str]:
        try:
            node = await self.kube.resource(NODES).get(self.config.node_name)
        except NotFoundError:
            log.warning(
                "Node %s not found; instance type must come from DMI", self.config.node_name
            )
            return {}
        return dict((node.get("metadata") or {}).get("labels") or {})

    def _emulate(self) -> EmulatedPaths:
        cfg = self.config
        assert cfg.emulation_mode is not None
        root = cfg.emulation_root or (cfg.data_dir / "emulated" / cfg.node_name)
        return write_emulated_tree(
            root,
            cfg.emulation_mode,
            node_name=cfg.node_name,
            ultraserver_id=cfg.emulated_ultraserver_id,
            ultraserver_node_id=cfg.emulated_ultraserver_node_id,
            reuse=True,
        )

    async def _write_emulated_tree(self) -> None:
        if self.config.emulation_mode:
            self._emulated = await asyncio.to_thread(self._emulate)
            log.info("emulating %s at %s", self.config.emulation_mode, self._emulated.sysfs_root)

    def _scan(self) -> NodeInventory:
        cfg = self.config
        if self._emulated is not None:
            return scan_emulated(
                self._emulated, node_name=cfg.node_name, node_labels=self._node_labels
            )
        inventory = scan_udev(
            cfg.sysfs_root,
            cfg.dev_root,
            node_name=cfg.node_name,
            node_labels=self._node_labels,
            opt_root=cfg.opt_root,
        )
        inventory, self._pci_known = locate(
            inventory, cfg.sysfs_root, cfg.pci_sources, known=self._pci_known
        )
        return inventory

    async def discover(self) -> bool:
        """Scan once; returns True when the inventory changed. Never raises on bad sysfs."""
        inventory = await asyncio.to_thread(self._scan)
        for problem in inventory.problems:
            log.warning("discovery: %s", problem, extra={"node": self.config.node_name})
        changed = inventory != self.inventory
        self.inventory = inventory
        if changed:
            self.health.replace(
                DeviceHealthReport(
                    pool_name=self.config.node_name,
                    device_name=device_name(d.index),
                    healthy=d.healthy,
                    last_updated=int(time.time()),
                    message="; ".join(d.unhealthy_reasons),
                )
                for d in inventory.devices
            )
            log.info(
                "discovered %d Neuron devices (%s, driver %s)",
                len(inventory.devices),
                inventory.instance_type,
                inventory.driver_version,
                extra={"node": self.config.node_name},
            )
        return changed

    async def _rescan_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.rescan_interval)
            try:
                if await self.discover():
                    self.publisher.request_sync()
                    self.labeller.request_sync()
            except Exception:  # a bad scan must not stop the plugin; the next one may work
                log.exception("rescan failed")

    # -- lifecycle ------------------------------------------------------------------------

    def _serving_check(self) -> tuple[bool, str]:
        # Liveness: both sockets must still exist while we run; if someone removed them the
        # kubelet can no longer reach us and a restart is the cure.
        if not self._started:
            return True, "starting"
        for sock in (self.server.dra_socket, self.server.registration_socket):
            if not sock.exists():
                return False, f"socket {sock} is gone"
        return True, "ok"

    def _reservations_check(self) -> tuple[bool, str]:
        if self.reservations.reflector.has_synced():
            return True, "NeuronUltraServers listed"
        return False, "waiting for the NeuronUltraServer list"

    def _registered_check(self) -> tuple[bool, str]:
        if self.server.registered.is_set():
            return True, "registered with the kubelet"
        return False, "waiting for the kubelet to register the plugin"

    async def start(self) -> None:
        cfg = self.config
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
        cfg.cdi_root.mkdir(parents=True, exist_ok=True)
        self.labeller.watch_node(self.publisher.node_reflector)
        # The watches first: their initial lists run while the emulated tree is written (in a
        # worker thread, while the Node GET is in flight) and scanned, and the checkpoint is
        # recovered. Nothing is published before the publisher starts below.
        self.reservations.start()
        self.publisher.start_watching()
        self._node_labels, _ = await asyncio.gather(
            self._read_node_labels(), self._write_emulated_tree()
        )
        await self.discover()
        await self.preparer.start()
        # Publishing before the reservations are known would briefly show a reserved node as
        # free after a restart, and the scheduler could hand its devices to anyone.
        try:
            await asyncio.wait_for(self.reservations.wait_synced(), RESERVATIONS_SYNC_TIMEOUT)
        except TimeoutError:
            # Without the CRD (or RBAC for it) the list never succeeds; a node with no slice
            # helps nobody, so publish untagged and keep /readyz failing with the reason.
            log.warning(
                "NeuronUltraServers not listed after %.0fs; publishing without reservations",
                RESERVATIONS_SYNC_TIMEOUT,
            )
        self.publisher.start()
        self.labeller.start()
        # What only serving needs was left out of the imports so far: nothing before the
        # publish needs it. Load it before serving, so that no Prepare pays for it, but after
        # the first publish (bounded wait), which the imports would slow down (they hold the
        # GIL for a few hundred ms).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.publisher.published.wait(), PUBLISH_BEFORE_IMPORT_WAIT)
        await asyncio.to_thread(load_serving_stack)
        await self.server.start()
        self.device_status.start()
        await self.http.start(cfg.http_host, cfg.http_port)
        self._rescan_task = asyncio.create_task(self._rescan_loop(), name="rescan")
        self._started = True
        log.info(
            "kubelet plugin serving: dra=%s registration=%s http=%d",
            self.server.dra_socket,
            self.server.registration_socket,
            self.http.port,
        )

    async def stop(self) -> None:
        if self._rescan_task is not None:
            self._rescan_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._rescan_task
        # Registration socket first (PluginServer.stop does), so the kubelet stops sending.
        with contextlib.suppress(Exception):
            await self.server.stop(grace=5.0)
        # Checkpoint commits of calls the gRPC layer cancelled still finish before we exit.
        await self.preparer.drain()
        await self.device_status.stop()
        await self.labeller.stop()
        await self.publisher.stop()
        await self.reservations.stop()
        await self.http.stop()
        self._started = False
