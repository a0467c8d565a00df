"""The project's DeviceClasses, defined once.

The Helm chart, the simulated cluster and ``neuron-dra check-claim`` all use these objects, so
what a template selects in a test is what it selects in a cluster.

- ``neuron.aws.com``: every Neuron device (and the ``neuronnode`` whole-node device) that is
  not reserved for an UltraServer workload, i.e. has no ``workloadId`` attribute.
- ``ultraserver.neuron.aws.com``: only devices reserved for a workload; the templates the
  controller generates add a selector for their own ``workloadId``.
- ``extended-resource.neuron.aws.com``: the unreserved Neuron devices (not the whole-node
  device) behind the device plugin's extended resource ``aws.amazon.com/neuron``
  (``extendedResourceName``, KEP-5004): a pod asking ``aws.amazon.com/neuron: 4`` in its
  limits gets four of them, unchanged from the device-plugin days (Kubernetes 1.36+).
"""

from __future__ import annotations

from typing import Any, Final

from neuron_dra.common.constants import (
    ATTR_RESOURCE_TYPE,
    ATTR_WORKLOAD_ID,
    DEVICE_CLASS_EXTENDED_RESOURCE,
    DEVICE_CLASS_NEURON,
    DEVICE_CLASS_ULTRASERVER,
    DRIVER_NAME,
    EXTENDED_RESOURCE_NEURON,
    RESOURCE_TYPE_DEVICE,
)

DEVICE_CLASS_API_VERSION: Final = "resource.k8s.io/v1"

_OURS: Final = f'device.driver == "{DRIVER_NAME}"'
_RESERVED: Final = f'"{ATTR_WORKLOAD_ID}" in device.attributes["{DRIVER_NAME}"]'

#: CEL selector of the ``neuron.aws.com`` class: our devices that are not reserved.
NEURON_CLASS_EXPRESSION: Final = f"{_OURS} && !({_RESERVED})"
#: CEL selector of the ``ultraserver.neuron.aws.com`` class: our reserved devices.
ULTRASERVER_CLASS_EXPRESSION: Final = f"{_OURS} && {_RESERVED}"

#: CEL selector of the ``extended-resource.neuron.aws.com`` class: our unreserved devices, one
#: Neuron device each (a count of the extended resource is a count of devices, as with the
#: device plugin; the whole-node device would count 16 as 1).
EXTENDED_RESOURCE_CLASS_EXPRESSION: Final = (
    f"{NEURON_CLASS_EXPRESSION} && "
    f'device.attributes["{DRIVER_NAME}"].{ATTR_RESOURCE_TYPE} == "{RESOURCE_TYPE_DEVICE}"'
)

#: Class name -> its single CEL selector.
CLASS_EXPRESSIONS: Final[dict[str, str]] = {
    DEVICE_CLASS_NEURON: NEURON_CLASS_EXPRESSION,
    DEVICE_CLASS_ULTRASERVER: ULTRASERVER_CLASS_EXPRESSION,
    DEVICE_CLASS_EXTENDED_RESOURCE: EXTENDED_RESOURCE_CLASS_EXPRESSION,
}

#: Class name -> the extended resource it stands for (DeviceClass ``extendedResourceName``).
CLASS_EXTENDED_RESOURCES: Final[dict[str, str]] = {
    DEVICE_CLASS_EXTENDED_RESOURCE: EXTENDED_RESOURCE_NEURON,
}


def device_class(
    name: str, expression: str, extended_resource_name: str | None = None
) -> dict[str, Any]:
    """A ``resource.k8s.io/v1`` DeviceClass selecting devices with one CEL expression."""
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": expression}}]}
    if extended_resource_name:
        spec["extendedResourceName"] = extended_resource_name
    return {
        "apiVersion": DEVICE_CLASS_API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": spec,
    }


def default_device_classes() -> list[dict[str, Any]]:
    """The project's DeviceClasses, as fresh dicts (callers may add labels and the like)."""
    return [
        device_class(name, expr, CLASS_EXTENDED_RESOURCES.get(name))
        for name, expr in CLASS_EXPRESSIONS.items()
    ]


def default_classes_by_name() -> dict[str, dict[str, Any]]:
    """``default_device_classes`` keyed by name, the shape the structured allocator takes."""
    return {c["metadata"]["name"]: c for c in default_device_classes()}
