"""Validation of built-in objects for the fake API server: the entry points and what it checks
of ObjectMeta and ResourceSlices.

The real kube-apiserver judges on the real tier (tests ``real-1.34``/``real-1.37``); the fake
keeps only what its own tests, ``neuron-dra sim`` and ``neuron-dra check-claim`` need to behave
as on the real server (docs/sim.md lists what went and what covers it now). Paths and messages
follow the real server (``spec.devices[3].name``, ``Required value``, ``field is immutable``)
because callers match on them.

Division of work with the server:

* ``validate_object_meta`` checks ``metadata`` (the server calls it for every kind; it resolves
  ``generateName`` first).
* ``apply_builtin_defaults`` fills the defaults the real server applies before validation.
* ``validate_builtin`` checks spec/status of the ``resource.k8s.io/v1`` kinds (``[]`` for other
  kinds): claims, templates and classes in full (:mod:`.claims`), ResourceSlices as
  far as the fake tier relies on it (below). It treats absent defaulted fields as defaulted, so
  forgetting ``apply_builtin_defaults`` does not produce bogus errors.

Of a ResourceSlice the fake checks the driver and pool, the immutable fields, which one of the
node-selection fields is set, device names and count, and that each attribute has exactly one
value. It does not check attribute and capacity names or values, taints, counters, per-device
node selection or binding conditions: only the kubelet plugin writes slices, and the real tier
publishes its slices to the real API server in every e2e run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from neuron_dra.sim.fakeapi.errors import FORBIDDEN, FieldError
from neuron_dra.sim.fakeapi.validation.claims import (
    apply_claim_defaults,
    validate_device_class,
    validate_resource_claim,
    validate_resource_claim_template,
)
from neuron_dra.sim.fakeapi.validation.fields import (
    child,
    get_dict,
    get_list,
    get_str,
    immutable,
    invalid,
    map_key,
    messages,
    required,
    validate_annotations,
    validate_dns_label,
    validate_dns_subdomain,
    validate_driver_name,
    validate_labels,
    validate_pool_name,
    validate_set,
)
from neuron_dra.sim.fakeapi.validation.names import (
    is_dns1123_label,
    is_dns1123_subdomain,
    is_path_segment,
    is_qualified_name,
)

__all__ = ["apply_builtin_defaults", "validate_builtin", "validate_object_meta"]

# resource.k8s.io/v1 limits (Kubernetes 1.34 values, from the API's types and validation).
RESOURCE_SLICE_MAX_DEVICES = 128
RESOURCE_SLICE_MAX_DEVICES_WITH_TAINTS_OR_COUNTERS = 64

# --------------------------------------------------------------------------------------------
# ObjectMeta

_NAME_VALIDATORS: dict[str, Callable[[str], list[str]]] = {
    "dns-subdomain": is_dns1123_subdomain,
    "dns-label": is_dns1123_label,
    "path-segment": is_path_segment,
}


def validate_object_meta(
    obj: dict[str, Any], *, namespaced: bool, name_validator: str = "dns-subdomain"
) -> list[FieldError]:
    """``metadata`` checks shared by every kind (apimachinery ValidateObjectMeta), without the
    owner references (our components write valid ones; the real tier judges them)."""
    check_name = _NAME_VALIDATORS[name_validator]
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return [required("metadata.name", "name or generateName is required")]
    errs: list[FieldError] = []
    name = get_str(meta, "name")
    generate_name = get_str(meta, "generateName")
    if generate_name:
        # A prefix may end in "-"; the server appends a random suffix.
        stem = generate_name.rstrip("-") if name_validator != "path-segment" else generate_name
        if stem:
            errs.extend(messages("metadata.generateName", generate_name, check_name(stem)))
    if not name:
        errs.append(required("metadata.name", "name or generateName is required"))
    else:
        errs.extend(messages("metadata.name", name, check_name(name)))

    namespace = get_str(meta, "namespace")
    if namespaced:
        if not namespace:
            errs.append(required("metadata.namespace"))
        else:
            errs.extend(messages("metadata.namespace", namespace, is_dns1123_label(namespace)))
    elif namespace:
        errs.append(FieldError("metadata.namespace", FORBIDDEN, "not allowed on this type"))

    generation = meta.get("generation")
    if isinstance(generation, int) and generation < 0:
        errs.append(
            invalid("metadata.generation", generation, "must be greater than or equal to 0")
        )
    errs.extend(validate_labels(get_dict(meta, "labels"), "metadata.labels"))
    errs.extend(validate_annotations(get_dict(meta, "annotations"), "metadata.annotations"))
    for finalizer in get_list(meta, "finalizers"):
        text = finalizer if isinstance(finalizer, str) else str(finalizer)
        errs.extend(messages("metadata.finalizers", text, is_qualified_name(text)))
    return errs


# --------------------------------------------------------------------------------------------
# ResourceSlice


def _validate_resource_slice(obj: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    spec = get_dict(obj, "spec")
    errs = validate_driver_name(get_str(spec, "driver"), "spec.driver")
    errs.extend(_validate_pool(get_dict(spec, "pool")))
    if old is not None:
        errs.extend(_immutable_slice_fields(spec, get_dict(old, "spec")))
    errs.extend(_validate_node_selection(spec))
    devices = get_list(spec, "devices")
    limited = any(get_list(d, "taints") or get_list(d, "consumesCounters") for d in devices)
    max_devices = (
        RESOURCE_SLICE_MAX_DEVICES_WITH_TAINTS_OR_COUNTERS
        if limited
        else RESOURCE_SLICE_MAX_DEVICES
    )
    errs.extend(
        validate_set(
            devices, max_devices, _validate_device, lambda d: get_str(d, "name"),
            "spec.devices", "name",
        )
    )  # fmt: skip
    return errs


def _validate_pool(pool: dict[str, Any]) -> list[FieldError]:
    errs = validate_pool_name(get_str(pool, "name"), "spec.pool.name")
    count = pool.get("resourceSliceCount", 0)
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
        errs.append(invalid("spec.pool.resourceSliceCount", count, "must be greater than zero"))
    generation = pool.get("generation", 0)
    if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
        errs.append(
            invalid("spec.pool.generation", generation, "must be greater than or equal to zero")
        )
    return errs


def _immutable_slice_fields(spec: dict[str, Any], old_spec: dict[str, Any]) -> list[FieldError]:
    errs: list[FieldError] = []
    pool, old_pool = get_dict(spec, "pool"), get_dict(old_spec, "pool")
    if pool.get("name") != old_pool.get("name"):
        errs.append(immutable("spec.pool.name", pool.get("name")))
    for name in ("driver", "nodeName"):
        if spec.get(name) != old_spec.get(name):
            errs.append(immutable(child("spec", name), spec.get(name)))
    return errs


_ONE_OF_NODE_SELECTION = (
    "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
)


def _validate_node_selection(spec: dict[str, Any]) -> list[FieldError]:
    errs: list[FieldError] = []
    set_fields: list[str] = []
    node_name = spec.get("nodeName")
    if node_name is not None:
        if node_name != "":
            set_fields.append("`nodeName`")
            errs.extend(validate_dns_subdomain(str(node_name), "spec.nodeName"))
        else:
            errs.append(
                invalid(
                    "spec.nodeName", node_name, "must be either unset or set to a non-empty string"
                )
            )
    if spec.get("nodeSelector") is not None:
        set_fields.append("`nodeSelector`")
        terms = get_list(spec["nodeSelector"], "nodeSelectorTerms")
        if len(terms) != 1:
            errs.append(
                invalid(
                    "spec.nodeSelector.nodeSelectorTerms",
                    terms,
                    "must have exactly one node selector term",
                )
            )
    for flag in ("allNodes", "perDeviceNodeSelection"):
        value = spec.get(flag)
        if value is True:
            set_fields.append(f"`{flag}`")
        elif value is not None:
            errs.append(invalid(child("spec", flag), value, "must be either unset or set to true"))
    if not set_fields:
        errs.append(required("spec", _ONE_OF_NODE_SELECTION))
    elif len(set_fields) > 1:
        errs.append(
            invalid(
                "spec",
                "{" + ", ".join(set_fields) + "}",
                _ONE_OF_NODE_SELECTION + ", but multiple fields are set",
            )
        )
    return errs


_ATTRIBUTE_KINDS = ("int", "bool", "string", "version")


def _validate_device(device: Any, path: str) -> list[FieldError]:
    device = device if isinstance(device, dict) else {}
    name = get_str(device, "name")
    errs = (
        [required(child(path, "name"))]
        if not name
        else validate_dns_label(name, child(path, "name"))
    )
    for key, attribute in get_dict(device, "attributes").items():
        # An attribute given only in a form the server does not know is empty after pruning.
        kinds = [k for k in _ATTRIBUTE_KINDS if isinstance(attribute, dict) and k in attribute]
        if len(kinds) != 1:
            shown = attribute if kinds else ""
            errs.append(
                invalid(
                    map_key(child(path, "attributes"), key),
                    shown,
                    "exactly one value must be specified",
                )
            )
    return errs


# --------------------------------------------------------------------------------------------
# Dispatch and defaults

_VALIDATORS: dict[
    tuple[str, str], Callable[[dict[str, Any], dict[str, Any] | None], list[FieldError]]
] = {
    ("resource.k8s.io", "resourceslices"): _validate_resource_slice,
    ("resource.k8s.io", "resourceclaims"): validate_resource_claim,
    ("resource.k8s.io", "resourceclaimtemplates"): validate_resource_claim_template,
    ("resource.k8s.io", "deviceclasses"): validate_device_class,
}


def validate_builtin(
    group: str, plural: str, obj: dict[str, Any], old: dict[str, Any] | None
) -> list[FieldError]:
    """Spec/status validation of a built-in kind (metadata is ``validate_object_meta``'s job)."""
    validator = _VALIDATORS.get((group, plural))
    return validator(obj, old) if validator is not None else []


def apply_builtin_defaults(group: str, plural: str, obj: dict[str, Any]) -> None:
    """In place: the defaults kube-apiserver sets on create/update for these kinds."""
    if group != "resource.k8s.io":
        return
    if plural == "resourceclaims":
        apply_claim_defaults(obj.get("spec"))
    elif plural == "resourceclaimtemplates":
        apply_claim_defaults(get_dict(obj, "spec").get("spec"))


def gate_device_taints(
    plural: str, obj: dict[str, Any], old: dict[str, Any] | None, *, enabled: bool, now: str
) -> None:
    """In place: fields of features a 1.34 server has off by default, dropped as
    kube-apiserver's strategies drop them (known fields: no strict-decoding error).

    - DeviceClass ``extendedResourceName`` (``DRAExtendedResource``, alpha in 1.34), unless
      the stored class already has one.
    - ResourceSlice device taints (``DRADeviceTaints``): dropped when ``enabled`` is False,
      unless the stored slice already has some; kept taints get ``timeAdded`` = now when the
      writer left it empty (every write: a republish without it restarts the clock).
    """
    if plural == "deviceclasses":
        if not (old and get_dict(old, "spec").get("extendedResourceName")):
            get_dict(obj, "spec").pop("extendedResourceName", None)
        return
    if plural != "resourceslices":
        return
    devices = [d for d in get_list(get_dict(obj, "spec"), "devices") if isinstance(d, dict)]
    in_use = old is not None and any(
        isinstance(d, dict) and d.get("taints")
        for d in get_list(get_dict(old, "spec"), "devices")
    )
    for device in devices:
        if not device.get("taints"):
            continue
        if not (enabled or in_use):
            del device["taints"]
            continue
        device["taints"] = [
            {**t, "timeAdded": t.get("timeAdded") or now} if isinstance(t, dict) else t
            for t in device["taints"]
        ]
