"""Graceful pod deletion and the delete path's finalizer rules, as kube-apiserver has them.

A pod bound to a node is only marked on DELETE (``deletionTimestamp`` = now + grace,
``deletionGracePeriodSeconds``) and stays Terminating until its kubelet deletes it again with
grace 0; an unbound or terminal pod, or one deleted with grace 0, is removed at once. The
server's clock is fixed here so the timestamps can be checked exactly.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client import ApiException
from neuron_dra.sim.fakeapi.deletion import (
    DEFAULT_TERMINATION_GRACE_SECONDS,
    DeletePlan,
    plan_delete,
    pod_grace_period,
    removed_by_update,
)
from neuron_dra.sim.fakeapi.server import FakeAPIServer

T = 10  # per-call and per-wait bound, seconds
NOW = datetime(2025, 11, 11, 12, 0, 0, tzinfo=UTC)


def at(seconds: int) -> str:
    return (NOW + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest_asyncio.fixture
async def server() -> AsyncIterator[FakeAPIServer]:
    async with FakeAPIServer(crd_paths=[], clock=lambda: NOW) as srv:
        yield srv


@pytest_asyncio.fixture
async def v1(server: FakeAPIServer) -> AsyncIterator[client.CoreV1Api]:
    async with client.ApiClient(server.client_configuration()) as api:
        yield client.CoreV1Api(api)


def pod(
    name: str,
    *,
    node: str | None = "n1",
    grace: int | None = None,
    finalizers: list[str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if finalizers:
        meta["finalizers"] = finalizers
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def running(server: FakeAPIServer, obj: dict[str, Any], phase: str = "Running") -> dict[str, Any]:
    created = server.create(obj)
    created["status"] = {"phase": phase}
    return server.update_status(created)


def stored(server: FakeAPIServer, name: str) -> dict[str, Any] | None:
    return server.get("v1", "Pod", name, "default")


async def delete(v1: client.CoreV1Api, name: str, **options: Any) -> dict[str, Any]:
    """DELETE and the server's answer as JSON (the pod, as marked or as removed)."""
    resp = await v1.delete_namespaced_pod(
        name,
        "default",
        body=client.V1DeleteOptions(**options),
        _preload_content=False,
        _request_timeout=T,
    )
    body: dict[str, Any] = await resp.json()
    if resp.status >= 400:  # unread responses are not checked by the client
        raise ApiException(status=resp.status, reason=body.get("message"))
    return body


# --- over HTTP ---------------------------------------------------------------------------------


async def test_bound_pod_is_marked_with_its_default_grace_and_stays(
    server: FakeAPIServer, v1: client.CoreV1Api
) -> None:
    before = running(server, pod("p"))
    answer = await delete(v1, "p")
    assert answer["metadata"]["deletionTimestamp"] == at(DEFAULT_TERMINATION_GRACE_SECONDS)
    assert answer["metadata"]["deletionGracePeriodSeconds"] == 30
    after = stored(server, "p")
    assert after is not None and after["metadata"]["deletionTimestamp"] == at(30)
    assert after["metadata"]["generation"] == before["metadata"]["generation"] + 1
    assert after["status"]["phase"] == "Running"  # only its kubelet changes that


async def test_grace_comes_from_the_options_else_the_pod_spec(
    server: FakeAPIServer, v1: client.CoreV1Api
) -> None:
    running(server, pod("spec5", grace=5))
    running(server, pod("opt10", grace=5))
    running(server, pod("negative"))
    assert (await delete(v1, "spec5"))["metadata"]["deletionGracePeriodSeconds"] == 5
    marked = await delete(v1, "opt10", grace_period_seconds=10)
    assert marked["metadata"]["deletionGracePeriodSeconds"] == 10
    assert marked["metadata"]["deletionTimestamp"] == at(10)
    negative = await delete(v1, "negative", grace_period_seconds=-5)
    assert negative["metadata"]["deletionGracePeriodSeconds"] == 1  # negative counts as 1


async def test_a_longer_or_unset_grace_changes_nothing_a_shorter_one_moves_the_deadline(
    server: FakeAPIServer, v1: client.CoreV1Api
) -> None:
    running(server, pod("p"))
    await delete(v1, "p")
    rv = stored(server, "p")["metadata"]["resourceVersion"]  # type: ignore[index]
    await delete(v1, "p")
    await delete(v1, "p", grace_period_seconds=30)
    await delete(v1, "p", grace_period_seconds=60)
    assert stored(server, "p")["metadata"]["resourceVersion"] == rv  # type: ignore[index]

    shorter = await delete(v1, "p", grace_period_seconds=3)
    # The deadline moves by the difference: (now + 30) - 30 + 3.
    assert shorter["metadata"]["deletionTimestamp"] == at(3)
    assert shorter["metadata"]["deletionGracePeriodSeconds"] == 3
    assert stored(server, "p") is not None


async def test_the_kubelets_final_delete_removes_it_after_one_last_modification(
    server: FakeAPIServer, v1: client.CoreV1Api
) -> None:
    created = running(server, pod("p"))
    uid = created["metadata"]["uid"]
    await delete(v1, "p")
    rv = stored(server, "p")["metadata"]["resourceVersion"]  # type: ignore[index]

    with pytest.raises(ApiException) as err:
        await delete(
            v1, "p", grace_period_seconds=0, preconditions=client.V1Preconditions(uid="another-pod")
        )
    assert err.value.status == 409
    assert stored(server, "p") is not None

    await delete(v1, "p", grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid))
    assert stored(server, "p") is None
    async with watch.Watch() as w, asyncio.timeout(T):
        stream = w.stream(v1.list_namespaced_pod, "default", resource_version=rv)
        events = [await anext(stream), await anext(stream)]
    assert [e["type"] for e in events] == ["MODIFIED", "DELETED"]
    assert all(e["raw_object"]["metadata"]["deletionGracePeriodSeconds"] == 0 for e in events)
    assert events[0]["raw_object"]["metadata"]["deletionTimestamp"] == at(0)


@pytest.mark.parametrize(
    ("name", "obj", "phase", "options"),
    [
        ("unbound", pod("unbound", node=None), "Pending", {}),
        ("succeeded", pod("succeeded"), "Succeeded", {}),
        ("failed", pod("failed"), "Failed", {}),
        ("grace-zero", pod("grace-zero"), "Running", {"grace_period_seconds": 0}),
        ("spec-zero", pod("spec-zero", grace=0), "Running", {}),
    ],
)
async def test_pods_with_nothing_to_stop_are_removed_at_once(
    server: FakeAPIServer,
    v1: client.CoreV1Api,
    name: str,
    obj: dict[str, Any],
    phase: str,
    options: dict[str, Any],
) -> None:
    running(server, obj, phase)
    answer = await delete(v1, name, **options)
    assert answer["metadata"]["deletionGracePeriodSeconds"] == 0
    assert stored(server, name) is None


async def test_grace_period_in_the_query_string(
    server: FakeAPIServer, v1: client.CoreV1Api
) -> None:
    running(server, pod("p"))
    resp = await v1.api_client.call_api(
        "/api/v1/namespaces/default/pods/p",
        "DELETE",
        query_params=[("gracePeriodSeconds", "7")],
        _preload_content=False,
        _request_timeout=T,
    )
    assert (await resp.json())["metadata"]["deletionGracePeriodSeconds"] == 7


async def test_finalizers_keep_a_pod_whose_grace_is_over_until_they_are_gone(
    server: FakeAPIServer, v1: client.CoreV1Api
) -> None:
    running(server, pod("p", finalizers=["example.com/hold"]))
    await delete(v1, "p")
    await delete(v1, "p", grace_period_seconds=0)
    held = stored(server, "p")
    assert held is not None and held["metadata"]["deletionGracePeriodSeconds"] == 0
    await v1.patch_namespaced_pod(
        "p", "default", {"metadata": {"finalizers": None}}, _request_timeout=T
    )
    assert stored(server, "p") is None


async def test_updates_during_the_grace_period_do_not_remove_the_pod(
    server: FakeAPIServer, v1: client.CoreV1Api
) -> None:
    running(server, pod("p", finalizers=["example.com/hold"]))
    await delete(v1, "p")
    # Neither a status write nor dropping the last finalizer ends a grace period: only the
    # kubelet's DELETE does.
    await v1.patch_namespaced_pod_status(
        "p", "default", {"status": {"message": "stopping"}}, _request_timeout=T
    )
    await v1.patch_namespaced_pod(
        "p", "default", {"metadata": {"finalizers": None}}, _request_timeout=T
    )
    left = stored(server, "p")
    assert left is not None and left["status"]["message"] == "stopping"
    assert not left["metadata"].get("finalizers")
    await delete(v1, "p", grace_period_seconds=0)
    assert stored(server, "p") is None


async def test_other_kinds_have_no_grace_period(
    server: FakeAPIServer, v1: client.CoreV1Api
) -> None:
    await v1.create_namespaced_config_map(
        "default", {"metadata": {"name": "cm"}}, _request_timeout=T
    )
    await v1.delete_namespaced_config_map(
        "cm", "default", grace_period_seconds=30, _request_timeout=T
    )
    assert server.get("v1", "ConfigMap", "cm", "default") is None


async def test_in_process_delete_takes_grace_and_uid(server: FakeAPIServer) -> None:
    created = running(server, pod("p"))
    marked = server.delete("v1", "Pod", "p", "default")
    assert marked["metadata"]["deletionGracePeriodSeconds"] == 30
    server.delete(
        "v1", "Pod", "p", "default", grace_period_seconds=0, uid=created["metadata"]["uid"]
    )
    assert stored(server, "p") is None


# --- the decisions, without a server -----------------------------------------------------------


def test_pod_grace_period_rules() -> None:
    bound = {"spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}
    assert pod_grace_period(bound, None) == 30
    assert (
        pod_grace_period(
            {**bound, "spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 0}}, None
        )
        == 0
    )
    assert pod_grace_period(bound, 12) == 12
    assert pod_grace_period(bound, -3) == 1
    assert pod_grace_period({"spec": {}}, 12) == 0
    assert pod_grace_period({**bound, "status": {"phase": "Failed"}}, 12) == 0


def test_plan_delete_for_other_kinds() -> None:
    fresh = {"metadata": {"generation": 3}}
    assert plan_delete(fresh, None, NOW, graceful=False, held=False) == DeletePlan(None, True)
    assert plan_delete(fresh, None, NOW, graceful=False, held=True) == DeletePlan(
        {"deletionGracePeriodSeconds": 0, "deletionTimestamp": at(0), "generation": 4}, False
    )
    marked = {"metadata": {"deletionTimestamp": at(-5), "deletionGracePeriodSeconds": 0}}
    assert plan_delete(marked, 0, NOW, graceful=False, held=True) == DeletePlan(None, False)
    assert plan_delete(marked, 0, NOW, graceful=False, held=False) == DeletePlan(None, True)


def test_removed_by_update_only_once_the_grace_is_over() -> None:
    over = {"deletionTimestamp": at(0), "deletionGracePeriodSeconds": 0}
    during = {"deletionTimestamp": at(30), "deletionGracePeriodSeconds": 30}
    assert removed_by_update(over, {})
    assert not removed_by_update(over, {"finalizers": ["x/y"]})
    assert not removed_by_update(during, {})
    assert not removed_by_update({}, {})
