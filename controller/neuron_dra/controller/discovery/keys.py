"""Which UltraServers an event concerns (the work-queue keys), and the slice indexes that
answer it without scanning every slice of the cluster."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from neuron_dra.common.k8s.cache import Store
from neuron_dra.controller.caches import SLICES_BY_NODE, ensure_slices_by_node
from neuron_dra.controller.context import ControllerContext

from .fields import as_mapping, slice_ultraserver_id
from .naming import ultraserver_id_of

JsonDict = dict[str, Any]

#: Secondary indexes this reconciler needs on ``ctx.slices`` (if the manager has not added
#: them): without them every reconcile and every Node event would scan all slices of the
#: cluster. The node index is the slice cache's own, which the workload fleet shares.
SLICE_INDEX_ULTRASERVER: Final = "discovery.neuron.aws.com/ultraserverId"
SLICE_INDEX_NODE: Final = SLICES_BY_NODE


def keys_for_slice(slice_: Any, old: Any = None) -> set[str]:
    """UltraServer ids to reconcile after a ResourceSlice event.

    Pass the previous object on updates: a slice whose ``ultraserverId`` changed must requeue
    the UltraServer it left as well as the one it joined.
    """
    keys: set[str] = set()
    for obj in (slice_, old):
        if isinstance(obj, Mapping):
            us_id = slice_ultraserver_id(obj)
            if us_id:
                keys.add(us_id)
    return keys


def keys_for_node(node: Any, ctx: ControllerContext) -> set[str]:
    """UltraServer ids whose member is this Node (Ready flips change their health)."""
    name = as_mapping(as_mapping(node).get("metadata")).get("name")
    if not isinstance(name, str) or not name:
        return set()
    ensure_slice_indexes(ctx.slices)
    return {
        us_id
        for s in ctx.slices.by_index(SLICE_INDEX_NODE, name)
        if (us_id := slice_ultraserver_id(s))
    }


def keys_for_ultraserver(nus: Any) -> set[str]:
    """The UltraServer id of a NUS event (so objects whose nodes vanished get reconciled)."""
    us_id = ultraserver_id_of(nus) if isinstance(nus, Mapping) else None
    return {us_id} if us_id else set()


def _index_ultraserver(obj: JsonDict) -> list[str]:
    us_id = slice_ultraserver_id(obj)
    return [us_id] if us_id else []


def ensure_slice_indexes(store: Store) -> None:
    names = store.index_names()
    if SLICE_INDEX_ULTRASERVER not in names:
        store.add_index(SLICE_INDEX_ULTRASERVER, _index_ultraserver)
    ensure_slices_by_node(store)
