"""A small simulated Kubernetes control plane for DRA, on top of the fake API server.

Everything talks to the API server over HTTP through the raw-dict client, like the real
components: :class:`ClaimController` (ResourceClaims from templates; releasing claims whose
pods are gone, with the ``resource.kubernetes.io/delete-protection`` finalizer),
:class:`Scheduler` (structured allocation, the finalizer, reservation, binding),
:class:`SimKubelet` (plugin
registration, NodePrepare/UnprepareResources over the real gRPC sockets, pod status), the
workload controllers :class:`ReplicaSet` and :class:`Group`, and :class:`ControlPlane`
running them together. :func:`ensure_device_classes` creates the project's DeviceClasses.
"""

from neuron_dra.sim.controlplane.base import (
    CDI_DEVICES_ANNOTATION,
    DELETE_PROTECTION_FINALIZER,
    POD_CLAIM_NAME_ANNOTATION,
    PodClaim,
    pod_claims,
)
from neuron_dra.sim.controlplane.claims import ClaimController
from neuron_dra.sim.controlplane.cluster import ControlPlane, ensure_device_classes
from neuron_dra.sim.controlplane.kubelet import SimKubelet, container_cdi_devices
from neuron_dra.sim.controlplane.podsets import Group, PodSet, ReplicaSet
from neuron_dra.sim.controlplane.scheduler import Scheduler

__all__ = [
    "CDI_DEVICES_ANNOTATION",
    "DELETE_PROTECTION_FINALIZER",
    "POD_CLAIM_NAME_ANNOTATION",
    "ClaimController",
    "ControlPlane",
    "Group",
    "PodClaim",
    "PodSet",
    "ReplicaSet",
    "Scheduler",
    "SimKubelet",
    "container_cdi_devices",
    "ensure_device_classes",
    "pod_claims",
]
