"""CRDSchema: structural-schema defaulting, pruning, validation and CEL rules."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from neuron_dra.sim.fakeapi.crdschema.schema import CRDSchema, SchemaError, validate_crd_manifest
from neuron_dra.sim.fakeapi.errors import (
    DUPLICATE,
    INVALID,
    NOT_SUPPORTED,
    REQUIRED,
    TOO_LONG,
    TYPE_INVALID,
    FieldError,
    invalid_status,
)

CRD_DIR = Path(__file__).resolve().parents[2] / "charts" / "neuron-dra-driver" / "crds"

# A workload-like schema exercising the features our CRDs use.
WORKLOAD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["instanceType", "topologySize"],
            "properties": {
                "instanceType": {
                    "type": "string",
                    "minLength": 1,
                    "x-kubernetes-validations": [
                        {"rule": "self == oldSelf", "message": "instanceType is immutable"}
                    ],
                },
                "topologySize": {
                    "type": "integer",
                    "x-kubernetes-validations": [
                        {"rule": "self in [1, 2, 4]", "message": "topologySize must be 1, 2 or 4"}
                    ],
                },
                "serverCount": {"type": "integer", "minimum": 1, "maximum": 10, "default": 1},
                "allocationPolicy": {
                    "type": "object",
                    "default": {},
                    "properties": {
                        "failureStrategy": {
                            "type": "string",
                            "enum": ["NoOp", "RestartAll", "ReplaceAffected"],
                            "default": "NoOp",
                        },
                        "retries": {"type": "integer", "default": 3},
                    },
                },
                "topology": {
                    "type": "array",
                    "maxItems": 4,
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["nodeId"],
                    "items": {
                        "type": "object",
                        "required": ["nodeId"],
                        "properties": {
                            "nodeId": {"type": "integer", "minimum": 0, "maximum": 7},
                            "nodeName": {
                                "type": "string",
                                "x-kubernetes-validations": [
                                    {"rule": "self == oldSelf", "message": "nodeName is immutable"}
                                ],
                            },
                            "link": {"type": "string", "default": "Up"},
                        },
                    },
                },
                "tags": {
                    "type": "array",
                    "x-kubernetes-list-type": "set",
                    "items": {"type": "string"},
                },
                "labels": {
                    "type": "object",
                    "additionalProperties": {"type": "string", "maxLength": 5},
                },
                "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8},
                "startedAt": {"type": "string", "format": "date-time"},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "note": {"type": "string", "nullable": True},
            },
        },
        "status": {"type": "object", "properties": {"state": {"type": "string"}}},
    },
}


def workload(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"instanceType": "trn2u.48xlarge", "topologySize": 4}
    base.update(spec)
    return {
        "apiVersion": "neuron.aws.com/v1beta1",
        "kind": "NeuronUltraServerWorkload",
        "metadata": {"name": "w", "namespace": "default"},
        "spec": base,
    }


@pytest.fixture(scope="module")
def schema() -> CRDSchema:
    return CRDSchema.from_openapi(WORKLOAD_SCHEMA)


def full(errors: list[FieldError]) -> list[str]:
    return [e.full() for e in errors]


# ------------------------------------------------------------------------------------------
# Defaulting


def test_defaults_fill_absent_fields_recursively(schema: CRDSchema) -> None:
    obj = workload()
    schema.apply_defaults(obj)
    assert obj["spec"]["serverCount"] == 1
    # The default {} is itself defaulted.
    assert obj["spec"]["allocationPolicy"] == {"failureStrategy": "NoOp", "retries": 3}


def test_defaults_do_not_override_and_apply_in_array_items(schema: CRDSchema) -> None:
    obj = workload(
        serverCount=5,
        allocationPolicy={"failureStrategy": "RestartAll"},
        topology=[{"nodeId": 0}, {"nodeId": 1, "link": "Down"}],
    )
    schema.apply_defaults(obj)
    assert obj["spec"]["serverCount"] == 5
    assert obj["spec"]["allocationPolicy"] == {"failureStrategy": "RestartAll", "retries": 3}
    assert [t["link"] for t in obj["spec"]["topology"]] == ["Up", "Down"]


def test_defaults_replace_non_nullable_null_and_drop_others(schema: CRDSchema) -> None:
    obj = workload(serverCount=None, name=None, note=None)
    schema.apply_defaults(obj)
    assert obj["spec"]["serverCount"] == 1
    assert "name" not in obj["spec"]
    assert obj["spec"]["note"] is None  # nullable: kept


def test_defaults_inside_additional_properties() -> None:
    s = CRDSchema.from_openapi(
        {
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "object",
                        "properties": {"weight": {"type": "integer", "default": 7}},
                    },
                }
            },
        }
    )
    obj: dict[str, Any] = {"spec": {"a": {}, "b": {"weight": 1}}}
    s.apply_defaults(obj)
    assert obj["spec"] == {"a": {"weight": 7}, "b": {"weight": 1}}


def test_root_metadata_is_not_defaulted_or_pruned() -> None:
    s = CRDSchema.from_openapi({"type": "object", "properties": {"spec": {"type": "object"}}})
    obj = {"apiVersion": "a/v1", "kind": "K", "metadata": {"name": "x", "labels": {"a": "b"}}}
    assert s.prune(obj) == []
    assert obj["metadata"] == {"name": "x", "labels": {"a": "b"}}


# ------------------------------------------------------------------------------------------
# Pruning


def test_prune_drops_unknown_fields_and_reports_paths(schema: CRDSchema) -> None:
    obj = workload(bogus=1, topology=[{"nodeId": 0, "junk": True}], extra={"anything": {"x": 1}})
    obj["status"] = {"state": "Pending", "other": 2}
    obj["topLevel"] = "x"
    removed = schema.prune(obj)
    assert sorted(removed) == sorted(
        ["spec.bogus", "spec.topology[0].junk", "status.other", "topLevel"]
    )
    assert obj["spec"]["topology"] == [{"nodeId": 0}]
    assert obj["spec"]["extra"] == {"anything": {"x": 1}}  # preserve-unknown-fields
    assert "topLevel" not in obj


# ------------------------------------------------------------------------------------------
# Value validation


def test_valid_object_has_no_errors(schema: CRDSchema) -> None:
    obj = workload(
        serverCount=2,
        topology=[{"nodeId": 0, "nodeName": "n0"}, {"nodeId": 3}],
        tags=["a", "b"],
        labels={"x": "y"},
        name="abc",
        startedAt="2024-05-01T10:00:00Z",
        note=None,
    )
    schema.apply_defaults(obj)
    assert schema.validate(obj) == []


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"topologySize": "4"},
            'spec.topologySize: Invalid value: "string": spec.topologySize in body must be of '
            'type integer: "string"',
        ),
        (
            {"topologySize": 1.5},
            'spec.topologySize: Invalid value: "number": spec.topologySize in body must be of '
            'type integer: "number"',
        ),
        (
            {"topologySize": True},
            'spec.topologySize: Invalid value: "boolean": spec.topologySize in body must be of '
            'type integer: "boolean"',
        ),
        (
            {"allocationPolicy": {"failureStrategy": "Panic"}},
            'spec.allocationPolicy.failureStrategy: Unsupported value: "Panic": supported values: '
            '"NoOp", "RestartAll", "ReplaceAffected"',
        ),
        (
            {"serverCount": 0},
            "spec.serverCount: Invalid value: 0: spec.serverCount in body should be greater than "
            "or equal to 1",
        ),
        (
            {"serverCount": 11},
            "spec.serverCount: Invalid value: 11: spec.serverCount in body should be less than or "
            "equal to 10",
        ),
        (
            {"instanceType": ""},
            'spec.instanceType: Invalid value: "": spec.instanceType in body should be at least 1 '
            "chars long",
        ),
        ({"name": "abcdefghi"}, "spec.name: Too long: may not be more than 8 bytes"),
        (
            {"name": "ABC"},
            "spec.name: Invalid value: \"ABC\": spec.name in body should match '^[a-z]+$'",
        ),
        (
            {"topology": [{"nodeId": i} for i in range(5)]},
            "spec.topology: Too many: 5: must have at most 4 items",
        ),
        (
            {"topology": [{"nodeId": 1}, {"nodeId": 1}]},
            'spec.topology[1]: Duplicate value: map[string]interface {}{"nodeId":1}',
        ),
        ({"tags": ["a", "b", "a"]}, 'spec.tags[2]: Duplicate value: "a"'),
        ({"labels": {"k": "toolong"}}, "spec.labels[k]: Too long: may not be more than 5 bytes"),
        (
            {"startedAt": "yesterday"},
            'spec.startedAt: Invalid value: "yesterday": spec.startedAt in body must be of type '
            'date-time: "yesterday"',
        ),
        ({"topology": [{"nodeName": "x"}]}, "spec.topology[0].nodeId: Required value"),
        (
            {"topologySize": 3},
            'spec.topologySize: Invalid value: "integer": topologySize must be 1, 2 or 4',
        ),
    ],
)
def test_single_error(schema: CRDSchema, spec: dict[str, Any], expected: str) -> None:
    obj = workload(**spec)
    assert full(schema.validate(obj)) == [expected]


def test_error_reasons(schema: CRDSchema) -> None:
    obj = workload(
        topologySize="x",
        allocationPolicy={"failureStrategy": "x"},
        name="toolongname",
        tags=["a", "a"],
        labels={"a": "123456"},
    )
    del obj["spec"]["instanceType"]
    reasons = {e.field: e.reason for e in schema.validate(obj)}
    assert reasons == {
        "spec.instanceType": REQUIRED,
        "spec.topologySize": TYPE_INVALID,
        "spec.allocationPolicy.failureStrategy": NOT_SUPPORTED,
        "spec.name": TOO_LONG,
        "spec.tags[1]": DUPLICATE,
        "spec.labels[a]": TOO_LONG,
    }


def test_integer_accepts_integral_float(schema: CRDSchema) -> None:
    # JSON "4.0" decodes to a float; the real validator treats it as an integer.
    assert schema.validate(workload(topologySize=4.0)) == []


def test_required_null_is_missing(schema: CRDSchema) -> None:
    assert full(schema.validate(workload(topologySize=None))) == [
        "spec.topologySize: Required value"
    ]


def test_errors_feed_invalid_status(schema: CRDSchema) -> None:
    errors = schema.validate(workload(topologySize=3))
    body = invalid_status("NeuronUltraServerWorkload", "neuron.aws.com", "w", errors)
    assert body["code"] == 422
    assert body["message"] == (
        'NeuronUltraServerWorkload.neuron.aws.com "w" is invalid: spec.topologySize: Invalid '
        'value: "integer": topologySize must be 1, 2 or 4'
    )


@pytest.mark.parametrize(
    "keyword",
    [
        {"allOf": [{"minimum": 1}]},
        {"oneOf": [{"minimum": 1}]},
        {"not": {"minimum": 1}},
        {"multipleOf": 2},
        {"exclusiveMinimum": True, "minimum": 0},
        {"maxProperties": 2},
        {"x-kubernetes-int-or-string": True},
        {"x-kubernetes-embedded-resource": True},
        {"format": "int64"},
    ],
)
def test_keywords_the_fake_does_not_judge_are_refused_at_load(keyword: dict[str, Any]) -> None:
    # Ignoring them would accept what the real server rejects; the real tier judges such CRDs.
    schema = {"type": "object", "properties": {"a": {"type": "integer", **keyword}}}
    with pytest.raises(SchemaError, match="not supported by the fake API server"):
        CRDSchema.from_openapi(schema)


# ------------------------------------------------------------------------------------------
# CEL rules


def test_transition_rule_runs_only_on_update(schema: CRDSchema) -> None:
    old = workload()
    new = workload(instanceType="trn1.32xlarge")
    assert schema.validate(new) == []
    assert full(schema.validate(new, old)) == [
        'spec.instanceType: Invalid value: "string": instanceType is immutable'
    ]
    assert schema.validate(copy.deepcopy(old), old) == []


def test_transition_rule_skipped_when_old_value_absent(schema: CRDSchema) -> None:
    old = workload()
    new = workload(topology=[{"nodeId": 0, "nodeName": "a"}])
    assert schema.validate(new, old) == []


def test_transition_rule_correlates_list_map_items_by_key(schema: CRDSchema) -> None:
    old = workload(topology=[{"nodeId": 0, "nodeName": "a"}, {"nodeId": 1, "nodeName": "b"}])
    # Reordering keeps the correlation by nodeId; nothing changed per key.
    reordered = workload(topology=[{"nodeId": 1, "nodeName": "b"}, {"nodeId": 0, "nodeName": "a"}])
    assert schema.validate(reordered, old) == []
    changed = workload(topology=[{"nodeId": 1, "nodeName": "b"}, {"nodeId": 0, "nodeName": "z"}])
    assert full(schema.validate(changed, old)) == [
        'spec.topology[1].nodeName: Invalid value: "string": nodeName is immutable'
    ]


def test_ratcheting_allows_unchanged_invalid_values(schema: CRDSchema) -> None:
    # Stored before a stricter schema: unchanged values are not re-validated on update...
    old = workload(topologySize=3, serverCount=50)
    update = copy.deepcopy(old)
    update["status"] = {"state": "Pending"}
    assert schema.validate(update, old) == []
    # ...but a changed value is.
    update["spec"]["serverCount"] = 60
    assert [e.field for e in schema.validate(update, old)] == ["spec.serverCount"]


def make_rule_schema(rule: dict[str, Any], prop: dict[str, Any] | None = None) -> CRDSchema:
    spec: dict[str, Any] = {
        "type": "object",
        "properties": prop or {"x": {"type": "integer"}, "y": {"type": "integer"}},
        "x-kubernetes-validations": [rule],
    }
    return CRDSchema.from_openapi({"type": "object", "properties": {"spec": spec}})


@pytest.mark.parametrize(
    ("rule", "spec", "expected"),
    [
        (
            {"rule": "self.x < self.y"},
            {"x": 2, "y": 1},
            'spec: Invalid value: "object": failed rule: self.x < self.y',
        ),
        (
            {"rule": "self.x < self.y", "message": "x must be below y"},
            {"x": 2, "y": 1},
            'spec: Invalid value: "object": x must be below y',
        ),
        (
            {"rule": "self.x < self.y", "fieldPath": ".x", "message": "too big"},
            {"x": 2, "y": 1},
            'spec.x: Invalid value: "object": too big',
        ),
        (
            # A missing key is an evaluation error, reported, not raised.
            {"rule": "self.x > 0"},
            {"y": 1},
            'spec: Invalid value: "object": no such key: x evaluating rule: self.x > 0',
        ),
        (
            {"rule": "self.name.lowerAscii() == self.name", "message": "lowercase only"},
            {"name": "ABC"},
            'spec: Invalid value: "object": lowercase only',
        ),
    ],
)
def test_rule_errors(rule: dict[str, Any], spec: dict[str, Any], expected: str) -> None:
    props = {"x": {"type": "integer"}, "y": {"type": "integer"}, "name": {"type": "string"}}
    s = make_rule_schema(rule, props)
    assert full(s.validate({"spec": spec})) == [expected]


def test_rule_passes(schema: CRDSchema) -> None:
    s = make_rule_schema({"rule": "self.x < self.y"})
    assert s.validate({"spec": {"x": 1, "y": 2}}) == []


def test_rule_not_run_when_node_absent() -> None:
    s = make_rule_schema({"rule": "self.x > 0"})
    assert s.validate({"metadata": {"name": "a"}}) == []


def test_root_rule_sees_metadata_name_and_reports_nil() -> None:
    s = CRDSchema.from_openapi(
        {
            "type": "object",
            "properties": {"spec": {"type": "object"}},
            "x-kubernetes-validations": [
                {"rule": "self.metadata.name.startsWith('nus-')", "message": "bad name"},
                {"rule": "!has(self.metadata.labels)", "message": "labels are hidden from CEL"},
            ],
        }
    )
    assert full(s.validate({"metadata": {"name": "x", "labels": {"a": "b"}}})) == [
        '<nil>: Invalid value: "object": bad name'
    ]
    assert s.validate({"metadata": {"name": "nus-1"}}) == []


def test_number_fields_are_doubles_in_cel() -> None:
    s = make_rule_schema({"rule": "self.w == 1.0"}, {"w": {"type": "number"}})
    # JSON 1 arrives as a Python int; the schema says number, so CEL must see a double.
    assert s.validate({"spec": {"w": 1}}) == []


def test_list_and_map_equality_in_cel() -> None:
    props = {
        "l": {"type": "array", "items": {"type": "string"}},
        "m": {"type": "object", "additionalProperties": {"type": "string"}},
    }
    s = make_rule_schema({"rule": "self == oldSelf", "message": "immutable"}, props)
    old = {"spec": {"l": ["a", "b"], "m": {"k": "v"}}}
    assert s.validate(copy.deepcopy(old), old) == []
    changed = {"spec": {"l": ["a", "b"], "m": {"k": "w"}}}
    assert full(s.validate(changed, old)) == ['spec: Invalid value: "object": immutable']


@pytest.mark.parametrize(
    ("rule", "fragment"),
    [
        ({"rule": "self.x <"}, "compilation failed"),
        ({"rule": "'a' + 1 == 'a1'"}, "compilation failed"),
        ({"rule": "1 + 1"}, "must evaluate to a bool"),
        ({"rule": "self.x > 0", "optionalOldSelf": True}, "optionalOldSelf: not supported"),
        ({"rule": "self.x > 0", "reason": "FieldValueForbidden"}, "reason: not supported"),
        ({"rule": "self.x > 0", "fieldPath": ".nope"}, "does not refer to a valid field"),
        ({"rule": "self.x > 0", "fieldPath": "x"}, "fieldPath"),
        ({"rule": "self.x > 0", "messageExpression": "'m'"}, "messageExpression: not supported"),
        ({"rule": ""}, "Required"),
    ],
)
def test_bad_rules_fail_at_load(rule: dict[str, Any], fragment: str) -> None:
    with pytest.raises(SchemaError, match=fragment):
        make_rule_schema(rule)


def test_transition_rule_under_set_items_is_rejected() -> None:
    with pytest.raises(SchemaError, match="uncorrelatable"):
        CRDSchema.from_openapi(
            {
                "type": "object",
                "properties": {
                    "l": {
                        "type": "array",
                        "items": {
                            "type": "string",
                            "x-kubernetes-validations": [{"rule": "self == oldSelf"}],
                        },
                    }
                },
            }
        )


def test_bad_pattern_fails_at_load() -> None:
    with pytest.raises(SchemaError, match="pattern"):
        CRDSchema.from_openapi(
            {"type": "object", "properties": {"a": {"type": "string", "pattern": "("}}}
        )


@given(st.integers(min_value=-(2**40), max_value=2**40))
def test_topology_rule_matches_python(n: int) -> None:
    s = CRDSchema.from_openapi(WORKLOAD_SCHEMA)
    errors = s.validate(workload(topologySize=n))
    assert (errors == []) == (n in (1, 2, 4))


# ------------------------------------------------------------------------------------------
# validate_crd_manifest


def crd(schema: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    manifest: dict[str, Any] = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }
    manifest["spec"].update(overrides)
    return manifest


def test_manifest_ok() -> None:
    assert validate_crd_manifest(crd(WORKLOAD_SCHEMA)) == []


@pytest.mark.parametrize(
    ("schema", "fragment"),
    [
        ({"type": "object", "properties": {"a": {"$ref": "#/x", "type": "string"}}}, "$ref"),
        (
            {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "x-kubernetes-validations": [{"rule": "self >"}]}
                },
            },
            "compilation failed",
        ),
    ],
)
def test_manifest_schema_problems(schema: dict[str, Any], fragment: str) -> None:
    problems = validate_crd_manifest(crd(schema))
    assert any(fragment in p for p in problems), problems


def test_manifest_crd_level_problems() -> None:
    manifest = crd(WORKLOAD_SCHEMA, scope="Global")
    manifest["metadata"]["name"] = "wrong"
    manifest["spec"]["versions"][0]["storage"] = False
    problems = validate_crd_manifest(manifest)
    assert any(p.startswith("spec.scope") for p in problems)
    assert any(p.startswith("metadata.name") for p in problems)
    assert any("storage version" in p for p in problems)


# ------------------------------------------------------------------------------------------
# The project's generated CRDs


def _load_crds() -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text()) for p in sorted(CRD_DIR.glob("*.yaml"))]


@pytest.mark.skipif(not list(CRD_DIR.glob("*.yaml")), reason=f"no generated CRDs in {CRD_DIR}")
def test_project_crds_are_structural_and_compile() -> None:
    for manifest in _load_crds():
        assert validate_crd_manifest(manifest) == [], manifest["metadata"]["name"]
        for version in manifest["spec"]["versions"]:
            CRDSchema.from_openapi(version["schema"]["openAPIV3Schema"])


def _workload_schema() -> CRDSchema:
    for manifest in _load_crds():
        if manifest["spec"]["names"]["kind"] == "NeuronUltraServerWorkload":
            version = next(v for v in manifest["spec"]["versions"] if v["name"] == "v1beta1")
            return CRDSchema.from_openapi(version["schema"]["openAPIV3Schema"])
    pytest.skip("NeuronUltraServerWorkload CRD not generated yet")


SEED_WORKLOAD = {
    "apiVersion": "neuron.aws.com/v1beta1",
    "kind": "NeuronUltraServerWorkload",
    "metadata": {"name": "my-training-job", "namespace": "default"},
    "spec": {
        "instanceType": "<trn3pds instance type>",
        "topologySize": 4,
        "serverCount": 2,
        "allocationPolicy": {"failureStrategy": "NoOp"},
        "resourceClaimTemplate": {"name": "my-training-job-rct"},
    },
}


@pytest.mark.skipif(not list(CRD_DIR.glob("*.yaml")), reason=f"no generated CRDs in {CRD_DIR}")
def test_seed_workload_applies_and_topology_size_3_does_not() -> None:
    s = _workload_schema()
    obj = copy.deepcopy(SEED_WORKLOAD)
    assert s.prune(obj) == []
    s.apply_defaults(obj)
    assert s.validate(obj) == []

    bad = copy.deepcopy(SEED_WORKLOAD)
    bad["spec"]["topologySize"] = 3
    s.apply_defaults(bad)
    errors = s.validate(bad)
    assert [e.field for e in errors] == ["spec.topologySize"]
    assert errors[0].reason == INVALID


@pytest.mark.skipif(not list(CRD_DIR.glob("*.yaml")), reason=f"no generated CRDs in {CRD_DIR}")
def test_seed_workload_spec_is_immutable() -> None:
    s = _workload_schema()
    old = copy.deepcopy(SEED_WORKLOAD)
    s.apply_defaults(old)
    new = copy.deepcopy(old)
    new["spec"]["serverCount"] = 3
    assert [e.field for e in s.validate(new, old)] == ["spec.serverCount"]
    assert s.validate(copy.deepcopy(old), old) == []
