"""Built-in object validation: ObjectMeta and resource.k8s.io/v1 kinds, as kube-apiserver 1.34."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from neuron_dra.sim.fakeapi.errors import (
    FORBIDDEN,
    INVALID,
    REQUIRED,
    TOO_LONG,
    FieldError,
)
from neuron_dra.sim.fakeapi.validation.builtin import (
    apply_builtin_defaults,
    validate_builtin,
    validate_object_meta,
)
from neuron_dra.sim.fakeapi.validation.device_selectors import compile_device_selector
from neuron_dra.sim.fakeapi.validation.names import (
    is_c_identifier,
    is_dns1123_label,
    is_dns1123_subdomain,
    is_qualified_name,
    is_valid_label_value,
)

G = "resource.k8s.io"


def full(errors: list[FieldError]) -> list[str]:
    return [e.full() for e in errors]


def fields(errors: list[FieldError]) -> list[tuple[str, str]]:
    return [(e.field, e.reason) for e in errors]


# ------------------------------------------------------------------------------------------
# Name formats


@pytest.mark.parametrize("name", ["a", "a-b", "0", "abc-123", "a" * 63])
def test_dns_label_ok(name: str) -> None:
    assert is_dns1123_label(name) == []


@pytest.mark.parametrize("name", ["", "-a", "a-", "A", "a.b", "a_b", "a" * 64])
def test_dns_label_bad(name: str) -> None:
    assert is_dns1123_label(name)


def test_dns_label_message_matches_server() -> None:
    assert is_dns1123_label("Gpu") == [
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
        "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
        "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
    ]


@pytest.mark.parametrize(
    "name", ["a", "a.b", "neuron.aws.com", "a-b.c-d", ("a" * 63 + ".") * 3 + "a"]
)
def test_dns_subdomain_ok(name: str) -> None:
    assert is_dns1123_subdomain(name) == []


@pytest.mark.parametrize("name", ["", ".a", "a.", "a..b", "A.b", "a_b.c", "a" * 254])
def test_dns_subdomain_bad(name: str) -> None:
    assert is_dns1123_subdomain(name)


@pytest.mark.parametrize(
    "name", ["a", "A", "a.b_c-d", "example.com/Name", "kubernetes.io/hostname", "a" * 63]
)
def test_qualified_name_ok(name: str) -> None:
    assert is_qualified_name(name) == []


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "name part must be non-empty"),
        ("/a", "prefix part must be non-empty"),
        ("a/", "name part must be non-empty"),
        ("a/b/c", "a qualified name must consist of"),
        ("-a", "name part must consist of"),
        ("Bad_Prefix/a", "prefix part a lowercase RFC 1123 subdomain"),
        ("a" * 64, "name part must be no more than 63 characters"),
    ],
)
def test_qualified_name_bad(name: str, fragment: str) -> None:
    assert any(fragment in m for m in is_qualified_name(name))


@pytest.mark.parametrize("value", ["", "a", "A-b_c.d", "a" * 63])
def test_label_value_ok(value: str) -> None:
    assert is_valid_label_value(value) == []


@pytest.mark.parametrize("value", ["-a", "a-", "a b", "a/b", "a" * 64])
def test_label_value_bad(value: str) -> None:
    assert is_valid_label_value(value)


@pytest.mark.parametrize(
    ("value", "ok"),
    [("a", True), ("_a9", True), ("A_B", True), ("9a", False), ("a-b", False), ("", False)],
)
def test_c_identifier(value: str, ok: bool) -> None:
    assert (is_c_identifier(value) == []) == ok


# ------------------------------------------------------------------------------------------
# ObjectMeta


def meta(**kw: Any) -> dict[str, Any]:
    return {"metadata": {"name": "ok", "namespace": "default", **kw}}


def test_meta_ok() -> None:
    obj = meta(
        labels={"app.kubernetes.io/name": "x", "empty": ""},
        annotations={"Example.com/Note": "anything goes here"},
        finalizers=["neuron.aws.com/workload"],
        ownerReferences=[
            {"apiVersion": "neuron.aws.com/v1beta1", "kind": "W", "name": "w", "uid": "1"}
        ],
    )
    assert validate_object_meta(obj, namespaced=True) == []


@pytest.mark.parametrize(
    ("obj", "namespaced", "expected"),
    [
        ({"metadata": {"namespace": "d"}}, True, [("metadata.name", REQUIRED)]),
        ({"metadata": {"name": "Bad_Name", "namespace": "d"}}, True, [("metadata.name", INVALID)]),
        ({"metadata": {"name": "a"}}, True, [("metadata.namespace", REQUIRED)]),
        (
            {"metadata": {"name": "a", "namespace": "ns"}},
            False,
            [("metadata.namespace", FORBIDDEN)],
        ),
        ({"metadata": {"name": "a", "namespace": "a.b"}}, True, [("metadata.namespace", INVALID)]),
        (meta(labels={"bad key": "v"}), True, [("metadata.labels", INVALID)]),
        (meta(labels={"k": "bad value"}), True, [("metadata.labels", INVALID)]),
        (meta(annotations={"a/b/c": "v"}), True, [("metadata.annotations", INVALID)]),
        (meta(annotations={"big": "x" * (256 * 1024)}), True, [("metadata.annotations", TOO_LONG)]),
        (meta(finalizers=["has space"]), True, [("metadata.finalizers", INVALID)]),
        (
            {"metadata": {"name": "a", "namespace": "d", "generation": -1}},
            True,
            [("metadata.generation", INVALID)],
        ),
    ],
)
def test_meta_errors(
    obj: dict[str, Any], namespaced: bool, expected: list[tuple[str, str]]
) -> None:
    assert fields(validate_object_meta(obj, namespaced=namespaced)) == expected


def test_meta_messages() -> None:
    errors = validate_object_meta({"metadata": {"namespace": "d"}}, namespaced=True)
    assert full(errors) == ["metadata.name: Required value: name or generateName is required"]
    errors = validate_object_meta({"metadata": {"name": "a", "namespace": "ns"}}, namespaced=False)
    assert full(errors) == ["metadata.namespace: Forbidden: not allowed on this type"]


def test_meta_name_validators() -> None:
    label_only = {"metadata": {"name": "a.b"}}
    assert validate_object_meta(label_only, namespaced=False) == []
    assert fields(
        validate_object_meta(label_only, namespaced=False, name_validator="dns-label")
    ) == [("metadata.name", INVALID)]
    assert (
        validate_object_meta(
            {"metadata": {"name": "Any_Thing"}}, namespaced=False, name_validator="path-segment"
        )
        == []
    )
    assert validate_object_meta(
        {"metadata": {"name": "a/b"}}, namespaced=False, name_validator="path-segment"
    )


def test_meta_generate_name_prefix_may_end_in_dash() -> None:
    assert (
        validate_object_meta(
            {"metadata": {"generateName": "node-1-", "name": "node-1-abcde"}}, namespaced=False
        )
        == []
    )
    errors = validate_object_meta(
        {"metadata": {"generateName": "Node-", "name": "x"}}, namespaced=False
    )
    assert fields(errors) == [("metadata.generateName", INVALID)]


# ------------------------------------------------------------------------------------------
# ResourceSlice


def device(name: str = "neuron-0", **kw: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": name,
        "attributes": {
            "instanceType": {"string": "trn2.48xlarge"},
            "driverVersion": {"version": "2.24.7"},
            "neuron.aws.com/topology_x": {"int": 0},
            "healthy": {"bool": True},
        },
        "capacity": {"memory": {"value": "96Gi"}, "cores": {"value": "8"}},
    }
    d.update(kw)
    return d


def rslice(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "driver": "neuron.aws.com",
        "nodeName": "node-1",
        "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1},
        "devices": [device("neuron-0"), device("neuron-1")],
    }
    base.update(spec)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "node-1-neuron.aws.com-abcde"},
        "spec": base,
    }


def slice_errors(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[FieldError]:
    return validate_builtin(G, "resourceslices", obj, old)


def test_slice_ok() -> None:
    assert slice_errors(rslice()) == []
    assert slice_errors(rslice(nodeName=None, allNodes=True)) == []
    assert (
        slice_errors(rslice(pool={"name": "a.b/c-d", "generation": 0, "resourceSliceCount": 3}))
        == []
    )
    sel = {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
        ]
    }
    assert slice_errors(rslice(nodeName=None, nodeSelector=sel)) == []


def _with_device(**kw: Any) -> dict[str, Any]:
    return rslice(devices=[device(**kw)])


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (
            rslice(driver=""),
            [
                "spec.driver: Required value",
                'spec.driver: Invalid value: "": a lowercase RFC 1123 subdomain must consist of '
                "lower "
                "case alphanumeric characters, '-' or '.', and must start and end with an "
                "alphanumeric character (e.g. 'example.com', regex used for validation is "
                "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
            ],
        ),
        (rslice(driver="a" * 64), ["spec.driver: Too long: may not be more than 63 bytes"]),
        (
            rslice(pool={"name": "", "generation": 0, "resourceSliceCount": 1}),
            ["spec.pool.name: Required value"],
        ),
        (
            rslice(pool={"name": "p", "generation": -1, "resourceSliceCount": 1}),
            ["spec.pool.generation: Invalid value: -1: must be greater than or equal to zero"],
        ),
        (
            rslice(pool={"name": "p", "generation": 0, "resourceSliceCount": 0}),
            ["spec.pool.resourceSliceCount: Invalid value: 0: must be greater than zero"],
        ),
        (
            rslice(nodeName=None),
            [
                "spec: Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
                "`perDeviceNodeSelection` is required"
            ],
        ),
        (
            rslice(allNodes=True),
            [
                'spec: Invalid value: "{`nodeName`, `allNodes`}": exactly one of `nodeName`, '
                "`nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required, but multiple "
                "fields are set"
            ],
        ),
        (
            rslice(allNodes=False),
            ["spec.allNodes: Invalid value: false: must be either unset or set to true"],
        ),
        (
            rslice(nodeName=""),
            [
                'spec.nodeName: Invalid value: "": must be either unset or set to a non-empty '
                "string",
                "spec: Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
                "`perDeviceNodeSelection` is required",
            ],
        ),
        (
            rslice(devices=[device("neuron-0"), device("neuron-0")]),
            ['spec.devices[1].name: Duplicate value: "neuron-0"'],
        ),
        (
            rslice(devices=[device(f"d{i}") for i in range(129)]),
            ["spec.devices: Too many: 129: must have at most 128 items"],
        ),
        (
            _with_device(attributes={"x": {}}),
            [
                'spec.devices[0].attributes[x]: Invalid value: "": exactly one value must be '
                "specified"
            ],
        ),
    ],
)
def test_slice_errors(obj: dict[str, Any], expected: list[str]) -> None:
    assert full(slice_errors(obj)) == expected


def test_slice_with_taints_limits_devices_to_64() -> None:
    devices = [device(f"d{i}") for i in range(65)]
    assert slice_errors(rslice(devices=devices)) == []
    devices[0]["taints"] = [{"key": "k", "effect": "NoExecute"}]
    assert full(slice_errors(rslice(devices=devices))) == [
        "spec.devices: Too many: 65: must have at most 64 items"
    ]


def test_slice_node_selector_needs_exactly_one_term() -> None:
    term = {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}
    errs = slice_errors(rslice(nodeName=None, nodeSelector={"nodeSelectorTerms": [term, term]}))
    assert fields(errs) == [("spec.nodeSelector.nodeSelectorTerms", INVALID)]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda s: s.update(driver="other.example.com"), "spec.driver"),
        (lambda s: s["pool"].update(name="node-2"), "spec.pool.name"),
        (lambda s: s.update(nodeName="node-2"), "spec.nodeName"),
    ],
)
def test_slice_immutable_fields(change: Callable[[dict[str, Any]], None], field: str) -> None:
    old = rslice()
    new = copy.deepcopy(old)
    change(new["spec"])
    errs = slice_errors(new, old)
    assert [(e.field, e.detail) for e in errs] == [(field, "field is immutable")]


def test_slice_update_of_devices_and_generation_is_fine() -> None:
    old = rslice()
    new = copy.deepcopy(old)
    new["spec"]["pool"]["generation"] = 2
    new["spec"]["devices"][0]["attributes"]["workloadId"] = {"string": "job-1"}
    assert slice_errors(new, old) == []


# ------------------------------------------------------------------------------------------
# ResourceClaim / ResourceClaimTemplate


def claim(**devices: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "requests": [
            {
                "name": "neurons",
                "exactly": {
                    "deviceClassName": "neuron.aws.com",
                    "selectors": [
                        {
                            "cel": {
                                "expression": (
                                    'device.attributes["neuron.aws.com"].workloadId == "w"'
                                )
                            }
                        }
                    ],
                },
            }
        ],
        "config": [
            {
                "requests": ["neurons"],
                "opaque": {
                    "driver": "neuron.aws.com",
                    "parameters": {
                        "apiVersion": "neuron.aws.com/v1",
                        "kind": "UltraServerConfig",
                        "ultraserverMode": 4,
                    },
                },
            }
        ],
    }
    if "requests" in devices:
        base["config"] = []  # the default config refers to the default request
    base.update(devices)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": base},
    }


def claim_errors(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[FieldError]:
    return validate_builtin(G, "resourceclaims", obj, old)


def req(name: str = "r", **exactly: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": "neuron.aws.com", **exactly}}


def test_claim_ok() -> None:
    assert claim_errors(claim()) == []
    obj = claim(
        requests=[
            req("a", allocationMode="All"),
            {
                "name": "b",
                "firstAvailable": [
                    {"name": "big", "deviceClassName": "x", "count": 2},
                    {"name": "small", "deviceClassName": "x"},
                ],
            },
        ],
        constraints=[
            {"requests": ["a", "b/big"], "matchAttribute": "neuron.aws.com/ultraserverId"}
        ],
        config=[],
    )
    assert claim_errors(obj) == []


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        (
            {"requests": [{"name": "r"}]},
            [
                "spec.devices.requests[0]: Required value: exactly one of `exactly` or "
                "`firstAvailable` is required"
            ],
        ),
        (
            {"requests": [req("r"), req("r")]},
            ['spec.devices.requests[1].name: Duplicate value: "r"'],
        ),
        (
            {"requests": [req(f"r{i}") for i in range(33)]},
            ["spec.devices.requests: Too many: 33: must have at most 32 items"],
        ),
        (
            {"requests": [{"name": "r", "exactly": {}}]},
            ["spec.devices.requests[0].exactly.deviceClassName: Required value"],
        ),
        (
            {"requests": [req("r", allocationMode="Some")]},
            [
                'spec.devices.requests[0].exactly.allocationMode: Unsupported value: "Some": '
                'supported values: "All", "ExactCount"'
            ],
        ),
        (
            {"requests": [req("r", count=0)]},
            ["spec.devices.requests[0].exactly.count: Invalid value: 0: must be greater than zero"],
        ),
        (
            {"requests": [req("r", allocationMode="All", count=2)]},
            [
                "spec.devices.requests[0].exactly.count: Invalid value: 2: must not be specified "
                "when allocationMode is 'All'"
            ],
        ),
        (
            {"requests": [req("r", selectors=[{}])]},
            ["spec.devices.requests[0].exactly.selectors[0].cel: Required value"],
        ),
        (
            {"requests": [req("r")], "constraints": [{"matchAttribute": "ultraserverId"}]},
            [
                'spec.devices.constraints[0].matchAttribute: Invalid value: "ultraserverId": a '
                "fully "
                "qualified name must be a domain and a name separated by a slash"
            ],
        ),
        (
            {
                "requests": [req("r")],
                "constraints": [{"requests": ["nope"], "matchAttribute": "a.b/c"}],
            },
            [
                'spec.devices.constraints[0].requests[0]: Invalid value: "nope": must be the name '
                "of a "
                "request in the claim or the name of a request and a subrequest separated by '/'"
            ],
        ),
        (
            {"requests": [req("r")], "config": [{"requests": ["r"]}]},
            ["spec.devices.config[0].opaque: Required value"],
        ),
        (
            {
                "requests": [req("r")],
                "config": [{"opaque": {"driver": "neuron.aws.com", "parameters": ["x"]}}],
            },
            [
                'spec.devices.config[0].opaque.parameters: Invalid value: "<value omitted>": must '
                "be a valid JSON object"
            ],
        ),
        (
            {
                "requests": [req("r")],
                "config": [
                    {"opaque": {"driver": "neuron.aws.com", "parameters": {"x": "y" * 10240}}}
                ],
            },
            [
                "spec.devices.config[0].opaque.parameters: Too long: may not be more than 10240 "
                "bytes"
            ],
        ),
        (
            {
                "requests": [req("r")],
                "config": [{"opaque": {"driver": "Bad Driver", "parameters": {}}}],
            },
            ["spec.devices.config[0].opaque.driver"],
        ),
    ],
)
def test_claim_errors(devices: dict[str, Any], expected: list[str]) -> None:
    errs = claim_errors(claim(**devices))
    if len(expected) == 1 and ":" not in expected[0]:
        assert [e.field for e in errs] == expected
    else:
        assert full(errs) == expected


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("device.attributes[", "compilation failed"),
        ("device.nope == 1", "undefined field 'nope'"),
        ("1 + 1", "must evaluate to bool"),
        ("'a' + 1 == 'a1'", "compilation failed"),
    ],
)
def test_selector_compile_errors(expression: str, fragment: str) -> None:
    errs = claim_errors(claim(requests=[req("r", selectors=[{"cel": {"expression": expression}}])]))
    assert len(errs) == 1
    assert errs[0].field == "spec.devices.requests[0].exactly.selectors[0].cel.expression"
    assert errs[0].reason == INVALID
    assert fragment in errs[0].detail


@pytest.mark.parametrize(
    "expression",
    [
        'device.driver == "neuron.aws.com"',
        '"x" in device.attributes["neuron.aws.com"] && device.attributes["neuron.aws.com"].x',
        'device.capacity["neuron.aws.com"].memory.compareTo(quantity("8Gi")) >= 0',
        'device.attributes["neuron.aws.com"].driverVersion.isGreaterThan(semver("1.0.0"))',
        'cel.bind(a, device.attributes["neuron.aws.com"], a.instanceType.startsWith("trn2"))',
        '"device.foo" != device.driver',  # a string mentioning device.foo is not a field reference
    ],
)
def test_selector_valid_expressions(expression: str) -> None:
    program, error = compile_device_selector(expression)
    assert error is None
    assert program is not None


def test_selector_too_long() -> None:
    expr = "true && " * 1300 + "true"
    errs = claim_errors(claim(requests=[req("r", selectors=[{"cel": {"expression": expr}}])]))
    assert [(e.field, e.reason) for e in errs] == [
        ("spec.devices.requests[0].exactly.selectors[0].cel.expression", TOO_LONG)
    ]


def test_claim_spec_immutable() -> None:
    old = claim()
    assert claim_errors(copy.deepcopy(old), old) == []
    new = copy.deepcopy(old)
    new["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    assert [(e.field, e.detail) for e in claim_errors(new, old)] == [("spec", "field is immutable")]


def allocated(claim_obj: dict[str, Any], **status: Any) -> dict[str, Any]:
    obj = copy.deepcopy(claim_obj)
    obj["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "neurons",
                        "driver": "neuron.aws.com",
                        "pool": "node-1",
                        "device": "neuron-0",
                    }
                ],
                "config": [
                    {
                        "source": "FromClaim",
                        "requests": ["neurons"],
                        "opaque": {"driver": "neuron.aws.com", "parameters": {}},
                    }
                ],
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["node-1"]}
                        ]
                    }
                ]
            },
        },
        **status,
    }
    return obj


def test_claim_status_ok() -> None:
    base = claim()
    obj = allocated(base, reservedFor=[{"resource": "pods", "name": "p", "uid": "u1"}])
    assert claim_errors(obj, base) == []


def test_claim_reserved_for_rules() -> None:
    base = claim()
    obj = copy.deepcopy(base)
    obj["status"] = {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}
    assert full(claim_errors(obj, base)) == [
        "status.reservedFor: Forbidden: may not be specified when `allocated` is not set"
    ]
    deleting = allocated(base, reservedFor=[{"resource": "pods", "name": "p", "uid": "u1"}])
    deleting["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    more = copy.deepcopy(deleting)
    more["status"]["reservedFor"].append({"resource": "pods", "name": "q", "uid": "u2"})
    assert full(claim_errors(more, deleting)) == [
        "status.reservedFor: Forbidden: new entries may not be added while "
        "`deallocationRequested` or `deletionTimestamp` are set"
    ]


def test_claim_allocation_immutable_once_set() -> None:
    old = allocated(claim())
    new = copy.deepcopy(old)
    new["status"]["allocation"]["devices"]["results"][0]["device"] = "neuron-1"
    assert [(e.field, e.detail) for e in claim_errors(new, old)] == [
        ("status.allocation", "field is immutable")
    ]
    # Deallocation (removing it) is allowed.
    cleared = copy.deepcopy(old)
    del cleared["status"]["allocation"]
    assert claim_errors(cleared, old) == []


def template(**devices: Any) -> dict[str, Any]:
    c = claim(**devices)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "default"},
        "spec": {"metadata": {"labels": {"neuron.aws.com/workload-id": "w-1"}}, "spec": c["spec"]},
    }


def test_template_ok_and_paths() -> None:
    assert validate_builtin(G, "resourceclaimtemplates", template(), None) == []
    bad = template(requests=[{"name": "Bad"}])
    bad["spec"]["metadata"]["labels"] = {"k": "bad value"}
    assert fields(validate_builtin(G, "resourceclaimtemplates", bad, None)) == [
        ("spec.metadata.labels", INVALID),
        ("spec.spec.devices.requests[0].name", INVALID),
        ("spec.spec.devices.requests[0]", REQUIRED),
    ]


def test_template_spec_immutable() -> None:
    old = template()
    new = copy.deepcopy(old)
    new["spec"]["metadata"]["labels"]["x"] = "y"
    assert [
        (e.field, e.detail) for e in validate_builtin(G, "resourceclaimtemplates", new, old)
    ] == [("spec", "field is immutable")]


def test_defaults() -> None:
    obj = claim(
        requests=[
            req("a"),
            req("b", allocationMode="All"),
            {
                "name": "c",
                "firstAvailable": [
                    {"name": "s", "deviceClassName": "x", "tolerations": [{"key": "k"}]}
                ],
            },
        ]
    )
    apply_builtin_defaults(G, "resourceclaims", obj)
    requests = obj["spec"]["devices"]["requests"]
    assert requests[0]["exactly"]["allocationMode"] == "ExactCount"
    assert requests[0]["exactly"]["count"] == 1
    assert "count" not in requests[1]["exactly"]
    assert requests[2]["firstAvailable"][0]["count"] == 1
    assert requests[2]["firstAvailable"][0]["tolerations"][0]["operator"] == "Equal"
    tpl = template()
    apply_builtin_defaults(G, "resourceclaimtemplates", tpl)
    assert tpl["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 1
    assert claim_errors(obj) == []


# ------------------------------------------------------------------------------------------
# DeviceClass and dispatch


def test_device_class() -> None:
    good = {
        "spec": {
            "selectors": [{"cel": {"expression": 'device.driver == "neuron.aws.com"'}}],
            "config": [{"opaque": {"driver": "neuron.aws.com", "parameters": {"a": 1}}}],
        }
    }
    assert validate_builtin(G, "deviceclasses", good, None) == []
    bad = {"spec": {"selectors": [{"cel": {"expression": "device.driver =="}}], "config": [{}]}}
    assert fields(validate_builtin(G, "deviceclasses", bad, None)) == [
        ("spec.selectors[0].cel.expression", INVALID),
        ("spec.config[0].opaque", REQUIRED),
    ]


def test_unknown_kinds_have_no_rules() -> None:
    assert validate_builtin("", "pods", {"spec": {"whatever": 1}}, None) == []
    assert validate_builtin("apps", "deployments", {}, None) == []
