"""Fidelity of the fake API server: behaviours where it used to differ from kube-apiserver 1.34.

Each test states what the real server does (and where in its source that comes from) and
checks the fake does the same, through the real kubernetes_asyncio client over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client import ApiException
from neuron_dra.sim.fakeapi.server import FakeAPIServer

pytestmark = pytest.mark.asyncio

T = 10  # per-call timeout, seconds
GROUP, VERSION, NUSW = "neuron.aws.com", "v1beta1", "neuronultraserverworkloads"
APPLY = "application/apply-patch+yaml"


def _body(exc: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exc.body)
    return body


def workload(name: str = "w") -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "NeuronUltraServerWorkload",
        "metadata": {"name": name},
        "spec": {
            "instanceType": "trn2u.48xlarge",
            "topologySize": 4,
            "serverCount": 2,
            "allocationPolicy": {"failureStrategy": "NoOp"},
            "resourceClaimTemplate": {"name": f"{name}-rct"},
        },
    }


def slice_body(name: str, node: str, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": "neuron.aws.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "neurondevice0", "attributes": {"deviceId": {"int": 0}}}],
        },
    }


async def eventually(probe: Callable[[], Awaitable[bool]], within: float = 3.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        if await probe():
            return True
        await asyncio.sleep(0.02)
    return await probe()


async def exists(call: Callable[[], Awaitable[Any]]) -> bool:
    try:
        await call()
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


# --------------------------------------------------------------------------- server-side apply


async def test_apply_conflict_carries_field_manager_causes(
    kube_api_client: client.ApiClient,
) -> None:
    """errors.NewApplyConflict: 409 whose details hold only causes, one FieldManagerConflict
    per field (``field`` in fieldpath notation, ``message`` naming the manager), and the
    message format of structured-merge-diff's conflict error."""
    v1 = client.CoreV1Api(kube_api_client)

    def cm(data: dict[str, str]) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"},
                "data": data}

    await v1.patch_namespaced_config_map("ssa", "default", cm({"k": "1", "l": "1"}),
                                         field_manager="alpha", _content_type=APPLY,
                                         _request_timeout=T)
    with pytest.raises(ApiException) as ei:
        await v1.patch_namespaced_config_map("ssa", "default", cm({"k": "2"}),
                                             field_manager="beta", _content_type=APPLY,
                                             _request_timeout=T)
    assert ei.value.status == 409
    body = _body(ei.value)
    assert body["reason"] == "Conflict"
    assert body["message"] == 'Apply failed with 1 conflict: conflict with "alpha": .data.k'
    assert body["details"] == {"causes": [
        {"reason": "FieldManagerConflict", "message": 'conflict with "alpha"',
         "field": ".data.k"},
    ]}

    with pytest.raises(ApiException) as ei:
        await v1.patch_namespaced_config_map("ssa", "default", cm({"k": "2", "l": "2"}),
                                             field_manager="beta", _content_type=APPLY,
                                             _request_timeout=T)
    body = _body(ei.value)
    assert body["message"] == (
        'Apply failed with 2 conflicts: conflicts with "alpha":\n- .data.k\n- .data.l'
    )
    assert [c["field"] for c in body["details"]["causes"]] == [".data.k", ".data.l"]
    assert {c["reason"] for c in body["details"]["causes"]} == {"FieldManagerConflict"}


async def test_apply_conflict_paths_use_fieldpath_notation(
    kube_api_client: client.ApiClient,
) -> None:
    """Keyed list elements print as ``[name="x"]`` and set members as ``[="x"]``."""
    v1 = client.CoreV1Api(kube_api_client)

    def pod(image: str, finalizer: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "finalizers": [finalizer]},
                "spec": {"containers": [{"name": "c", "image": image}]}}

    await v1.patch_namespaced_pod("p", "default", pod("a", "x.io/a"), field_manager="alpha",
                                  _content_type=APPLY, _request_timeout=T)
    with pytest.raises(ApiException) as ei:
        await v1.patch_namespaced_pod("p", "default", pod("b", "x.io/a"), field_manager="beta",
                                      _content_type=APPLY, _request_timeout=T)
    causes = _body(ei.value)["details"]["causes"]
    assert [c["field"] for c in causes] == ['.spec.containers[name="c"].image']


# --------------------------------------------------------------------------- garbage collection


async def test_gc_deletes_dependents_whose_owners_are_absent(
    kube_api_client: client.ApiClient,
) -> None:
    """The garbage collector looks every owner up by kind/name (in the dependent's namespace)
    and compares uids: a dependent whose owners are all absent (never existed, another uid,
    another namespace) is deleted, not only when an owner is deleted while it is watched."""
    v1 = client.CoreV1Api(kube_api_client)
    res = client.ResourceV1Api(kube_api_client)
    node = await v1.create_node({"metadata": {"name": "n1"}}, _request_timeout=T)
    uid = node.metadata.uid

    def node_ref(name: str, node_uid: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid,
                "controller": True}

    await res.create_resource_slice(slice_body("good", "n1", node_ref("n1", uid)),
                                    _request_timeout=T)
    await res.create_resource_slice(slice_body("ghost-uid", "n1",
                                               node_ref("n1", str(uuid.uuid4()))),
                                    _request_timeout=T)
    await res.create_resource_slice(slice_body("ghost-node", "n9",
                                               node_ref("n9", str(uuid.uuid4()))),
                                    _request_timeout=T)
    # Owner references carry no namespace: a namespaced owner is looked for in the
    # dependent's namespace, so one in another namespace is absent.
    await v1.create_namespace({"metadata": {"name": "other"}}, _request_timeout=T)
    owner = await v1.create_namespaced_config_map("other", {"metadata": {"name": "owner"}},
                                                  _request_timeout=T)
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
           "uid": owner.metadata.uid}
    await v1.create_namespaced_config_map(
        "default", {"metadata": {"name": "cross-ns", "ownerReferences": [ref]}},
        _request_timeout=T)
    await v1.create_namespaced_config_map(
        "other", {"metadata": {"name": "same-ns", "ownerReferences": [ref]}},
        _request_timeout=T)
    # A cluster-scoped dependent of a namespaced owner is unresolvable: the GC reports it
    # (OwnerRefInvalidNamespace) and leaves the dependent alone.
    await res.create_resource_slice(slice_body("bad-scope", "n1", ref), _request_timeout=T)

    async def slice_gone(name: str) -> bool:
        return not await exists(lambda: res.read_resource_slice(name, _request_timeout=T))

    assert await eventually(lambda: slice_gone("ghost-uid"))
    assert await eventually(lambda: slice_gone("ghost-node"))
    async def cross_ns_gone() -> bool:
        return not await exists(lambda: v1.read_namespaced_config_map(
            "cross-ns", "default", _request_timeout=T))

    assert await eventually(cross_ns_gone)
    assert await res.read_resource_slice("good", _request_timeout=T)
    assert await res.read_resource_slice("bad-scope", _request_timeout=T)
    assert await v1.read_namespaced_config_map("same-ns", "other", _request_timeout=T)

    # And the ordinary path still works: deleting the node collects its slice.
    await v1.delete_node("n1", _request_timeout=T)
    assert await eventually(lambda: slice_gone("good"))


async def test_gc_checks_objects_seeded_before_start() -> None:
    """In-process seeding before the server runs gets the same owner check once it does."""
    api = FakeAPIServer(crd_paths=[])
    api.create(slice_body("orphan", "n1", {"apiVersion": "v1", "kind": "Node", "name": "n1",
                                           "uid": str(uuid.uuid4())}))
    assert api.get("resource.k8s.io/v1", "ResourceSlice", "orphan") is not None
    async with api:
        async def gone() -> bool:
            return api.get("resource.k8s.io/v1", "ResourceSlice", "orphan") is None
        assert await eventually(gone)


# --------------------------------------------------------------------------- updates


async def test_custom_resource_put_requires_resource_version(
    kube_api_client: client.ApiClient,
) -> None:
    """customResourceStrategy.AllowUnconditionalUpdate is false: PUT without
    metadata.resourceVersion is a 422 naming the resource (genericregistry.Store.Update)."""
    co = client.CustomObjectsApi(kube_api_client)
    made = await co.create_namespaced_custom_object(GROUP, VERSION, "default", NUSW,
                                                    workload(), _request_timeout=T)
    made["metadata"].pop("resourceVersion")
    made["spec"]["serverCount"] = 4
    with pytest.raises(ApiException) as ei:
        await co.replace_namespaced_custom_object(GROUP, VERSION, "default", NUSW, "w", made,
                                                  _request_timeout=T)
    assert ei.value.status == 422
    body = _body(ei.value)
    assert body["message"] == (
        f'{NUSW}.{GROUP} "w" is invalid: metadata.resourceVersion: Invalid value: 0: '
        "must be specified for an update"
    )
    assert body["details"]["kind"] == NUSW
    # A merge patch has no such requirement (it applies to the current version).
    patched = await co.patch_namespaced_custom_object(
        GROUP, VERSION, "default", NUSW, "w", {"metadata": {"labels": {"a": "b"}}},
        _content_type="application/merge-patch+json", _request_timeout=T)
    assert patched["metadata"]["labels"] == {"a": "b"}


async def test_removing_last_finalizer_answers_with_the_updated_object(
    kube_api_client: client.ApiClient,
) -> None:
    """genericregistry deleteWithoutFinalizers: the PUT that empties the finalizers of a
    terminating object deletes it and answers 200 with the object *as updated* (no
    finalizers), while watchers get DELETED with the last stored state at a new version."""
    v1 = client.CoreV1Api(kube_api_client)
    await v1.create_namespaced_config_map(
        "default", {"metadata": {"name": "f", "finalizers": ["x.io/hold"]}}, _request_timeout=T)
    await v1.delete_namespaced_config_map("f", "default", _request_timeout=T)
    first = await v1.read_namespaced_config_map("f", "default", _request_timeout=T)
    assert first.metadata.deletion_timestamp is not None
    # A second DELETE of a terminating object is a 200 that changes nothing.
    await v1.delete_namespaced_config_map("f", "default", _request_timeout=T)
    current = await v1.read_namespaced_config_map("f", "default", _request_timeout=T)
    assert current.metadata.resource_version == first.metadata.resource_version
    rv = current.metadata.resource_version
    current.metadata.finalizers = []
    async with watch.Watch() as w:
        # Read until the DELETED event: everything sent before it is in the list. The
        # stream's timeout only guards against a stuck server.
        stream = w.stream(v1.list_namespaced_config_map, "default", resource_version=rv,
                          timeout_seconds=60)
        result = await v1.replace_namespaced_config_map("f", "default", current,
                                                        _request_timeout=T)
        assert not result.metadata.finalizers
        assert result.metadata.name == "f"
        events: list[dict[str, Any]] = []
        async for ev in stream:
            events.append(ev)
            if ev["type"] == "DELETED":
                break
    assert [e["type"] for e in events] == ["DELETED"]
    gone = events[0]["raw_object"]
    assert gone["metadata"]["finalizers"] == ["x.io/hold"]
    assert int(gone["metadata"]["resourceVersion"]) > int(rv)
    with pytest.raises(ApiException) as ei:
        await v1.read_namespaced_config_map("f", "default", _request_timeout=T)
    assert ei.value.status == 404


async def test_custom_resource_generation_counts_every_non_metadata_change(
    kube_api_client: client.ApiClient,
) -> None:
    """customResourceStrategy.PrepareForUpdate bumps metadata.generation for a change to
    anything but metadata: without a status subresource, a status write counts too."""
    ext = client.ApiextensionsV1Api(kube_api_client)
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget",
                      "listKind": "WidgetList"},
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {"type": "object",
                                 "x-kubernetes-preserve-unknown-fields": True},
                        "status": {"type": "object",
                                   "x-kubernetes-preserve-unknown-fields": True},
                    },
                }},
            }],
        },
    }
    await ext.create_custom_resource_definition(crd, _request_timeout=T)
    co = client.CustomObjectsApi(kube_api_client)
    obj = await co.create_namespaced_custom_object(
        "example.com", "v1", "default", "widgets",
        {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
         "spec": {"a": 1}}, _request_timeout=T)
    assert obj["metadata"]["generation"] == 1
    obj["status"] = {"ready": True}
    obj = await co.replace_namespaced_custom_object("example.com", "v1", "default", "widgets",
                                                    "w", obj, _request_timeout=T)
    assert obj["status"] == {"ready": True}
    assert obj["metadata"]["generation"] == 2
    obj["metadata"]["labels"] = {"x": "y"}
    obj = await co.replace_namespaced_custom_object("example.com", "v1", "default", "widgets",
                                                    "w", obj, _request_timeout=T)
    assert obj["metadata"]["generation"] == 2


# --------------------------------------------------------------------------- list resourceVersion


async def test_list_resource_version_semantics(fake_apiserver: FakeAPIServer,
                                               kube_api_client: client.ApiClient) -> None:
    """resourceVersionMatch=Exact lists the state at that version (410 once compacted);
    a version the server has not reached is a 504 "Too large resource version" with the
    ResourceVersionTooLarge cause; ListOptions are validated (422 ListOptions.meta.k8s.io)."""
    v1 = client.CoreV1Api(kube_api_client)
    a = await v1.create_namespaced_config_map("default", {"metadata": {"name": "a"}},
                                              _request_timeout=T)
    at_a = a.metadata.resource_version
    await v1.create_namespaced_config_map("default", {"metadata": {"name": "b"}},
                                          _request_timeout=T)
    await v1.patch_namespaced_config_map("a", "default", {"data": {"k": "v"}},
                                         _request_timeout=T)

    old = await v1.list_namespaced_config_map("default", resource_version=at_a,
                                              resource_version_match="Exact",
                                              _request_timeout=T)
    assert old.metadata.resource_version == at_a
    assert [(i.metadata.name, i.data) for i in old.items] == [("a", None)]
    # NotOlderThan (and a bare resourceVersion) may serve anything newer: the current state.
    now = await v1.list_namespaced_config_map("default", resource_version=at_a,
                                              resource_version_match="NotOlderThan",
                                              _request_timeout=T)
    assert [i.metadata.name for i in now.items] == ["a", "b"]
    assert int(now.metadata.resource_version) > int(at_a)

    fake_apiserver.too_large_rv_wait = 0.1
    future = str(int(now.metadata.resource_version) + 100)
    with pytest.raises(ApiException) as ei:
        await v1.list_namespaced_config_map("default", resource_version=future,
                                            _request_timeout=T)
    assert ei.value.status == 504
    body = _body(ei.value)
    assert body["reason"] == "Timeout"
    assert body["message"].startswith(f"Timeout: Too large resource version: {future}, current: ")
    assert body["details"]["causes"] == [{"reason": "ResourceVersionTooLarge",
                                          "message": "Too large resource version"}]

    with pytest.raises(ApiException) as ei:
        await v1.list_namespaced_config_map("default", resource_version_match="Exact",
                                            _request_timeout=T)
    assert ei.value.status == 422
    assert _body(ei.value)["message"] == (
        'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
        "resourceVersionMatch is forbidden unless resourceVersion is provided"
    )

    fake_apiserver.faults.compact()
    with pytest.raises(ApiException) as ei:
        await v1.list_namespaced_config_map("default", resource_version=at_a,
                                            resource_version_match="Exact",
                                            _request_timeout=T)
    assert ei.value.status == 410
    assert _body(ei.value)["message"] == "The resourceVersion for the provided list is too old."


async def test_list_waits_for_a_resource_version_about_to_exist(
    fake_apiserver: FakeAPIServer, kube_api_client: client.ApiClient,
) -> None:
    """The watch cache blocks a list at a not-yet-seen version until it arrives."""
    v1 = client.CoreV1Api(kube_api_client)
    fake_apiserver.too_large_rv_wait = 5
    nxt = str(fake_apiserver.store.rv + 1)
    listing = asyncio.ensure_future(v1.list_namespaced_config_map(
        "default", resource_version=nxt, _request_timeout=T))
    await asyncio.sleep(0.1)
    assert not listing.done()
    await v1.create_namespaced_config_map("default", {"metadata": {"name": "late"}},
                                          _request_timeout=T)
    result = await listing
    assert [i.metadata.name for i in result.items] == ["late"]


# --------------------------------------------------------------------------- watch


async def test_watch_from_a_future_resource_version_skips_older_events(
    fake_apiserver: FakeAPIServer, kube_api_client: client.ApiClient,
) -> None:
    """cacheWatcher only sends events newer than the requested version, even when that
    version is ahead of the server (e.g. a client that outlived a restored server)."""
    v1 = client.CoreV1Api(kube_api_client)
    ahead = fake_apiserver.store.rv + 2

    async def collect() -> list[str]:
        # Read until the last create's event arrives: everything the server sent before it
        # is in the list. The stream's timeout only guards against a stuck server.
        names: list[str] = []
        async with watch.Watch() as w:
            stream = w.stream(v1.list_namespaced_config_map, "default",
                              resource_version=str(ahead), timeout_seconds=60)
            async for ev in stream:
                names.append(ev["object"].metadata.name)
                if names[-1] == "three":
                    break
        return names

    task = asyncio.ensure_future(collect())

    async def watching() -> bool:
        return any(True for _ in fake_apiserver.store.watchers())

    assert await eventually(watching)
    for name in ("one", "two", "three"):
        await v1.create_namespaced_config_map("default", {"metadata": {"name": name}},
                                              _request_timeout=T)
    assert await task == ["three"]


# --------------------------------------------------------------------------- unknown fields


async def test_unknown_fields_of_builtin_kinds_are_dropped_with_a_warning(
    kube_api_client: client.ApiClient,
) -> None:
    """Decoding into the Go type drops fields the kind does not have: with the default
    fieldValidation (Warn) each one is named in a Warning header, with Strict it is a 400.
    So a misspelt field (or one newer than the 1.34 server) never reaches storage."""
    res = client.ResourceV1Api(kube_api_client)
    body = slice_body("typo", "n1")
    device = body["spec"]["devices"][0]
    device["attributez"] = {"x": {"int": 1}}  # misspelt
    # The list-typed attributes (DRAListTypeAttributes) are newer than 1.34: dropped.
    device["attributes"]["list"] = {"int": 3, "ints": [1, 2]}
    body["spec"]["poolz"] = {}
    made, code, headers = await res.create_resource_slice_with_http_info(body,
                                                                         _request_timeout=T)
    assert code == 201
    assert made.spec.devices[0].attributes["list"].ints is None
    raw = await res.read_resource_slice("typo", _preload_content=False, _request_timeout=T)
    stored = json.loads(await raw.read())
    assert "attributez" not in stored["spec"]["devices"][0]
    assert stored["spec"]["devices"][0]["attributes"]["list"] == {"int": 3}
    assert "poolz" not in stored["spec"]
    warning = headers.get("Warning", "")
    for path in ("spec.devices[0].attributez", "spec.devices[0].attributes.list.ints",
                 "spec.poolz"):
        assert f'unknown field \\"{path}\\"' in warning
    # An attribute given only in a form the server does not know is left empty: invalid.
    only_list = slice_body("only-list", "n1")
    only_list["spec"]["devices"][0]["attributes"]["list"] = {"ints": [1, 2]}
    with pytest.raises(ApiException) as ei:
        await res.create_resource_slice(only_list, _request_timeout=T)
    assert ei.value.status == 422

    v1 = client.CoreV1Api(kube_api_client)
    with pytest.raises(ApiException) as ei:
        await v1.create_namespaced_config_map(
            "default", {"metadata": {"name": "cm"}, "dta": {"a": "b"}},
            field_validation="Strict", _request_timeout=T)
    assert ei.value.status == 400
    assert _body(ei.value)["message"] == (
        'ConfigMap in version "v1" cannot be handled as a ConfigMap: strict decoding error: '
        'unknown field "dta"'
    )
    # Updates too.
    cm = await v1.create_namespaced_config_map("default", {"metadata": {"name": "cm"}},
                                               _request_timeout=T)
    put = client.ApiClient.sanitize_for_serialization(kube_api_client, cm)
    put["dta"] = {"a": "b"}
    await v1.replace_namespaced_config_map("cm", "default", put, _request_timeout=T)
    raw = await v1.read_namespaced_config_map("cm", "default", _preload_content=False,
                                              _request_timeout=T)
    assert "dta" not in json.loads(await raw.read())
