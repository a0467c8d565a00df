"""Fault injection, in-process and over the /fake/ HTTP control API; discovery and health."""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client import ApiException
from neuron_dra.sim.fakeapi.faults import RequestInfo
from neuron_dra.sim.fakeapi.server import FakeAPIServer


def cm(name: str) -> client.V1ConfigMap:
    return client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name))


@pytest.mark.parametrize(("code", "reason"), [(500, "InternalError"),
                                              (429, "TooManyRequests"),
                                              (409, "Conflict")])
async def test_fail_next_request(kube_api_client: client.ApiClient,
                                 fake_apiserver: FakeAPIServer, code: int, reason: str) -> None:
    v1 = client.CoreV1Api(kube_api_client)
    fake_apiserver.faults.fail_next(1, code, verb="create", resource="configmaps")
    # A non-matching request is unaffected.
    await v1.list_namespaced_config_map("default")
    with pytest.raises(ApiException) as ei:
        await v1.create_namespaced_config_map("default", cm("a"))
    assert ei.value.status == code
    assert json.loads(ei.value.body)["reason"] == reason
    if code == 429:
        assert ei.value.headers["Retry-After"] == "1"
    # Only one failure was requested; the retry succeeds, and nothing was written before.
    assert fake_apiserver.get("v1", "ConfigMap", "a", "default") is None
    await v1.create_namespaced_config_map("default", cm("a"))


async def test_fail_next_write_matching_predicate_after_commit(
    kube_api_client: client.ApiClient, fake_apiserver: FakeAPIServer
) -> None:
    v1 = client.CoreV1Api(kube_api_client)

    def labels_b(req: RequestInfo) -> bool:
        body: Any = req.body
        return isinstance(body, dict) and body.get("metadata", {}).get("name") == "b"

    fake_apiserver.faults.fail_next_write(labels_b, 500, after_commit=True)
    await v1.create_namespaced_config_map("default", cm("a"))
    with pytest.raises(ApiException) as ei:
        await v1.create_namespaced_config_map("default", cm("b"))
    assert ei.value.status == 500
    # "Response lost": the write happened although the client saw an error.
    assert fake_apiserver.get("v1", "ConfigMap", "b", "default") is not None


async def test_http_control_api(fake_apiserver: FakeAPIServer,
                                kube_api_client: client.ApiClient) -> None:
    v1 = client.CoreV1Api(kube_api_client)
    async with aiohttp.ClientSession(base_url=fake_apiserver.url) as http:
        async with http.post("/fake/fail", json={"count": 2, "code": 500, "verb": "list"}) as r:
            assert r.status == 200 and (await r.json())["pending"] == 2
        for _ in range(2):
            with pytest.raises(ApiException) as ei:
                await v1.list_namespaced_config_map("default")
            assert ei.value.status == 500
        await v1.list_namespaced_config_map("default")

        async with http.post("/fake/compact") as r:
            assert (await r.json())["resourceVersion"] == fake_apiserver.store.rv
        async with http.post("/fake/drop-watches") as r:
            assert (await r.json())["dropped"] == 0
        async with http.get("/fake/state") as r:
            state = await r.json()
        assert state["objects"]["namespaces"] == 5
        assert state["requests"]["list configmaps"] == 3
        for path in ("/healthz", "/readyz", "/livez"):
            async with http.get(path) as r:
                assert await r.text() == "ok"


async def test_discovery_documents(fake_apiserver: FakeAPIServer) -> None:
    async with aiohttp.ClientSession(base_url=fake_apiserver.url) as http:
        async with http.get("/version") as r:
            assert (await r.json())["gitVersion"].startswith("v1.34.")
        async with http.get("/api") as r:
            assert (await r.json())["versions"] == ["v1"]
        async with http.get("/apis") as r:
            groups = {g["name"] for g in (await r.json())["groups"]}
        assert {"resource.k8s.io", "coordination.k8s.io", "neuron.aws.com",
                "apiextensions.k8s.io"} <= groups
        async with http.get("/apis/neuron.aws.com/v1beta1") as r:
            resources = {x["name"]: x for x in (await r.json())["resources"]}
        assert resources["neuronultraserverworkloads"]["shortNames"] == ["nusw"]
        assert resources["neuronultraserverworkloads"]["namespaced"] is True
        assert "neuronultraserverworkloads/status" in resources
        async with http.get("/apis/nope.example.com/v1") as r:
            assert r.status == 404


async def test_kubeconfig_round_trip(fake_apiserver: FakeAPIServer, tmp_path: Any) -> None:
    path = tmp_path / "kubeconfig"
    fake_apiserver.write_kubeconfig(path)
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(path), client_configuration=cfg)
    async with client.ApiClient(cfg) as api:
        names = [n.metadata.name for n in (await client.CoreV1Api(api).list_namespace()).items]
    assert "neuron-dra-driver" in names


async def test_latency_applies_to_matching_verb(kube_api_client: client.ApiClient,
                                                fake_apiserver: FakeAPIServer) -> None:
    v1 = client.CoreV1Api(kube_api_client)
    faults = fake_apiserver.faults
    faults.set_latency(0.5, verb="list")
    start = time.monotonic()
    await v1.list_namespace()
    # The server sleeps the latency before answering, so this lower bound holds however
    # slow the machine is.
    assert time.monotonic() - start >= 0.5
    # Which requests the latency hit is read from the server's record, not from how long
    # they took: the matching verb was held back, another verb was not, ...
    await v1.read_namespace("default")
    assert faults.delayed == [("list", "/api/v1/namespaces", 0.5)]
    # ... and once the latency is removed the same verb is not held back either.
    faults.set_latency(0, verb="list")
    await v1.list_namespace()
    assert faults.delayed == [("list", "/api/v1/namespaces", 0.5)]
