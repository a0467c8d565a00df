"""The raw-dict client against the fake API server, over real HTTP."""

from __future__ import annotations

import asyncio
import copy
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from neuron_dra.common import constants
from neuron_dra.common.k8s import errors
from neuron_dra.common.k8s.client import (
    CONFIG_MAPS,
    LEASES,
    NEURON_ULTRASERVERS,
    NODES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    KubeClient,
    PatchType,
    Timeouts,
    connect,
    go_json,
    object_key,
)
from neuron_dra.sim.fakeapi.faults import RequestInfo
from neuron_dra.sim.fakeapi.server import FakeAPIServer

from .conftest import configmap, resource_slice


def test_paths() -> None:
    assert CONFIG_MAPS.path("ns", "a") == "/api/v1/namespaces/ns/configmaps/a"
    assert CONFIG_MAPS.path() == "/api/v1/configmaps"
    assert NODES.path(name="n1", subresource="status") == "/api/v1/nodes/n1/status"
    assert RESOURCE_SLICES.path(name="s") == "/apis/resource.k8s.io/v1/resourceslices/s"
    assert NEURON_ULTRASERVERS.path("neuron-dra-driver", "us-1", "status") == (
        "/apis/neuron.aws.com/v1beta1/namespaces/neuron-dra-driver/neuronultraservers/us-1/status"
    )
    assert RESOURCE_CLAIMS.api_version == "resource.k8s.io/v1"
    with pytest.raises(ValueError):
        NODES.path("ns", "n1")  # cluster-scoped
    with pytest.raises(ValueError):
        CONFIG_MAPS.path(None, "a")  # namespaced object needs a namespace
    with pytest.raises(ValueError):
        CONFIG_MAPS.path("ns", subresource="status")


def test_timeouts_always_set() -> None:
    t = Timeouts(connect=2, request=7, watch_margin=3)
    unary = t.unary()
    assert unary.total == 7 and unary.connect == 2
    assert t.unary(1.5).total == 1.5
    w = t.watch(300)
    assert w.total is None and w.sock_read == 303, "watches are long-lived but not unbounded"
    with pytest.raises(ValueError):
        Timeouts(request=0)


async def test_core_crud(kube: KubeClient) -> None:
    cms = kube.resource(CONFIG_MAPS)
    created = await cms.create(configmap("a", x="1"))
    rv1 = created["metadata"]["resourceVersion"]
    assert created["data"] == {"x": "1"} and created["metadata"]["uid"]

    got = await cms.get("a", "default")
    assert got == created

    with pytest.raises(errors.AlreadyExistsError):
        await cms.create(configmap("a"))

    # RV-guarded PUT: fresh RV succeeds, the now-stale one conflicts.
    updated = copy.deepcopy(got)
    updated["data"]["x"] = "2"
    put = await cms.replace(updated)
    assert put["data"]["x"] == "2" and put["metadata"]["resourceVersion"] != rv1
    stale = copy.deepcopy(got)
    stale["data"]["x"] = "3"
    with pytest.raises(errors.ConflictError) as ei:
        await cms.replace(stale)
    assert errors.is_conflict(ei.value) and ei.value.retryable

    patched = await cms.merge_patch("a", {"data": {"y": "9"}}, "default")
    assert patched["data"] == {"x": "2", "y": "9"}
    patched = await cms.patch(
        "a",
        [{"op": "replace", "path": "/data/x", "value": "j"}],
        patch_type=PatchType.JSON,
        namespace="default",
    )
    assert patched["data"]["x"] == "j"

    await cms.create(configmap("b", ns="kube-system"))
    everywhere = await cms.list_all()
    keys = {object_key(o) for o in everywhere.items}
    assert {"default/a", "kube-system/b"} <= keys
    only_default = await cms.list_all("default")
    assert {object_key(o) for o in only_default.items} >= {"default/a"}
    assert "kube-system/b" not in {object_key(o) for o in only_default.items}
    assert int(everywhere.resource_version) >= int(patched["metadata"]["resourceVersion"])

    await cms.delete("a", "default")
    with pytest.raises(errors.NotFoundError):
        await cms.get("a", "default")
    with pytest.raises(errors.NotFoundError):
        await cms.delete("a", "default")


async def test_delete_preconditions(kube: KubeClient) -> None:
    cms = kube.resource(CONFIG_MAPS)
    created = await cms.create(configmap("p"))
    with pytest.raises(errors.ConflictError):
        await cms.delete("p", "default", uid="not-the-uid")
    await cms.delete("p", "default", uid=created["metadata"]["uid"])
    with pytest.raises(errors.NotFoundError):
        await cms.get("p", "default")


async def test_resource_slices_paging_selectors_and_large_objects(kube: KubeClient) -> None:
    slices = kube.resource(RESOURCE_SLICES)
    for i in range(5):
        await slices.create(resource_slice(f"node-{i}", devices=2))
    big = await slices.create(resource_slice("node-big", devices=128))
    assert len(big["spec"]["devices"]) == 128

    page = await slices.list(limit=2)
    assert len(page["items"]) == 2 and page["metadata"]["continue"]
    everything = await slices.list_all(page_size=2)
    assert len(everything.items) == 6
    assert len({o["metadata"]["name"] for o in everything.items}) == 6

    mine = await slices.list_all(field_selector="spec.nodeName=node-3")
    assert [o["spec"]["nodeName"] for o in mine.items] == ["node-3"]
    with pytest.raises(errors.PermanentError):  # not a field the server can select on
        await slices.list_all(field_selector="spec.devices=x")


async def test_server_side_apply(kube: KubeClient, fake_apiserver: FakeAPIServer) -> None:
    slices = kube.resource(RESOURCE_SLICES)
    desired = resource_slice("node-a")
    first = await slices.apply(desired, field_manager="neuron-dra")
    assert first["spec"]["nodeName"] == "node-a"
    desired2 = copy.deepcopy(desired)
    desired2["spec"]["pool"]["generation"] = 2
    second = await slices.apply(desired2, field_manager="neuron-dra", force=True)
    assert second["spec"]["pool"]["generation"] == 2
    assert second["metadata"]["uid"] == first["metadata"]["uid"]
    managers = {m.get("manager") for m in second["metadata"].get("managedFields") or []}
    assert "neuron-dra" in managers
    with pytest.raises(ValueError):
        await slices.patch("x", {}, patch_type=PatchType.APPLY)  # no field manager
    with pytest.raises(TypeError):
        await slices.patch("x", {}, patch_type=PatchType.JSON)  # JSON patch needs a list


async def test_custom_resource_crud_and_status(kube: KubeClient) -> None:
    nus = kube.resource(NEURON_ULTRASERVERS)
    ns = constants.DRIVER_NAMESPACE
    # The driver namespace exists in the fake server from the start, as after a chart install.
    body: dict[str, Any] = {
        "apiVersion": f"{constants.CRD_GROUP}/{constants.CRD_VERSION}",
        "kind": constants.KIND_ULTRASERVER,
        "metadata": {"name": "us-1", "namespace": ns},
        "spec": {"instanceType": "trn2u.48xlarge"},
    }
    created = await nus.create(body)
    assert created["spec"]["instanceType"] == "trn2u.48xlarge"
    # Merge patch is what CRDs accept; a status write goes to the subresource only.
    st = await nus.merge_patch("us-1", {"status": {"state": "Available"}}, ns, subresource="status")
    assert st["status"]["state"] == "Available"
    ignored = await nus.merge_patch(
        "us-1", {"status": {"state": "FullyAllocated"}, "metadata": {"labels": {"a": "b"}}}, ns
    )
    assert ignored["status"]["state"] == "Available", "main resource ignores .status"
    assert ignored["metadata"]["labels"] == {"a": "b"}
    with pytest.raises(errors.PermanentError):
        # CRDs do not support strategic merge patch: the server says so, we surface it.
        await nus.patch("us-1", {"metadata": {}}, patch_type=PatchType.STRATEGIC, namespace=ns)
    listed = await nus.list_all(ns)
    assert [o["metadata"]["name"] for o in listed.items] == ["us-1"]
    await nus.delete("us-1", ns)


async def test_invalid_object_is_permanent_with_causes(kube: KubeClient) -> None:
    slices = kube.resource(RESOURCE_SLICES)
    bad = resource_slice("n")
    del bad["spec"]["driver"]
    with pytest.raises(errors.InvalidError) as ei:
        await slices.create(bad)
    assert any("driver" in c.get("field", "") for c in ei.value.causes)


async def test_injected_faults_are_typed(kube: KubeClient, fake_apiserver: FakeAPIServer) -> None:
    leases = kube.resource(LEASES)
    fake_apiserver.faults.fail_next(1, 429, verb="list", resource="leases")
    with pytest.raises(errors.TooManyRequestsError) as ei:
        await leases.list("default")
    assert ei.value.retry_after == 1.0
    fake_apiserver.faults.fail_next(1, 503, verb="get")
    with pytest.raises(errors.ServerError):
        await leases.get("x", "default")


async def test_request_timeout_is_enforced(kube: KubeClient, fake_apiserver: FakeAPIServer) -> None:
    fake_apiserver.faults.set_latency(5.0, verb="get")
    with pytest.raises(errors.NetworkError):
        await kube.resource(CONFIG_MAPS).get("x", "default", request_timeout=0.2)


async def test_default_timeout_applies_without_override(fake_apiserver: FakeAPIServer) -> None:
    import kubernetes_asyncio.client as k8s

    async with KubeClient(
        k8s.ApiClient(fake_apiserver.client_configuration()),
        timeouts=Timeouts(request=0.2),
        owned=True,
    ) as kube:
        fake_apiserver.faults.set_latency(5.0, verb="list")
        with pytest.raises(errors.NetworkError):
            await kube.resource(CONFIG_MAPS).list("default")


async def test_connection_refused_is_retryable() -> None:
    import kubernetes_asyncio.client as k8s

    async with KubeClient(
        k8s.ApiClient(k8s.Configuration(host="http://127.0.0.1:1")), owned=True
    ) as kube:
        with pytest.raises(errors.NetworkError) as ei:
            await kube.resource(NODES).list()
        assert ei.value.retryable


async def test_connect_from_kubeconfig(fake_apiserver: FakeAPIServer, tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    fake_apiserver.write_kubeconfig(path)
    async with await connect(path) as kube:
        cm = await kube.resource(CONFIG_MAPS).create(configmap("from-kubeconfig"))
        assert cm["metadata"]["name"] == "from-kubeconfig"
        assert kube.api_client.configuration.host == fake_apiserver.url
        assert kube.api_client.configuration.api_key.get("BearerToken", "").endswith("fake-token")


@pytest.mark.parametrize("proxied", [False, True])
async def test_connect_reads_the_proxy_environment_once(
    fake_apiserver: FakeAPIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, proxied: bool
) -> None:
    """No per-request netrc/proxy look-ups (a worker thread each) unless a proxy from the
    environment applies to the API server; then the session keeps honouring it."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    if proxied:
        monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    path = tmp_path / "kubeconfig"
    fake_apiserver.write_kubeconfig(path)
    async with await connect(path) as kube:
        assert kube.api_client.rest_client.pool_manager.trust_env is proxied
        if not proxied:
            cm = await kube.resource(CONFIG_MAPS).create(configmap("no-env-lookups"))
            assert cm["metadata"]["name"] == "no-env-lookups"


async def test_connect_without_config_is_permanent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", os.fspath(tmp_path / "missing"))
    with pytest.raises(errors.PermanentError):
        await connect()


async def test_watch_stream_events_and_close(kube: KubeClient) -> None:
    cms = kube.resource(CONFIG_MAPS)
    start = await cms.list("default")
    rv = start["metadata"]["resourceVersion"]
    stream = await cms.watch("default", resource_version=rv, timeout_seconds=30)
    async with stream:
        await cms.create(configmap("w1"))
        ev = await asyncio.wait_for(anext(aiter(stream)), 5)
        while ev.type == "BOOKMARK":
            ev = await asyncio.wait_for(anext(aiter(stream)), 5)
        assert ev.type == "ADDED" and ev.object["metadata"]["name"] == "w1"
    assert stream.closed


async def test_watch_large_event_line(kube: KubeClient) -> None:
    """A 128-device slice is one ~60 KB line (larger than aiohttp's default 64 KiB chunk
    handling in places); it must come through whole."""
    slices = kube.resource(RESOURCE_SLICES)
    rv = (await slices.list())["metadata"]["resourceVersion"]
    big = resource_slice("node-big", devices=128)
    for d in big["spec"]["devices"]:
        d["attributes"]["instanceType"] = {"string": "x" * 60}
    await slices.create(big)
    stream = await slices.watch(resource_version=rv, timeout_seconds=30)
    async with stream:
        async for ev in stream:
            if ev.type == "ADDED":
                assert len(ev.object["spec"]["devices"]) == 128
                break


async def test_watch_expired_rv_raises_gone(
    kube: KubeClient, fake_apiserver: FakeAPIServer
) -> None:
    cms = kube.resource(CONFIG_MAPS)
    created = await cms.create(configmap("g"))
    await cms.merge_patch("g", {"data": {"k": "v"}}, "default")
    fake_apiserver.faults.compact()
    stream = await cms.watch("default", resource_version=created["metadata"]["resourceVersion"])
    async with stream:
        with pytest.raises(errors.GoneError):
            async for _ in stream:
                pass


async def test_aiohttp_errors_do_not_leak_untyped(kube: KubeClient) -> None:
    # A client-side aiohttp exception type must never escape our API untyped.
    assert errors.classify(aiohttp.ClientConnectionError()) is not None


def requests_seen(fake_apiserver: FakeAPIServer, verb: str) -> list[RequestInfo]:
    """The requests of ``verb`` the fake server gets from now until ``faults.clear()``."""
    seen: list[RequestInfo] = []

    def record(req: RequestInfo) -> bool:
        if req.verb == verb:
            seen.append(req)
        return False  # observe only

    fake_apiserver.faults.fail_next(1, 500, predicate=record)
    return seen


async def test_patch_content_types_on_the_wire(
    kube: KubeClient, fake_apiserver: FakeAPIServer
) -> None:
    """What the server actually receives: merge-patch for merge, apply-patch+yaml (with
    fieldManager) for SSA; never json-patch unless asked for."""
    seen = requests_seen(fake_apiserver, "patch")
    cms = kube.resource(CONFIG_MAPS)
    await cms.create(configmap("ct"))
    await cms.merge_patch("ct", {"data": {"a": "1"}}, "default")
    await cms.apply(configmap("ct", a="2"), field_manager="m", force=True)
    await cms.patch(
        "ct",
        [{"op": "add", "path": "/data/b", "value": "3"}],
        patch_type=PatchType.JSON,
        namespace="default",
    )
    fake_apiserver.faults.clear()
    assert [r.content_type.split(";")[0] for r in seen] == [
        "application/merge-patch+json",
        "application/apply-patch+yaml",
        "application/json-patch+json",
    ]


def test_request_bodies_are_written_as_go_writes_them() -> None:
    # Go's encoding/json: compact, map keys sorted, UTF-8, HTML characters and the two
    # JavaScript line separators escaped. The API server re-encodes an opaque config this
    # way during a server-side apply and compares the bytes with the stored ones.
    obj = {"b": [1, {"z": True, "y": None}], "a": "<é&>\u2028\u2029"}
    want = '{"a":"\\u003cé\\u0026\\u003e\\u2028\\u2029","b":[1,{"y":null,"z":true}]}'
    assert go_json(obj) == want


async def test_request_bodies_on_the_wire_are_go_json(
    kube: KubeClient, fake_apiserver: FakeAPIServer
) -> None:
    """The bytes the server receives for a create are :func:`go_json`'s, not json.dumps's."""
    seen = requests_seen(fake_apiserver, "create")
    made = configmap("wire", zeta="1", alpha="<ü>")
    await kube.resource(CONFIG_MAPS).create(made)
    fake_apiserver.faults.clear()
    assert [r.body_bytes for r in seen] == [go_json(made).encode()]
