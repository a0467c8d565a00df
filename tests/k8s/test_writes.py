"""Write helpers against the fake API server: conflicts, SSA, finalizers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from neuron_dra.common import constants
from neuron_dra.common.k8s import errors
from neuron_dra.common.k8s.client import CONFIG_MAPS, NEURON_ULTRASERVERS, KubeClient
from neuron_dra.common.k8s.clock import InstantClock
from neuron_dra.common.k8s.writes import (
    apply,
    ensure_finalizer,
    has_finalizer,
    merge_patch,
    remove_finalizer,
    update_with_retry,
)
from neuron_dra.sim.fakeapi.server import FakeAPIServer

from .conftest import configmap

FINALIZER = "neuron.aws.com/test"


def bump(obj: dict[str, Any]) -> dict[str, Any]:
    obj["data"]["n"] = str(int(obj["data"]["n"]) + 1)
    return obj


async def test_update_with_retry_recovers_from_injected_conflict(
    kube: KubeClient, fake_apiserver: FakeAPIServer
) -> None:
    cms = kube.resource(CONFIG_MAPS)
    await cms.create(configmap("c", n="0"))
    calls = 0

    def mutate(obj: dict[str, Any]) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        return bump(obj)

    fake_apiserver.faults.fail_next(1, 409, verb="update", resource="configmaps")
    clock = InstantClock()
    result = await update_with_retry(cms, "c", "default", mutate, clock=clock)
    assert result["data"]["n"] == "1"
    assert calls == 2, "mutate is re-applied to a fresh read after the conflict"
    assert len(clock.sleeps) == 1
    assert (await cms.get("c", "default"))["data"]["n"] == "1"


async def test_concurrent_updates_all_land(kube: KubeClient) -> None:
    """Real races, not injected ones: every increment must survive."""
    cms = kube.resource(CONFIG_MAPS)
    await cms.create(configmap("race", n="0"))
    clock = InstantClock()
    await asyncio.gather(
        *(
            update_with_retry(cms, "race", "default", bump, attempts=20, clock=clock)
            for _ in range(6)
        )
    )
    assert (await cms.get("race", "default"))["data"]["n"] == "6"


async def test_no_change_means_no_write(kube: KubeClient, fake_apiserver: FakeAPIServer) -> None:
    cms = kube.resource(CONFIG_MAPS)
    created = await cms.create(configmap("same", n="0"))
    before = fake_apiserver.request_counts[("update", "configmaps")]
    result = await update_with_retry(cms, "same", "default", lambda o: None)
    assert result == created
    assert fake_apiserver.request_counts[("update", "configmaps")] == before


async def test_conflicts_exhaust_attempts(kube: KubeClient, fake_apiserver: FakeAPIServer) -> None:
    cms = kube.resource(CONFIG_MAPS)
    await cms.create(configmap("busy", n="0"))
    fake_apiserver.faults.fail_next(3, 409, verb="update", resource="configmaps")
    clock = InstantClock()
    with pytest.raises(errors.ConflictError):
        await update_with_retry(cms, "busy", "default", bump, attempts=3, clock=clock)
    assert clock.sleeps == sorted(clock.sleeps) and len(clock.sleeps) == 2, "growing pauses"
    assert (await cms.get("busy", "default"))["data"]["n"] == "0"


async def test_a_fresh_cached_object_saves_the_get(
    kube: KubeClient, fake_apiserver: FakeAPIServer
) -> None:
    cms = kube.resource(CONFIG_MAPS)
    cached = await cms.create(configmap("cached", n="0"))
    gets = fake_apiserver.request_counts[("get", "configmaps")]
    result = await update_with_retry(cms, "cached", "default", bump, current=cached)
    assert result["data"]["n"] == "1"
    assert fake_apiserver.request_counts[("get", "configmaps")] == gets, "no GET"


async def test_a_stale_cached_object_costs_a_conflict_then_a_read(
    kube: KubeClient, fake_apiserver: FakeAPIServer
) -> None:
    cms = kube.resource(CONFIG_MAPS)
    stale = await cms.create(configmap("stale", n="0"))
    await update_with_retry(cms, "stale", "default", bump)  # n=1 behind the cache's back
    clock = InstantClock()
    result = await update_with_retry(cms, "stale", "default", bump, current=stale, clock=clock)
    assert result["data"]["n"] == "2", "applied to the fresh read, not the stale copy"
    assert clock.sleeps == [], "a lagging cache is no race: no pause"


async def test_no_change_is_judged_from_a_fresh_read(kube: KubeClient) -> None:
    """A cache that says "already done" is not trusted: the server is asked."""
    cms = kube.resource(CONFIG_MAPS)
    stale = await cms.create(configmap("judge", n="0"))
    await update_with_retry(cms, "judge", "default", bump)  # n=1 on the server

    def to_zero(obj: dict[str, Any]) -> dict[str, Any] | None:
        if obj["data"]["n"] == "0":
            return None
        obj["data"]["n"] = "0"
        return obj

    result = await update_with_retry(cms, "judge", "default", to_zero, current=stale)
    assert result["data"]["n"] == "0"
    assert (await cms.get("judge", "default"))["data"]["n"] == "0"


async def test_not_found_propagates(kube: KubeClient) -> None:
    with pytest.raises(errors.NotFoundError):
        await update_with_retry(kube.resource(CONFIG_MAPS), "nope", "default", bump)


async def test_status_update_uses_subresource(kube: KubeClient) -> None:
    nus = kube.resource(NEURON_ULTRASERVERS)
    ns = constants.DRIVER_NAMESPACE
    await nus.create(
        {
            "apiVersion": constants.CRD_API_VERSION,
            "kind": constants.KIND_ULTRASERVER,
            "metadata": {"name": "us-s", "namespace": ns},
            "spec": {"instanceType": "trn2u.48xlarge"},
        }
    )

    def set_state(obj: dict[str, Any]) -> dict[str, Any]:
        obj["status"] = {"state": "Available"}
        obj["spec"]["instanceType"] = "ignored-by-status-write"
        return obj

    out = await update_with_retry(nus, "us-s", ns, set_state, status=True)
    assert out["status"]["state"] == "Available"
    assert out["spec"]["instanceType"] == "trn2u.48xlarge"


async def test_merge_patch_guarded_by_rv(kube: KubeClient) -> None:
    cms = kube.resource(CONFIG_MAPS)
    created = await cms.create(configmap("mp", n="0"))
    rv = created["metadata"]["resourceVersion"]
    ok = await merge_patch(cms, "mp", {"data": {"n": "1"}}, "default", resource_version=rv)
    assert ok["data"]["n"] == "1"
    with pytest.raises(errors.ConflictError):
        await merge_patch(cms, "mp", {"data": {"n": "2"}}, "default", resource_version=rv)


async def test_apply_create_update_and_ownership_conflict(
    kube: KubeClient, fake_apiserver: FakeAPIServer
) -> None:
    cms = kube.resource(CONFIG_MAPS)
    first = await apply(cms, configmap("ssa", a="1"), field_manager="controller")
    assert first["data"] == {"a": "1"}
    again = await apply(cms, configmap("ssa", a="2"), field_manager="controller")
    assert again["data"] == {"a": "2"}

    patches = fake_apiserver.request_counts[("patch", "configmaps")]
    with pytest.raises(errors.FieldManagerConflictError) as ei:
        await apply(cms, configmap("ssa", a="3"), field_manager="intruder", clock=InstantClock())
    assert not ei.value.retryable
    assert fake_apiserver.request_counts[("patch", "configmaps")] == patches + 1, "no retries"

    forced = await apply(cms, configmap("ssa", a="3"), field_manager="intruder", force=True)
    assert forced["data"] == {"a": "3"}


async def test_apply_retries_plain_conflict(
    kube: KubeClient, fake_apiserver: FakeAPIServer
) -> None:
    cms = kube.resource(CONFIG_MAPS)
    fake_apiserver.faults.fail_next(2, 409, verb="patch", resource="configmaps")
    clock = InstantClock()
    out = await apply(cms, configmap("ssa2", a="1"), field_manager="m", clock=clock)
    assert out["data"] == {"a": "1"} and len(clock.sleeps) == 2


async def test_finalizers(kube: KubeClient, fake_apiserver: FakeAPIServer) -> None:
    cms = kube.resource(CONFIG_MAPS)
    other = "someone.else/keep"
    created = await cms.create(configmap("fin"))
    created["metadata"]["finalizers"] = [other]
    await cms.replace(created)

    obj = await ensure_finalizer(cms, "fin", "default", FINALIZER)
    assert obj["metadata"]["finalizers"] == [other, FINALIZER]
    writes = fake_apiserver.request_counts[("update", "configmaps")]
    await ensure_finalizer(cms, "fin", "default", FINALIZER)
    assert fake_apiserver.request_counts[("update", "configmaps")] == writes, "idempotent"

    deleting = await cms.delete("fin", "default")
    assert deleting is not None and deleting["metadata"].get("deletionTimestamp")
    assert has_finalizer(deleting, FINALIZER)

    obj2 = await remove_finalizer(cms, "fin", "default", FINALIZER)
    assert obj2 is not None and obj2["metadata"]["finalizers"] == [other]
    assert await remove_finalizer(cms, "fin", "default", FINALIZER) is not None  # no-op

    # Dropping the last finalizer lets the deletion finish.
    await remove_finalizer(cms, "fin", "default", other)
    with pytest.raises(errors.NotFoundError):
        await cms.get("fin", "default")
    assert await remove_finalizer(cms, "fin", "default", FINALIZER) is None


async def test_ensure_finalizer_skips_deleting_object(kube: KubeClient) -> None:
    cms = kube.resource(CONFIG_MAPS)
    created = await cms.create(configmap("del"))
    created["metadata"]["finalizers"] = ["x/y"]
    await cms.replace(created)
    await cms.delete("del", "default")
    obj = await ensure_finalizer(cms, "del", "default", FINALIZER)
    assert not has_finalizer(obj, FINALIZER)
