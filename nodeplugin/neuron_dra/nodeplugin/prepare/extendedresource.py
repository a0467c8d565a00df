"""The claims kube-scheduler makes for a pod's extended resources (KEP-5004: a pod asking
``resources.limits aws.amazon.com/neuron: N`` through the DeviceClass that names the resource):
how to tell them, and what their users can do when one cannot be prepared (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

#: The scheduler's annotation on the claim it makes for a pod's extended resources.
EXTENDED_RESOURCE_CLAIM_ANNOTATION: Final = "resource.kubernetes.io/extended-resource-claim"

#: Such a claim has no request to constrain, and the scheduler takes devices in the order it
#: finds them: the way to a connected set is a claim of one's own.
EXTENDED_RESOURCE_ADVICE: Final = (
    "This claim was made by the scheduler for the pod's extended resource "
    "(resources.limits aws.amazon.com/neuron), which takes devices in the order it finds "
    "them and cannot ask for a connected set: use a ResourceClaimTemplate with a "
    "matchAttribute constraint on resource.aws.com/devicegroup<N>_id instead "
    '(docs/configuration.md, "Pods written for the device plugin").'
)


def made_for_extended_resource(meta: Mapping[str, Any]) -> bool:
    """Whether the claim with metadata ``meta`` is one the scheduler made for a pod's
    extended resources."""
    annotations = meta.get("annotations")
    if not isinstance(annotations, Mapping):
        return False
    return annotations.get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) == "true"
