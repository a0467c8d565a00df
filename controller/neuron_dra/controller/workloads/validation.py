"""Whether a workload's spec fits the discovered hardware (what the CRD schema cannot know):
its instance type has been discovered, and its topologySize is a unit size that type has.
Pure: the caches come in as arguments."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from neuron_dra.common.profiles import PROFILES

from .health import published_modes
from .model import FAILED, PENDING, JsonDict, nus_instance_type, nus_members, spec_of

SlicesOf = Callable[[str], list[JsonDict]]


def supported_sizes(
    instance_type: str, nus_objects: Iterable[Mapping[str, Any]], slices_of: SlicesOf
) -> set[int] | None:
    """Unit sizes ``instance_type`` supports, None when nothing says.

    The profile of the type is the hardware fact. Only for types we have no profile of (new
    instance types are not in our table) do the nodes' published ``ultraserverModes`` count;
    they are not asked first because they also drop sizes while links are down, and a
    temporary fault must not fail a workload that will fit once repaired.
    """
    profile = PROFILES.get(instance_type)
    if profile is not None and profile.ultraserver_node_counts:
        return set(profile.ultraserver_node_counts)
    sizes: set[int] = set()
    for nus in nus_objects:
        if spec_of(nus).get("instanceType") != instance_type:
            continue
        for name in nus_members(nus):
            sizes |= published_modes(slices_of(name))
    return sizes or None


@dataclass(frozen=True)
class Verdict:
    ok: bool
    state: str = ""
    reason: str = ""
    message: str = ""


class Validator:
    """Checks specs against the discovered hardware; per-type facts are computed once per
    instance, i.e. once per reconcile.

    ``nus_objects`` may be a function returning them: they are read only for an instance
    type we have no profile of. ``types`` (the ``nus_instance_type`` of every object), when
    the caller already knows them, saves a pass over all objects.
    """

    def __init__(
        self,
        nus_objects: Sequence[Mapping[str, Any]] | Callable[[], Sequence[Mapping[str, Any]]],
        slices_of: SlicesOf,
        *,
        types: Iterable[str] | None = None,
    ) -> None:
        self._nus = nus_objects
        self._slices_of = slices_of
        if types is None:
            types = (nus_instance_type(n) for n in self._objects())
        self._types = sorted(set(types))
        self._sizes: dict[str, set[int] | None] = {}

    def _objects(self) -> Sequence[Mapping[str, Any]]:
        return self._nus() if callable(self._nus) else self._nus

    def sizes(self, instance_type: str) -> set[int] | None:
        if instance_type not in self._sizes:
            profile = PROFILES.get(instance_type)
            known = profile is not None and profile.ultraserver_node_counts
            # A profiled type never reads the objects: skip listing them.
            objects = () if known else self._objects()
            self._sizes[instance_type] = supported_sizes(instance_type, objects, self._slices_of)
        return self._sizes[instance_type]

    def __call__(self, workload: Mapping[str, Any]) -> Verdict:
        spec = spec_of(workload)
        instance_type = str(spec.get("instanceType") or "")
        size = int(spec.get("topologySize") or 0)
        if instance_type not in self._types:
            known = ", ".join(self._types) if self._types else "none yet"
            return Verdict(
                False,
                PENDING,
                "UnknownInstanceType",
                f"no UltraServers of instance type {instance_type} have been discovered "
                f"(discovered types: {known}); the workload waits until such nodes join the "
                "cluster, or fix spec.instanceType",
            )
        sizes = self.sizes(instance_type)
        if sizes is not None and size not in sizes:
            listed = ", ".join(str(s) for s in sorted(sizes))
            return Verdict(
                False,
                FAILED,
                "UnsupportedTopologySize",
                f"topologySize {size} is not supported by {instance_type} (supported: "
                f"{listed}); recreate the workload with one of those sizes",
            )
        return Verdict(True)
