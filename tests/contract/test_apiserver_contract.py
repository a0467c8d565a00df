"""API-server behaviour our code depends on, checked against the fake AND a real server.

Each test runs against ``neuron-dra``'s fake API server and against the real kube-apiserver
of every pinned minor (``hack/k8s``; ids ``fake`` / ``real-1.34`` ...): a difference between
the two is a fidelity bug in the fake.
Everything goes through the real kubernetes_asyncio client over HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import time
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException
from neuron_dra.common.constants import DRIVER_NAME
from neuron_dra.common.k8s.client import RESOURCE_CLAIMS, KubeClient, PatchType
from neuron_dra.common.models.configs import UltraServerConfig, encode_opaque_config
from neuron_dra.nodeplugin.prepare.devicestatus import apply_body
from neuron_dra.sim.fakeapi.server import FakeAPIServer
from neuron_dra.sim.worlds import minor_of, real_control_plane, world_params

T = 10  # per-call timeout, seconds
GROUP, VERSION, NUSW = "neuron.aws.com", "v1beta1", "neuronultraserverworkloads"


def seed_workload(name: str = "my-training-job") -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "NeuronUltraServerWorkload",
        "metadata": {"name": name},
        "spec": {
            "instanceType": "<trn3pds instance type>",
            "topologySize": 4,
            "serverCount": 2,
            "allocationPolicy": {"failureStrategy": "NoOp"},
            "resourceClaimTemplate": {"name": "my-training-job-rct"},
        },
    }


def slice_for(node: str, **spec_extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": "neuron.aws.com",
        "nodeName": node,
        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": "neurondevice0", "attributes": {"deviceId": {"int": 0}}}],
    }
    spec.update(spec_extra)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-neuron.aws.com", "labels": {"node": node}},
        "spec": spec,
    }


@pytest.fixture(params=world_params())
def world(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def api(world: str) -> AsyncIterator[k8s.ApiClient]:
    """A client of a fresh fake API server, or of the session's real control plane of a
    pinned minor (shared: tests isolate with the ``ns`` fixture's namespace and prefix)."""
    minor = minor_of(world)
    if minor is None:
        server = FakeAPIServer()
        async with server, k8s.ApiClient(server.client_configuration()) as client:
            yield client
        return
    cp = real_control_plane(minor)
    async with k8s.ApiClient(cp.client_configuration()) as client:
        yield client


@pytest.fixture
async def ns(api: k8s.ApiClient, world: str) -> AsyncIterator[str]:
    """A namespace of the test's own (also the prefix of its cluster-scoped names). On a real
    server, once its ``default`` ServiceAccount exists: admission requires it of every pod
    (the controller-manager creates it; the fake runs no controllers and needs none)."""
    name = f"ct-{uuid.uuid4().hex[:8]}"
    core = k8s.CoreV1Api(api)
    await core.create_namespace({"metadata": {"name": name}}, _request_timeout=T)
    if minor_of(world) is not None:
        # A watch without a resourceVersion starts with the object if it exists already.
        resp = await api.call_api(
            f"/api/v1/namespaces/{name}/serviceaccounts",
            "GET",
            query_params=[("watch", "true"), ("fieldSelector", "metadata.name=default")],
            _preload_content=False,
            _request_timeout=60,
        )
        async with asyncio.timeout(60):
            assert await resp.content.readline(), "watch closed before the ServiceAccount"
        resp.close()
    yield name
    # Cluster-scoped objects do not go with the namespace: the slices carry its name.
    res = k8s.ResourceV1Api(api)
    for item in (await res.list_resource_slice(_request_timeout=T)).items:
        if item.metadata.name.startswith(name):
            with contextlib.suppress(ApiException):
                await res.delete_resource_slice(item.metadata.name, _request_timeout=T)
    with contextlib.suppress(ApiException):
        await core.delete_namespace(name, _request_timeout=T)


def _body(exc: ApiException) -> dict[str, Any]:
    return dict(json.loads(exc.body))


async def test_seed_workload_applies_with_defaults(api: k8s.ApiClient, ns: str) -> None:
    objs = k8s.CustomObjectsApi(api)
    wl = seed_workload()
    del wl["spec"]["allocationPolicy"]
    created = await objs.create_namespaced_custom_object(
        GROUP, VERSION, ns, NUSW, wl, _request_timeout=T
    )
    assert created["spec"]["allocationPolicy"]["failureStrategy"] == "NoOp"
    assert created["metadata"]["generation"] == 1
    assert created["metadata"]["uid"]
    assert int(created["metadata"]["resourceVersion"]) > 0


async def test_topology_size_three_rejected_naming_the_field(api: k8s.ApiClient, ns: str) -> None:
    wl = seed_workload("bad")
    wl["spec"]["topologySize"] = 3
    with pytest.raises(ApiException) as err:
        await k8s.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, VERSION, ns, NUSW, wl, _request_timeout=T
        )
    assert err.value.status == 422
    body = _body(err.value)
    assert body["reason"] == "Invalid"
    assert "spec.topologySize" in body["message"]
    assert any(c.get("field") == "spec.topologySize" for c in body["details"]["causes"])


async def test_immutable_spec_field(api: k8s.ApiClient, ns: str) -> None:
    objs = k8s.CustomObjectsApi(api)
    await objs.create_namespaced_custom_object(
        GROUP, VERSION, ns, NUSW, seed_workload(), _request_timeout=T
    )
    with pytest.raises(ApiException) as err:
        await objs.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            ns,
            NUSW,
            "my-training-job",
            {"spec": {"topologySize": 2}},
            _content_type="application/merge-patch+json",
            _request_timeout=T,
        )
    assert err.value.status == 422
    assert "spec.topologySize" in _body(err.value)["message"]


async def test_stale_resource_version_put_conflicts(api: k8s.ApiClient, ns: str) -> None:
    core = k8s.CoreV1Api(api)
    cm = await core.create_namespaced_config_map(
        ns, {"metadata": {"name": "cm"}, "data": {"a": "1"}}, _request_timeout=T
    )
    stale = api.sanitize_for_serialization(cm)
    await core.patch_namespaced_config_map("cm", ns, {"data": {"a": "2"}}, _request_timeout=T)
    stale["data"]["a"] = "3"
    with pytest.raises(ApiException) as err:
        await core.replace_namespaced_config_map("cm", ns, stale, _request_timeout=T)
    assert err.value.status == 409
    assert _body(err.value)["reason"] == "Conflict"


async def test_generate_name(api: k8s.ApiClient, ns: str) -> None:
    core = k8s.CoreV1Api(api)
    a = await core.create_namespaced_config_map(
        ns, {"metadata": {"generateName": "job-"}}, _request_timeout=T
    )
    b = await core.create_namespaced_config_map(
        ns, {"metadata": {"generateName": "job-"}}, _request_timeout=T
    )
    assert a.metadata.name.startswith("job-") and len(a.metadata.name) == len("job-") + 5
    assert a.metadata.name != b.metadata.name


async def test_status_subresource_split_and_generation(api: k8s.ApiClient, ns: str) -> None:
    objs = k8s.CustomObjectsApi(api)
    wl = seed_workload()
    wl["status"] = {"state": "Allocated"}
    created = await objs.create_namespaced_custom_object(
        GROUP, VERSION, ns, NUSW, wl, _request_timeout=T
    )
    assert "status" not in created or not created["status"].get("state")
    st = await objs.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        ns,
        NUSW,
        "my-training-job",
        {"status": {"state": "Pending"}, "spec": {"serverCount": 9}},
        _content_type="application/merge-patch+json",
        _request_timeout=T,
    )
    assert st["status"]["state"] == "Pending"
    assert st["spec"]["serverCount"] == 2  # /status ignores spec
    assert st["metadata"]["generation"] == 1  # status writes do not bump generation
    relabeled = await objs.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        ns,
        NUSW,
        "my-training-job",
        {"metadata": {"labels": {"x": "y"}}},
        _content_type="application/merge-patch+json",
        _request_timeout=T,
    )
    assert relabeled["metadata"]["generation"] == 1  # metadata-only change
    changed = await objs.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        ns,
        NUSW,
        "my-training-job",
        {"spec": {"allocationPolicy": {"failureStrategy": "RestartAll"}}},
        _content_type="application/merge-patch+json",
        _request_timeout=T,
    )
    assert changed["metadata"]["generation"] == 2


async def test_slice_selectors(api: k8s.ApiClient, ns: str) -> None:
    res = k8s.ResourceV1Api(api)
    a, b, c = (f"{ns}-node-{x}" for x in "abc")
    for node in (a, b, c):
        await res.create_resource_slice(slice_for(node), _request_timeout=T)
    by_field = await res.list_resource_slice(
        field_selector=f"spec.nodeName={b}", _request_timeout=T
    )
    assert [s.spec.node_name for s in by_field.items] == [b]
    by_label = await res.list_resource_slice(
        label_selector=f"node in ({a},{c})", _request_timeout=T
    )
    assert sorted(s.spec.node_name for s in by_label.items) == [a, c]
    # Other tests' slices may exist on a shared server: look at ours.
    not_b = await res.list_resource_slice(label_selector=f"node!={b}", _request_timeout=T)
    assert sorted(s.spec.node_name for s in not_b.items if s.spec.node_name in (a, b, c)) == [a, c]
    with pytest.raises(ApiException) as err:
        # Not a field label on any minor (1.37 added spec.pool.name; 1.34 refuses it).
        await res.list_resource_slice(field_selector="spec.pool.generation=1", _request_timeout=T)
    assert err.value.status == 400


async def test_slice_all_nodes_false_is_invalid(api: k8s.ApiClient, ns: str) -> None:
    # allNodes must be unset or true; a JSON false is rejected by the API server.
    # The raw call keeps the false on the wire: the typed model would drop it.
    bad = slice_for(f"{ns}-node-x", allNodes=False)
    resp = await api.call_api(
        "/apis/resource.k8s.io/v1/resourceslices",
        "POST",
        body=bad,
        header_params={"Content-Type": "application/json"},
        _preload_content=False,
        _request_timeout=T,
    )
    body = json.loads(await resp.read())
    assert resp.status == 422, body
    assert "spec.allNodes" in body["message"]


async def test_finalizer_holds_deletion(api: k8s.ApiClient, ns: str) -> None:
    core = k8s.CoreV1Api(api)
    await core.create_namespaced_config_map(
        ns,
        {"metadata": {"name": "held", "finalizers": ["example.com/hold"]}},
        _request_timeout=T,
    )
    await core.delete_namespaced_config_map("held", ns, _request_timeout=T)
    held = await core.read_namespaced_config_map("held", ns, _request_timeout=T)
    assert held.metadata.deletion_timestamp is not None
    await core.patch_namespaced_config_map(
        "held", ns, {"metadata": {"finalizers": None}}, _request_timeout=T
    )
    with pytest.raises(ApiException) as err:
        await core.read_namespaced_config_map("held", ns, _request_timeout=T)
    assert err.value.status == 404


async def test_watch_resumes_from_resource_version(api: k8s.ApiClient, ns: str) -> None:
    core = k8s.CoreV1Api(api)
    # Labelled and watched by label: on the real server kube-controller-manager publishes
    # kube-root-ca.crt into every new namespace, at a moment of its own choosing.
    labels = {"contract": "watch-resume"}
    first = await core.create_namespaced_config_map(
        ns, {"metadata": {"name": "w1", "labels": labels}}, _request_timeout=T
    )
    rv = first.metadata.resource_version
    await core.create_namespaced_config_map(
        ns, {"metadata": {"name": "w2", "labels": labels}}, _request_timeout=T
    )
    await core.delete_namespaced_config_map("w1", ns, _request_timeout=T)
    resp = await api.call_api(
        f"/api/v1/namespaces/{ns}/configmaps",
        "GET",
        query_params=[
            ("watch", "true"),
            ("resourceVersion", rv),
            ("labelSelector", "contract=watch-resume"),
            ("timeoutSeconds", "5"),
        ],
        _preload_content=False,
        _request_timeout=T,
    )
    seen: list[tuple[str, str]] = []
    async with asyncio.timeout(T):
        while len(seen) < 2:
            line = await resp.content.readline()
            assert line, "watch closed before the expected events"
            ev = json.loads(line)
            seen.append((ev["type"], ev["object"]["metadata"]["name"]))
    resp.close()
    assert seen == [("ADDED", "w2"), ("DELETED", "w1")]


async def test_update_of_missing_object_is_not_found(api: k8s.ApiClient, ns: str) -> None:
    body = copy.deepcopy(seed_workload("ghost"))
    body["metadata"]["resourceVersion"] = "1"
    with pytest.raises(ApiException) as err:
        await k8s.CustomObjectsApi(api).replace_namespaced_custom_object(
            GROUP, VERSION, ns, NUSW, "ghost", body, _request_timeout=T
        )
    assert err.value.status == 404


def _pod(name: str, node: str | None = "node-a") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node  # bound without a scheduler (no kubelet runs it)
    else:
        # Stays unbound even where a real scheduler and nodes are about.
        spec["nodeSelector"] = {"contract.neuron.aws.com/unschedulable": "true"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def _delete_pod(api: k8s.ApiClient, ns: str, name: str, **options: Any) -> dict[str, Any]:
    """DELETE a pod; the server's answer as JSON (for pods: the pod as marked or removed)."""
    resp = await api.call_api(
        f"/api/v1/namespaces/{ns}/pods/{name}",
        "DELETE",
        body={"kind": "DeleteOptions", "apiVersion": "v1", **options},
        header_params={"Content-Type": "application/json"},
        _preload_content=False,
        _request_timeout=T,
    )
    body: dict[str, Any] = json.loads(await resp.read())
    assert resp.status == 200, body
    return body


def _seconds(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


async def test_bound_pod_is_deleted_gracefully(api: k8s.ApiClient, ns: str) -> None:
    """With no kubelet to end its grace period, a bound pod stays Terminating; a shorter grace
    moves its deadline; the kubelet's DELETE with grace 0 and the uid removes it."""
    core = k8s.CoreV1Api(api)
    created = await core.create_namespaced_pod(ns, _pod("bound"), _request_timeout=T)
    uid = created.metadata.uid

    before = time.time()
    marked = await _delete_pod(api, ns, "bound")
    after = time.time()
    meta = marked["metadata"]
    assert meta["deletionGracePeriodSeconds"] == 30  # terminationGracePeriodSeconds' default
    # The deadline is the server's time of the DELETE plus the grace period. That time lies
    # between the moments around the call, whatever the machine's speed; the timestamp has
    # second resolution (truncated), hence a second of slack below.
    assert before - 1 + 30 <= _seconds(meta["deletionTimestamp"]) <= after + 30
    still = await core.read_namespaced_pod("bound", ns, _request_timeout=T)
    assert still.metadata.deletion_timestamp is not None

    again = await _delete_pod(api, ns, "bound", gracePeriodSeconds=60)  # longer: no change
    assert again["metadata"]["deletionTimestamp"] == meta["deletionTimestamp"]
    shorter = await _delete_pod(api, ns, "bound", gracePeriodSeconds=5)
    assert shorter["metadata"]["deletionGracePeriodSeconds"] == 5
    assert _seconds(meta["deletionTimestamp"]) - _seconds(
        shorter["metadata"]["deletionTimestamp"]
    ) == pytest.approx(25)
    rv = shorter["metadata"]["resourceVersion"]

    with pytest.raises(ApiException) as err:
        await core.delete_namespaced_pod(
            "bound",
            ns,
            body=k8s.V1DeleteOptions(
                grace_period_seconds=0, preconditions=k8s.V1Preconditions(uid="not-this-pod")
            ),
            _request_timeout=T,
        )
    assert err.value.status == 409
    assert _body(err.value)["message"].startswith(
        'Operation cannot be fulfilled on Pod "bound": the UID in the precondition '
        f"(not-this-pod) does not match the UID in record ({uid})"
    )

    await _delete_pod(api, ns, "bound", gracePeriodSeconds=0, preconditions={"uid": uid})
    with pytest.raises(ApiException) as err:
        await core.read_namespaced_pod("bound", ns, _request_timeout=T)
    assert err.value.status == 404
    # Watchers see the grace period end, then the removal.
    resp = await api.call_api(
        f"/api/v1/namespaces/{ns}/pods",
        "GET",
        query_params=[("watch", "true"), ("resourceVersion", rv), ("timeoutSeconds", "5")],
        _preload_content=False,
        _request_timeout=T,
    )
    seen: list[tuple[str, int]] = []
    async with asyncio.timeout(T):
        while len(seen) < 2:
            line = await resp.content.readline()
            assert line, "watch closed before the expected events"
            ev = json.loads(line)
            seen.append((ev["type"], ev["object"]["metadata"]["deletionGracePeriodSeconds"]))
    resp.close()
    assert seen == [("MODIFIED", 0), ("DELETED", 0)]


async def test_unbound_and_terminal_pods_are_deleted_at_once(api: k8s.ApiClient, ns: str) -> None:
    core = k8s.CoreV1Api(api)
    await core.create_namespaced_pod(ns, _pod("pending", node=None), _request_timeout=T)
    await core.create_namespaced_pod(ns, _pod("done"), _request_timeout=T)
    await core.patch_namespaced_pod_status(
        "done", ns, {"status": {"phase": "Succeeded"}}, _request_timeout=T
    )
    for name in ("pending", "done"):
        answer = await _delete_pod(api, ns, name)
        assert answer["metadata"]["deletionGracePeriodSeconds"] == 0
        with pytest.raises(ApiException) as err:
            await core.read_namespaced_pod(name, ns, _request_timeout=T)
        assert err.value.status == 404


async def test_status_devices_apply_leaves_an_allocation_with_opaque_config(
    api: k8s.ApiClient, ns: str
) -> None:
    # The plugin reports status.devices by server-side apply. The server runs the live claim
    # through its structured form and back, then checks that status.allocation did not
    # change; an opaque config's parameters are compared byte for byte. Written with JSON's
    # spaces (Python's default), they came back compact, and 1.34 refused every report on
    # the UltraServer claims of generated templates: "field is immutable".
    kube = KubeClient(api)
    claims = kube.resource(RESOURCE_CLAIMS)
    config = {"opaque": {"driver": DRIVER_NAME, "parameters": encode_opaque_config(
        UltraServerConfig(ultraserverMode=4)
    )}}  # fmt: skip
    made = await claims.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "us-claim"},
            "spec": {
                "devices": {
                    "requests": [{"name": "us", "exactly": {"deviceClassName": "neuron.aws.com"}}],
                    "config": [config],
                }
            },
        },
        ns,
    )
    result = {"request": "us", "driver": DRIVER_NAME, "pool": "n0", "device": "neuronnode"}
    # As the scheduler allocates: the claim's config copied into the allocation.
    made["status"] = {
        "allocation": {
            "devices": {
                "results": [result],
                "config": [{"source": "FromClaim", "requests": ["us"], **config}],
            }
        }
    }
    allocated = await claims.replace(made, subresource="status")
    entry = {
        "driver": DRIVER_NAME,
        "pool": "n0",
        "device": "neuronnode",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Prepared",
                "message": "prepared",
                "lastTransitionTime": "2026-11-26T00:00:00Z",
            }
        ],
    }
    applied = await claims.patch(
        "us-claim",
        apply_body(ns, "us-claim", allocated["metadata"]["uid"], [entry]),
        patch_type=PatchType.APPLY,
        namespace=ns,
        subresource="status",
        field_manager="neuron-dra-contract",
        force=True,
    )
    assert [d["device"] for d in applied["status"]["devices"]] == ["neuronnode"]
    assert applied["status"]["allocation"] == allocated["status"]["allocation"]
