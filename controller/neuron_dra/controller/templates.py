"""The ResourceClaimTemplate generated for a NeuronUltraServerWorkload. Pure.

Users point their pods at this template; every pod then gets a ResourceClaim asking for one
whole node *of this workload*: the ``neuronnode`` device whose ``workloadId`` attribute the
node plugin sets once the controller has reserved the node. The scheduler therefore places
the pods exactly on the reserved nodes, without node affinities or labels to maintain.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from neuron_dra.common.constants import (
    ATTR_RESOURCE_TYPE,
    ATTR_WORKLOAD_ID,
    ATTRIBUTE_DOMAIN,
    CRD_API_VERSION,
    DEVICE_CLASS_ULTRASERVER,
    DRIVER_NAME,
    KIND_WORKLOAD,
    LABEL_WORKLOAD_ID,
    RESOURCE_TYPE_NODE,
)
from neuron_dra.common.models.configs import (
    NeuronConfig,
    OpaqueConfig,
    UltraServerConfig,
    encode_opaque_config,
)
from neuron_dra.common.models.crds import DEFAULT_WORKLOAD_LNC
from neuron_dra.common.names import is_label_value

MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
#: Value of ``MANAGED_BY_LABEL`` on everything the controller generates.
MANAGED_BY_VALUE: Final = "neuron-dra-controller"
#: The one request of the generated claims (a DNS label; users may refer to it in
#: ``resources.claims[].request``).
REQUEST_NAME: Final = "neuron-node"


def node_selector_expression(workload_id: str) -> str:
    """CEL selecting the whole-node device reserved for ``workload_id``.

    ``workloadId`` exists only on reserved devices, and reading a missing attribute is a CEL
    runtime error (which fails the claim's allocation instead of skipping the device); the
    ``in`` tests first make such devices simply not match. ``resourceType`` is guarded too,
    for devices published by a driver version that did not set it.
    """
    # A label value: the workload id is one (it also travels in LABEL_WORKLOAD_ID), and that
    # charset needs no escaping inside a CEL string literal.
    if not workload_id or not is_label_value(workload_id):
        raise ValueError(f"workload id {workload_id!r} is not a valid label value")
    attrs = f'device.attributes["{ATTRIBUTE_DOMAIN}"]'
    return (
        f'"{ATTR_WORKLOAD_ID}" in {attrs} && {attrs}.{ATTR_WORKLOAD_ID} == "{workload_id}" && '
        f'"{ATTR_RESOURCE_TYPE}" in {attrs} && '
        f'{attrs}.{ATTR_RESOURCE_TYPE} == "{RESOURCE_TYPE_NODE}"'
    )


def template_name(workload_obj: Mapping[str, Any]) -> str:
    """``spec.resourceClaimTemplate.name``, else the workload's own name."""
    ref = (workload_obj.get("spec") or {}).get("resourceClaimTemplate") or {}
    name = ref.get("name") or (workload_obj.get("metadata") or {}).get("name", "")
    return str(name)


def _configs(spec: Mapping[str, Any]) -> list[OpaqueConfig]:
    configs: list[OpaqueConfig] = [UltraServerConfig(ultraserver_mode=int(spec["topologySize"]))]
    config = spec.get("config")
    if isinstance(config, Mapping):
        # The schema defaults it inside ``config``; the default is repeated here for objects
        # stored before it had one. Without ``config`` the nodes' default applies.
        lnc = config.get("logicalNeuronCore", DEFAULT_WORKLOAD_LNC)
        configs.append(NeuronConfig(logical_neuron_core=int(lnc)))
    return configs


def claim_template_for(workload_obj: Mapping[str, Any], workload_id: str) -> dict[str, Any]:
    """The desired ``resource.k8s.io/v1`` ResourceClaimTemplate of a workload.

    Owned by the workload (controller reference), so deleting the workload removes it and
    Kubernetes garbage-collects it even if the controller is down. Every field the API server
    would default (``allocationMode``, ``count``) is written explicitly, so the stored object
    compares equal to this one and ``template_matches`` does not see a phantom difference.
    """
    meta = workload_obj.get("metadata") or {}
    spec = workload_obj.get("spec") or {}
    labels = {MANAGED_BY_LABEL: MANAGED_BY_VALUE, LABEL_WORKLOAD_ID: workload_id}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": template_name(workload_obj),
            "namespace": meta.get("namespace") or "default",
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": CRD_API_VERSION,
                    "kind": KIND_WORKLOAD,
                    "name": meta.get("name", ""),
                    "uid": meta.get("uid", ""),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            # Each generated ResourceClaim carries the id, so the node plugin's Prepare can
            # check that the claim belongs to the workload its devices are reserved for.
            "metadata": {"labels": {LABEL_WORKLOAD_ID: workload_id}},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": REQUEST_NAME,
                            "exactly": {
                                "deviceClassName": DEVICE_CLASS_ULTRASERVER,
                                "allocationMode": "ExactCount",
                                "count": 1,
                                "selectors": [
                                    {"cel": {"expression": node_selector_expression(workload_id)}}
                                ],
                            },
                        }
                    ],
                    "config": [
                        {"opaque": {"driver": DRIVER_NAME, "parameters": encode_opaque_config(c)}}
                        for c in _configs(spec)
                    ],
                }
            },
        },
    }


def template_matches(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """True when ``existing`` already is ``desired`` as far as the controller cares.

    Compared: the whole ``spec``, our labels (labels others add are left alone: demanding
    equality would make the controller fight them) and our controller owner reference (a
    same-named template the workload does not own is not ours to leave as is). Note that a
    ResourceClaimTemplate's spec is immutable: a spec difference means delete and recreate,
    a label or owner difference a patch.
    """
    if existing.get("spec") != desired.get("spec"):
        return False
    have_meta = existing.get("metadata") or {}
    want_meta = desired.get("metadata") or {}
    have_labels = have_meta.get("labels") or {}
    if any(have_labels.get(k) != v for k, v in (want_meta.get("labels") or {}).items()):
        return False
    have_owners = [_owner_key(r) for r in have_meta.get("ownerReferences") or []]
    return all(
        _owner_key(r) in have_owners
        for r in want_meta.get("ownerReferences") or []
        if r.get("controller")
    )


def _owner_key(ref: Mapping[str, Any]) -> tuple[Any, ...]:
    return (ref.get("uid"), ref.get("kind"), bool(ref.get("controller")))


__all__ = [
    "MANAGED_BY_LABEL",
    "MANAGED_BY_VALUE",
    "REQUEST_NAME",
    "claim_template_for",
    "node_selector_expression",
    "template_matches",
    "template_name",
]
