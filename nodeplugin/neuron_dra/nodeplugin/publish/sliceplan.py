"""From the slices we have to the slices we want: the publisher's pure decisions.

:func:`plan_slices` turns our existing ResourceSlices and the desired ones
(:func:`~.slices.build_resource_slices`) into the writes that converge them, choosing the
pool generation (as the Go helper does, every content change moves the whole pool to
a new ``pool.generation``, since consumers trust only the highest generation of a pool).
:func:`slice_resync_reason` and :func:`node_slice_facts` decide which watch events are worth
a sync; :func:`published_attributes` is what the published slices offer to Prepare.

No I/O: :mod:`.publisher` reads the watch caches and writes the plan.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from neuron_dra.common.constants import (
    LABEL_CAPACITY_BLOCK_ID,
    LABEL_INSTANCE_TYPE,
    NETWORK_NODE_LAYER_ATTRIBUTES,
)
from neuron_dra.common.k8s.client.resources import resource_version
from neuron_dra.nodeplugin.publish.slices import next_generation, slice_content_changed
from neuron_dra.nodeplugin.publish.taints import carry_time_added

JsonDict = dict[str, Any]

#: Node labels the slices depend on (attributes; the instance type is discovery's fallback):
#: a change to one of these means a sync.
SLICE_NODE_LABELS: Final[frozenset[str]] = frozenset(
    {
        LABEL_CAPACITY_BLOCK_ID,
        LABEL_INSTANCE_TYPE,
        *(label for label, _ in NETWORK_NODE_LAYER_ATTRIBUTES),
    }
)


def slice_name_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def is_own_slice(obj: Mapping[str, Any], node_name: str, driver_name: str) -> bool:
    spec = obj.get("spec") or {}
    return spec.get("driver") == driver_name and spec.get("nodeName") == node_name


def pool_generation(obj: Mapping[str, Any]) -> int:
    value = ((obj.get("spec") or {}).get("pool") or {}).get("generation", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _owner_uids(obj: Mapping[str, Any]) -> list[str]:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return sorted(str(r.get("uid")) for r in refs if isinstance(r, Mapping))


def slice_up_to_date(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether ``current`` already is ``desired``: same content, generation and owner.

    The owner matters too: a Node deleted and re-created under the same name has a new uid, and
    slices owned by the old one would be garbage-collected.
    """
    return (
        not slice_content_changed(current, desired)
        and pool_generation(current) == pool_generation(desired)
        and _owner_uids(current) == _owner_uids(desired)
    )


def _with_generation(obj: Mapping[str, Any], generation: int) -> JsonDict:
    out = copy.deepcopy(dict(obj))
    out["spec"]["pool"]["generation"] = generation
    return out


#: Metadata others may have put on our slices that a PUT of ours should keep.
_PRESERVED_METADATA: Final = ("labels", "annotations", "finalizers")


@dataclass(frozen=True)
class SlicePlan:
    """The writes that turn the existing slices into the desired ones."""

    generation: int
    #: The desired slices, all at ``generation``.
    desired: tuple[JsonDict, ...]
    create: tuple[JsonDict, ...] = ()
    #: Full objects to PUT, guarded by the existing ``metadata.resourceVersion``.
    update: tuple[JsonDict, ...] = ()
    #: (name, resourceVersion) of slices to delete, RV-guarded.
    delete: tuple[tuple[str, str], ...] = ()

    @property
    def writes(self) -> int:
        return len(self.create) + len(self.update) + len(self.delete)


def plan_slices(
    existing: Sequence[Mapping[str, Any]],
    desired: Sequence[Mapping[str, Any]],
    *,
    previous_generation: int | None = None,
) -> SlicePlan:
    """Plan the writes from ``existing`` (our slices as the API has them) to ``desired``.

    ``desired`` may carry any generation: the plan picks it (slices.next_generation: unchanged
    content keeps the generation, any change moves the whole pool past the highest one).
    ``previous_generation`` is the highest generation this process published; when slices are
    missing (the kubelet deleted them) the recreated pool goes above it, so a consumer that
    still holds the deleted slices sees ours as newer rather than as an older pool.

    Creates and updates come before deletes in the order the caller should apply them: when a
    pool shrinks, the surviving slices announce the new slice count at the new generation
    first, and the extra slice is by then an older generation that consumers ignore.
    """
    by_name = {slice_name_of(s): s for s in existing}
    generation = next_generation(existing, desired)
    missing = any(slice_name_of(s) not in by_name for s in desired)
    if missing and previous_generation is not None:
        generation = max(generation, previous_generation + 1)
    final = tuple(_with_generation(s, generation) for s in desired)
    create: list[JsonDict] = []
    update: list[JsonDict] = []
    for want in final:
        have = by_name.get(slice_name_of(want))
        if have is None:
            create.append(want)
        elif not slice_up_to_date(have, want):
            obj = copy.deepcopy(want)
            meta = obj["metadata"]
            have_meta = have.get("metadata") or {}
            for key in _PRESERVED_METADATA:
                if have_meta.get(key):
                    meta[key] = copy.deepcopy(have_meta[key])
            meta["resourceVersion"] = resource_version(have)
            carry_time_added(have, obj)
            update.append(obj)
    wanted = {slice_name_of(s) for s in final}
    delete = tuple(
        (name, resource_version(s)) for name, s in sorted(by_name.items()) if name not in wanted
    )
    return SlicePlan(generation, final, tuple(create), tuple(update), delete)


@dataclass(frozen=True)
class NodeSliceFacts:
    """What of a Node goes into its slices: the uid (owner) and the labels attributes come from."""

    uid: str
    labels: tuple[tuple[str, str], ...]


def node_slice_facts(node: Mapping[str, Any]) -> NodeSliceFacts:
    """The :class:`NodeSliceFacts` of ``node``: when they change, the slices must be rebuilt."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    return NodeSliceFacts(
        str(meta.get("uid") or ""),
        tuple(sorted((k, str(v)) for k, v in labels.items() if k in SLICE_NODE_LABELS)),
    )


def slice_resync_reason(
    current: Mapping[str, Any] | None, desired: Mapping[str, Any] | None
) -> str | None:
    """Why a watch event leaving our slice at ``current`` (None: deleted) calls for a sync
    when we last planned it as ``desired`` (None: not ours to keep); None if it does not.

    Events for our own writes find ``current`` equal to ``desired`` and cost no sync.
    """
    if current is None:
        return "was deleted" if desired is not None else None
    if desired is None or not slice_up_to_date(current, desired):
        return "differs from what we publish"
    return None


def published_attributes(
    slices: Sequence[Mapping[str, Any]],
) -> Mapping[str, Mapping[str, Any]]:
    """Device name -> attributes of the highest pool generation among ``slices``, read-only
    (copies: the caller shares the view while the watch cache moves on)."""
    out: dict[str, Mapping[str, Any]] = {}
    if slices:
        top = max(pool_generation(s) for s in slices)
        for s in slices:
            if pool_generation(s) != top:
                continue
            for dev in (s.get("spec") or {}).get("devices") or []:
                attrs = copy.deepcopy(dev.get("attributes") or {})
                out[str(dev.get("name"))] = types.MappingProxyType(attrs)
    return types.MappingProxyType(out)
