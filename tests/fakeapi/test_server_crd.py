"""Custom resources from the chart's CRDs, through CustomObjectsApi."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiException
from neuron_dra.sim.fakeapi.server import FakeAPIServer

G, V, NUSW, NUS = "neuron.aws.com", "v1beta1", "neuronultraserverworkloads", "neuronultraservers"


def workload(name: str = "my-training-job", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{G}/{V}",
        "kind": "NeuronUltraServerWorkload",
        "metadata": {"name": name},
        "spec": {"instanceType": "trn3pds.48xlarge", "topologySize": 4, "serverCount": 2,
                 **spec},
    }


MERGE = "application/merge-patch+json"


def _body(exc: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exc.body)
    return body


async def test_create_returns_body_with_defaults(kube_api_client: client.ApiClient) -> None:
    co = client.CustomObjectsApi(kube_api_client)
    created = await co.create_namespaced_custom_object(
        G, V, "default", NUSW, {**workload(), "status": {"state": "Allocated"}}
    )
    # kubernetes_asyncio only deserializes a 201 for POST: a body proves the status code.
    assert created["metadata"]["uid"]
    assert created["spec"]["allocationPolicy"] == {"failureStrategy": "NoOp"}
    assert "status" not in created  # status subresource: create drops it


async def test_unknown_fields_are_pruned(kube_api_client: client.ApiClient) -> None:
    co = client.CustomObjectsApi(kube_api_client)
    created = await co.create_namespaced_custom_object(
        G, V, "default", NUSW, workload(extra="x")
    )
    assert "extra" not in created["spec"]


async def test_invalid_topology_size(kube_api_client: client.ApiClient) -> None:
    co = client.CustomObjectsApi(kube_api_client)
    with pytest.raises(ApiException) as ei:
        await co.create_namespaced_custom_object(G, V, "default", NUSW,
                                                 workload(topologySize=3))
    assert ei.value.status == 422
    body = _body(ei.value)
    assert body["reason"] == "Invalid"
    assert "spec.topologySize" in body["message"]
    assert body["details"]["causes"][0]["field"] == "spec.topologySize"


async def test_status_subresource_split_and_generation(
    kube_api_client: client.ApiClient,
) -> None:
    co = client.CustomObjectsApi(kube_api_client)
    await co.create_namespaced_custom_object(G, V, "default", NUSW, workload())
    # Main resource ignores status.
    patched = await co.patch_namespaced_custom_object(
        G, V, "default", NUSW, "my-training-job",
        {"metadata": {"labels": {"a": "b"}}, "status": {"state": "Allocated"}},
        _content_type=MERGE,
    )
    assert patched["metadata"]["labels"] == {"a": "b"}
    assert "status" not in patched
    assert patched["metadata"]["generation"] == 1

    # /status ignores everything but status, and does not bump generation.
    st = await co.patch_namespaced_custom_object_status(
        G, V, "default", NUSW, "my-training-job",
        {"metadata": {"labels": {"c": "d"}}, "status": {"state": "Allocated",
                                                        "totalNodesAllocated": 8}},
        _content_type=MERGE,
    )
    assert st["status"] == {"state": "Allocated", "totalNodesAllocated": 8}
    assert st["metadata"]["labels"] == {"a": "b"}
    assert st["metadata"]["generation"] == 1

    # The status schema is enforced too.
    with pytest.raises(ApiException) as ei:
        await co.patch_namespaced_custom_object_status(
            G, V, "default", NUSW, "my-training-job", {"status": {"state": "Bogus"}},
            _content_type=MERGE)
    assert ei.value.status == 422
    assert "status.state" in _body(ei.value)["message"]

    spec_change = await co.patch_namespaced_custom_object(
        G, V, "default", NUSW, "my-training-job",
        {"spec": {"allocationPolicy": {"failureStrategy": "RestartAll"}}},
        _content_type=MERGE,
    )
    assert spec_change["metadata"]["generation"] == 2
    assert spec_change["status"]["state"] == "Allocated"  # status kept


async def test_immutability_transition_rule(kube_api_client: client.ApiClient) -> None:
    co = client.CustomObjectsApi(kube_api_client)
    await co.create_namespaced_custom_object(G, V, "default", NUSW, workload())
    with pytest.raises(ApiException) as ei:
        await co.patch_namespaced_custom_object(
            G, V, "default", NUSW, "my-training-job", {"spec": {"serverCount": 3}},
            _content_type=MERGE)
    assert ei.value.status == 422
    assert "serverCount is immutable" in _body(ei.value)["message"]


async def test_dict_body_sent_as_json_patch_is_rejected(
    kube_api_client: client.ApiClient,
) -> None:
    # kubernetes_asyncio labels a dict patch body for custom objects as json-patch unless told
    # otherwise; the real server answers 400, so must we (callers need _content_type).
    co = client.CustomObjectsApi(kube_api_client)
    await co.create_namespaced_custom_object(G, V, "default", NUSW, workload())
    with pytest.raises(ApiException) as ei:
        await co.patch_namespaced_custom_object(
            G, V, "default", NUSW, "my-training-job", {"metadata": {"labels": {"a": "b"}}})
    assert ei.value.status == 400
    assert "jsonpatch.Patch" in _body(ei.value)["message"]


async def test_strategic_merge_patch_is_415_for_custom_resources(
    kube_api_client: client.ApiClient,
) -> None:
    co = client.CustomObjectsApi(kube_api_client)
    await co.create_namespaced_custom_object(G, V, "default", NUSW, workload())
    with pytest.raises(ApiException) as ei:
        await co.patch_namespaced_custom_object(
            G, V, "default", NUSW, "my-training-job", {"metadata": {"labels": {"a": "b"}}},
            _content_type="application/strategic-merge-patch+json",
        )
    assert ei.value.status == 415


async def test_replace_and_list_custom_objects(kube_api_client: client.ApiClient) -> None:
    co = client.CustomObjectsApi(kube_api_client)
    obj = await co.create_namespaced_custom_object(
        G, V, "neuron-dra-driver", NUS,
        {"apiVersion": f"{G}/{V}", "kind": "NeuronUltraServer", "metadata": {"name": "us-1"},
         "spec": {"instanceType": "trn2u.48xlarge",
                  "topology": [{"nodeName": f"n{i}", "nodeId": i} for i in range(4)]}},
    )
    obj["metadata"]["labels"] = {"x": "1"}
    replaced = await co.replace_namespaced_custom_object(
        G, V, "neuron-dra-driver", NUS, "us-1", obj)
    assert replaced["metadata"]["labels"] == {"x": "1"}
    listed = await co.list_cluster_custom_object(G, V, NUS, label_selector="x=1")
    assert listed["kind"] == "NeuronUltraServerList"
    assert [o["metadata"]["name"] for o in listed["items"]] == ["us-1"]
    deleted = await co.delete_namespaced_custom_object(G, V, "neuron-dra-driver", NUS, "us-1")
    assert deleted["metadata"]["name"] == "us-1"


async def test_runtime_crd_creation(
    kube_api_client: client.ApiClient, fake_apiserver: FakeAPIServer
) -> None:
    ext = client.ApiextensionsV1Api(kube_api_client)
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Cluster",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget",
                      "listKind": "WidgetList"},
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "size": {"type": "integer", "minimum": 1}}}}}},
            }],
        },
    }
    created = await ext.create_custom_resource_definition(crd)
    assert any(c.type == "Established" and c.status == "True"
               for c in created.status.conditions)
    co = client.CustomObjectsApi(kube_api_client)
    w = await co.create_cluster_custom_object("example.com", "v1", "widgets",
                                              {"apiVersion": "example.com/v1", "kind": "Widget",
                                               "metadata": {"name": "w"},
                                               "spec": {"size": 2}})
    assert w["spec"]["size"] == 2
    with pytest.raises(ApiException) as ei:
        await co.create_cluster_custom_object("example.com", "v1", "widgets",
                                              {"apiVersion": "example.com/v1", "kind": "Widget",
                                               "metadata": {"name": "bad"},
                                               "spec": {"size": 0}})
    assert ei.value.status == 422

    await ext.delete_custom_resource_definition("widgets.example.com")
    with pytest.raises(ApiException) as ei:
        await co.list_cluster_custom_object("example.com", "v1", "widgets")
    assert ei.value.status == 404
    assert fake_apiserver.registry.lookup("example.com", "v1", "widgets") is None
