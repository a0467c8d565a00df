"""Validation of built-in objects, as kube-apiserver 1.34 does it, for the fake API server.

Only what our driver, controller and tests write is covered in depth: ObjectMeta and the
``resource.k8s.io/v1`` kinds (ResourceSlice, ResourceClaim, ResourceClaimTemplate, DeviceClass).
Paths and messages follow the real server (``spec.devices[3].name``, ``Required value``,
``Too many: 129: must have at most 128 items``, ``field is immutable``) because callers match on
them and because a test that passes here should pass against a real cluster.

Division of work with the server:

* ``validate_object_meta`` checks ``metadata`` (the server calls it for every kind; it resolves
  ``generateName`` first).
* ``apply_builtin_defaults`` fills the defaults the real server applies before validation.
* ``validate_builtin`` checks spec/status of the kinds above (``[]`` for other kinds). It treats
  absent defaulted fields as defaulted, so forgetting ``apply_builtin_defaults`` does not produce
  bogus errors.

Deliberate gaps: DRA selectors are compiled with ``device`` as DYN, so only syntax, unknown
functions, literal type errors and unknown top-level ``device`` fields are caught (not e.g.
``device.attributes["x"].y > "a"``); the Kubernetes CEL libraries are declared for compilation
only (``quantity``, ``semver``) and others (lists, regex extras, ip/cidr/url, format) are absent;
CEL cost limits, consumable-capacity request policies, admin access namespace checks and
``extendedResourceName`` rules are not enforced.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings
from neuron_dra.common import names
from neuron_dra.common.quantity import parse_quantity
from neuron_dra.sim.fakeapi.errors import (
    DUPLICATE,
    FORBIDDEN,
    INVALID,
    NOT_SUPPORTED,
    REQUIRED,
    TOO_LONG,
    TOO_MANY,
    TYPE_INVALID,
    FieldError,
)

__all__ = [
    "apply_builtin_defaults",
    "compile_device_selector",
    "is_c_identifier",
    "is_dns1123_label",
    "is_dns1123_subdomain",
    "is_qualified_name",
    "is_semver",
    "is_valid_label_value",
    "validate_builtin",
    "validate_object_meta",
]

# resource.k8s.io/v1 limits (Kubernetes 1.34 values; see reference/kubelet-dra.md §5.2, §6).
RESOURCE_SLICE_MAX_DEVICES = 128
RESOURCE_SLICE_MAX_DEVICES_WITH_TAINTS_OR_COUNTERS = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
DEVICE_MAX_DOMAIN_LENGTH = 63
DEVICE_MAX_ID_LENGTH = 32
DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH = 64
DRIVER_NAME_MAX_LENGTH = 63
POOL_NAME_MAX_LENGTH = 253
DEVICE_TAINTS_MAX = 4
DEVICE_TAINT_EFFECTS = ("NoExecute", "NoSchedule")
BINDING_CONDITIONS_MAX = 4
SHARED_COUNTERS_MAX = 32
DEVICE_COUNTER_CONSUMPTIONS_MAX = 32
DEVICE_REQUESTS_MAX = 32
FIRST_AVAILABLE_MAX = 8
DEVICE_SELECTORS_MAX = 32
DEVICE_CONSTRAINTS_MAX = 32
DEVICE_CONFIG_MAX = 32
DEVICE_TOLERATIONS_MAX = 16
OPAQUE_PARAMETERS_MAX_LENGTH = 10 * 1024
CEL_SELECTOR_EXPRESSION_MAX_LENGTH = 10 * 1024
ALLOCATION_RESULTS_MAX = 32
RESERVED_FOR_MAX = 256
ALLOCATED_DEVICE_STATUS_MAX_CONDITIONS = 8
ALLOCATED_DEVICE_STATUS_DATA_MAX_LENGTH = 10 * 1024
NETWORK_DATA_MAX_IPS = 16
NETWORK_INTERFACE_NAME_MAX = 256
NETWORK_HARDWARE_ADDRESS_MAX = 128
TOTAL_ANNOTATION_SIZE_LIMIT = 256 * 1024

# --------------------------------------------------------------------------------------------
# Name formats (k8s.io/apimachinery/pkg/util/validation): each returns the list of messages.

_DNS1123_LABEL_FMT = names.DNS1123_LABEL_FMT
_DNS1123_SUBDOMAIN_FMT = names.DNS1123_SUBDOMAIN_FMT
_QUALIFIED_NAME_FMT = names.QUALIFIED_NAME_FMT
_LABEL_VALUE_FMT = names.LABEL_VALUE_FMT
_C_IDENTIFIER_FMT = names.C_IDENTIFIER_FMT

_DNS1123_LABEL_RE = names.DNS1123_LABEL_RE
_DNS1123_SUBDOMAIN_RE = names.DNS1123_SUBDOMAIN_RE
_QUALIFIED_NAME_RE = names.QUALIFIED_NAME_RE
_LABEL_VALUE_RE = names.LABEL_VALUE_RE
_C_IDENTIFIER_RE = names.C_IDENTIFIER_RE

_QUALIFIED_NAME_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character"
)


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    # The real helper joins examples with ",  or " (two spaces); callers match on the text.
    shown = ",  or ".join(f"'{e}'" for e in examples)
    prefix = f"e.g. {shown}, " if examples else ""
    return f"{msg} ({prefix}regex used for validation is '{fmt}')"


def _max_len(n: int) -> str:
    return f"must be no more than {n} characters"


def is_dns1123_label(value: str) -> list[str]:
    errs = []
    if len(value) > 63:
        errs.append(_max_len(63))
    if not _DNS1123_LABEL_RE.fullmatch(value):
        errs.append(
            _regex_error(
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
                "'-', and must start and end with an alphanumeric character",
                _DNS1123_LABEL_FMT,
                "my-name",
                "123-abc",
            )
        )
    return errs


def is_dns1123_subdomain(value: str) -> list[str]:
    errs = []
    if len(value) > 253:
        errs.append(_max_len(253))
    if not _DNS1123_SUBDOMAIN_RE.fullmatch(value):
        errs.append(
            _regex_error(
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                "characters, '-' or '.', and must start and end with an alphanumeric character",
                _DNS1123_SUBDOMAIN_FMT,
                "example.com",
            )
        )
    return errs


def is_qualified_name(value: str) -> list[str]:
    """Label keys, annotation keys, finalizers: ``[prefix/]name``."""
    errs: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs.extend("prefix part " + m for m in is_dns1123_subdomain(prefix))
    else:
        return [
            "a qualified name "
            + _regex_error(_QUALIFIED_NAME_MSG, _QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part " + _max_len(63))
    if not _QUALIFIED_NAME_RE.fullmatch(name):
        errs.append(
            "name part "
            + _regex_error(_QUALIFIED_NAME_MSG, _QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
        )
    return errs


def is_valid_label_value(value: str) -> list[str]:
    errs = []
    if len(value) > 63:
        errs.append(_max_len(63))
    if not _LABEL_VALUE_RE.fullmatch(value):
        errs.append(
            _regex_error(
                "a valid label must be an empty string or consist of alphanumeric characters, "
                "'-', '_' or '.', and must start and end with an alphanumeric character",
                _LABEL_VALUE_FMT,
                "MyValue",
                "my_value",
                "12345",
            )
        )
    return errs


def is_c_identifier(value: str) -> list[str]:
    if _C_IDENTIFIER_RE.fullmatch(value):
        return []
    return [
        _regex_error(
            "a valid C identifier must start with alphabetic character or '_', followed by a "
            "string of alphanumeric characters or '_'",
            _C_IDENTIFIER_FMT,
            "my_name",
            "MY_NAME",
            "MyName",
        )
    ]


def _is_path_segment(value: str) -> list[str]:
    if value in (".", ".."):
        return [f"may not be '{value}'"]
    return [f"may not contain '{c}'" for c in ("/", "%") if c in value]


# Semantic Versioning 2.0.0, exactly: no "v" prefix, no leading zeros in numeric identifiers.
_NUM = r"(0|[1-9][0-9]*)"
_PRE = r"(0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*)"
_BUILD = r"[0-9a-zA-Z-]+"
_SEMVER_RE = re.compile(
    rf"{_NUM}\.{_NUM}\.{_NUM}(-{_PRE}(\.{_PRE})*)?(\+{_BUILD}(\.{_BUILD})*)?", re.ASCII
)


def is_semver(value: str) -> bool:
    return _SEMVER_RE.fullmatch(value) is not None


# --------------------------------------------------------------------------------------------
# Path and error helpers


def _child(path: str, *names: str) -> str:
    for name in names:
        path = f"{path}.{name}" if path else name
    return path


def _idx(path: str, i: int) -> str:
    return f"{path}[{i}]"


def _key(path: str, key: str) -> str:
    return f"{path}[{_truncate(key)}]"


def _truncate(key: str, limit: int = DEVICE_MAX_DOMAIN_LENGTH + 1 + DEVICE_MAX_ID_LENGTH) -> str:
    # Very long map keys are shortened in the middle so one bad key cannot flood the message.
    if len(key) <= limit:
        return key
    keep = limit - 3
    return key[: (keep + 1) // 2] + "..." + key[len(key) - keep // 2 :]


def _invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError(path, INVALID, detail, value=value, has_value=True)


def _required(path: str, detail: str = "") -> FieldError:
    return FieldError(path, REQUIRED, detail)


def _too_long(path: str, limit: int) -> FieldError:
    return FieldError(path, TOO_LONG, f"may not be more than {limit} bytes")


def _too_many(path: str, actual: int, limit: int) -> FieldError:
    return FieldError(path, TOO_MANY, f"must have at most {limit} items", actual, True)


def _not_supported(path: str, value: Any, supported: Iterable[str]) -> FieldError:
    detail = "supported values: " + ", ".join(json.dumps(s) for s in supported)
    return FieldError(path, NOT_SUPPORTED, detail, value=value, has_value=True)


def _duplicate(path: str, value: Any) -> FieldError:
    # field.Duplicate has no detail; the rendered value ends the message.
    return FieldError(path, DUPLICATE, json.dumps(value) if isinstance(value, str) else str(value))


def _immutable(path: str, value: Any) -> FieldError:
    return _invalid(path, value, "field is immutable")


def _messages(path: str, value: str, msgs: list[str]) -> list[FieldError]:
    return [_invalid(path, value, m) for m in msgs]


def _list(obj: Any, key: str) -> list[Any]:
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, list) else []


def _dict(obj: Any, key: str) -> dict[str, Any]:
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, dict) else {}


def _str(obj: Any, key: str) -> str:
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, str) else ""


Validator = Callable[[Any, str], list[FieldError]]


def _validate_slice(items: list[Any], limit: int, each: Validator, path: str) -> list[FieldError]:
    # Like the real server, an oversized list gets only the size error (DoS protection).
    if limit >= 0 and len(items) > limit:
        return [_too_many(path, len(items), limit)]
    errs: list[FieldError] = []
    for i, item in enumerate(items):
        errs.extend(each(item, _idx(path, i)))
    return errs


def _validate_set(
    items: list[Any],
    limit: int,
    each: Validator,
    key: Callable[[Any], Any],
    path: str,
    key_field: str = "",
) -> list[FieldError]:
    # Duplicates are reported at the key field of the repeated item (``devices[1].name``).
    if limit >= 0 and len(items) > limit:
        return [_too_many(path, len(items), limit)]
    errs: list[FieldError] = []
    for i, item in enumerate(items):
        errs.extend(each(item, _idx(path, i)))
    seen: set[Any] = set()
    for i, item in enumerate(items):
        k = key(item)
        if k in seen:
            dup_path = _child(_idx(path, i), key_field) if key_field else _idx(path, i)
            errs.append(_duplicate(dup_path, k))
        else:
            seen.add(k)
    return errs


# --------------------------------------------------------------------------------------------
# Common field validators


def validate_dns_label(value: str, path: str) -> list[FieldError]:
    return _messages(path, value, is_dns1123_label(value))


def validate_dns_subdomain(value: str, path: str) -> list[FieldError]:
    return _messages(path, value, is_dns1123_subdomain(value))


def validate_driver_name(value: str, path: str) -> list[FieldError]:
    """CSI driver name rules: required, <= 63, DNS subdomain after lowercasing."""
    errs: list[FieldError] = []
    if not value:
        errs.append(_required(path))
    if len(value) > DRIVER_NAME_MAX_LENGTH:
        errs.append(_too_long(path, DRIVER_NAME_MAX_LENGTH))
    errs.extend(_messages(path, value, is_dns1123_subdomain(value.lower())))
    return errs


def validate_pool_name(value: str, path: str) -> list[FieldError]:
    if not value:
        return [_required(path)]
    errs: list[FieldError] = []
    if len(value) > POOL_NAME_MAX_LENGTH:
        errs.append(_too_long(path, POOL_NAME_MAX_LENGTH))
    for part in value.split("/"):
        errs.extend(_messages(path, part, is_dns1123_subdomain(part)))
    return errs


def _validate_c_identifier(value: str, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    if len(value) > DEVICE_MAX_ID_LENGTH:
        errs.append(_too_long(path, DEVICE_MAX_ID_LENGTH))
    errs.extend(FieldError(path, TYPE_INVALID, m, value, True) for m in is_c_identifier(value))
    return errs


def validate_qualified_name(value: str, path: str) -> list[FieldError]:
    """Attribute/capacity names: ``<C identifier>`` or ``<domain>/<C identifier>``."""
    if not value:
        return [_required(path, "name required")]
    parts = value.split("/")
    if len(parts) == 1:
        return _validate_c_identifier(value, path)
    if len(parts) > 2:
        return [_invalid(path, value, "must include at most one slash")]
    domain, ident = parts
    errs: list[FieldError] = []
    if not domain:
        errs.append(_invalid(path, "", "the domain must not be empty"))
    else:
        errs.extend(validate_driver_name(domain, path))
    if not ident:
        errs.append(_invalid(path, "", "the name must not be empty"))
    else:
        errs.extend(_validate_c_identifier(ident, path))
    return errs


def validate_fully_qualified_name(value: str, path: str) -> list[FieldError]:
    errs = validate_qualified_name(value, path)
    if value and "/" not in value:
        errs.append(
            _invalid(
                path,
                value,
                "a fully qualified name must be a domain and a name separated by a slash",
            )
        )
    return errs


def _validate_label_name(value: str, path: str) -> list[FieldError]:
    return _messages(path, value, is_qualified_name(value))


def _validate_label_value(value: str, path: str) -> list[FieldError]:
    return _messages(path, value, is_valid_label_value(value))


def _validate_quantity(value: Any, path: str) -> list[FieldError]:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return [_invalid(path, value, "must be a quantity string")]
    try:
        parse_quantity(str(value))
    except ValueError as err:
        return [_invalid(path, value, str(err))]
    return []


# --------------------------------------------------------------------------------------------
# ObjectMeta


_NAME_VALIDATORS: dict[str, Callable[[str], list[str]]] = {
    "dns-subdomain": is_dns1123_subdomain,
    "dns-label": is_dns1123_label,
    "path-segment": _is_path_segment,
}


def validate_object_meta(
    obj: dict[str, Any], *, namespaced: bool, name_validator: str = "dns-subdomain"
) -> list[FieldError]:
    """``metadata`` checks shared by every kind (apimachinery ValidateObjectMeta)."""
    check_name = _NAME_VALIDATORS[name_validator]
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return [_required("metadata.name", "name or generateName is required")]
    errs: list[FieldError] = []
    name = _str(meta, "name")
    generate_name = _str(meta, "generateName")
    if generate_name:
        # A prefix may end in "-"; the server appends a random suffix.
        stem = generate_name.rstrip("-") if name_validator != "path-segment" else generate_name
        if stem:
            errs.extend(_messages("metadata.generateName", generate_name, check_name(stem)))
    if not name:
        errs.append(_required("metadata.name", "name or generateName is required"))
    else:
        errs.extend(_messages("metadata.name", name, check_name(name)))

    namespace = _str(meta, "namespace")
    if namespaced:
        if not namespace:
            errs.append(_required("metadata.namespace"))
        else:
            errs.extend(_messages("metadata.namespace", namespace, is_dns1123_label(namespace)))
    elif namespace:
        errs.append(FieldError("metadata.namespace", FORBIDDEN, "not allowed on this type"))

    generation = meta.get("generation")
    if isinstance(generation, int) and generation < 0:
        errs.append(
            _invalid("metadata.generation", generation, "must be greater than or equal to 0")
        )
    errs.extend(_validate_labels(_dict(meta, "labels"), "metadata.labels"))
    errs.extend(_validate_annotations(_dict(meta, "annotations"), "metadata.annotations"))
    errs.extend(_validate_owner_references(_list(meta, "ownerReferences")))
    for finalizer in _list(meta, "finalizers"):
        text = finalizer if isinstance(finalizer, str) else str(finalizer)
        errs.extend(_messages("metadata.finalizers", text, is_qualified_name(text)))
    return errs


def _validate_labels(labels: dict[str, Any], path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    for key, value in labels.items():
        errs.extend(_validate_label_name(key, path))
        text = value if isinstance(value, str) else ""
        errs.extend(_validate_label_value(text, path))
    return errs


def _validate_annotations(annotations: dict[str, Any], path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    total = 0
    for key, value in annotations.items():
        # Annotation keys are checked case-insensitively (upper case is allowed).
        errs.extend(_messages(path, key, is_qualified_name(key.lower())))
        total += len(key) + len(value if isinstance(value, str) else "")
    if total > TOTAL_ANNOTATION_SIZE_LIMIT:
        errs.append(_too_long(path, TOTAL_ANNOTATION_SIZE_LIMIT))
    return errs


def _validate_owner_references(refs: list[Any]) -> list[FieldError]:
    path = "metadata.ownerReferences"
    errs: list[FieldError] = []
    controllers: list[str] = []
    for ref in refs:
        ref = ref if isinstance(ref, dict) else {}
        api_version = _str(ref, "apiVersion")
        version = api_version.rsplit("/", 1)[-1] if api_version else ""
        if not version:
            errs.append(
                _invalid(_child(path, "apiVersion"), api_version, "version must not be empty")
            )
        if not _str(ref, "kind"):
            errs.append(_invalid(_child(path, "kind"), _str(ref, "kind"), "kind must not be empty"))
        if not _str(ref, "name"):
            errs.append(_invalid(_child(path, "name"), _str(ref, "name"), "name must not be empty"))
        if not _str(ref, "uid"):
            errs.append(_invalid(_child(path, "uid"), _str(ref, "uid"), "uid must not be empty"))
        if ref.get("controller") is True:
            controllers.append(f"{_str(ref, 'kind')}/{_str(ref, 'name')}")
    if len(controllers) > 1:
        errs.append(
            _invalid(
                path,
                refs,
                'Only one reference can have Controller set to true. Found "true" in references '
                "for " + " and ".join(controllers),
            )
        )
    return errs


# --------------------------------------------------------------------------------------------
# Node selectors (core/v1 NodeSelector as used by ResourceSlice and allocation results)

_NODE_SELECTOR_OPS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


def validate_node_selector(selector: Any, path: str) -> list[FieldError]:
    terms_path = _child(path, "nodeSelectorTerms")
    terms = _list(selector, "nodeSelectorTerms")
    if not terms:
        return [_required(terms_path, "must have at least one node selector term")]
    errs: list[FieldError] = []
    for i, term in enumerate(terms):
        term_path = _idx(terms_path, i)
        for j, req in enumerate(_list(term, "matchExpressions")):
            errs.extend(
                _node_selector_requirement(req, _idx(_child(term_path, "matchExpressions"), j))
            )
        for j, req in enumerate(_list(term, "matchFields")):
            errs.extend(_node_field_requirement(req, _idx(_child(term_path, "matchFields"), j)))
    return errs


def _node_selector_requirement(req: Any, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    op = _str(req, "operator")
    values = _list(req, "values")
    values_path = _child(path, "values")
    if op in ("In", "NotIn"):
        if not values:
            errs.append(
                _required(values_path, "must be specified when `operator` is 'In' or 'NotIn'")
            )
    elif op in ("Exists", "DoesNotExist"):
        if values:
            errs.append(
                FieldError(
                    values_path,
                    FORBIDDEN,
                    "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                )
            )
    elif op in ("Gt", "Lt"):
        if len(values) != 1:
            errs.append(
                _required(
                    values_path, "must be specified single value when `operator` is 'Lt' or 'Gt'"
                )
            )
    else:
        errs.append(_invalid(_child(path, "operator"), op, "not a valid selector operator"))
    errs.extend(_validate_label_name(_str(req, "key"), _child(path, "key")))
    for i, value in enumerate(values):
        errs.extend(_validate_label_value(str(value), _idx(values_path, i)))
    return errs


def _node_field_requirement(req: Any, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    op = _str(req, "operator")
    values = _list(req, "values")
    if op in ("In", "NotIn"):
        if len(values) != 1:
            errs.append(
                _required(
                    _child(path, "values"),
                    "must be only one value when `operator` is 'In' or 'NotIn' for node field "
                    "selector",
                )
            )
    else:
        errs.append(_invalid(_child(path, "operator"), op, "not a valid selector operator"))
    key = _str(req, "key")
    if key != "metadata.name":
        errs.append(_invalid(_child(path, "key"), key, "not a valid field selector key"))
    else:
        for i, value in enumerate(values):
            errs.extend(validate_dns_subdomain(str(value), _idx(_child(path, "values"), i)))
    return errs


def _validate_node_name(value: str, path: str) -> list[FieldError]:
    return validate_dns_subdomain(value, path)


# --------------------------------------------------------------------------------------------
# DRA CEL selectors

_DEVICE_FIELDS = ("driver", "attributes", "capacity", "allowMultipleAllocations")
_STRING_LITERAL = re.compile(r"""(?:[rRbB]{0,2})("(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')""")
_DEVICE_FIELD_REF = re.compile(r"(?<![\w.])device\s*\.\s*([A-Za-z_]\w*)")


def _selector_functions() -> list[Any]:
    """Declarations (no implementations) of the Kubernetes quantity and semver CEL libraries.

    Selectors such as ``device.capacity[d].memory.compareTo(quantity("8Gi")) >= 0`` must
    compile here as they do on the real server; evaluating them is the simulated scheduler's
    business.
    """
    semver_t = cel.Type.AbstractType("kubernetes.Semver")
    quantity_t = cel.Type.AbstractType("kubernetes.Quantity")
    s, b, i, d = cel.Type.STRING, cel.Type.BOOL, cel.Type.INT, cel.Type.DOUBLE

    def fn(name: str, *overloads: tuple[str, Any, list[Any], bool]) -> Any:
        return cel.FunctionDecl(
            name,
            [
                cel.Overload(oid, ret, params, is_member=member)
                for oid, ret, params, member in overloads
            ],
        )

    q, v = quantity_t, semver_t
    return [
        fn("quantity", ("string_to_quantity", q, [s], False)),
        fn("isQuantity", ("is_quantity_string", b, [s], False)),
        fn(
            "semver",
            ("string_to_semver", v, [s], False),
            ("string_bool_to_semver", v, [s, b], False),
        ),
        fn(
            "isSemver",
            ("is_semver_string", b, [s], False),
            ("is_semver_string_bool", b, [s, b], False),
        ),
        fn("isInteger", ("quantity_is_integer", b, [q], True)),
        fn("asInteger", ("quantity_as_integer", i, [q], True)),
        fn("asApproximateFloat", ("quantity_as_float", d, [q], True)),
        fn("sign", ("quantity_sign", i, [q], True)),
        fn("add", ("quantity_add", q, [q, q], True), ("quantity_add_int", q, [q, i], True)),
        fn("sub", ("quantity_sub", q, [q, q], True), ("quantity_sub_int", q, [q, i], True)),
        fn("isLessThan", ("quantity_less", b, [q, q], True), ("semver_less", b, [v, v], True)),
        fn(
            "isGreaterThan",
            ("quantity_greater", b, [q, q], True),
            ("semver_greater", b, [v, v], True),
        ),
        fn("compareTo", ("quantity_compare", i, [q, q], True), ("semver_compare", i, [v, v], True)),
        fn("major", ("semver_major", i, [v], True)),
        fn("minor", ("semver_minor", i, [v], True)),
        fn("patch", ("semver_patch", i, [v], True)),
    ]


@functools.cache
def _selector_env() -> Any:
    return cel.NewEnv(
        variables={"device": cel.Type.DYN},
        functions=_selector_functions(),
        extensions=[
            ext_strings.ExtStrings(),
            ext_optional.ExtOptional(),
            ext_bindings.ExtBindings(),
        ],
    )


def _clean_cel_error(err: BaseException) -> str:
    text = re.sub(r"^[A-Z_]+: ", "", str(err).strip())
    return re.sub(r"\s*\[[A-Z_]+\]$", "", text)


@functools.lru_cache(maxsize=2048)
def compile_device_selector(expression: str) -> tuple[Any | None, str | None]:
    """(program, None) or (None, message) for a DRA ``cel.expression``; cached per text."""
    # ``device`` is DYN here, so catch the typed environment's "undefined field" by hand.
    unquoted = _STRING_LITERAL.sub('""', expression)
    for match in _DEVICE_FIELD_REF.finditer(unquoted):
        if match.group(1) not in _DEVICE_FIELDS:
            return None, f"compilation failed: ERROR: <input>: undefined field '{match.group(1)}'"
    try:
        program = _selector_env().compile(expression)
    except RuntimeError as err:
        return None, f"compilation failed: {_clean_cel_error(err)}"
    if program.return_type().name() not in ("BOOL", "DYN"):
        return None, "must evaluate to bool"
    return program, None


def _validate_selectors(selectors: list[Any], path: str) -> list[FieldError]:
    return _validate_slice(selectors, DEVICE_SELECTORS_MAX, _validate_selector, path)


def _validate_selector(selector: Any, path: str) -> list[FieldError]:
    cel_sel = selector.get("cel") if isinstance(selector, dict) else None
    cel_path = _child(path, "cel")
    if not isinstance(cel_sel, dict):
        return [_required(cel_path)]
    expr_path = _child(cel_path, "expression")
    expression = _str(cel_sel, "expression")
    if len(expression) > CEL_SELECTOR_EXPRESSION_MAX_LENGTH:
        return [_too_long(expr_path, CEL_SELECTOR_EXPRESSION_MAX_LENGTH)]
    if not expression.strip():
        return [_required(expr_path)]
    _, error = compile_device_selector(expression)
    return [_invalid(expr_path, expression, error)] if error else []


# --------------------------------------------------------------------------------------------
# Opaque configuration


def _validate_raw_object(value: Any, path: str, limit: int) -> list[FieldError]:
    if value is None:
        return [_required(path)]
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
    if size > limit:
        return [_too_long(path, limit)]
    if not isinstance(value, dict):
        return [_invalid(path, "<value omitted>", "must be a valid JSON object")]
    return []


def _validate_device_configuration(config: Any, path: str) -> list[FieldError]:
    opaque = config.get("opaque") if isinstance(config, dict) else None
    opaque_path = _child(path, "opaque")
    if not isinstance(opaque, dict):
        return [_required(opaque_path)]
    errs = validate_driver_name(_str(opaque, "driver"), _child(opaque_path, "driver"))
    errs.extend(
        _validate_raw_object(
            opaque.get("parameters"),
            _child(opaque_path, "parameters"),
            OPAQUE_PARAMETERS_MAX_LENGTH,
        )
    )
    return errs


# --------------------------------------------------------------------------------------------
# ResourceSlice


def _validate_resource_slice(obj: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    spec = _dict(obj, "spec")
    path = "spec"
    errs = validate_driver_name(_str(spec, "driver"), _child(path, "driver"))
    pool = _dict(spec, "pool")
    pool_path = _child(path, "pool")
    errs.extend(validate_pool_name(_str(pool, "name"), _child(pool_path, "name")))
    count = pool.get("resourceSliceCount", 0)
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
        errs.append(
            _invalid(_child(pool_path, "resourceSliceCount"), count, "must be greater than zero")
        )
    generation = pool.get("generation", 0)
    if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
        errs.append(
            _invalid(
                _child(pool_path, "generation"), generation, "must be greater than or equal to zero"
            )
        )

    if old is not None:
        old_spec = _dict(old, "spec")
        old_pool = _dict(old_spec, "pool")
        if pool.get("name") != old_pool.get("name"):
            errs.append(_immutable(_child(pool_path, "name"), pool.get("name")))
        if spec.get("driver") != old_spec.get("driver"):
            errs.append(_immutable(_child(path, "driver"), spec.get("driver")))
        if spec.get("nodeName") != old_spec.get("nodeName"):
            errs.append(_immutable(_child(path, "nodeName"), spec.get("nodeName")))

    set_fields: list[str] = []
    node_name = spec.get("nodeName")
    if node_name is not None:
        if node_name != "":
            set_fields.append("`nodeName`")
            errs.extend(_validate_node_name(str(node_name), _child(path, "nodeName")))
        else:
            errs.append(
                _invalid(
                    _child(path, "nodeName"),
                    node_name,
                    "must be either unset or set to a non-empty string",
                )
            )
    if spec.get("nodeSelector") is not None:
        set_fields.append("`nodeSelector`")
        selector = spec["nodeSelector"]
        errs.extend(validate_node_selector(selector, _child(path, "nodeSelector")))
        terms = _list(selector, "nodeSelectorTerms")
        if len(terms) != 1:
            errs.append(
                _invalid(
                    _child(path, "nodeSelector", "nodeSelectorTerms"),
                    terms,
                    "must have exactly one node selector term",
                )
            )
    for flag in ("allNodes", "perDeviceNodeSelection"):
        value = spec.get(flag)
        if value is None:
            continue
        if value is True:
            set_fields.append(f"`{flag}`")
        else:
            errs.append(_invalid(_child(path, flag), value, "must be either unset or set to true"))
    one_of = (
        "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` "
        "is required"
    )
    if not set_fields:
        errs.append(_required(path, one_of))
    elif len(set_fields) > 1:
        errs.append(
            _invalid(
                path, "{" + ", ".join(set_fields) + "}", one_of + ", but multiple fields are set"
            )
        )

    devices = _list(spec, "devices")
    limited = any(_list(d, "taints") or _list(d, "consumesCounters") for d in devices)
    max_devices = (
        RESOURCE_SLICE_MAX_DEVICES_WITH_TAINTS_OR_COUNTERS
        if limited
        else RESOURCE_SLICE_MAX_DEVICES
    )
    per_device = spec.get("perDeviceNodeSelection") is True
    errs.extend(
        _validate_set(
            devices,
            max_devices,
            lambda d, p: _validate_device(d, p, per_device),
            lambda d: _str(d, "name"),
            _child(path, "devices"),
            "name",
        )
    )
    errs.extend(
        _validate_set(
            _list(spec, "sharedCounters"),
            SHARED_COUNTERS_MAX,
            _validate_counter_set,
            lambda c: _str(c, "name"),
            _child(path, "sharedCounters"),
            "name",
        )
    )
    return errs


def _validate_device(device: Any, path: str, per_device_node_selection: bool) -> list[FieldError]:
    device = device if isinstance(device, dict) else {}
    name = _str(device, "name")
    errs = (
        [_required(_child(path, "name"))]
        if not name
        else validate_dns_label(name, _child(path, "name"))
    )
    attributes = _dict(device, "attributes")
    capacity = _dict(device, "capacity")
    total = len(attributes) + len(capacity)
    if total > MAX_ATTRIBUTES_AND_CAPACITIES:
        errs.append(
            _invalid(
                path,
                total,
                "the total number of attributes and capacities must not exceed "
                f"{MAX_ATTRIBUTES_AND_CAPACITIES}",
            )
        )
    for key, attribute in attributes.items():
        key_path = _key(_child(path, "attributes"), key)
        errs.extend(validate_qualified_name(key, key_path))
        errs.extend(_validate_attribute(attribute, key_path))
    multi = device.get("allowMultipleAllocations") is True
    for key, cap in capacity.items():
        key_path = _key(_child(path, "capacity"), key)
        errs.extend(validate_qualified_name(key, key_path))
        cap = cap if isinstance(cap, dict) else {}
        if "value" not in cap:
            errs.append(_required(_child(key_path, "value")))
        else:
            errs.extend(_validate_quantity(cap["value"], _child(key_path, "value")))
        if cap.get("requestPolicy") is not None and not multi:
            errs.append(
                FieldError(
                    _child(key_path, "requestPolicy"),
                    FORBIDDEN,
                    "allowMultipleAllocations must be true",
                )
            )
    errs.extend(
        _validate_slice(
            _list(device, "taints"), DEVICE_TAINTS_MAX, _validate_taint, _child(path, "taints")
        )
    )
    errs.extend(
        _validate_set(
            _list(device, "consumesCounters"),
            DEVICE_COUNTER_CONSUMPTIONS_MAX,
            _validate_counter_consumption,
            lambda c: _str(c, "counterSet"),
            _child(path, "consumesCounters"),
            "counterSet",
        )
    )
    errs.extend(_validate_device_node_selection(device, path, per_device_node_selection))
    for key in ("bindingConditions", "bindingFailureConditions"):
        conditions = _list(device, key)
        if len(conditions) > BINDING_CONDITIONS_MAX:
            errs.append(_too_many(_child(path, key), len(conditions), BINDING_CONDITIONS_MAX))
        for i, cond in enumerate(conditions):
            errs.extend(_validate_label_name(str(cond), _idx(_child(path, key), i)))
    if bool(_list(device, "bindingConditions")) != bool(_list(device, "bindingFailureConditions")):
        errs.append(
            _invalid(
                path,
                "",
                "bindingConditions and bindingFailureConditions must both be set or both be empty",
            )
        )
    return errs


def _validate_device_node_selection(
    device: dict[str, Any], path: str, per_device: bool
) -> list[FieldError]:
    errs: list[FieldError] = []
    present = [k for k in ("nodeName", "nodeSelector", "allNodes") if device.get(k) is not None]
    if not per_device:
        if present:
            errs.append(
                _invalid(
                    path,
                    None,
                    "`nodeName`, `nodeSelector` and `allNodes` can only be set if "
                    "`perDeviceNodeSelection` is set to true in the ResourceSlice spec",
                )
            )
        return errs
    set_fields: list[str] = []
    if device.get("nodeName") is not None:
        if device["nodeName"]:
            set_fields.append("`nodeName`")
            errs.extend(_validate_node_name(str(device["nodeName"]), _child(path, "nodeName")))
        else:
            errs.append(_invalid(_child(path, "nodeName"), "", "must not be empty"))
    if device.get("nodeSelector") is not None:
        set_fields.append("`nodeSelector`")
        errs.extend(validate_node_selector(device["nodeSelector"], _child(path, "nodeSelector")))
    if device.get("allNodes") is not None:
        if device["allNodes"] is True:
            set_fields.append("`allNodes`")
        else:
            errs.append(
                _invalid(
                    _child(path, "allNodes"),
                    device["allNodes"],
                    "must be either unset or set to true",
                )
            )
    msg = (
        "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when "
        "`perDeviceNodeSelection` is set to true in the ResourceSlice spec"
    )
    if not set_fields:
        errs.append(_required(path, msg))
    elif len(set_fields) > 1:
        errs.append(_invalid(path, "{" + ", ".join(set_fields) + "}", msg))
    return errs


_ATTRIBUTE_KINDS = ("int", "bool", "string", "version")


def _validate_attribute(attribute: Any, path: str) -> list[FieldError]:
    attribute = attribute if isinstance(attribute, dict) else {}
    errs: list[FieldError] = []
    set_kinds = [k for k in _ATTRIBUTE_KINDS if attribute.get(k) is not None]
    if "int" in set_kinds:
        value = attribute["int"]
        if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**63:
            errs.append(_invalid(_child(path, "int"), value, "must be a 64-bit integer"))
    if "bool" in set_kinds and not isinstance(attribute["bool"], bool):
        errs.append(_invalid(_child(path, "bool"), attribute["bool"], "must be a boolean"))
    if "string" in set_kinds:
        value = attribute["string"]
        if not isinstance(value, str):
            errs.append(_invalid(_child(path, "string"), value, "must be a string"))
        elif len(value) > DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH:
            errs.append(_too_long(_child(path, "string"), DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH))
    if "version" in set_kinds:
        value = attribute["version"]
        text = value if isinstance(value, str) else str(value)
        if not is_semver(text):
            errs.append(
                _invalid(
                    _child(path, "version"),
                    value,
                    "must be a string compatible with semver.org spec 2.0.0",
                )
            )
        if len(text) > DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH:
            errs.append(_too_long(_child(path, "version"), DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH))
    if not set_kinds:
        errs.append(_invalid(path, "", "exactly one value must be specified"))
    elif len(set_kinds) > 1:
        errs.append(_invalid(path, attribute, "exactly one value must be specified"))
    return errs


def _validate_taint(taint: Any, path: str) -> list[FieldError]:
    taint = taint if isinstance(taint, dict) else {}
    errs = _validate_label_name(_str(taint, "key"), _child(path, "key"))
    value = _str(taint, "value")
    if value:
        errs.extend(_validate_label_value(value, _child(path, "value")))
    effect = _str(taint, "effect")
    if not effect:
        errs.append(_required(_child(path, "effect")))
    elif effect not in DEVICE_TAINT_EFFECTS:
        errs.append(_not_supported(_child(path, "effect"), effect, DEVICE_TAINT_EFFECTS))
    return errs


def _validate_counters(counters: dict[str, Any], path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    for name, counter in counters.items():
        key_path = _key(path, name)
        errs.extend(validate_dns_label(name, key_path))
        counter = counter if isinstance(counter, dict) else {}
        if "value" not in counter:
            errs.append(_required(_child(key_path, "value")))
        else:
            errs.extend(_validate_quantity(counter["value"], _child(key_path, "value")))
    return errs


def _validate_counter_set(counter_set: Any, path: str) -> list[FieldError]:
    name = _str(counter_set, "name")
    errs = (
        [_required(_child(path, "name"))]
        if not name
        else validate_dns_label(name, _child(path, "name"))
    )
    counters = _dict(counter_set, "counters")
    if not counters:
        errs.append(_required(_child(path, "counters")))
    errs.extend(_validate_counters(counters, _child(path, "counters")))
    return errs


def _validate_counter_consumption(consumption: Any, path: str) -> list[FieldError]:
    name = _str(consumption, "counterSet")
    errs = (
        [_required(_child(path, "counterSet"))]
        if not name
        else validate_dns_label(name, _child(path, "counterSet"))
    )
    counters = _dict(consumption, "counters")
    if not counters:
        errs.append(_required(_child(path, "counters")))
    errs.extend(_validate_counters(counters, _child(path, "counters")))
    return errs


# --------------------------------------------------------------------------------------------
# ResourceClaim / ResourceClaimTemplate

RequestNames = dict[str, "set[str] | None"]


def _gather_request_names(devices: dict[str, Any]) -> dict[str, set[str] | None]:
    names: dict[str, set[str] | None] = {}
    for request in _list(devices, "requests"):
        sub = _list(request, "firstAvailable")
        names[_str(request, "name")] = {_str(s, "name") for s in sub} if sub else None
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
        return [_invalid(path, text, _REQUEST_REF_MSG)]
    errs: list[FieldError] = []
    for part in parts:
        errs.extend(validate_dns_label(part, path))
    if not _has_request(names, text):
        errs.append(_invalid(path, text, _REQUEST_REF_MSG))
    return errs


def _validate_request_refs(
    refs: list[Any], path: str, names: dict[str, set[str] | None]
) -> list[FieldError]:
    return _validate_set(
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
                _invalid(
                    _child(path, "count"),
                    count,
                    "must not be specified when allocationMode is 'All'",
                )
            ]
        return []
    if mode == "ExactCount":
        effective = 1 if count is None else count
        if isinstance(effective, bool) or not isinstance(effective, int) or effective <= 0:
            return [_invalid(_child(path, "count"), effective, "must be greater than zero")]
        return []
    return [_not_supported(_child(path, "allocationMode"), mode, ("All", "ExactCount"))]


def _validate_toleration(toleration: Any, path: str) -> list[FieldError]:
    toleration = toleration if isinstance(toleration, dict) else {}
    errs: list[FieldError] = []
    key = _str(toleration, "key")
    if key:
        errs.extend(_validate_label_name(key, _child(path, "key")))
    operator = toleration.get("operator") or "Equal"
    value = _str(toleration, "value")
    if operator == "Exists":
        if value:
            errs.append(
                _invalid(_child(path, "value"), value, "must be empty for operator `Exists`")
            )
    elif operator == "Equal":
        errs.extend(_validate_label_value(value, _child(path, "value")))
    else:
        errs.append(_not_supported(_child(path, "operator"), operator, ("Equal", "Exists")))
    effect = _str(toleration, "effect")
    if effect and effect not in DEVICE_TAINT_EFFECTS:
        errs.append(_not_supported(_child(path, "effect"), effect, DEVICE_TAINT_EFFECTS))
    return errs


def _validate_device_class_ref(name: str, path: str) -> list[FieldError]:
    if not name:
        return [_required(path)]
    return validate_dns_subdomain(name, path)


def _validate_exact_request(request: Any, path: str) -> list[FieldError]:
    request = request if isinstance(request, dict) else {}
    errs = _validate_device_class_ref(
        _str(request, "deviceClassName"), _child(path, "deviceClassName")
    )
    errs.extend(_validate_selectors(_list(request, "selectors"), _child(path, "selectors")))
    errs.extend(_validate_allocation_mode(request, path))
    errs.extend(
        _validate_slice(
            _list(request, "tolerations"),
            DEVICE_TOLERATIONS_MAX,
            _validate_toleration,
            _child(path, "tolerations"),
        )
    )
    for key, quantity in _dict(_dict(request, "capacity"), "requests").items():
        key_path = _key(_child(path, "capacity", "requests"), key)
        errs.extend(validate_qualified_name(key, key_path))
        errs.extend(_validate_quantity(quantity, key_path))
    return errs


def _validate_sub_request(sub: Any, path: str) -> list[FieldError]:
    sub = sub if isinstance(sub, dict) else {}
    name = _str(sub, "name")
    errs = (
        [_required(_child(path, "name"))]
        if not name
        else validate_dns_label(name, _child(path, "name"))
    )
    if sub.get("adminAccess") is not None:
        errs.append(
            FieldError(_child(path, "adminAccess"), FORBIDDEN, "not supported in subrequests")
        )
    errs.extend(_validate_exact_request(sub, path))
    return errs


def _validate_request(request: Any, path: str) -> list[FieldError]:
    request = request if isinstance(request, dict) else {}
    name = _str(request, "name")
    errs = (
        [_required(_child(path, "name"))]
        if not name
        else validate_dns_label(name, _child(path, "name"))
    )
    first = _list(request, "firstAvailable")
    exactly = request.get("exactly")
    kinds = int(bool(first)) + int(exactly is not None)
    if kinds == 0:
        errs.append(_required(path, "exactly one of `exactly` or `firstAvailable` is required"))
    elif kinds > 1:
        errs.append(
            _invalid(
                path,
                None,
                "exactly one of `exactly` or `firstAvailable` is required, but multiple fields "
                "are set",
            )
        )
    elif first:
        errs.extend(
            _validate_set(
                first,
                FIRST_AVAILABLE_MAX,
                _validate_sub_request,
                lambda s: _str(s, "name"),
                _child(path, "firstAvailable"),
                "name",
            )
        )
    else:
        errs.extend(_validate_exact_request(exactly, _child(path, "exactly")))
    return errs


def _validate_constraint(
    constraint: Any, path: str, names: dict[str, set[str] | None]
) -> list[FieldError]:
    constraint = constraint if isinstance(constraint, dict) else {}
    errs = _validate_request_refs(_list(constraint, "requests"), _child(path, "requests"), names)
    match = constraint.get("matchAttribute")
    distinct = constraint.get("distinctAttribute")
    if match is not None and distinct is not None:
        errs.append(
            _invalid(
                path,
                None,
                'exactly one of "matchAttribute" or "distinctAttribute" is required, but '
                "multiple fields are set",
            )
        )
    elif match is not None:
        errs.extend(validate_fully_qualified_name(str(match), _child(path, "matchAttribute")))
    elif distinct is not None:
        errs.extend(validate_fully_qualified_name(str(distinct), _child(path, "distinctAttribute")))
    else:
        errs.append(_required(_child(path, "matchAttribute")))
    return errs


def _validate_claim_config(
    config: Any, path: str, names: dict[str, set[str] | None]
) -> list[FieldError]:
    errs = _validate_request_refs(_list(config, "requests"), _child(path, "requests"), names)
    errs.extend(_validate_device_configuration(config, path))
    return errs


def _validate_claim_spec(spec: Any, path: str) -> list[FieldError]:
    devices = _dict(spec, "devices")
    dpath = _child(path, "devices")
    names = _gather_request_names(devices)
    errs = _validate_set(
        _list(devices, "requests"),
        DEVICE_REQUESTS_MAX,
        _validate_request,
        lambda r: _str(r, "name"),
        _child(dpath, "requests"),
        "name",
    )
    errs.extend(
        _validate_slice(
            _list(devices, "constraints"),
            DEVICE_CONSTRAINTS_MAX,
            lambda c, p: _validate_constraint(c, p, names),
            _child(dpath, "constraints"),
        )
    )
    errs.extend(
        _validate_slice(
            _list(devices, "config"),
            DEVICE_CONFIG_MAX,
            lambda c, p: _validate_claim_config(c, p, names),
            _child(dpath, "config"),
        )
    )
    return errs


def _validate_claim_status(obj: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    status = _dict(obj, "status")
    old_status = _dict(old, "status") if old is not None else {}
    names = _gather_request_names(_dict(_dict(obj, "spec"), "devices"))
    errs = _validate_set(
        _list(status, "reservedFor"),
        RESERVED_FOR_MAX,
        _validate_consumer_ref,
        lambda r: _str(r, "uid"),
        "status.reservedFor",
        "uid",
    )
    allocation = status.get("allocation")
    old_allocation = old_status.get("allocation")
    reserved = _list(status, "reservedFor")
    if reserved:
        if allocation is None:
            errs.append(
                FieldError(
                    "status.reservedFor",
                    FORBIDDEN,
                    "may not be specified when `allocated` is not set",
                )
            )
        elif _dict(obj, "metadata").get("deletionTimestamp"):
            old_uids = {_str(r, "uid") for r in _list(old_status, "reservedFor")}
            if any(_str(r, "uid") not in old_uids for r in reserved):
                errs.append(
                    FieldError(
                        "status.reservedFor",
                        FORBIDDEN,
                        "new entries may not be added while `deallocationRequested` or "
                        "`deletionTimestamp` are set",
                    )
                )
    if allocation is not None and old_allocation is not None:
        if allocation != old_allocation:
            errs.append(_immutable("status.allocation", allocation))
    elif allocation is not None:
        errs.extend(_validate_allocation(allocation, "status.allocation", names))
    allocated = {
        (_str(r, "driver"), _str(r, "pool"), _str(r, "device"), r.get("shareID"))
        for r in _list(_dict(allocation, "devices"), "results")
    }
    errs.extend(
        _validate_set(
            _list(status, "devices"),
            -1,
            lambda d, p: _validate_device_status(d, p, allocated),
            lambda d: (_str(d, "driver"), _str(d, "pool"), _str(d, "device"), d.get("shareID")),
            "status.devices",
            "deviceID",
        )
    )
    return errs


def _validate_consumer_ref(ref: Any, path: str) -> list[FieldError]:
    return [
        _required(_child(path, key)) for key in ("resource", "name", "uid") if not _str(ref, key)
    ]


def _validate_allocation(
    allocation: Any, path: str, names: dict[str, set[str] | None]
) -> list[FieldError]:
    devices = _dict(allocation, "devices")
    dpath = _child(path, "devices")
    errs = _validate_slice(
        _list(devices, "results"),
        ALLOCATION_RESULTS_MAX,
        lambda r, p: _validate_allocation_result(r, p, names),
        _child(dpath, "results"),
    )
    errs.extend(
        _validate_slice(
            _list(devices, "config"),
            2 * DEVICE_CONFIG_MAX,
            lambda c, p: _validate_allocation_config(c, p, names),
            _child(dpath, "config"),
        )
    )
    if isinstance(allocation, dict) and allocation.get("nodeSelector") is not None:
        errs.extend(
            validate_node_selector(allocation["nodeSelector"], _child(path, "nodeSelector"))
        )
    return errs


def _validate_allocation_result(
    result: Any, path: str, names: dict[str, set[str] | None]
) -> list[FieldError]:
    result = result if isinstance(result, dict) else {}
    errs = _validate_request_ref(_str(result, "request"), _child(path, "request"), names)
    errs.extend(validate_driver_name(_str(result, "driver"), _child(path, "driver")))
    errs.extend(validate_pool_name(_str(result, "pool"), _child(path, "pool")))
    device = _str(result, "device")
    errs.extend(validate_dns_label(device, _child(path, "device")))
    return errs


def _validate_allocation_config(
    config: Any, path: str, names: dict[str, set[str] | None]
) -> list[FieldError]:
    source = _str(config, "source")
    errs: list[FieldError] = []
    if not source:
        errs.append(_required(_child(path, "source")))
    elif source not in ("FromClaim", "FromClass"):
        errs.append(_not_supported(_child(path, "source"), source, ("FromClaim", "FromClass")))
    errs.extend(_validate_request_refs(_list(config, "requests"), _child(path, "requests"), names))
    errs.extend(_validate_device_configuration(config, path))
    return errs


def _validate_device_status(
    device: Any, path: str, allocated: set[tuple[str, str, str, Any]]
) -> list[FieldError]:
    device = device if isinstance(device, dict) else {}
    errs = validate_driver_name(_str(device, "driver"), _child(path, "driver"))
    errs.extend(validate_pool_name(_str(device, "pool"), _child(path, "pool")))
    errs.extend(validate_dns_label(_str(device, "device"), _child(path, "device")))
    key = (
        _str(device, "driver"),
        _str(device, "pool"),
        _str(device, "device"),
        device.get("shareID"),
    )
    if key not in allocated:
        shown = "/".join(key[:3])
        errs.append(_invalid(path, shown, "must be an allocated device in the claim"))
    conditions = _list(device, "conditions")
    if len(conditions) > ALLOCATED_DEVICE_STATUS_MAX_CONDITIONS:
        errs.append(
            _too_many(
                _child(path, "conditions"), len(conditions), ALLOCATED_DEVICE_STATUS_MAX_CONDITIONS
            )
        )
    if device.get("data") is not None:
        errs.extend(
            _validate_raw_object(
                device["data"], _child(path, "data"), ALLOCATED_DEVICE_STATUS_DATA_MAX_LENGTH
            )
        )
    network = _dict(device, "networkData")
    npath = _child(path, "networkData")
    if len(_str(network, "interfaceName")) > NETWORK_INTERFACE_NAME_MAX:
        errs.append(_too_long(_child(npath, "interfaceName"), NETWORK_INTERFACE_NAME_MAX))
    if len(_str(network, "hardwareAddress")) > NETWORK_HARDWARE_ADDRESS_MAX:
        errs.append(_too_long(_child(npath, "hardwareAddress"), NETWORK_HARDWARE_ADDRESS_MAX))
    ips = _list(network, "ips")
    if len(ips) > NETWORK_DATA_MAX_IPS:
        errs.append(_too_many(_child(npath, "ips"), len(ips), NETWORK_DATA_MAX_IPS))
    return errs


def _validate_resource_claim(obj: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    if old is not None:
        # The spec is immutable; on update only that is checked (the rest was checked on create).
        errs: list[FieldError] = []
        if obj.get("spec") != old.get("spec"):
            errs.append(_immutable("spec", obj.get("spec")))
        return errs + _validate_claim_status(obj, old)
    return _validate_claim_spec(obj.get("spec"), "spec") + _validate_claim_status(obj, None)


def _validate_resource_claim_template(
    obj: dict[str, Any], old: dict[str, Any] | None
) -> list[FieldError]:
    if old is not None:
        return [_immutable("spec", obj.get("spec"))] if obj.get("spec") != old.get("spec") else []
    spec = _dict(obj, "spec")
    template_meta = _dict(spec, "metadata")
    errs = _validate_labels(_dict(template_meta, "labels"), "spec.metadata.labels")
    errs.extend(
        _validate_annotations(_dict(template_meta, "annotations"), "spec.metadata.annotations")
    )
    errs.extend(_validate_claim_spec(spec.get("spec"), "spec.spec"))
    return errs


# --------------------------------------------------------------------------------------------
# DeviceClass


def _validate_device_class(obj: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    spec = _dict(obj, "spec")
    errs = _validate_selectors(_list(spec, "selectors"), "spec.selectors")
    errs.extend(
        _validate_slice(
            _list(spec, "config"), DEVICE_CONFIG_MAX, _validate_device_configuration, "spec.config"
        )
    )
    return errs


# --------------------------------------------------------------------------------------------
# Dispatch and defaults

_VALIDATORS: dict[
    tuple[str, str], Callable[[dict[str, Any], dict[str, Any] | None], list[FieldError]]
] = {
    ("resource.k8s.io", "resourceslices"): _validate_resource_slice,
    ("resource.k8s.io", "resourceclaims"): _validate_resource_claim,
    ("resource.k8s.io", "resourceclaimtemplates"): _validate_resource_claim_template,
    ("resource.k8s.io", "deviceclasses"): _validate_device_class,
}


def validate_builtin(
    group: str, plural: str, obj: dict[str, Any], old: dict[str, Any] | None
) -> list[FieldError]:
    """Spec/status validation of a built-in kind (metadata is ``validate_object_meta``'s job)."""
    validator = _VALIDATORS.get((group, plural))
    return validator(obj, old) if validator is not None else []


def _default_request(request: dict[str, Any]) -> None:
    if not request.get("allocationMode"):
        request["allocationMode"] = "ExactCount"
    if request["allocationMode"] == "ExactCount" and request.get("count") is None:
        request["count"] = 1
    for toleration in _list(request, "tolerations"):
        if isinstance(toleration, dict) and not toleration.get("operator"):
            toleration["operator"] = "Equal"


def _default_claim_spec(spec: Any) -> None:
    for request in _list(_dict(spec, "devices"), "requests"):
        if not isinstance(request, dict):
            continue
        if isinstance(request.get("exactly"), dict):
            _default_request(request["exactly"])
        for sub in _list(request, "firstAvailable"):
            if isinstance(sub, dict):
                _default_request(sub)


def apply_builtin_defaults(group: str, plural: str, obj: dict[str, Any]) -> None:
    """In place: the defaults kube-apiserver sets on create/update for these kinds."""
    if group != "resource.k8s.io":
        return
    if plural == "resourceclaims":
        _default_claim_spec(obj.get("spec"))
    elif plural == "resourceclaimtemplates":
        _default_claim_spec(_dict(obj, "spec").get("spec"))
