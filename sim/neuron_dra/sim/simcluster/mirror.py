"""What the simulated cluster reads, as watch-fed copies: the same ``get``/``list`` calls the
fake API server answers in-process, answered from reflectors on any API server.

On the fake API server the simulated cluster reads the store directly; on a real control
plane it reads this mirror, which every watch event updates and whose ``listeners`` fire on
each change, so ``SimCluster.wait_until`` stays event-driven in both worlds.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Any, Protocol

from neuron_dra.common.k8s.cache import Store
from neuron_dra.common.k8s.client import (
    DEVICE_CLASSES,
    EVENTS,
    NEURON_ULTRASERVER_WORKLOADS,
    NEURON_ULTRASERVERS,
    NODES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    ApiResource,
    KubeClient,
)
from neuron_dra.common.k8s.reflector import Reflector
from neuron_dra.sim.fakeapi.selectors import label_matcher

JsonDict = dict[str, Any]

#: The kinds the simulated cluster, its walkthrough and the e2e tests read.
MIRRORED: tuple[ApiResource, ...] = (
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_SLICES,
    DEVICE_CLASSES,
    NEURON_ULTRASERVERS,
    NEURON_ULTRASERVER_WORKLOADS,
    EVENTS,
)


class ClusterReader(Protocol):
    """Reads by apiVersion and kind: the fake API server in-process, or a :class:`ClusterMirror`."""

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> JsonDict | None: ...

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
    ) -> list[JsonDict]: ...


class ClusterMirror:
    def __init__(self, kube: KubeClient, resources: tuple[ApiResource, ...] = MIRRORED) -> None:
        self.listeners: list[Callable[..., None]] = []
        self._by_kind: dict[tuple[str, str], Reflector] = {}
        for res in resources:
            reflector = Reflector(kube.resource(res), Store(), name=f"mirror-{res.plural}")
            reflector.add_handler(
                on_add=self._changed,
                on_update=lambda _old, _new: self._changed(),
                on_delete=self._changed,
            )
            self._by_kind[(res.api_version, res.kind)] = reflector

    def _changed(self, *_args: Any) -> None:
        for listener in list(self.listeners):
            listener()

    async def start(self) -> None:
        for reflector in self._by_kind.values():
            reflector.start()
        await asyncio.gather(*(r.wait_synced() for r in self._by_kind.values()))

    async def stop(self) -> None:
        for reflector in self._by_kind.values():
            await reflector.stop()

    def resource(self, api_version: str, kind: str) -> ApiResource | None:
        reflector = self._by_kind.get((api_version, kind))
        return None if reflector is None else reflector.api.resource

    def _store(self, api_version: str, kind: str) -> Store:
        try:
            return self._by_kind[(api_version, kind)].store
        except KeyError:
            raise KeyError(f"{api_version} {kind} is not mirrored") from None

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> JsonDict | None:
        obj = self._store(api_version, kind).get_by_name(name, namespace)
        return None if obj is None else copy.deepcopy(obj)

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
    ) -> list[JsonDict]:
        match = label_matcher(label_selector)
        out = []
        for obj in self._store(api_version, kind).list():
            if namespace is not None and (obj.get("metadata") or {}).get("namespace") != namespace:
                continue
            if match is not None and not match(obj):
                continue
            out.append(copy.deepcopy(obj))
        return sorted(
            out, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"])
        )
