"""Validation of ResourceClaims, ResourceClaimTemplates and DeviceClasses, as kube-apiserver
1.34 does it (``resource.k8s.io/v1``), and the defaults it sets on them.

Kept in full because it judges *user input* offline: ``neuron-dra check-claim`` runs it on the
templates a user is about to deploy, the differential test compares that verdict with the real
scheduler's, and the fake API server runs it on every claim write. Paths and messages follow
the real server (``spec.devices.requests[0].exactly.count``, ``Required value``).

Selectors are compiled by :mod:`.device_selectors` (its docstring says what it does not
catch). Not enforced: consumable-capacity request policies, admin-access namespace checks and
``extendedResourceName`` rules.

Of the status, only the protocol rules are checked (``reservedFor`` needs an allocation, no new
consumers while the claim is deleted, the allocation is immutable once set); the format of
allocation results and device statuses is the real tier's to judge (docs/sim.md).
"""

from __future__ import annotations

import json
from typing import Any

from neuron_dra.common.quantity import parse_quantity
from neuron_dra.sim.fakeapi.errors import FORBIDDEN, FieldError
from neuron_dra.sim.fakeapi.validation.device_selectors import compile_device_selector
from neuron_dra.sim.fakeapi.validation.fields import (
    child,
    get_dict,
    get_list,
    get_str,
    immutable,
    invalid,
    map_key,
    not_supported,
    required,
    too_long,
    validate_annotations,
    validate_dns_label,
    validate_dns_subdomain,
    validate_driver_name,
    validate_fully_qualified_name,
    validate_label_name,
    validate_label_value,
    validate_labels,
    validate_qualified_name,
    validate_set,
    validate_slice,
)

__all__ = [
    "apply_claim_defaults",
    "validate_device_class",
    "validate_resource_claim",
    "validate_resource_claim_template",
]

# resource.k8s.io/v1 limits (Kubernetes 1.34 values, from the API's types and validation).
DEVICE_REQUESTS_MAX = 32
FIRST_AVAILABLE_MAX = 8
DEVICE_SELECTORS_MAX = 32
DEVICE_CONSTRAINTS_MAX = 32
DEVICE_CONFIG_MAX = 32
DEVICE_TOLERATIONS_MAX = 16
DEVICE_TAINT_EFFECTS = ("NoExecute", "NoSchedule")
OPAQUE_PARAMETERS_MAX_LENGTH = 10 * 1024
CEL_SELECTOR_EXPRESSION_MAX_LENGTH = 10 * 1024


def _validate_quantity(value: Any, path: str) -> list[FieldError]:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return [invalid(path, value, "must be a quantity string")]
    try:
        parse_quantity(str(value))
    except ValueError as err:
        return [invalid(path, value, str(err))]
    return []


# --------------------------------------------------------------------------------------------
# Selectors


def _validate_selectors(selectors: list[Any], path: str) -> list[FieldError]:
    return validate_slice(selectors, DEVICE_SELECTORS_MAX, _validate_selector, path)


def _validate_selector(selector: Any, path: str) -> list[FieldError]:
    cel_sel = selector.get("cel") if isinstance(selector, dict) else None
    cel_path = child(path, "cel")
    if not isinstance(cel_sel, dict):
        return [required(cel_path)]
    expr_path = child(cel_path, "expression")
    expression = get_str(cel_sel, "expression")
    if len(expression) > CEL_SELECTOR_EXPRESSION_MAX_LENGTH:
        return [too_long(expr_path, CEL_SELECTOR_EXPRESSION_MAX_LENGTH)]
    if not expression.strip():
        return [required(expr_path)]
    _, error = compile_device_selector(expression)
    return [invalid(expr_path, expression, error)] if error else []


# --------------------------------------------------------------------------------------------
# Opaque configuration


def _validate_raw_object(value: Any, path: str, limit: int) -> list[FieldError]:
    if value is None:
        return [required(path)]
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
    if size > limit:
        return [too_long(path, limit)]
    if not isinstance(value, dict):
        return [invalid(path, "<value omitted>", "must be a valid JSON object")]
    return []


def _validate_device_configuration(config: Any, path: str) -> list[FieldError]:
    opaque = config.get("opaque") if isinstance(config, dict) else None
    opaque_path = child(path, "opaque")
    if not isinstance(opaque, dict):
        return [required(opaque_path)]
    errs = validate_driver_name(get_str(opaque, "driver"), child(opaque_path, "driver"))
    errs.extend(
        _validate_raw_object(
            opaque.get("parameters"),
            child(opaque_path, "parameters"),
            OPAQUE_PARAMETERS_MAX_LENGTH,
        )
    )
    return errs


# --------------------------------------------------------------------------------------------
# Claim spec (ResourceClaim and ResourceClaimTemplate)

RequestNames = dict[str, "set[str] | None"]


def _gather_request_names(devices: dict[str, Any]) -> dict[str, set[str] | None]:
    names: dict[str, set[str] | None] = {}
    for request in get_list(devices, "requests"):
        sub = get_list(request, "firstAvailable")
        names[get_str(request, "name")] = {get_str(s, "name") for s in sub} if sub else None
    return names


def _has_request(names: dict[str, set[str] | None], ref: str) -> bool:
    parts = ref.split("/")
    if len(parts) > 2 or parts[0] not in names:
        return False
    if len(parts) == 1:
        return True
    subs = names[parts[0]]
    return subs is not None and parts[1] in subs


_REQUEST_REF_MSG = (
    "must be the name of a request in the claim or the name of a request and a subrequest "
    "separated by '/'"
)


def _validate_request_ref(
    ref: Any, path: str, names: dict[str, set[str] | None]
) -> list[FieldError]:
    text = ref if isinstance(ref, str) else str(ref)
    parts = text.split("/")
    if len(parts) > 2:
        return [invalid(path, text, _REQUEST_REF_MSG)]
    errs: list[FieldError] = []
    for part in parts:
        errs.extend(validate_dns_label(part, path))
    if not _has_request(names, text):
        errs.append(invalid(path, text, _REQUEST_REF_MSG))
    return errs


def _validate_request_refs(
    refs: list[Any], path: str, names: dict[str, set[str] | None]
) -> list[FieldError]:
    return validate_set(
        refs,
        DEVICE_REQUESTS_MAX,
        lambda r, p: _validate_request_ref(r, p, names),
        lambda r: str(r),
        path,
    )


def _validate_allocation_mode(request: dict[str, Any], path: str) -> list[FieldError]:
    # Absent values are what defaulting would set: ExactCount, and count 1 for ExactCount.
    mode = request.get("allocationMode") or "ExactCount"
    count = request.get("count")
    if mode == "All":
        if count not in (None, 0):
            return [
                invalid(
                    child(path, "count"),
                    count,
                    "must not be specified when allocationMode is 'All'",
                )
            ]
        return []
    if mode == "ExactCount":
        effective = 1 if count is None else count
        if isinstance(effective, bool) or not isinstance(effective, int) or effective <= 0:
            return [invalid(child(path, "count"), effective, "must be greater than zero")]
        return []
    return [not_supported(child(path, "allocationMode"), mode, ("All", "ExactCount"))]


def _validate_toleration(toleration: Any, path: str) -> list[FieldError]:
    toleration = toleration if isinstance(toleration, dict) else {}
    errs: list[FieldError] = []
    key = get_str(toleration, "key")
    if key:
        errs.extend(validate_label_name(key, child(path, "key")))
    operator = toleration.get("operator") or "Equal"
    value = get_str(toleration, "value")
    if operator == "Exists":
        if value:
            errs.append(invalid(child(path, "value"), value, "must be empty for operator `Exists`"))
    elif operator == "Equal":
        errs.extend(validate_label_value(value, child(path, "value")))
    else:
        errs.append(not_supported(child(path, "operator"), operator, ("Equal", "Exists")))
    effect = get_str(toleration, "effect")
    if effect and effect not in DEVICE_TAINT_EFFECTS:
        errs.append(not_supported(child(path, "effect"), effect, DEVICE_TAINT_EFFECTS))
    return errs


def _validate_device_class_ref(name: str, path: str) -> list[FieldError]:
    if not name:
        return [required(path)]
    return validate_dns_subdomain(name, path)


def _validate_exact_request(request: Any, path: str) -> list[FieldError]:
    request = request if isinstance(request, dict) else {}
    errs = _validate_device_class_ref(
        get_str(request, "deviceClassName"), child(path, "deviceClassName")
    )
    errs.extend(_validate_selectors(get_list(request, "selectors"), child(path, "selectors")))
    errs.extend(_validate_allocation_mode(request, path))
    errs.extend(
        validate_slice(
            get_list(request, "tolerations"),
            DEVICE_TOLERATIONS_MAX,
            _validate_toleration,
            child(path, "tolerations"),
        )
    )
    for key, quantity in get_dict(get_dict(request, "capacity"), "requests").items():
        key_path = map_key(child(path, "capacity", "requests"), key)
        errs.extend(validate_qualified_name(key, key_path))
        errs.extend(_validate_quantity(quantity, key_path))
    return errs


def _validate_sub_request(sub: Any, path: str) -> list[FieldError]:
    sub = sub if isinstance(sub, dict) else {}
    name = get_str(sub, "name")
    errs = (
        [required(child(path, "name"))]
        if not name
        else validate_dns_label(name, child(path, "name"))
    )
    if sub.get("adminAccess") is not None:
        errs.append(
            FieldError(child(path, "adminAccess"), FORBIDDEN, "not supported in subrequests")
        )
    errs.extend(_validate_exact_request(sub, path))
    return errs


def _validate_request(request: Any, path: str) -> list[FieldError]:
    request = request if isinstance(request, dict) else {}
    name = get_str(request, "name")
    errs = (
        [required(child(path, "name"))]
        if not name
        else validate_dns_label(name, child(path, "name"))
    )
    first = get_list(request, "firstAvailable")
    exactly = request.get("exactly")
    kinds = int(bool(first)) + int(exactly is not None)
    if kinds == 0:
        errs.append(required(path, "exactly one of `exactly` or `firstAvailable` is required"))
    elif kinds > 1:
        errs.append(
            invalid(
                path,
                None,
                "exactly one of `exactly` or `firstAvailable` is required, but multiple fields "
                "are set",
            )
        )
    elif first:
        errs.extend(
            validate_set(
                first,
                FIRST_AVAILABLE_MAX,
                _validate_sub_request,
                lambda s: get_str(s, "name"),
                child(path, "firstAvailable"),
                "name",
            )
        )
    else:
        errs.extend(_validate_exact_request(exactly, child(path, "exactly")))
    return errs


def _validate_constraint(
    constraint: Any, path: str, names: dict[str, set[str] | None]
) -> list[FieldError]:
    constraint = constraint if isinstance(constraint, dict) else {}
    errs = _validate_request_refs(get_list(constraint, "requests"), child(path, "requests"), names)
    match = constraint.get("matchAttribute")
    distinct = constraint.get("distinctAttribute")
    if match is not None and distinct is not None:
        errs.append(
            invalid(
                path,
                None,
                'exactly one of "matchAttribute" or "distinctAttribute" is required, but '
                "multiple fields are set",
            )
        )
    elif match is not None:
        errs.extend(validate_fully_qualified_name(str(match), child(path, "matchAttribute")))
    elif distinct is not None:
        errs.extend(validate_fully_qualified_name(str(distinct), child(path, "distinctAttribute")))
    else:
        errs.append(required(child(path, "matchAttribute")))
    return errs


def _validate_claim_config(
    config: Any, path: str, names: dict[str, set[str] | None]
) -> list[FieldError]:
    errs = _validate_request_refs(get_list(config, "requests"), child(path, "requests"), names)
    errs.extend(_validate_device_configuration(config, path))
    return errs


def _validate_claim_spec(spec: Any, path: str) -> list[FieldError]:
    devices = get_dict(spec, "devices")
    dpath = child(path, "devices")
    names = _gather_request_names(devices)
    errs = validate_set(
        get_list(devices, "requests"),
        DEVICE_REQUESTS_MAX,
        _validate_request,
        lambda r: get_str(r, "name"),
        child(dpath, "requests"),
        "name",
    )
    errs.extend(
        validate_slice(
            get_list(devices, "constraints"),
            DEVICE_CONSTRAINTS_MAX,
            lambda c, p: _validate_constraint(c, p, names),
            child(dpath, "constraints"),
        )
    )
    errs.extend(
        validate_slice(
            get_list(devices, "config"),
            DEVICE_CONFIG_MAX,
            lambda c, p: _validate_claim_config(c, p, names),
            child(dpath, "config"),
        )
    )
    return errs


# --------------------------------------------------------------------------------------------
# Claim status: the protocol rules only


def _validate_claim_status(obj: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    status = get_dict(obj, "status")
    old_status = get_dict(old, "status") if old is not None else {}
    errs: list[FieldError] = []
    allocation = status.get("allocation")
    reserved = get_list(status, "reservedFor")
    if reserved:
        if allocation is None:
            errs.append(
                FieldError(
                    "status.reservedFor",
                    FORBIDDEN,
                    "may not be specified when `allocated` is not set",
                )
            )
        elif get_dict(obj, "metadata").get("deletionTimestamp"):
            old_uids = {get_str(r, "uid") for r in get_list(old_status, "reservedFor")}
            if any(get_str(r, "uid") not in old_uids for r in reserved):
                errs.append(
                    FieldError(
                        "status.reservedFor",
                        FORBIDDEN,
                        "new entries may not be added while `deallocationRequested` or "
                        "`deletionTimestamp` are set",
                    )
                )
    old_allocation = old_status.get("allocation")
    if allocation is not None and old_allocation is not None and allocation != old_allocation:
        errs.append(immutable("status.allocation", allocation))
    return errs


# --------------------------------------------------------------------------------------------
# The kinds


def validate_resource_claim(obj: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    if old is not None:
        # The spec is immutable; on update only that is checked (the rest was checked on create).
        errs: list[FieldError] = []
        if obj.get("spec") != old.get("spec"):
            errs.append(immutable("spec", obj.get("spec")))
        return errs + _validate_claim_status(obj, old)
    return _validate_claim_spec(obj.get("spec"), "spec") + _validate_claim_status(obj, None)


def validate_resource_claim_template(
    obj: dict[str, Any], old: dict[str, Any] | None
) -> list[FieldError]:
    if old is not None:
        return [immutable("spec", obj.get("spec"))] if obj.get("spec") != old.get("spec") else []
    spec = get_dict(obj, "spec")
    template_meta = get_dict(spec, "metadata")
    errs = validate_labels(get_dict(template_meta, "labels"), "spec.metadata.labels")
    errs.extend(
        validate_annotations(get_dict(template_meta, "annotations"), "spec.metadata.annotations")
    )
    errs.extend(_validate_claim_spec(spec.get("spec"), "spec.spec"))
    return errs


def validate_device_class(obj: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    spec = get_dict(obj, "spec")
    errs = _validate_selectors(get_list(spec, "selectors"), "spec.selectors")
    errs.extend(
        validate_slice(
            get_list(spec, "config"),
            DEVICE_CONFIG_MAX,
            _validate_device_configuration,
            "spec.config",
        )
    )
    return errs


# --------------------------------------------------------------------------------------------
# Defaults


def _default_request(request: dict[str, Any]) -> None:
    if not request.get("allocationMode"):
        request["allocationMode"] = "ExactCount"
    if request["allocationMode"] == "ExactCount" and request.get("count") is None:
        request["count"] = 1
    for toleration in get_list(request, "tolerations"):
        if isinstance(toleration, dict) and not toleration.get("operator"):
            toleration["operator"] = "Equal"


def apply_claim_defaults(spec: Any) -> None:
    """In place: the defaults kube-apiserver sets on a claim spec (``ResourceClaimSpec``)."""
    for request in get_list(get_dict(spec, "devices"), "requests"):
        if not isinstance(request, dict):
            continue
        if isinstance(request.get("exactly"), dict):
            _default_request(request["exactly"])
        for sub in get_list(request, "firstAvailable"):
            if isinstance(sub, dict):
                _default_request(sub)
