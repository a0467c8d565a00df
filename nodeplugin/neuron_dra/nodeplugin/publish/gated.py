"""Slice fields an API server may drop: those of features behind a gate that is off (pure).

kube-apiserver drops, without an error, the fields of a feature its gate has off (the
registry strategies' ``dropDisabled...Fields``), unless the stored object already uses them.
A publisher that kept sending such a field would find its slice different from what it
wants after every write and republish forever. So the publisher checks each write's
response (:func:`newly_dropped`): a feature whose fields came back missing is noted, logged
once with what still works, and from then on the slices are built as that server keeps them
(:func:`as_kept`), which converges. A plugin restart tries again (the control plane may have
been upgraded meanwhile).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from neuron_dra.nodeplugin.publish.coresharing import sharing_dropped, without_sharing
from neuron_dra.nodeplugin.publish.taints import taints_dropped, without_taints

JsonDict = dict[str, Any]


@dataclass(frozen=True)
class GatedFeature:
    """A feature of our slices behind a Kubernetes feature gate."""

    #: What the logs call it.
    name: str
    #: The Kubernetes feature gate, and the first minor where it is on by default.
    gate: str
    default_since: str
    #: Whether a slice we sent (first) came back (second) without the feature's fields.
    dropped: Callable[[Mapping[str, Any], Mapping[str, Any]], bool]
    #: A slice as a server with the gate off keeps it.
    strip: Callable[[Mapping[str, Any]], JsonDict]
    #: What users still get without it.
    instead: str

    def message(self) -> str:
        return (
            f"the API server dropped the {self.name} of our ResourceSlice (feature {self.gate} "
            f"is off; it is on by default from Kubernetes {self.default_since}): {self.instead}"
        )


DEVICE_TAINTS: Final = GatedFeature(
    name="device taints",
    gate="DRADeviceTaints",
    default_since="1.36",
    dropped=taints_dropped,
    strip=without_taints,
    instead="unhealthy devices are marked only by the healthy=false attribute",
)
CORE_SHARING: Final = GatedFeature(
    name="core sharing (allowMultipleAllocations, request policies)",
    gate="DRAConsumableCapacity",
    default_since="1.36",
    dropped=sharing_dropped,
    strip=without_sharing,
    instead="every device is allocated whole, and a claim asking for logicalCores gets a "
    "whole device (the API server drops its capacity requests too)",
)
FEATURES: Final = (DEVICE_TAINTS, CORE_SHARING)


def newly_dropped(
    sent: Mapping[str, Any], returned: Mapping[str, Any], known: Collection[str]
) -> list[GatedFeature]:
    """The features (not in ``known``, by name) whose fields the write of ``sent`` lost."""
    return [f for f in FEATURES if f.name not in known and f.dropped(sent, returned)]


def as_kept(slices: Iterable[Mapping[str, Any]], dropped: Collection[str]) -> list[JsonDict]:
    """``slices`` without the fields of the ``dropped`` features (by name)."""
    out = []
    for obj in slices:
        kept = dict(obj)
        for feature in FEATURES:
            if feature.name in dropped:
                kept = feature.strip(kept)
        out.append(kept)
    return out
