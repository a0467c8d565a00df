"""The workload reconciler's read side: the caches as our own writes left them, and the fleet
as the allocator sees it.

Reads from a cache can lag our own writes by a watch round-trip. Re-planning from such a
cache would plan the units we just wrote a second time, so the objects our writes returned
are overlaid on the cache until the cache has caught up (the idea of client-go's mutation
cache). The allocator's view (NeuronUltraServer objects → server states → free units) and
each node's health are kept between decisions and brought up to date from what changed, so
a decision does not re-derive 2,500 UltraServers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from neuron_dra.common.k8s.cache import Store
from neuron_dra.common.k8s.client import object_key, resource_version
from neuron_dra.controller.allocation.cache import ServerCache
from neuron_dra.controller.allocation.unitindex import UnitIndex
from neuron_dra.controller.caches import (
    SLICES_BY_NODE,
    claim_nodes_in_use,
    ensure_slices_by_node,
    slice_node_name,
)
from neuron_dra.controller.context import ControllerContext
from neuron_dra.controller.storechanges import StoreChanges

from .health import node_problem
from .model import (
    CLAIMS_BY_WORKLOAD,
    NUS_BY_WORKLOAD,
    JsonDict,
    allocation_refs,
    claim_workload,
    count,
    nus_instance_type,
)

#: Index of ``ctx.device_claims``: node → claims of no workload holding its devices.
CLAIMS_BY_NODE_IN_USE = "controller/claims-by-node-in-use"


def _first_node_in_use(claim: Mapping[str, Any]) -> str | None:
    # A claim's devices are on one node (node-local devices), so one name stands for it.
    nodes = claim_nodes_in_use(claim)
    return nodes[0] if nodes else None


def _rv_int(obj: JsonDict) -> int | None:
    try:
        return int(resource_version(obj))
    except ValueError:
        return None


def _newer(ours: JsonDict, cached: JsonDict) -> bool:
    """Whether the object our write returned is newer than the cached one.

    resourceVersions are opaque by contract but etcd revisions in practice; if either does not
    parse we trust the cache (the overlay is an optimisation against re-planning on stale
    reads, never the source of truth: every write is RV-guarded anyway).
    """
    a, b = _rv_int(ours), _rv_int(cached)
    return a is not None and b is not None and a > b


@dataclass
class Overlay:
    """Objects our own writes returned, newer than the cache until its watch catches up."""

    objects: dict[str, JsonDict] = field(default_factory=dict)

    def remember(self, obj: JsonDict) -> None:
        self.objects[object_key(obj)] = obj

    def view(self, store: Store, key: str) -> JsonDict | None:
        cached = store.get(key)
        ours = self.objects.get(key)
        if cached is None:
            # Gone from the cache (or not there yet): we never create these objects, so our
            # copy cannot be newer than "absent" in a way that matters; forget it.
            self.objects.pop(key, None)
            return None
        if ours is not None and _newer(ours, cached):
            return ours
        self.objects.pop(key, None)
        return cached

    def list(self, store: Store) -> list[JsonDict]:
        out = []
        for key in list(store.keys()):
            obj = self.view(store, key)
            if obj is not None:
                out.append(obj)
        return out

    def keys(self) -> set[str]:
        return set(self.objects)


class Fleet:
    """What the reconciler reads: workloads, NeuronUltraServers and templates with our own
    writes overlaid, node health, and the free-unit index."""

    def __init__(self, ctx: ControllerContext) -> None:
        self.ctx = ctx
        self._nus_overlay = Overlay()
        self._workload_overlay = Overlay()
        #: Templates we created that the cache may not have delivered yet (key → object).
        self._created_templates: dict[str, JsonDict] = {}
        ensure_slices_by_node(ctx.slices)
        if NUS_BY_WORKLOAD not in ctx.ultraservers.index_names():
            ctx.ultraservers.add_index(NUS_BY_WORKLOAD, allocation_refs)
        if CLAIMS_BY_WORKLOAD not in ctx.claims.index_names():
            ctx.claims.add_index(CLAIMS_BY_WORKLOAD, claim_workload)
        #: node name → node_problem(), forgotten for a node when its Node or slices change.
        self._problems: dict[str, str | None] = {}
        self._node_changes = StoreChanges(ctx.nodes)
        self._slice_changes = StoreChanges(ctx.slices, slice_node_name)
        # NUS objects → states (``_servers``) → free units (``units``), from what changed.
        self._nus_changes = StoreChanges(ctx.ultraservers)
        if CLAIMS_BY_NODE_IN_USE not in ctx.device_claims.index_names():
            ctx.device_claims.add_index(CLAIMS_BY_NODE_IN_USE, claim_nodes_in_use)
        self._claim_changes = StoreChanges(ctx.device_claims, _first_node_in_use)
        self._servers = ServerCache(lambda n: self._problem_of(n) is None, self._in_use)
        self.units = UnitIndex()
        #: NUS key → the object as last synced; what the objects say in total: how many
        #: are of each ``nus_instance_type`` (the Validator's "discovered types") and how
        #: many record each workloadRef (a workload holding nothing is waiting).
        self._synced_nus: dict[str, JsonDict] = {}
        self.type_counts: Counter[str] = Counter()
        self.held_refs: Counter[str] = Counter()
        #: NUS keys our overlay covered at the last sync (its view of them may change
        #: without any cache event).
        self._overlaid: set[str] = set()

    # --- our writes ------------------------------------------------------------------------

    def remember_nus(self, obj: JsonDict) -> None:
        self._nus_overlay.remember(obj)

    def remember_workload(self, obj: JsonDict) -> None:
        self._workload_overlay.remember(obj)

    def remember_template(self, key: str, obj: JsonDict) -> None:
        self._created_templates[key] = obj

    # --- objects ---------------------------------------------------------------------------

    def caches_synced(self) -> bool:
        ctx = self.ctx
        stores = (ctx.slices, ctx.nodes, ctx.ultraservers, ctx.workloads, ctx.device_claims)
        return all(s.has_synced() for s in stores)

    def ultraservers(self) -> list[JsonDict]:
        return self._nus_overlay.list(self.ctx.ultraservers)

    def workloads(self) -> list[JsonDict]:
        return self._workload_overlay.list(self.ctx.workloads)

    def workload(self, key: str) -> JsonDict | None:
        return self._workload_overlay.view(self.ctx.workloads, key)

    def nus_named(self, name: str) -> JsonDict | None:
        return self._nus_overlay.view(self.ctx.ultraservers, f"{self.ctx.namespace}/{name}")

    def nus_holding(self, ref: str) -> list[JsonDict]:
        """The NeuronUltraServers (as we last wrote or cached them) that may record ``ref``:
        those the index names plus our overlay; a superset, ``holdings`` filters."""
        store = self.ctx.ultraservers
        overlay = self._nus_overlay
        keys = set(store.index_keys(NUS_BY_WORKLOAD, ref)) | overlay.keys()
        return [nus for key in sorted(keys) if (nus := overlay.view(store, key)) is not None]

    def template(self, key: str) -> JsonDict | None:
        """The cached template, or the one we just created while the cache has not caught up
        with our create (judged by the cache's resourceVersion, so a template deleted after
        we created it is not mistaken for present)."""
        cached = self.ctx.templates.get(key)
        mine = self._created_templates.get(key)
        if cached is not None or mine is None:
            self._created_templates.pop(key, None)
            return cached
        try:
            behind = int(self.ctx.templates.resource_version or 0) < int(resource_version(mine))
        except ValueError:
            behind = False
        if behind:
            return mine
        self._created_templates.pop(key, None)
        return None

    def slices_of(self, node: str) -> list[JsonDict]:
        return self.ctx.slices.by_index(SLICES_BY_NODE, node)

    # --- node health -----------------------------------------------------------------------

    def _refresh_health(self) -> None:
        """Forget what was remembered about nodes whose Node or slices changed; note the
        nodes whose devices claims of no workload took or gave back."""
        for node in self._node_changes.drain() | self._slice_changes.drain():
            self._problems.pop(node, None)
            self._servers.node_changed(node)
        for node in self._claim_changes.drain():
            self._servers.node_changed(node)

    def _in_use(self, node: str) -> bool:
        return bool(self.ctx.device_claims.index_keys(CLAIMS_BY_NODE_IN_USE, node))

    def node_problems(self, names: Iterable[str]) -> dict[str, str]:
        """``node_problem`` of each node that has one, remembered until its Node or
        ResourceSlices change."""
        out: dict[str, str] = {}
        for name in names:
            self._refresh_health()
            problem = self._problem_of(name)
            if problem is not None:
                out[name] = problem
        return out

    def _problem_of(self, name: str) -> str | None:
        # Without a refresh: for use while the fleet is synced (refreshed once up front).
        try:
            return self._problems[name]
        except KeyError:
            problem = node_problem(self.ctx.nodes.get(name), self.slices_of(name))
            self._problems[name] = problem
            return problem

    # --- the allocator's view --------------------------------------------------------------

    def sync_nus(self) -> None:
        """Catch up with the NeuronUltraServers (as we last wrote or cached them) that
        changed since the last sync: only those are looked at."""
        store = self.ctx.ultraservers
        overlay = self._nus_overlay
        for key in self._nus_changes.drain() | self._overlaid | overlay.keys():
            nus = overlay.view(store, key)
            before = self._synced_nus.get(key)
            if nus is before:
                continue
            self._servers.put(key, nus)
            if before is not None:
                del self._synced_nus[key]
                count(self.type_counts, [nus_instance_type(before)], -1)
                count(self.held_refs, set(allocation_refs(before)), -1)
            if nus is not None:
                self._synced_nus[key] = nus
                count(self.type_counts, [nus_instance_type(nus)], +1)
                count(self.held_refs, set(allocation_refs(nus)), +1)
        self._overlaid = overlay.keys()

    def sync(self) -> UnitIndex:
        """Bring the free-unit index up to date with the caches and our overlay: only the
        NeuronUltraServers and nodes that changed since the last sync are looked at."""
        self._refresh_health()
        self.sync_nus()
        for name, state in self._servers.changes():
            if state is None:
                self.units.remove(name)
            else:
                self.units.set(state)
        return self.units
