"""Workload controllers in their simplest form: a fixed set of pods, recreated when deleted.

- :class:`ReplicaSet`: ``replicas`` pods named ``<name>-<i>`` (stable names instead of
  random suffixes, so scenarios can name them), labelled ``sim.neuron.aws.com/replicaset``;
  :meth:`ReplicaSet.scale` changes the count (the highest indexes go first).
- :class:`Group`: a LeaderWorkerSet-like group of ``size`` pods ``<name>-0`` .. ``<name>-<size-1>``
  with LeaderWorkerSet's labels (``leaderworkerset.sigs.k8s.io/name``, ``group-index`` 0,
  ``worker-index``, ``group-key``) and annotations (``size``; ``leader-name`` on workers);
  index 0 is the leader.
- :class:`LeaderWorkerSet`: ``replicas`` such groups named as LeaderWorkerSet names them
  (leader ``<name>-<g>``, workers ``<name>-<g>-<w>``), from a ``leaderworkerset.x-k8s.io/v1``
  manifest; the ``exclusive-topology`` annotation becomes the required pod affinity and
  anti-affinity LeaderWorkerSet's webhook injects (one group per topology domain).

:func:`from_manifest` turns an ``apps/v1`` Deployment or a LeaderWorkerSet manifest into the
matching controller, so scenarios run the manifests users write.

There is no owning API object (the fake API server serves no apps/v1 kinds), hence no
ownerReferences: stop the controller with ``delete_pods=True`` to remove its pods.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
from collections.abc import Mapping
from typing import Any, Final

from neuron_dra.common.k8s.client import PODS, KubeClient
from neuron_dra.common.k8s.errors import AlreadyExistsError, NotFoundError

from .base import JsonDict, Loop, meta

log = logging.getLogger(__name__)

REPLICASET_LABEL: Final = "sim.neuron.aws.com/replicaset"
INDEX_LABEL: Final = "sim.neuron.aws.com/index"
LWS_PREFIX: Final = "leaderworkerset.sigs.k8s.io/"
LWS_NAME_LABEL: Final = LWS_PREFIX + "name"
LWS_GROUP_INDEX_LABEL: Final = LWS_PREFIX + "group-index"
LWS_WORKER_INDEX_LABEL: Final = LWS_PREFIX + "worker-index"
LWS_GROUP_KEY_LABEL: Final = LWS_PREFIX + "group-key"
LWS_SIZE_ANNOTATION: Final = LWS_PREFIX + "size"
LWS_LEADER_NAME_ANNOTATION: Final = LWS_PREFIX + "leader-name"


class PodSet(Loop[str]):
    """Keeps exactly the pods of :meth:`desired` in existence (by name)."""

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        name: str,
        pod_template: Mapping[str, Any],
        selector: Mapping[str, str],
    ) -> None:
        super().__init__(f"sim-podset-{namespace}-{name}")
        self.kube = kube
        self.namespace = namespace
        self.set_name = name
        self.pod_template = copy.deepcopy(dict(pod_template))
        self.selector = dict(selector)
        label_selector = ",".join(f"{k}={v}" for k, v in sorted(self.selector.items()))
        self.pods = self.reflector(
            kube.resource(PODS), namespace=namespace, label_selector=label_selector
        )
        self.pods.add_handler(
            on_add=self._poke,
            on_update=lambda _old, _new: None,
            on_delete=self._poke,
        )

    def _poke(self, _obj: JsonDict | None = None) -> None:
        self.queue.add("reconcile")

    async def start(self) -> None:
        await super().start()
        self._poke()

    def desired(self) -> dict[str, JsonDict]:
        raise NotImplementedError

    def _pod(
        self,
        name: str,
        labels: Mapping[str, str],
        annotations: Mapping[str, str],
        template: Mapping[str, Any] | None = None,
    ) -> JsonDict:
        template = self.pod_template if template is None else template
        tmeta = template.get("metadata") or {}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {**(tmeta.get("labels") or {}), **self.selector, **labels},
                "annotations": {**(tmeta.get("annotations") or {}), **annotations},
            },
            "spec": copy.deepcopy(template.get("spec") or {}),
        }

    def pod_names(self) -> list[str]:
        return sorted(self.desired())

    async def sync(self, key: str) -> None:
        want = self.desired()
        have = {str(meta(p).get("name")): p for p in self.pods.store.list()}
        api = self.kube.resource(PODS)
        for name, pod in want.items():
            if name not in have:
                try:
                    await api.create(pod, self.namespace)
                    log.info("%s: created pod %s", self.name, name)
                except AlreadyExistsError:
                    pass  # our cache is behind (or an old pod is still being deleted)
        for name, pod in have.items():
            if name not in want and not meta(pod).get("deletionTimestamp"):
                with contextlib.suppress(NotFoundError):
                    await api.delete(name, self.namespace)

    async def stop(self, *, delete_pods: bool = False) -> None:
        await super().stop()
        if delete_pods:
            for name in self.desired():
                with contextlib.suppress(NotFoundError):
                    await self.kube.resource(PODS).delete(name, self.namespace)


class ReplicaSet(PodSet):
    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        name: str,
        replicas: int,
        pod_template: Mapping[str, Any],
    ) -> None:
        if replicas < 0:
            raise ValueError("replicas must be >= 0")
        super().__init__(kube, namespace, name, pod_template, {REPLICASET_LABEL: name})
        self.replicas = replicas

    def desired(self) -> dict[str, JsonDict]:
        return {
            f"{self.set_name}-{i}": self._pod(f"{self.set_name}-{i}", {INDEX_LABEL: str(i)}, {})
            for i in range(self.replicas)
        }

    def scale(self, replicas: int) -> None:
        if replicas < 0:
            raise ValueError("replicas must be >= 0")
        self.replicas = replicas
        self._poke()


class Group(PodSet):
    """A LeaderWorkerSet-like group: one leader (index 0) and ``size - 1`` workers."""

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        name: str,
        pod_template: Mapping[str, Any],
        *,
        size: int = 4,
    ) -> None:
        if size < 1:
            raise ValueError("size must be >= 1")
        super().__init__(kube, namespace, name, pod_template, {LWS_NAME_LABEL: name})
        self.size = size
        self.group_key = _group_key(namespace, name, 0)

    @property
    def leader_name(self) -> str:
        return f"{self.set_name}-0"

    def desired(self) -> dict[str, JsonDict]:
        out: dict[str, JsonDict] = {}
        for i in range(self.size):
            name = f"{self.set_name}-{i}"
            labels = {
                LWS_GROUP_INDEX_LABEL: "0",
                LWS_WORKER_INDEX_LABEL: str(i),
                LWS_GROUP_KEY_LABEL: self.group_key,
            }
            annotations = {LWS_SIZE_ANNOTATION: str(self.size)}
            if i:
                annotations[LWS_LEADER_NAME_ANNOTATION] = self.leader_name
            out[name] = self._pod(name, labels, annotations)
        return out


LWS_EXCLUSIVE_TOPOLOGY_ANNOTATION: Final = LWS_PREFIX + "exclusive-topology"


def _group_key(namespace: str, name: str, group: int) -> str:
    return hashlib.sha1(f"{namespace}/{name}/{group}".encode()).hexdigest()


def exclusive_topology_affinity(group_key: str, topology_key: str) -> JsonDict:
    """What LeaderWorkerSet injects for ``exclusive-topology``: every pod of a group in the
    same topology domain, and no other group's pods in it."""
    return {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [
                            {"key": LWS_GROUP_KEY_LABEL, "operator": "In", "values": [group_key]}
                        ]
                    },
                    "topologyKey": topology_key,
                }
            ]
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [
                            {"key": LWS_GROUP_KEY_LABEL, "operator": "Exists"},
                            {
                                "key": LWS_GROUP_KEY_LABEL,
                                "operator": "NotIn",
                                "values": [group_key],
                            },
                        ]
                    },
                    "topologyKey": topology_key,
                }
            ]
        },
    }


class LeaderWorkerSet(PodSet):
    """``replicas`` groups of ``size`` pods: leader ``<name>-<g>``, workers ``<name>-<g>-<w>``."""

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        name: str,
        *,
        replicas: int,
        size: int,
        worker_template: Mapping[str, Any],
        leader_template: Mapping[str, Any] | None = None,
        exclusive_topology: str | None = None,
    ) -> None:
        if replicas < 0 or size < 1:
            raise ValueError("replicas must be >= 0 and size >= 1")
        super().__init__(kube, namespace, name, worker_template, {LWS_NAME_LABEL: name})
        self.replicas = replicas
        self.size = size
        self.leader_template = copy.deepcopy(dict(leader_template or worker_template))
        self.exclusive_topology = exclusive_topology

    def group_pod_names(self, group: int) -> list[str]:
        leader = f"{self.set_name}-{group}"
        return [leader, *(f"{leader}-{w}" for w in range(1, self.size))]

    def desired(self) -> dict[str, JsonDict]:
        out: dict[str, JsonDict] = {}
        for g in range(self.replicas):
            key = _group_key(self.namespace, self.set_name, g)
            names = self.group_pod_names(g)
            for w, pod_name in enumerate(names):
                labels = {
                    LWS_GROUP_INDEX_LABEL: str(g),
                    LWS_WORKER_INDEX_LABEL: str(w),
                    LWS_GROUP_KEY_LABEL: key,
                }
                annotations = {LWS_SIZE_ANNOTATION: str(self.size)}
                if w:
                    annotations[LWS_LEADER_NAME_ANNOTATION] = names[0]
                template = self.leader_template if w == 0 else self.pod_template
                pod = self._pod(pod_name, labels, annotations, template)
                if self.exclusive_topology:
                    pod["spec"]["affinity"] = {
                        **(pod["spec"].get("affinity") or {}),
                        **exclusive_topology_affinity(key, self.exclusive_topology),
                    }
                out[pod_name] = pod
        return out


class ManifestError(ValueError):
    """A workload manifest the simulated controllers cannot run (says what to change)."""


def from_manifest(kube: KubeClient, manifest: Mapping[str, Any], namespace: str) -> PodSet:
    """The controller for an ``apps/v1`` Deployment or a ``leaderworkerset.x-k8s.io/v1``
    LeaderWorkerSet manifest (not started)."""
    kind = manifest.get("kind")
    mmeta = manifest.get("metadata") or {}
    name = str(mmeta.get("name") or "")
    ns = str(mmeta.get("namespace") or namespace)
    spec = manifest.get("spec") or {}
    if kind == "Deployment":
        template = spec.get("template") or {}
        selector = (spec.get("selector") or {}).get("matchLabels") or {}
        labels = (template.get("metadata") or {}).get("labels") or {}
        if any(labels.get(k) != v for k, v in selector.items()):
            raise ManifestError(
                f"Deployment {name}: spec.selector.matchLabels {selector} does not match "
                f"spec.template.metadata.labels {labels}"
            )
        return ReplicaSet(kube, ns, name, int(spec.get("replicas", 1)), template)
    if kind == "LeaderWorkerSet":
        lwt = spec.get("leaderWorkerTemplate") or {}
        worker = lwt.get("workerTemplate")
        if not worker:
            raise ManifestError(
                f"LeaderWorkerSet {name}: spec.leaderWorkerTemplate.workerTemplate is required"
            )
        return LeaderWorkerSet(
            kube,
            ns,
            name,
            replicas=int(spec.get("replicas", 1)),
            size=int(lwt.get("size", 1)),
            worker_template=worker,
            leader_template=lwt.get("leaderTemplate"),
            exclusive_topology=(mmeta.get("annotations") or {}).get(
                LWS_EXCLUSIVE_TOPOLOGY_ANNOTATION
            ),
        )
    raise ManifestError(
        f"{kind} {name}: the simulated cluster runs Deployments and LeaderWorkerSets only"
    )
