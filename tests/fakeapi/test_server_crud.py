"""CRUD semantics of the fake API server through the real kubernetes_asyncio client."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiException
from neuron_dra.sim.fakeapi.server import FakeAPIServer
from neuron_dra.sim.fakeapi.store import ApiError

pytestmark = pytest.mark.asyncio


def _body(exc: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exc.body)
    return body


def slice_body(name: str, node: str, *, devices: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "neuron.aws.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": f"neurondevice{i}", "attributes": {"deviceId": {"int": i}}}
                for i in range(devices)
            ],
        },
    }


async def test_node_crud_and_status_split(kube_api_client: client.ApiClient) -> None:
    v1 = client.CoreV1Api(kube_api_client)
    node = await v1.create_node(
        client.V1Node(metadata=client.V1ObjectMeta(name="n1", labels={"a": "1"}))
    )
    assert node.metadata.uid and node.metadata.creation_timestamp
    assert node.metadata.generation == 1
    rv1 = int(node.metadata.resource_version)

    got = await v1.read_node("n1")
    assert got.metadata.uid == node.metadata.uid

    # Status through the main resource is ignored...
    got.status = client.V1NodeStatus(
        conditions=[client.V1NodeCondition(type="Ready", status="True")]
    )
    got.metadata.labels["b"] = "2"
    replaced = await v1.replace_node("n1", got)
    assert replaced.metadata.labels == {"a": "1", "b": "2"}
    assert not (replaced.status and replaced.status.conditions)
    assert int(replaced.metadata.resource_version) > rv1
    # ...and only the status subresource changes it (and nothing else).
    replaced.status = client.V1NodeStatus(
        conditions=[client.V1NodeCondition(type="Ready", status="True")]
    )
    replaced.metadata.labels["c"] = "3"
    st = await v1.replace_node_status("n1", replaced)
    assert st.status.conditions[0].type == "Ready"
    assert "c" not in st.metadata.labels

    await v1.delete_node("n1")
    with pytest.raises(ApiException) as ei:
        await v1.read_node("n1")
    assert ei.value.status == 404
    assert _body(ei.value)["message"] == 'nodes "n1" not found'


async def test_stale_resource_version_conflicts(kube_api_client: client.ApiClient) -> None:
    coord = client.CoordinationV1Api(kube_api_client)
    lease = await coord.create_namespaced_lease(
        "default",
        client.V1Lease(metadata=client.V1ObjectMeta(name="lock"),
                       spec=client.V1LeaseSpec(holder_identity="a")),
    )
    stale = lease.metadata.resource_version
    lease.spec.holder_identity = "b"
    updated = await coord.replace_namespaced_lease("lock", "default", lease)
    assert updated.spec.holder_identity == "b"

    lease.metadata.resource_version = stale
    lease.spec.holder_identity = "c"
    with pytest.raises(ApiException) as ei:
        await coord.replace_namespaced_lease("lock", "default", lease)
    assert ei.value.status == 409
    body = _body(ei.value)
    assert body["reason"] == "Conflict"
    assert body["message"] == (
        'Operation cannot be fulfilled on leases.coordination.k8s.io "lock": the object has '
        "been modified; please apply your changes to the latest version and try again"
    )
    # Leases do not allow unconditional updates (leaseStrategy.AllowUnconditionalUpdate is
    # false): a PUT without a resourceVersion is invalid, not a blind overwrite.
    lease.metadata.resource_version = None
    with pytest.raises(ApiException) as ei:
        await coord.replace_namespaced_lease("lock", "default", lease)
    assert ei.value.status == 422
    assert _body(ei.value)["message"] == (
        'leases.coordination.k8s.io "lock" is invalid: metadata.resourceVersion: '
        "Invalid value: 0: must be specified for an update"
    )

    # ...but they do allow create-on-update: a PUT of a missing lease creates it.
    lease.metadata.name = "other"
    made = await coord.replace_namespaced_lease("other", "default", lease)
    assert made.metadata.uid and made.spec.holder_identity == "c"

    # A kind without create-on-update answers 404.
    cm = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="nope"))
    with pytest.raises(ApiException) as ei:
        await client.CoreV1Api(kube_api_client).replace_namespaced_config_map(
            "nope", "default", cm)
    assert ei.value.status == 404


async def test_create_errors(kube_api_client: client.ApiClient) -> None:
    v1 = client.CoreV1Api(kube_api_client)
    cm = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="c"), data={"k": "v"})
    await v1.create_namespaced_config_map("default", cm)
    with pytest.raises(ApiException) as ei:
        await v1.create_namespaced_config_map("default", cm)
    assert ei.value.status == 409
    assert _body(ei.value)["reason"] == "AlreadyExists"
    assert _body(ei.value)["message"] == 'configmaps "c" already exists'

    with pytest.raises(ApiException) as ei:
        await v1.create_namespaced_config_map("nope", cm)
    assert ei.value.status == 404
    assert _body(ei.value)["message"] == 'namespaces "nope" not found'

    bad = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="Not_Valid"))
    with pytest.raises(ApiException) as ei:
        await v1.create_namespaced_config_map("default", bad)
    assert ei.value.status == 422
    assert "metadata.name" in _body(ei.value)["message"]


async def test_generate_name_and_generation(kube_api_client: client.ApiClient) -> None:
    res = client.ResourceV1Api(kube_api_client)
    created = await res.create_device_class(
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
         "metadata": {"generateName": "neuron-"},
         "spec": {"selectors": [{"cel": {"expression": 'device.driver == "neuron.aws.com"'}}]}}
    )
    name = created.metadata.name
    assert name.startswith("neuron-") and len(name) == len("neuron-") + 5
    assert created.metadata.generation == 1

    created.metadata.labels = {"x": "y"}
    relabeled = await res.replace_device_class(name, created)
    assert relabeled.metadata.generation == 1  # metadata-only change

    relabeled.spec.selectors[0].cel.expression = 'device.driver == "other.example.com"'
    respecced = await res.replace_device_class(name, relabeled)
    assert respecced.metadata.generation == 2

    # A no-op update does not bump the resourceVersion (like etcd-backed storage).
    again = await res.replace_device_class(name, respecced)
    assert again.metadata.resource_version == respecced.metadata.resource_version


async def test_pod_binding_and_status(kube_api_client: client.ApiClient) -> None:
    v1 = client.CoreV1Api(kube_api_client)
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="p"),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox")]),
    )
    created = await v1.create_namespaced_pod("default", pod)
    assert created.status.phase == "Pending"

    await v1.create_namespaced_pod_binding(
        "p", "default",
        client.V1Binding(metadata=client.V1ObjectMeta(name="p"),
                         target=client.V1ObjectReference(kind="Node", name="n1")),
        _preload_content=False,
    )
    bound = await v1.read_namespaced_pod("p", "default")
    assert bound.spec.node_name == "n1"
    with pytest.raises(ApiException) as ei:
        await v1.create_namespaced_pod_binding(
            "p", "default",
            client.V1Binding(metadata=client.V1ObjectMeta(name="p"),
                             target=client.V1ObjectReference(kind="Node", name="n2")),
        )
    assert ei.value.status == 409

    patched = await v1.patch_namespaced_pod_status(
        "p", "default", {"status": {"phase": "Running", "podIP": "10.0.0.5"}}
    )
    assert patched.status.phase == "Running"
    listed = await v1.list_pod_for_all_namespaces(field_selector="status.phase=Running")
    assert [p.metadata.name for p in listed.items] == ["p"]
    on_node = await v1.list_namespaced_pod("default", field_selector="spec.nodeName=n1")
    assert len(on_node.items) == 1


async def test_resource_api_kinds(kube_api_client: client.ApiClient) -> None:
    res = client.ResourceV1Api(kube_api_client)
    s = await res.create_resource_slice(slice_body("n1-neuron", "n1"))
    assert s.spec.driver == "neuron.aws.com" and len(s.spec.devices) == 2
    s.spec.pool.generation = 2
    s2 = await res.replace_resource_slice("n1-neuron", s)
    assert s2.spec.pool.generation == 2 and s2.metadata.generation == 2

    # Immutable field → 422 from the built-in validation.
    s2.spec.driver = "other.example.com"
    with pytest.raises(ApiException) as ei:
        await res.replace_resource_slice("n1-neuron", s2)
    assert ei.value.status == 422

    claim = await res.create_namespaced_resource_claim(
        "default",
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"name": "c"},
         "spec": {"devices": {"requests": [
             {"name": "r", "exactly": {"deviceClassName": "neuron.aws.com"}}]}},
         "status": {"reservedFor": [{"resource": "pods", "name": "x", "uid": "1"}]}},
    )
    assert claim.status is None or not claim.status.reserved_for  # status dropped on create
    # Server-side defaults are applied.
    assert claim.spec.devices.requests[0].exactly.allocation_mode == "ExactCount"
    assert claim.spec.devices.requests[0].exactly.count == 1

    allocated = await res.patch_namespaced_resource_claim_status(
        "c", "default",
        {"status": {"allocation": {"devices": {"results": [
            {"request": "r", "driver": "neuron.aws.com", "pool": "n1",
             "device": "neurondevice0"}]}}}},
    )
    assert allocated.status.allocation.devices.results[0].device == "neurondevice0"

    tmpl = await res.create_namespaced_resource_claim_template(
        "default",
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
         "metadata": {"name": "t"},
         "spec": {"spec": {"devices": {"requests": [
             {"name": "r", "exactly": {"deviceClassName": "neuron.aws.com"}}]}}}},
    )
    assert tmpl.metadata.name == "t"
    listed = await res.list_namespaced_resource_claim_template("default")
    assert [t.metadata.name for t in listed.items] == ["t"]
    await res.delete_namespaced_resource_claim_template("t", "default")
    await res.delete_namespaced_resource_claim("c", "default")
    await res.delete_resource_slice("n1-neuron")
    assert (await res.list_resource_slice()).items == []


async def test_finalizers_and_deletion_timestamp(
    kube_api_client: client.ApiClient, fake_apiserver: FakeAPIServer
) -> None:
    v1 = client.CoreV1Api(kube_api_client)
    cm = await v1.create_namespaced_config_map(
        "default",
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name="f", finalizers=["x/y"])),
    )
    await v1.delete_namespaced_config_map("f", "default")
    pending = await v1.read_namespaced_config_map("f", "default")
    assert pending.metadata.deletion_timestamp is not None
    assert pending.metadata.generation == cm.metadata.generation + 1

    # No new finalizers on a deleting object.
    pending.metadata.finalizers = ["x/y", "new/one"]
    with pytest.raises(ApiException) as ei:
        await v1.replace_namespaced_config_map("f", "default", pending)
    assert ei.value.status == 422
    assert "no new finalizers can be added" in _body(ei.value)["message"]

    # Removing the last finalizer deletes it.
    await v1.patch_namespaced_config_map("f", "default", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as ei:
        await v1.read_namespaced_config_map("f", "default")
    assert ei.value.status == 404
    assert fake_apiserver.get("v1", "ConfigMap", "f", "default") is None


async def test_delete_preconditions(kube_api_client: client.ApiClient) -> None:
    v1 = client.CoreV1Api(kube_api_client)
    cm = await v1.create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="p"))
    )
    with pytest.raises(ApiException) as ei:
        await v1.delete_namespaced_config_map(
            "p", "default",
            body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="wrong")),
        )
    assert ei.value.status == 409
    await v1.delete_namespaced_config_map(
        "p", "default",
        body=client.V1DeleteOptions(
            preconditions=client.V1Preconditions(
                uid=cm.metadata.uid, resource_version=cm.metadata.resource_version)),
    )


async def _wait_gone(read: Any, *args: Any) -> None:
    """Poll-free wait: watch would be nicer, but GC runs on the next loop iteration, so a
    few cooperative yields are enough; bounded so a missing GC fails the test."""
    for _ in range(50):
        try:
            await read(*args)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        await asyncio.sleep(0)
    raise AssertionError(f"{args} was not garbage-collected")


async def test_owner_reference_garbage_collection(kube_api_client: client.ApiClient) -> None:
    v1 = client.CoreV1Api(kube_api_client)
    res = client.ResourceV1Api(kube_api_client)
    node = await v1.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="owner")))
    body = slice_body("owned", "owner")
    body["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Node", "name": "owner", "uid": node.metadata.uid}
    ]
    await res.create_resource_slice(body)
    orphan_body = slice_body("orphaned", "owner")
    orphan_body["metadata"]["ownerReferences"] = body["metadata"]["ownerReferences"]
    other = await v1.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="other")))
    two_owners = slice_body("two-owners", "owner")
    two_owners["metadata"]["ownerReferences"] = [
        *body["metadata"]["ownerReferences"],
        {"apiVersion": "v1", "kind": "Node", "name": "other", "uid": other.metadata.uid},
    ]
    await res.create_resource_slice(two_owners)

    await v1.delete_node("owner")
    await _wait_gone(res.read_resource_slice, "owned")
    # Still has a live owner → kept.
    kept = await res.read_resource_slice("two-owners")
    assert kept.metadata.name == "two-owners"

    # Orphan propagation strips the reference instead of deleting.
    await v1.delete_node("other", propagation_policy="Orphan")
    kept = await res.read_resource_slice("two-owners")
    assert all(r.uid != other.metadata.uid for r in kept.metadata.owner_references or [])


async def test_namespace_deletion_removes_content(kube_api_client: client.ApiClient) -> None:
    v1 = client.CoreV1Api(kube_api_client)
    await v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="tmp")))
    await v1.create_namespaced_config_map(
        "tmp", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="a"))
    )
    # A finalizer keeps one object (and so the namespace) around while Terminating.
    await v1.create_namespaced_config_map(
        "tmp", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="held", finalizers=["x/y"]))
    )
    resp = await v1.delete_namespace("tmp", _preload_content=False)
    assert (await resp.json())["status"]["phase"] == "Terminating"
    await _wait_gone(v1.read_namespaced_config_map, "a", "tmp")
    ns = await v1.read_namespace("tmp")
    assert ns.status.phase == "Terminating"
    with pytest.raises(ApiException) as ei:
        await v1.create_namespaced_config_map(
            "tmp", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="b"))
        )
    assert ei.value.status == 403
    assert "because it is being terminated" in _body(ei.value)["message"]

    await v1.patch_namespaced_config_map("held", "tmp", {"metadata": {"finalizers": None}})
    await _wait_gone(v1.read_namespace, "tmp")


async def test_in_process_seeding_uses_same_validation(fake_apiserver: FakeAPIServer) -> None:
    created = fake_apiserver.create(slice_body("seeded", "n9"))
    assert created["metadata"]["resourceVersion"]
    created["spec"]["driver"] = "mutated"  # the caller's copy is private
    stored = fake_apiserver.get("resource.k8s.io/v1", "ResourceSlice", "seeded")
    assert stored is not None and stored["spec"]["driver"] == "neuron.aws.com"
    bad = slice_body("bad", "n9")
    bad["spec"]["devices"][0]["name"] = "Not A DNS Label"
    with pytest.raises(ApiError) as ei:
        fake_apiserver.create(bad)
    assert ei.value.code == 422
    assert "spec.devices[0].name" in ei.value.body["message"]
    assert fake_apiserver.seed(slice_body(f"bulk-{i}", f"n{i}") for i in range(3)) == 3
    assert len(fake_apiserver.list("resource.k8s.io/v1", "resourceslices")) == 4


async def test_delete_collection_by_label(kube_api_client: client.ApiClient) -> None:
    v1 = client.CoreV1Api(kube_api_client)
    for name, role in (("a", "x"), ("b", "x"), ("c", "y")):
        await v1.create_namespaced_config_map("default", client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=name, labels={"role": role})))
    await v1.delete_collection_namespaced_config_map("default", label_selector="role=x")
    left = await v1.list_namespaced_config_map("default")
    assert [c.metadata.name for c in left.items] == ["c"]


async def test_table_rendering_for_kubectl(fake_apiserver: FakeAPIServer) -> None:
    fake_apiserver.create(slice_body("s1", "n1"))
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    async with aiohttp.ClientSession(base_url=fake_apiserver.url) as http, http.get(
        "/apis/resource.k8s.io/v1/resourceslices", headers={"Accept": accept}
    ) as r:
        table = await r.json()
    assert table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"]] == [
        "Name", "Node", "Driver", "Pool", "Age"]
    row = table["rows"][0]
    assert row["cells"][:4] == ["s1", "n1", "neuron.aws.com", "n1"]
    assert row["object"]["kind"] == "PartialObjectMetadata"
