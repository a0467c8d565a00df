"""PATCH flavours: merge, JSON patch, strategic merge, server-side apply."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiException
from neuron_dra.sim.fakeapi import patch as patchlib
from neuron_dra.sim.fakeapi.server import FakeAPIServer

MERGE = "application/merge-patch+json"
JSONPATCH = "application/json-patch+json"
SMP = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"


def test_merge_patch_rfc7386() -> None:
    target = {"a": {"b": 1, "c": 2}, "l": [1, 2], "keep": True}
    result = patchlib.merge_patch(target, {"a": {"b": None, "d": 3}, "l": [3]})
    assert result == {"a": {"c": 2, "d": 3}, "l": [3], "keep": True}
    assert target == {"a": {"b": 1, "c": 2}, "l": [1, 2], "keep": True}  # not mutated


def test_strategic_merge_by_key_and_directives() -> None:
    target = {
        "metadata": {"finalizers": ["a"]},
        "status": {"conditions": [{"type": "Ready", "status": "False"},
                                  {"type": "Degraded", "status": "True"}]},
        "spec": {"containers": [{"name": "c", "image": "old", "env": [{"name": "X"}]}]},
    }
    patch = {
        "metadata": {"finalizers": ["b"]},
        "status": {"conditions": [{"type": "Ready", "status": "True"},
                                  {"type": "Degraded", "$patch": "delete"}]},
        "spec": {"$setElementOrder/containers": [{"name": "c"}],
                 "containers": [{"name": "c", "image": "new"}]},
    }
    result = patchlib.strategic_merge_patch(target, patch)
    assert result["metadata"]["finalizers"] == ["a", "b"]
    assert result["status"]["conditions"] == [{"type": "Ready", "status": "True"}]
    assert result["spec"]["containers"] == [{"name": "c", "image": "new", "env": [{"name": "X"}]}]
    removed = patchlib.strategic_merge_patch(result, {
        "metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]},
        "spec": {"containers": [{"$patch": "replace"}, {"name": "only"}]}})
    assert removed["metadata"]["finalizers"] == ["b"]
    assert removed["spec"]["containers"] == [{"name": "only"}]


async def test_strategic_patch_over_http(kube_api_client: client.ApiClient) -> None:
    v1 = client.CoreV1Api(kube_api_client)
    await v1.create_node(client.V1Node(
        metadata=client.V1ObjectMeta(name="n"),
        status=client.V1NodeStatus(conditions=[
            client.V1NodeCondition(type="Ready", status="False"),
            client.V1NodeCondition(type="MemoryPressure", status="False")])))
    node = await v1.patch_node_status(
        "n", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        _content_type=SMP)
    assert {c.type: c.status for c in node.status.conditions} == {
        "Ready": "True", "MemoryPressure": "False"}
    # The same body as a merge patch replaces the whole list (lists are atomic there).
    node = await v1.patch_node_status(
        "n", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        _content_type=MERGE)
    assert [c.type for c in node.status.conditions] == ["Ready"]


async def test_json_patch_and_test_op(kube_api_client: client.ApiClient) -> None:
    v1 = client.CoreV1Api(kube_api_client)
    await v1.create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="c"), data={"a": "1"}))
    out = await v1.patch_namespaced_config_map(
        "c", "default", [{"op": "add", "path": "/data/b", "value": "2"}])
    assert out.data == {"a": "1", "b": "2"}
    with pytest.raises(ApiException) as ei:
        await v1.patch_namespaced_config_map(
            "c", "default", [{"op": "test", "path": "/data/a", "value": "9"},
                             {"op": "remove", "path": "/data/a"}])
    assert ei.value.status == 422


async def test_resource_version_in_patch_is_a_precondition(
    kube_api_client: client.ApiClient,
) -> None:
    v1 = client.CoreV1Api(kube_api_client)
    c = await v1.create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="c")))
    rv = c.metadata.resource_version
    await v1.patch_namespaced_config_map(
        "c", "default", {"metadata": {"resourceVersion": rv, "labels": {"a": "1"}}},
        _content_type=MERGE)
    with pytest.raises(ApiException) as ei:
        await v1.patch_namespaced_config_map(
            "c", "default", {"metadata": {"resourceVersion": rv, "labels": {"a": "2"}}},
            _content_type=MERGE)
    assert ei.value.status == 409


async def test_unsupported_patch_type(kube_api_client: client.ApiClient) -> None:
    v1 = client.CoreV1Api(kube_api_client)
    await v1.create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="c")))
    with pytest.raises(ApiException) as ei:
        await v1.patch_namespaced_config_map("c", "default", {"data": {}},
                                             _content_type="application/vnd.unknown+json")
    assert ei.value.status == 415


def _workload(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "neuron.aws.com/v1beta1", "kind": "NeuronUltraServerWorkload",
            "metadata": {"name": "w", "namespace": "default"},
            "spec": {"instanceType": "trn2u.48xlarge", "topologySize": 2, "serverCount": 1,
                     **spec}}


async def test_server_side_apply(kube_api_client: client.ApiClient,
                                 fake_apiserver: FakeAPIServer) -> None:
    co = client.CustomObjectsApi(kube_api_client)
    args = ("neuron.aws.com", "v1beta1", "default", "neuronultraserverworkloads", "w")

    # Apply creates when absent; fieldManager is required.
    with pytest.raises(ApiException) as ei:
        await co.patch_namespaced_custom_object(*args, _workload(), _content_type=APPLY)
    assert ei.value.status == 400
    result = await co.patch_namespaced_custom_object(
        *args, {**_workload(), "metadata": {"name": "w", "labels": {"a": "1"}}},
        field_manager="ctrl", _content_type=APPLY)
    # Apply-create answers 201 like the real server, and CustomObjectsApi's PATCH only
    # deserializes 200: callers that create by apply get None and must read back.
    assert result is None
    created = await co.get_namespaced_custom_object(*args)
    assert created["metadata"]["labels"] == {"a": "1"}
    entry = created["metadata"]["managedFields"][0]
    assert (entry["manager"], entry["operation"]) == ("ctrl", "Apply")
    assert "f:topologySize" in entry["fieldsV1"]["f:spec"]

    # Status apply through the subresource, conditions merged by type.
    cond = {"type": "Ready", "status": "True", "reason": "Ok", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}
    st = await co.patch_namespaced_custom_object_status(
        *args, {"apiVersion": "neuron.aws.com/v1beta1", "kind": "NeuronUltraServerWorkload",
                "metadata": {"name": "w"}, "status": {"state": "Pending", "conditions": [cond]}},
        field_manager="ctrl-status", _content_type=APPLY)
    assert st["status"]["conditions"][0]["type"] == "Ready"

    # Another manager changing an owned field conflicts unless forced.
    with pytest.raises(ApiException) as ei:
        await co.patch_namespaced_custom_object(
            *args, {**_workload(), "metadata": {"name": "w", "labels": {"a": "2"}}},
            field_manager="other", _content_type=APPLY)
    assert ei.value.status == 409
    assert 'conflict with "ctrl"' in json.loads(ei.value.body)["message"]
    forced = await co.patch_namespaced_custom_object(
        *args, {**_workload(), "metadata": {"name": "w", "labels": {"a": "2"}}},
        field_manager="other", force=True, _content_type=APPLY)
    assert forced["metadata"]["labels"] == {"a": "2"}

    # Dropping a field from a manager's applied config removes it (when nobody else owns it).
    applied = _workload()
    applied["metadata"] = {"name": "w", "labels": {"b": "1"}}
    out = await co.patch_namespaced_custom_object(*args, applied, field_manager="third",
                                                  _content_type=APPLY)
    applied["metadata"] = {"name": "w"}
    out = await co.patch_namespaced_custom_object(*args, applied, field_manager="third",
                                                  _content_type=APPLY)
    assert "b" not in out["metadata"].get("labels", {})
    assert out["metadata"]["labels"]["a"] == "2"
    stored = fake_apiserver.get("neuron.aws.com/v1beta1", "NeuronUltraServerWorkload", "w",
                                "default")
    assert stored is not None and stored["status"]["state"] == "Pending"
