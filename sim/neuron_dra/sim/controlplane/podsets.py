"""Workload controllers in their simplest form: sets of pods, replaced when they go.

- :class:`ReplicaSet` (what a Deployment runs): ``replicas`` pods named by the server from
  ``generateName`` ``<name>-<template hash>-`` (5 random characters follow, as a real
  Deployment's pods are named), labelled
  ``sim.neuron.aws.com/replicaset=<name>``. Like the real ReplicaSet controller it counts only
  *active* pods (neither terminal nor being deleted): a pod being deleted is replaced at once,
  while it is still Terminating (on a dead node it stays so, as in Kubernetes). It remembers
  the pods it created or deleted that its cache does not show yet (the controller's
  "expectations"), so a lagging cache never makes it create or delete twice.
  :meth:`ReplicaSet.scale` changes the count; scaling down deletes unscheduled, then pending,
  then the newest pods first. :meth:`PodSet.current_pods` lists the active pods.
- :class:`Group`: a LeaderWorkerSet-like group of ``size`` pods ``<name>-0`` .. ``<name>-<size-1>``
  with LeaderWorkerSet's labels (``leaderworkerset.sigs.k8s.io/name``, ``group-index`` 0,
  ``worker-index``, ``group-key``) and annotations (``size``; ``leader-name`` on workers);
  index 0 is the leader.
- :class:`LeaderWorkerSet`: ``replicas`` such groups named as LeaderWorkerSet names them
  (leader ``<name>-<g>``, workers ``<name>-<g>-<w>``), from a ``leaderworkerset.x-k8s.io/v1``
  manifest; the ``exclusive-topology`` annotation becomes the required pod affinity and
  anti-affinity LeaderWorkerSet's webhook injects (one group per topology domain).

Groups keep stable pod names, as LeaderWorkerSet's StatefulSets do: a pod is recreated under
its name once the old pod of that name is gone (a pod stuck Terminating on a dead node holds
its name until it is force-deleted, as a StatefulSet's does). With ``restartPolicy``
``RecreateGroupOnPodRestart`` (LeaderWorkerSet's default) a pod of a group that is deleted,
starts terminating or fails, other than by this controller, restarts the whole group: its
other pods are deleted and every pod is recreated. ``None`` (or the deprecated ``Default``)
recreates only that pod; a failed pod is deleted first. Container restarts are not modelled
(the simulated kubelet runs no containers).

:func:`from_manifest` turns an ``apps/v1`` Deployment or a LeaderWorkerSet manifest into the
matching controller, so scenarios run the manifests users write.

There is no owning API object (the fake API server serves no apps/v1 kinds), hence no
ownerReferences: stop the controller with ``delete_pods=True`` to remove its pods.
"""

from __future__ import annotations

import copy
import hashlib
import logging
from collections.abc import Mapping
from typing import Any, Final

from neuron_dra.common.k8s.client import PODS, KubeClient
from neuron_dra.common.k8s.errors import AlreadyExistsError, ConflictError, NotFoundError

from .base import JsonDict, Loop, is_active, is_terminal, is_terminating, meta, uid_of

log = logging.getLogger(__name__)

REPLICASET_LABEL: Final = "sim.neuron.aws.com/replicaset"
LWS_PREFIX: Final = "leaderworkerset.sigs.k8s.io/"
LWS_NAME_LABEL: Final = LWS_PREFIX + "name"
LWS_GROUP_INDEX_LABEL: Final = LWS_PREFIX + "group-index"
LWS_WORKER_INDEX_LABEL: Final = LWS_PREFIX + "worker-index"
LWS_GROUP_KEY_LABEL: Final = LWS_PREFIX + "group-key"
LWS_SIZE_ANNOTATION: Final = LWS_PREFIX + "size"
LWS_LEADER_NAME_ANNOTATION: Final = LWS_PREFIX + "leader-name"
RECREATE_GROUP: Final = "RecreateGroupOnPodRestart"
POD_TEMPLATE_HASH_LABEL: Final = "pod-template-hash"
#: The characters of Kubernetes' SafeEncodeString (no vowels, no look-alikes).
_SAFE_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"
#: LeaderWorkerSet's restart policies; the simulation treats ``RecreateGroupAfterStart`` like
#: ``RecreateGroupOnPodRestart`` and ``Default`` (deprecated) like ``None``.
RESTART_POLICIES: Final = (RECREATE_GROUP, "RecreateGroupAfterStart", "None", "Default")
_RECREATING_POLICIES: Final = (RECREATE_GROUP, "RecreateGroupAfterStart")


class PodSet(Loop[str]):
    """A controller of the pods its label ``selector`` matches (one key: ``reconcile``)."""

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
        self.pods = self.reflector(
            kube.resource(PODS), namespace=namespace, label_selector=self.label_selector
        )
        #: Uids of pods this controller deleted that its cache does not show as deleted yet.
        self._deleting: set[str] = set()
        self.pods.add_handler(
            on_add=self._on_add,
            on_update=self._on_update,
            on_delete=self._on_delete,
        )

    @property
    def label_selector(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(self.selector.items()))

    def _poke(self) -> None:
        self.queue.add("reconcile")

    def _on_add(self, _pod: JsonDict) -> None:
        self._poke()

    def _on_update(self, old: JsonDict, new: JsonDict) -> None:
        if not is_active(new):
            self._deleting.discard(uid_of(new))
        if is_active(old) != is_active(new):
            self._poke()

    def _on_delete(self, pod: JsonDict) -> None:
        self._deleting.discard(uid_of(pod))
        self._poke()

    async def start(self) -> None:
        await super().start()
        self._poke()

    @property
    def expected(self) -> int:
        """How many active pods the set has once it has settled."""
        raise NotImplementedError

    def current_pods(self) -> list[JsonDict]:
        """The set's active pods in its cache (not being deleted, not terminal), by name."""
        pods = [p for p in self.pods.store.list() if is_active(p)]
        return sorted(pods, key=lambda p: str(meta(p).get("name")))

    def pod_names(self) -> list[str]:
        return [str(meta(p).get("name")) for p in self.current_pods()]

    def _pod_body(
        self,
        labels: Mapping[str, str],
        annotations: Mapping[str, str],
        template: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        generate_name: str | None = None,
    ) -> JsonDict:
        template = self.pod_template if template is None else template
        tmeta = template.get("metadata") or {}
        pmeta: JsonDict = {
            "namespace": self.namespace,
            "labels": {**(tmeta.get("labels") or {}), **self.selector, **labels},
            "annotations": {**(tmeta.get("annotations") or {}), **annotations},
        }
        if name:
            pmeta["name"] = name
        else:
            pmeta["generateName"] = generate_name
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": pmeta,
            "spec": copy.deepcopy(template.get("spec") or {}),
        }

    async def _delete(self, pod: JsonDict) -> None:
        """Delete ``pod`` (that very pod: uid precondition) and expect it to go. The
        expectation is set first: the watch may show the deletion before the answer."""
        name, uid = str(meta(pod).get("name")), uid_of(pod)
        self._deleting.add(uid)
        try:
            await self.kube.resource(PODS).delete(name, self.namespace, uid=uid)
        except (NotFoundError, ConflictError):
            self._deleting.discard(uid)
            return
        log.info("%s: deleted pod %s", self.name, name)

    async def stop(self, *, delete_pods: bool = False) -> None:
        await super().stop()
        if delete_pods:
            listed = await self.kube.resource(PODS).list_all(
                self.namespace, label_selector=self.label_selector
            )
            for pod in listed.items:
                if not is_terminating(pod):
                    await self._delete(pod)


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
        #: Names of pods this controller created that its cache does not show yet.
        self._creating: set[str] = set()

    @property
    def expected(self) -> int:
        return self.replicas

    @property
    def template_hash(self) -> str:
        """A stand-in for the Deployment controller's ``pod-template-hash``: stable for a
        template, in the alphabet and length the real one has (``9749b8647``)."""
        digest = hashlib.sha256(repr(sorted(self.pod_template.items())).encode()).digest()
        return "".join(_SAFE_ALPHABET[b % len(_SAFE_ALPHABET)] for b in digest[:9])

    def _on_add(self, pod: JsonDict) -> None:
        self._creating.discard(str(meta(pod).get("name")))
        super()._on_add(pod)

    def _on_delete(self, pod: JsonDict) -> None:
        self._creating.discard(str(meta(pod).get("name")))
        super()._on_delete(pod)

    def scale(self, replicas: int) -> None:
        if replicas < 0:
            raise ValueError("replicas must be >= 0")
        self.replicas = replicas
        self._poke()

    async def sync(self, key: str) -> None:
        active = [p for p in self.current_pods() if uid_of(p) not in self._deleting]
        missing = self.replicas - len(active) - len(self._creating)
        api = self.kube.resource(PODS)
        for _ in range(max(missing, 0)):
            # A Deployment's ReplicaSet is <deployment>-<pod-template-hash>, and its pods
            # <replicaset>-<5 random characters>, as the real controllers name them.
            body = self._pod_body(
                {POD_TEMPLATE_HASH_LABEL: self.template_hash},
                {},
                generate_name=f"{self.set_name}-{self.template_hash}-",
            )
            created = await api.create(body, self.namespace)
            name = str(meta(created).get("name"))
            if self.pods.store.get(f"{self.namespace}/{name}") is None:
                self._creating.add(name)
            log.info("%s: created pod %s", self.name, name)
        if missing < 0:
            for pod in sorted(active, key=_deletion_rank)[:-missing]:
                await self._delete(pod)


_PHASE_RANK: Final = {"Pending": 0, "Unknown": 1, "Running": 2}


def _deletion_rank(pod: JsonDict) -> tuple[bool, int, str, str]:
    """Scale-down order (first goes first): unscheduled, then by phase, then the newest."""
    status = pod.get("status") or {}
    created = str(meta(pod).get("creationTimestamp") or "")
    return (
        bool((pod.get("spec") or {}).get("nodeName")),
        _PHASE_RANK.get(str(status.get("phase") or "Pending"), 0),
        _inverted(created),
        _inverted(str(meta(pod).get("name"))),
    )


def _inverted(text: str) -> str:
    """Sorts in the reverse order of ``text`` (for newest first within a tuple key)."""
    return "".join(chr(0x10FFFF - ord(c)) for c in text)


class StablePodSet(PodSet):
    """Pods with stable names (:meth:`desired`), in groups (label ``group-index``)."""

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        name: str,
        pod_template: Mapping[str, Any],
        selector: Mapping[str, str],
        *,
        restart_policy: str = RECREATE_GROUP,
    ) -> None:
        if restart_policy not in RESTART_POLICIES:
            raise ValueError(f"restartPolicy must be one of {', '.join(RESTART_POLICIES)}")
        super().__init__(kube, namespace, name, pod_template, selector)
        self.restart_policy = restart_policy
        #: Groups to restart: one of their pods went without this controller deleting it.
        self._restart: set[str] = set()

    def desired(self) -> dict[str, JsonDict]:
        raise NotImplementedError

    @property
    def expected(self) -> int:
        return len(self.desired())

    def pod_names(self) -> list[str]:
        return sorted(self.desired())

    def _lost(self, pod: JsonDict) -> None:
        """A pod went (deleted, terminating, failed) and not by our hand."""
        if uid_of(pod) in self._deleting:
            return
        group = (meta(pod).get("labels") or {}).get(LWS_GROUP_INDEX_LABEL)
        if group is not None and self.restart_policy in _RECREATING_POLICIES:
            self._restart.add(str(group))

    def _on_update(self, old: JsonDict, new: JsonDict) -> None:
        if is_active(old) and not is_active(new):
            self._lost(new)
        super()._on_update(old, new)

    def _on_delete(self, pod: JsonDict) -> None:
        if is_active(pod):
            self._lost(pod)
        super()._on_delete(pod)

    async def sync(self, key: str) -> None:
        cached = {str(meta(p).get("name")): p for p in self.pods.store.list()}
        want = self.desired()
        restart, self._restart = self._restart, set()
        for pod in cached.values():
            group = (meta(pod).get("labels") or {}).get(LWS_GROUP_INDEX_LABEL)
            gone = str(meta(pod).get("name")) not in want
            if (
                not is_terminating(pod)
                and uid_of(pod) not in self._deleting
                and (gone or group in restart or is_terminal(pod))
            ):
                await self._delete(pod)
        api = self.kube.resource(PODS)
        for name, body in want.items():
            if name in cached:
                continue  # running, or its old pod is still going: recreated once it is gone
            try:
                await api.create(body, self.namespace)
                log.info("%s: created pod %s", self.name, name)
            except AlreadyExistsError:
                pass  # our cache is behind; its event brings us back


class Group(StablePodSet):
    """A LeaderWorkerSet-like group: one leader (index 0) and ``size - 1`` workers."""

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        name: str,
        pod_template: Mapping[str, Any],
        *,
        size: int = 4,
        restart_policy: str = RECREATE_GROUP,
    ) -> None:
        if size < 1:
            raise ValueError("size must be >= 1")
        super().__init__(
            kube,
            namespace,
            name,
            pod_template,
            {LWS_NAME_LABEL: name},
            restart_policy=restart_policy,
        )
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
            out[name] = self._pod_body(labels, annotations, name=name)
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


class LeaderWorkerSet(StablePodSet):
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
        restart_policy: str = RECREATE_GROUP,
    ) -> None:
        if replicas < 0 or size < 1:
            raise ValueError("replicas must be >= 0 and size >= 1")
        super().__init__(
            kube,
            namespace,
            name,
            worker_template,
            {LWS_NAME_LABEL: name},
            restart_policy=restart_policy,
        )
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
                pod = self._pod_body(labels, annotations, template, name=pod_name)
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
        policy = str(lwt.get("restartPolicy") or RECREATE_GROUP)
        if policy not in RESTART_POLICIES:
            raise ManifestError(
                f"LeaderWorkerSet {name}: spec.leaderWorkerTemplate.restartPolicy {policy!r} is "
                f"not one of {', '.join(RESTART_POLICIES)}"
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
            restart_policy=policy,
        )
    raise ManifestError(
        f"{kind} {name}: the simulated cluster runs Deployments and LeaderWorkerSets only"
    )
