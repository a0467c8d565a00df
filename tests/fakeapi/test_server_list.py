"""Listing: selectors, paging, consistency, cross-namespace lists."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiException
from neuron_dra.sim.fakeapi.selectors import (
    SelectorError,
    field_matcher,
    label_matcher,
)
from neuron_dra.sim.fakeapi.server import FakeAPIServer


def _obj(labels: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "x", "labels": labels}}


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("a=1", {"a": "1"}, True),
        ("a==1", {"a": "1"}, True),
        ("a=1", {"a": "2"}, False),
        ("a!=1", {"a": "2"}, True),
        ("a!=1", {}, True),  # missing label satisfies !=
        ("a in (1, 2)", {"a": "2"}, True),
        ("a in (1,2)", {"a": "3"}, False),
        ("a notin (1,2)", {"a": "3"}, True),
        ("a notin (1,2)", {}, True),
        ("a", {"a": ""}, True),
        ("a", {"b": "1"}, False),
        ("!a", {"b": "1"}, True),
        ("!a", {"a": "1"}, False),
        ("a=1,b in (x,y),!c", {"a": "1", "b": "y"}, True),
        ("a=1,b in (x,y),!c", {"a": "1", "b": "y", "c": "z"}, False),
        ("example.com/role=leader", {"example.com/role": "leader"}, True),
        ("n>3", {"n": "4"}, True),
        ("n<3", {"n": "4"}, False),
    ],
)
def test_label_selector_syntax(selector: str, labels: dict[str, str], expected: bool) -> None:
    match = label_matcher(selector)
    assert match is not None
    assert match(_obj(labels)) is expected


@pytest.mark.parametrize("selector", ["a in ()", "a=(", "=x", "a b", "-a=1", "a=b c"])
def test_label_selector_errors(selector: str) -> None:
    with pytest.raises(SelectorError):
        label_matcher(selector)


def test_field_selector_restricted_to_known_fields() -> None:
    allowed = {"metadata.name", "metadata.namespace", "spec.nodeName", "spec.driver"}
    match = field_matcher("spec.nodeName=n1,spec.driver!=x", allowed)
    assert match is not None
    assert match({"spec": {"nodeName": "n1", "driver": "d"}})
    assert not match({"spec": {"nodeName": "n1", "driver": "x"}})
    with pytest.raises(SelectorError, match=r"field label not supported: spec\.pool\.name"):
        field_matcher("spec.pool.name=n1", allowed)


def slice_body(name: str, node: str, driver: str = "neuron.aws.com") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": {"node": node}},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "d0"}]},
    }


async def test_field_selectors_over_http(
    kube_api_client: client.ApiClient, fake_apiserver: FakeAPIServer
) -> None:
    fake_apiserver.seed([slice_body("s1", "n1"), slice_body("s2", "n2"),
                         slice_body("s3", "n2", driver="other.example.com")])
    res = client.ResourceV1Api(kube_api_client)
    got = await res.list_resource_slice(
        field_selector="spec.nodeName=n2,spec.driver=neuron.aws.com")
    assert [s.metadata.name for s in got.items] == ["s2"]
    got = await res.list_resource_slice(field_selector="metadata.name!=s1")
    assert [s.metadata.name for s in got.items] == ["s2", "s3"]
    with pytest.raises(ApiException) as ei:
        await res.list_resource_slice(field_selector="spec.pool.name=n1")
    assert ei.value.status == 400
    assert json.loads(ei.value.body)["message"] == "field label not supported: spec.pool.name"

    got = await res.list_resource_slice(label_selector="node in (n1,n3)")
    assert [s.metadata.name for s in got.items] == ["s1"]
    with pytest.raises(ApiException) as ei:
        await res.list_resource_slice(label_selector="node in (")
    assert ei.value.status == 400


async def test_paging_is_consistent(
    kube_api_client: client.ApiClient, fake_apiserver: FakeAPIServer
) -> None:
    fake_apiserver.seed(slice_body(f"s{i:02d}", f"n{i}") for i in range(10))
    res = client.ResourceV1Api(kube_api_client)
    first = await res.list_resource_slice(limit=4)
    assert [s.metadata.name for s in first.items] == ["s00", "s01", "s02", "s03"]
    assert first.metadata._continue and first.metadata.remaining_item_count == 6
    rv = first.metadata.resource_version

    # Changes after the first page don't show up in later pages (snapshot at the first RV).
    await res.delete_resource_slice("s05")
    fake_apiserver.create(slice_body("s99", "n99"))
    names = [s.metadata.name for s in first.items]
    token = first.metadata._continue
    while token:
        page = await res.list_resource_slice(limit=4, _continue=token)
        assert page.metadata.resource_version == rv
        names += [s.metadata.name for s in page.items]
        token = page.metadata._continue
    assert names == [f"s{i:02d}" for i in range(10)]

    fresh = await res.list_resource_slice()
    assert "s05" not in [s.metadata.name for s in fresh.items]
    assert int(fresh.metadata.resource_version) > int(rv)


async def test_continue_after_compaction_is_410(
    kube_api_client: client.ApiClient, fake_apiserver: FakeAPIServer
) -> None:
    fake_apiserver.seed(slice_body(f"s{i}", f"n{i}") for i in range(3))
    res = client.ResourceV1Api(kube_api_client)
    first = await res.list_resource_slice(limit=1)
    fake_apiserver.create(slice_body("later", "n9"))
    fake_apiserver.faults.compact()
    with pytest.raises(ApiException) as ei:
        await res.list_resource_slice(limit=1, _continue=first.metadata._continue)
    assert ei.value.status == 410
    assert json.loads(ei.value.body)["reason"] == "Expired"
    # A fresh list works after compaction.
    assert len((await res.list_resource_slice()).items) == 4


async def test_cross_namespace_list(kube_api_client: client.ApiClient) -> None:
    v1 = client.CoreV1Api(kube_api_client)
    for ns in ("default", "kube-system"):
        await v1.create_namespaced_config_map(
            ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="c", labels={"k": ns})))
    every = await v1.list_config_map_for_all_namespaces()
    assert sorted((c.metadata.namespace, c.metadata.name) for c in every.items) == [
        ("default", "c"), ("kube-system", "c")]
    scoped = await v1.list_config_map_for_all_namespaces(
        field_selector="metadata.namespace=kube-system")
    assert [c.metadata.namespace for c in scoped.items] == ["kube-system"]
    one = await v1.list_namespaced_config_map("default")
    assert [c.metadata.namespace for c in one.items] == ["default"]
