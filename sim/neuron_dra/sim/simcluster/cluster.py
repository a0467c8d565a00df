"""The whole system on one machine: the UltraServer controller, one kubelet plugin per
emulated node and a simulated kubelet per node, on one of two Kubernetes worlds:

- ``kubernetes="fake"`` (the embedded default): our fake API server and the simulated control
  plane (claim controller, scheduler, ReplicaSets), in-process, started in seconds;
- ``kubernetes="real"``: a real control plane (:mod:`..realcluster`: etcd, kube-apiserver,
  kube-controller-manager, kube-scheduler built from the pinned modules). The real scheduler
  allocates claims from our plugins' ResourceSlices, the real resourceclaim controller makes
  claims from templates, real Deployments run; the simulated nodes register real Node
  objects and renew their Leases, and their kubelets prepare what the real scheduler
  allocated over the plugins' gRPC sockets.

All components talk HTTP and gRPC over real sockets.

    async with SimCluster(default_nodes()) as sim:
        await sim.apply_file(repo / "examples/specs/connected-4-devices.yaml")
        ...

Each component gets its own Kubernetes client (its own connection pool and watches), as the
separate processes of a real cluster would. Every node's files (emulated sysfs/dev tree, CDI
directory, kubelet plugin and registry directories, boot id) live under ``workdir/<node>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar

import yaml
from neuron_dra.common.constants import DRIVER_NAMESPACE
from neuron_dra.common.k8s.client import (
    NAMESPACES,
    ApiResource,
    KubeClient,
    ResourceClient,
    connect,
)
from neuron_dra.common.k8s.errors import NotFoundError
from neuron_dra.sim.controlplane import (
    ControlPlane,
    ensure_device_classes,
)
from neuron_dra.sim.controlplane.podsets import PodSet
from neuron_dra.sim.fakeapi.server import FakeAPIServer
from neuron_dra.sim.realcluster import ADMIN, RealControlPlane, shared_control_plane
from neuron_dra.sim.realnode.podspec import for_real_nodes
from neuron_dra.sim.scratch import work_dir
from neuron_dra.sim.waiting import Listeners, wait_until

from .mirror import ClusterMirror, ClusterReader
from .reads import ClusterReads
from .realnodes import RealNodes
from .realworld import (
    DEPLOYMENTS,
    SERVICE_ACCOUNTS,
    Deployment,
    NodeLease,
    ensure_namespace,
    register_node,
    set_node_ready,
)
from .topology import SimNode, check_unique, default_nodes, node_object, ready_condition

log = logging.getLogger(__name__)

T = TypeVar("T")
JsonDict = dict[str, Any]

RESOURCE_V1 = "resource.k8s.io/v1"
NEURON_V1BETA1 = "neuron.aws.com/v1beta1"
#: Bound for one awaited condition (a status the controller writes, a pod of a few Running):
#: generous, as CI machines are small and shared.
DEFAULT_LIMIT = 60.0
#: Bound for a recovery that restarts many pods at once or brings nodes back (a failure
#: strategy's RestartAll or ReplaceAffected, a node's reboot before the cluster is idle
#: again): each pod is a scheduling, a Prepare and a container start, and on real nodes a
#: rebooted node starts its kubelet, containerd and plugin first. A bound for being stuck.
RECOVERY_LIMIT = 300.0
#: Bound for a set of pods to be Running (a gang of a workload, a walkthrough step's pods):
#: on real nodes each is a scheduling, a Prepare and a container start. A bound for being
#: stuck, as the set's Running is still asserted.
PODS_LIMIT = 300.0
#: The controller's component name for ``SimCluster(identities=...)`` (plugins: node names).
CONTROLLER = "controller"
WORKLOAD_KINDS = ("Deployment", "LeaderWorkerSet")
FAKE, REAL = "fake", "real"
KUBERNETES_WORLDS = (FAKE, REAL)
#: Who runs the nodes: our simulated kubelets, or real kubelets, containerd and runc.
SIMULATED_NODES, REAL_NODES = "simulated", "real"


class SimCluster(ClusterReads):
    def __init__(
        self,
        nodes: Sequence[SimNode] | None = None,
        *,
        workdir: Path | None = None,
        api_port: int = 0,
        controller: bool = True,
        limit: float = DEFAULT_LIMIT,
        kubernetes: str = FAKE,
        control_plane: RealControlPlane | None = None,
        minor: str | None = None,
        identities: Callable[[str], Path] | None = None,
        nodes_kind: str | None = None,
        kubelet_minor: str | None = None,
        kubelet_verbosity: int = 2,
        plugin_args: Sequence[str] = (),
    ) -> None:
        """``kubernetes``: ``"fake"`` or ``"real"``. On a real world, ``control_plane`` is
        the one to use (default: the process's shared one of ``minor``, default the newest
        pinned); the cluster's nodes must not exist there yet.

        ``identities``: the kubeconfig each of our components talks with, by component
        (``CONTROLLER`` or a node's name for its plugin), called when the component starts
        (after the nodes are registered); default: the cluster's admin kubeconfig. The
        chart's identity tests pass ServiceAccount tokens here.

        ``nodes_kind``: ``"real"`` (the default on a real world) runs every node as a real
        kubelet with its own containerd (:mod:`neuron_dra.sim.realnode`) and our plugin as a
        process inside it; ``"simulated"`` (the only choice on the fake world) runs our
        simulated kubelets and the plugins in this process. ``kubelet_minor`` picks the
        real kubelets' minor (default: the control plane's), ``kubelet_verbosity`` their
        ``--v``, ``plugin_args`` flags added to the plugin processes'."""
        if kubernetes not in KUBERNETES_WORLDS:
            raise ValueError(f"kubernetes must be one of {KUBERNETES_WORLDS}, not {kubernetes!r}")
        nodes_kind = nodes_kind or (REAL_NODES if kubernetes == REAL else SIMULATED_NODES)
        if nodes_kind == REAL_NODES and kubernetes != REAL:
            raise ValueError("real nodes need a real control plane (kubernetes='real')")
        self.nodes_kind = nodes_kind
        self._kubelet_minor = kubelet_minor
        self._kubelet_verbosity = kubelet_verbosity
        self._plugin_args = tuple(plugin_args)
        self.real_nodes: RealNodes | None = None
        #: Nodes failed by :meth:`fail_node` and not recovered yet.
        self.failed_nodes: set[str] = set()
        self.nodes: list[SimNode] = list(default_nodes() if nodes is None else nodes)
        check_unique(self.nodes)
        # Unix socket paths are limited to 108 bytes: keep the root short.
        self._own_workdir = workdir is None
        self.workdir = workdir or work_dir("sim")
        self.kubernetes = kubernetes
        self.api = FakeAPIServer(port=api_port)
        self.real: RealControlPlane | None = control_plane
        self._minor = minor
        self.mirror: ClusterMirror | None = None
        self.leases: dict[str, NodeLease] = {}
        self.with_controller = controller
        self.limit = limit
        self.kubeconfig = self.workdir / "kubeconfig"
        self.kube: KubeClient | None = None
        self.cp: ControlPlane | None = None
        self.manager: Any = None  # ControllerManager (imported lazily: controller package)
        self.plugins: dict[str, Any] = {}  # node → KubeletPlugin
        self._clients: list[KubeClient] = []
        self._identities = identities

    # --- lifecycle -------------------------------------------------------------------------

    def node_root(self, node: str) -> Path:
        return self.workdir / node

    def cdi_root(self, node: str) -> Path:
        """Where the node's CDI specs are, seen from here."""
        if self.real_nodes is not None:
            return self.real_nodes.cdi_dir(node)
        return self.node_root(node) / "cdi"

    def registrar_dir(self, node: str) -> Path:
        return self.node_root(node) / "plugins_registry"

    async def _client(self, component: str | None = None) -> KubeClient:
        """An API client: the admin's, or ``component``'s identity (see ``identities``)."""
        path = self.kubeconfig
        if component is not None and self._identities is not None:
            path = self._identities(component)
        kube = await connect(path)
        self._clients.append(kube)
        return kube

    @property
    def is_real(self) -> bool:
        return self.kubernetes == REAL

    @property
    def has_real_nodes(self) -> bool:
        return self.nodes_kind == REAL_NODES

    @property
    def view(self) -> ClusterReader:
        """Where reads come from: the fake's store in-process, or the watch-fed mirror of a
        real API server (both answer ``get``/``list`` by apiVersion and kind)."""
        return self.mirror if self.mirror is not None else self.api

    @property
    def url(self) -> str:
        return self.real.url if self.real is not None else self.api.url

    async def _start_api(self) -> None:
        if not self.is_real:
            await self.api.start()
            self.api.write_kubeconfig(self.kubeconfig)
            return
        if self.real is None:
            from neuron_dra.sim.kubebuild import newest_minor

            # Started from this (main) thread, not a worker: its processes die with the
            # thread that forked them. Blocking the loop for seconds is fine at start.
            self.real = shared_control_plane(self._minor or newest_minor())
        shutil.copyfile(self.real.kubeconfig(ADMIN), self.kubeconfig)

    async def _register_nodes(self) -> None:
        assert self.kube is not None
        if self.has_real_nodes:
            await self._start_real_nodes()
            return
        for index, node in enumerate(self.nodes):
            if self.is_real:
                await register_node(self.kube, node, index)
                lease = NodeLease(self.kube, node.name)
                lease.start()
                self.leases[node.name] = lease
            else:
                self.api.create(node_object(node, index))
            root = self.node_root(node.name)
            root.mkdir(parents=True, exist_ok=True)
            (root / "boot_id").write_text("sim-boot-1\n")

    async def _start_real_nodes(self) -> None:
        """Real kubelets register their Nodes; wait until every one is there (the plugins
        read theirs). Ready comes a few seconds later (the kubelet's runtime-status tick):
        :meth:`start` waits for it after the plugins have started, meanwhile."""
        assert self.real is not None
        self.real_nodes = RealNodes(
            self.real,
            self.workdir / "nodes",
            kubelet_minor=self._kubelet_minor,
            kubelet_verbosity=self._kubelet_verbosity,
            plugin_args=self._plugin_args,
        )
        # From this (main) thread: the nodes' processes die with the thread that forked them.
        self.real_nodes.start(self.nodes)
        names = {n.name for n in self.nodes}

        def registered() -> bool:
            return names <= {n["metadata"]["name"] for n in self.view.list("v1", "Node")}

        await self.wait_until(registered, f"{len(names)} real nodes registered")

    async def _prepare_real_namespaces(self) -> None:
        """What a real cluster needs before our pods: the driver's namespace (the controller
        writes NeuronUltraServers there) and the ``default`` ServiceAccount of ``default``,
        which the ServiceAccount admission plugin requires of every pod (the
        controller-manager creates it soon after start)."""
        assert self.kube is not None
        await ensure_namespace(self.kube, DRIVER_NAMESPACE)
        api = self.kube.resource(SERVICE_ACCOUNTS)
        # A watch without a resourceVersion starts with the object if it exists already.
        async with asyncio.timeout(self.limit):
            stream = await api.watch("default", field_selector="metadata.name=default")
            async with stream:
                async for event in stream:
                    if event.type == "ADDED":
                        break

    async def start(self) -> None:
        await self._start_api()
        self.kube = await self._client()
        if self.is_real:
            await self._prepare_real_namespaces()
            self.mirror = ClusterMirror(await self._client())
            await self.mirror.start()
        await self._register_nodes()
        await ensure_device_classes(self.kube)
        # Plugins start one at a time on purpose: each writes an emulated tree and imports
        # nothing new after the first, so in parallel they would only contend for the GIL.
        for node in self.nodes:
            await self.start_plugin(node.name)
        if self.with_controller:
            await self.start_controller()
        self.cp = ControlPlane(
            await self._client(),
            # Real nodes have real kubelets; simulated ones get ours.
            registrar_dirs={}
            if self.has_real_nodes
            else {n.name: self.registrar_dir(n.name) for n in self.nodes},
            # On a real world the real scheduler and controllers do this part.
            simulate_control_plane=not self.is_real,
        )
        await self.cp.start()
        await asyncio.wait_for(
            asyncio.gather(*(k.registered.wait() for k in self.cp.kubelets.values())),
            self.limit,
        )
        await self.wait_until(self._all_published, "every node's ResourceSlice")
        if self.real_nodes is not None:
            await self.wait_until(self.whole, "every real node Ready and its slice published")
        if self.with_controller:
            want = {n.ultraserver_id for n in self.nodes if n.ultraserver_id}
            await self.wait_until(
                lambda: want <= {o["metadata"]["name"] for o in self.ultraservers()},
                f"NeuronUltraServers {sorted(want)} discovered",
            )

    def _all_published(self) -> bool:
        if self.real_nodes is not None:
            failed = self.real_nodes.plugin_failed()
            if failed:
                raise RuntimeError(failed)
        published = {s["spec"]["nodeName"] for s in self.slices()}
        return {n.name for n in self.nodes} <= published

    async def start_plugin(self, node_name: str) -> None:
        from neuron_dra.nodeplugin.plugin import KubeletPlugin, PluginConfig

        node = self.node(node_name)
        if self.real_nodes is not None:
            path = self._identities(node.name) if self._identities else self.kubeconfig
            self.real_nodes.start_plugin(node.name, path)
            return
        root = self.node_root(node_name)
        plugin = KubeletPlugin(
            PluginConfig(
                node_name=node.name,
                cdi_root=root / "cdi",
                registrar_dir=self.registrar_dir(node.name),
                plugins_dir=root / "plugins",
                emulation_mode=node.instance_type,
                emulated_ultraserver_id=node.ultraserver_id,
                emulated_ultraserver_node_id=node.ultraserver_node_id,
                emulation_root=root / "host",
                opt_root=None,
                http_host="127.0.0.1",
                http_port=0,
                boot_id_path=root / "boot_id",
            ),
            await self._client(node.name),
        )
        await plugin.start()
        self.plugins[node.name] = plugin

    async def start_controller(self) -> None:
        from neuron_dra.controller.manager import ControllerManager, ManagerConfig

        self.manager = ControllerManager(
            await self._client(CONTROLLER),
            ManagerConfig(namespace=DRIVER_NAMESPACE, http_host="127.0.0.1", http_port=0),
        )
        await self.manager.start()

    async def stop(self) -> None:
        if self.cp is not None:
            await _quietly(self.cp.stop(), "control plane")
        if self.manager is not None:
            await _quietly(self.manager.stop(), "controller")
        for name, plugin in list(self.plugins.items()):
            await _quietly(plugin.stop(), f"plugin {name}")
        self.plugins.clear()
        if self.real_nodes is not None:
            await _quietly(self.real_nodes.stop(), "real nodes")
        for name, lease in list(self.leases.items()):
            await _quietly(lease.stop(), f"lease {name}")
        self.leases.clear()
        if self.real is not None and self.kube is not None:
            await _quietly(self._remove_real_nodes(), "nodes")
        if self.mirror is not None:
            await _quietly(self.mirror.stop(), "mirror")
        for kube in self._clients:
            await _quietly(kube.close(), "client")
        self._clients.clear()
        if not self.is_real:
            await _quietly(self.api.stop(), "fake API server")
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    async def _remove_real_nodes(self) -> None:
        """A shared control plane outlives this cluster: take our Nodes and their slices
        away so the next cluster (or test) starts from none."""
        assert self.kube is not None
        from neuron_dra.common.k8s.client import NODES, RESOURCE_SLICES

        for node in self.nodes:
            with contextlib.suppress(NotFoundError):
                await self.kube.resource(NODES).delete(node.name)
        mine = {n.name for n in self.nodes}
        for item in (await self.kube.resource(RESOURCE_SLICES).list_all()).items:
            if item.get("spec", {}).get("nodeName") in mine:
                with contextlib.suppress(NotFoundError):
                    await self.kube.resource(RESOURCE_SLICES).delete(item["metadata"]["name"])

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def node(self, name: str) -> SimNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no simulated node {name}")

    # --- waiting ---------------------------------------------------------------------------

    async def wait_until(
        self,
        predicate: Callable[[], T | None],
        what: str,
        limit: float | None = None,
        *,
        poll: float | None = None,
    ) -> T:
        """``predicate()`` once truthy; re-checked on every API write and after every sync of
        the control plane's loops (a kubelet's unprepare changes files, not the API)."""
        sources: list[Listeners] = [
            self.mirror.listeners if self.mirror is not None else self.api.store.listeners
        ]
        if self.real_nodes is not None:
            sources.append(self.real_nodes.watch.listeners)
        if self.cp is not None:
            sources += [loop.listeners for loop in self.cp.loops]
        limit = self.limit if limit is None else limit
        return await wait_until(predicate, what, limit, sources, poll=poll)

    # --- applying manifests ----------------------------------------------------------------

    def _resource(self, api_version: str, kind: str) -> tuple[ResourceClient, bool]:
        """The client for a kind the API server serves, and whether it is namespaced."""
        assert self.kube is not None
        if self.mirror is not None:
            res = self.mirror.resource(api_version, kind)
            for unmirrored in (DEPLOYMENTS, NAMESPACES):  # served, not mirrored
                if res is None and (api_version, kind) == (unmirrored.api_version, unmirrored.kind):
                    res = unmirrored
            if res is None:
                raise KeyError(f"the simulated cluster does not handle {api_version} {kind}")
            return self.kube.resource(res), res.namespaced
        rt = self.api.resource_type(api_version, kind)
        res = ApiResource(rt.group, rt.version, rt.plural, rt.kind, rt.namespaced)
        return self.kube.resource(res), rt.namespaced

    async def apply(self, manifest: Mapping[str, Any], namespace: str = "default") -> Any:
        """Create an API object over HTTP as ``kubectl create`` does (admission errors come
        back as :class:`~neuron_dra.common.k8s.errors.KubeError`), or start the simulated
        controller of a Deployment or LeaderWorkerSet (kinds the fake API server does not
        serve)."""
        assert self.kube is not None and self.cp is not None
        if self.has_real_nodes:
            manifest = for_real_nodes(manifest)
        if manifest.get("kind") == "Deployment" and self.is_real:
            deployment = Deployment(self.kube, manifest, namespace, self._pods_by_selector)
            await deployment.start()
            self.cp.workloads.append(deployment)  # type: ignore[arg-type]
            return deployment
        if manifest.get("kind") in WORKLOAD_KINDS:
            return await self.cp.run(manifest, namespace)
        ns = str((manifest.get("metadata") or {}).get("namespace") or namespace)
        api, namespaced = self._resource(str(manifest.get("apiVersion")), str(manifest.get("kind")))
        return await api.create(dict(manifest), ns if namespaced else None)

    async def delete(
        self, api_version: str, kind: str, name: str, namespace: str = "default"
    ) -> None:
        """Delete over HTTP (background propagation, as kubectl); gone already is fine."""
        api, namespaced = self._resource(api_version, kind)
        with contextlib.suppress(NotFoundError):
            await api.delete(name, namespace if namespaced else None)

    async def apply_file(self, path: Path, namespace: str = "default") -> list[Any]:
        """Apply a file of manifests: with the real ``kubectl apply`` on a real world, as a
        user would (what the seeds' examples are), else over HTTP (:meth:`apply`)."""
        docs = [d for d in yaml.safe_load_all(await asyncio.to_thread(path.read_text)) if d]
        if not self.is_real:
            return [await self.apply(doc, namespace) for doc in docs]
        return [await self._kubectl_apply(doc, namespace) for doc in docs]

    async def _kubectl_apply(self, manifest: Mapping[str, Any], namespace: str) -> Any:
        """``kubectl apply -f -`` of one manifest; LeaderWorkerSets (not a Kubernetes kind)
        keep their simulated controller, a Deployment comes back as its handle."""
        assert self.real is not None and self.kube is not None and self.cp is not None
        if manifest.get("kind") == "LeaderWorkerSet":
            return await self.apply(manifest, namespace)
        if self.has_real_nodes:
            manifest = for_real_nodes(manifest)
        proc = await asyncio.create_subprocess_exec(
            str(self.real.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig),
            "apply", "-n", namespace, "-o", "json", "-f", "-",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate(json.dumps(manifest).encode())
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl apply: {err.decode(errors='replace').strip()}")
        created = json.loads(out)
        if manifest.get("kind") == "Deployment":
            deployment = Deployment(self.kube, manifest, namespace, self._pods_by_selector)
            self.cp.workloads.append(deployment)  # type: ignore[arg-type]
            return deployment
        return created

    async def remove(self, workload: PodSet) -> None:
        assert self.cp is not None
        await self.cp.remove(workload)

    async def scale(self, workload: PodSet, replicas: int) -> None:
        """Scale a Deployment (the simulated ReplicaSet, or the real Deployment object)."""
        if isinstance(workload, Deployment):
            await workload.scale(replicas)
        else:
            workload.scale(replicas)  # type: ignore[attr-defined]

    def _pods_by_selector(self, namespace: str, selector: str) -> list[JsonDict]:
        return self.pods(namespace, selector)

    # --- node failures ---------------------------------------------------------------------

    async def fail_node(self, name: str) -> None:
        """The node dies: its kubelet and plugin stop, and the node controller marks the Node
        NotReady (Kubernetes would after the grace period). Its ResourceSlice stays, as it
        does in a real cluster until the node object goes. Its pods, once deleted, stay
        Terminating (no kubelet ends their grace period), and so do the claims they hold;
        a ReplicaSet replaces them at once, as it counts only pods not being deleted."""
        assert self.cp is not None
        self.failed_nodes.add(name)
        if self.real_nodes is not None:
            self.real_nodes.fail(name)
            assert self.kube is not None
            await set_node_ready(self.kube, name, False)
            return
        await self.cp.kubelets[name].stop()
        plugin = self.plugins.pop(name, None)
        if plugin is not None:
            await plugin.stop()
        lease = self.leases.pop(name, None)
        if lease is not None:
            await lease.stop()
        if self.is_real:
            assert self.kube is not None
            await set_node_ready(self.kube, name, False)
        else:
            self._set_ready(name, False)

    async def recover_node(self, name: str) -> None:
        """A failed node comes back (a new boot): its kubelet, plugin and Lease run again and
        it reports Ready; its kubelet then finishes the pods deleted while it was away, and
        the plugin, on a new boot id, forgets what it had prepared."""
        assert self.cp is not None
        self.failed_nodes.discard(name)
        if self.real_nodes is not None:
            self.real_nodes.recover(name)  # the kubelet posts Ready itself
            return
        (self.node_root(name) / "boot_id").write_text(f"sim-boot-{uuid.uuid4()}\n")
        if self.is_real:
            assert self.kube is not None
            lease = NodeLease(self.kube, name)
            lease.start()
            self.leases[name] = lease
            await set_node_ready(self.kube, name, True)
        else:
            self._set_ready(name, True)
        await self.start_plugin(name)
        await self.cp.restart_kubelet(name, self.registrar_dir(name))

    def _set_ready(self, name: str, ready: bool) -> None:
        node = self.api.get("v1", "Node", name)
        assert node is not None
        others = [
            c for c in node.get("status", {}).get("conditions", []) if c.get("type") != "Ready"
        ]
        node.setdefault("status", {})["conditions"] = [*others, ready_condition(ready)]
        self.api.update_status(node)


async def _quietly(aw: Any, what: str) -> None:
    try:
        await aw
    except Exception:
        log.exception("stopping %s failed", what)
