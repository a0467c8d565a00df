"""SlicePublisher and NodeLabeller against the fake API server over real HTTP.

The publisher runs its real reflectors and worker; tests wait on its progress
(``wait_until``, re-checked after every sync attempt) with a safety timeout, never on sleeps.
Backoff delays go through an injected clock whose sleeps return at once but are recorded.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from neuron_dra.common.constants import (
    ATTR_CAPACITY_BLOCK_ID,
    ATTR_HEALTHY,
    ATTR_NETWORK_NODE_LAYER1,
    ATTR_ULTRASERVER_ID,
    ATTR_WORKLOAD_ID,
    LABEL_CAPACITY_BLOCK_ID,
    LABEL_INSTANCE_TYPE,
    LABEL_NETWORK_NODE_LAYER1,
    LABEL_ULTRASERVER_MODE,
    LABEL_ULTRASERVER_NODE_ID_2,
    LABEL_ULTRASERVER_NODE_ID_4,
    LABEL_ULTRASERVER_SERVER_ID_2,
    LABEL_ULTRASERVER_SERVER_ID_4,
    NODE_DEVICE_NAME,
    TAINT_KEY_UNHEALTHY_COMPONENT,
)
from neuron_dra.common.k8s.client import KubeClient
from neuron_dra.common.k8s.clock import InstantClock
from neuron_dra.common.k8s.workqueue import ExponentialBackoff
from neuron_dra.common.profiles import PROFILES, UltraServerMode
from neuron_dra.nodeplugin.discovery.model import (
    FailureClass,
    HealthFault,
    NeuronDevice,
    NodeInventory,
    UltraServerInfo,
)
from neuron_dra.nodeplugin.publish.labelplan import node_label_patch
from neuron_dra.nodeplugin.publish.metrics import PublisherMetrics
from neuron_dra.nodeplugin.publish.nodelabels import NodeLabeller
from neuron_dra.nodeplugin.publish.publisher import SlicePublisher
from neuron_dra.nodeplugin.publish.sliceplan import plan_slices
from neuron_dra.nodeplugin.publish.slices import build_resource_slices, slice_name
from neuron_dra.sim.fakeapi.faults import RequestInfo
from neuron_dra.sim.fakeapi.server import FakeAPIServer
from prometheus_client import CollectorRegistry

NODE = "ip-10-0-0-1.us-west-2.compute.internal"
OTHER_NODE = "ip-10-0-0-2.us-west-2.compute.internal"
VERSION = "0.1.0"
WAIT = 10.0  # safety net only: every wait is on the publisher's own progress
RS = ("resource.k8s.io/v1", "ResourceSlice")
WRITE_VERBS = ("create", "update", "delete")

US = UltraServerInfo(
    modes=(UltraServerMode.X4, UltraServerMode.X2V, UltraServerMode.X1),
    server_id_2="a1b2c3d4e5f60718",
    server_id_4="a1b2c3d4e5f60719",
    node_id_2=1,
    node_id_4=3,
)


def inventory(
    instance_type: str = "trn2.48xlarge",
    *,
    count: int | None = None,
    unhealthy: tuple[int, ...] = (),
    ultraserver: UltraServerInfo | None = None,
) -> NodeInventory:
    profile = PROFILES.get(instance_type)
    n = count if count is not None else profile.device_count if profile else 1
    return NodeInventory(
        node_name=NODE,
        instance_type=instance_type,
        driver_version="2.24.7.0",
        devices=tuple(
            NeuronDevice(
                index=i,
                dev_path=f"/dev/neuron{i}",
                core_count=profile.cores_per_device if profile else 8,
                device_name=profile.device_name if profile else "Trainium3",
                healthy=i not in unhealthy,
            )
            for i in range(n)
        ),
        ultraserver=ultraserver,
    )


def node_object(name: str = NODE, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
    }


def foreign_slice(name: str, node: str, driver: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 3, "resourceSliceCount": 1},
            "devices": [{"name": "dev0", "attributes": {"model": {"string": "x"}}}],
        },
    }


class Env:
    """The fake API server with our Node, plus mutable inputs for the publisher."""

    def __init__(self, server: FakeAPIServer, kube: KubeClient) -> None:
        self.server = server
        self.kube = kube
        self.inventory: NodeInventory | None = inventory()
        self.workload_ids: dict[int | str, str] = {}
        self.registry = CollectorRegistry()
        self.metrics = PublisherMetrics(self.registry)
        self.clock = InstantClock()
        self.node = server.create(
            node_object(
                **{
                    LABEL_INSTANCE_TYPE: "trn2.48xlarge",
                    LABEL_NETWORK_NODE_LAYER1: "nn-111",
                    "team": "ml",
                }
            )
        )
        self.publishers: list[SlicePublisher] = []

    def publisher(self, **kw: Any) -> SlicePublisher:
        kw.setdefault("node_name", NODE)
        kw.setdefault("dra_driver_version", VERSION)
        kw.setdefault("inventory", lambda: self.inventory)
        kw.setdefault("workload_ids", lambda: self.workload_ids)
        kw.setdefault("clock", self.clock)
        kw.setdefault("rate_limiter", ExponentialBackoff(0.001, 0.01))
        kw.setdefault("metrics", self.metrics)
        kw.setdefault("taint_effect", "NoSchedule")  # the plugin's default
        pub = SlicePublisher(self.kube, **kw)
        self.publishers.append(pub)
        return pub

    async def started(self) -> SlicePublisher:
        pub = self.publisher()
        pub.start()
        async with asyncio.timeout(WAIT):
            await pub.published.wait()
        return pub

    def slices(self, node: str = NODE) -> list[dict[str, Any]]:
        items = self.server.list(*RS, field_selector=f"spec.nodeName={node}")
        return sorted(items, key=lambda s: s["metadata"]["name"])

    def writes(self) -> dict[str, int]:
        return {v: self.server.request_counts[(v, "resourceslices")] for v in WRITE_VERBS}

    def metric(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)


@pytest_asyncio.fixture
async def env(
    fake_apiserver: FakeAPIServer, kube_api_client: client.ApiClient
) -> AsyncIterator[Env]:
    e = Env(fake_apiserver, KubeClient(kube_api_client))
    try:
        yield e
    finally:
        for pub in e.publishers:
            await pub.stop()


async def wait(pub: SlicePublisher, predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT):
        await pub.wait_until(predicate)


async def sync_again(pub: SlicePublisher) -> None:
    """Request a sync and wait until one more attempt has finished."""
    before = pub.sync_attempts
    pub.request_sync()
    await wait(pub, lambda: pub.sync_attempts > before)


def devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"]["devices"]}


# --- publishing ---------------------------------------------------------------------------------


async def test_publishes_one_valid_slice_owned_by_the_node(env: Env) -> None:
    pub = await env.started()

    # The create went through the server's ResourceSlice validation (it answers 422 otherwise).
    [rs] = env.slices()
    assert rs["metadata"]["name"] == slice_name(NODE, 0)
    assert rs["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "name": NODE,
            "uid": env.node["metadata"]["uid"],
            "controller": True,
        }
    ]
    assert rs["spec"]["pool"] == {"name": NODE, "generation": 0, "resourceSliceCount": 1}
    devs = devices([rs])
    # trn2.48xlarge is not UltraServer-capable: 16 devices and no neuronnode.
    assert sorted(devs) == sorted(f"neurondevice{i}" for i in range(16))
    assert devs["neurondevice0"]["attributes"][ATTR_NETWORK_NODE_LAYER1] == {"string": "nn-111"}

    assert pub.is_published()
    assert pub.first_publish_seconds is not None
    assert env.writes() == {"create": 1, "update": 0, "delete": 0}
    assert env.metric("neuron_dra_resourceslice_writes_total", verb="create") == 1
    assert env.metric("neuron_dra_published_devices") == 16
    assert env.metric("neuron_dra_resourceslice_first_publish_seconds") is not None


async def test_ultraserver_node_publishes_neuronnode_with_capacity_block(env: Env) -> None:
    env.server.patch(
        "v1", "Node", NODE, {"metadata": {"labels": {LABEL_CAPACITY_BLOCK_ID: "cr-0abc"}}}
    )
    env.inventory = inventory("trn2u.48xlarge")
    await env.started()

    devs = devices(env.slices())
    assert len(devs) == 17 and NODE_DEVICE_NAME in devs
    attrs = devs["neurondevice5"]["attributes"]
    assert attrs[ATTR_CAPACITY_BLOCK_ID] == {"string": "cr-0abc"}
    # No election result in the inventory: the capacity block stands in for the server id.
    assert attrs[ATTR_ULTRASERVER_ID] == {"string": "cr-0abc"}


async def test_content_change_is_one_update_with_the_next_generation(env: Env) -> None:
    pub = await env.started()
    env.inventory = inventory(unhealthy=(3,))

    # A sync triggered by the watch (our own create's event) may be the one that sees the new
    # inventory, so wait for the update itself rather than for "the next" attempt.
    pub.request_sync()
    await wait(pub, lambda: env.writes()["update"] >= 1)
    await sync_again(pub)  # and nothing more is written once it is published

    assert env.writes() == {"create": 1, "update": 1, "delete": 0}
    [rs] = env.slices()
    assert rs["spec"]["pool"]["generation"] == 1
    assert devices([rs])["neurondevice3"]["attributes"][ATTR_HEALTHY] == {"bool": False}
    assert devices([rs])["neurondevice2"]["attributes"][ATTR_HEALTHY] == {"bool": True}
    assert pub.last_result is not None and pub.last_result.writes == 0


async def test_no_change_means_no_write(env: Env) -> None:
    pub = await env.started()
    before = env.writes()

    await sync_again(pub)
    await sync_again(pub)

    assert env.writes() == before
    assert pub.last_result is not None and pub.last_result.writes == 0
    assert pub.sync_failures == 0


async def test_restarted_publisher_keeps_unchanged_slices(env: Env) -> None:
    first = await env.started()
    await first.stop()
    rv = env.slices()[0]["metadata"]["resourceVersion"]

    await env.started()

    assert env.writes() == {"create": 1, "update": 0, "delete": 0}
    [rs] = env.slices()
    assert rs["metadata"]["resourceVersion"] == rv
    assert rs["spec"]["pool"]["generation"] == 0


async def test_kubelet_deleting_the_slices_gets_them_republished(env: Env) -> None:
    pub = await env.started()

    # What the kubelet does at its start: delete every slice of the node.
    for rs in env.slices():
        env.server.delete(*RS, rs["metadata"]["name"])

    await wait(pub, lambda: pub.writes["create"] >= 2)
    [rs] = env.slices()
    # Above anything published before, so a consumer still holding the old slice prefers ours.
    assert rs["spec"]["pool"]["generation"] == 1
    assert len(rs["spec"]["devices"]) == 16


async def test_slice_edited_by_someone_else_is_restored(env: Env) -> None:
    pub = await env.started()
    [rs] = env.slices()
    rs["spec"]["devices"] = rs["spec"]["devices"][:4]
    env.server.update(rs)

    await wait(pub, lambda: pub.writes["update"] >= 1)
    [rs] = env.slices()
    assert len(rs["spec"]["devices"]) == 16
    assert rs["spec"]["pool"]["generation"] == 1


async def test_node_label_change_republishes(env: Env) -> None:
    pub = await env.started()
    env.server.patch(
        "v1", "Node", NODE, {"metadata": {"labels": {LABEL_NETWORK_NODE_LAYER1: "nn-2"}}}
    )

    await wait(pub, lambda: pub.writes["update"] >= 1)
    attrs = devices(env.slices())["neurondevice0"]["attributes"]
    assert attrs[ATTR_NETWORK_NODE_LAYER1] == {"string": "nn-2"}


async def test_other_nodes_and_drivers_slices_are_untouched(env: Env) -> None:
    env.server.create(node_object(OTHER_NODE))
    theirs = [
        env.server.create(foreign_slice("other-node-neuron", OTHER_NODE, "neuron.aws.com")),
        env.server.create(foreign_slice("our-node-efa", NODE, "efa.amazonaws.com")),
    ]
    pub = await env.started()
    env.inventory = inventory(count=8)
    await sync_again(pub)
    for rs in [s for s in env.slices() if s["spec"]["driver"] == "neuron.aws.com"]:
        env.server.delete(*RS, rs["metadata"]["name"])
    await wait(pub, lambda: pub.writes["create"] >= 2)

    for before in theirs:
        after = env.server.get(*RS, before["metadata"]["name"])
        assert after is not None
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert set(pub.published_devices()) == {f"neurondevice{i}" for i in range(8)}


async def test_conflict_on_update_is_retried(env: Env) -> None:
    pub = await env.started()
    env.server.faults.fail_next(1, 409, verb="update", resource="resourceslices")
    env.inventory = inventory(unhealthy=(0,))

    await sync_again(pub)

    assert env.server.faults.pending_rules == 0
    assert env.server.request_counts[("update", "resourceslices")] == 2
    # The conflict was handled inside the sync (re-read, re-planned), not as a failed sync.
    assert pub.sync_failures == 0
    [rs] = env.slices()
    assert rs["spec"]["pool"]["generation"] == 1
    assert devices([rs])["neurondevice0"]["attributes"][ATTR_HEALTHY] == {"bool": False}


async def test_server_error_on_create_is_retried_with_backoff(env: Env) -> None:
    env.server.faults.fail_next(1, 500, verb="create", resource="resourceslices")

    pub = await env.started()

    assert pub.sync_failures == 1
    assert env.clock.sleeps == [0.001]  # the worker's backoff, through the injected clock
    assert env.writes()["create"] == 2  # the failed one and the retry
    assert env.metric("neuron_dra_resourceslice_sync_errors_total", error="ServerError") == 1
    assert len(env.slices()) == 1


async def test_shrinking_below_128_devices_deletes_the_extra_slice(env: Env) -> None:
    env.inventory = inventory("trn9.huge", count=200)
    pub = await env.started()
    first = env.slices()
    assert [len(s["spec"]["devices"]) for s in first] == [128, 72]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in first} == {2}

    # Record the order of writes without failing any (the predicate never matches).
    order: list[tuple[str, str | None]] = []

    def record(req: RequestInfo) -> bool:
        if req.is_write and req.resource == "resourceslices":
            order.append((req.verb, req.name))
        return False

    env.server.faults.fail_next(1, 500, predicate=record)
    env.inventory = inventory("trn9.huge", count=100)
    await sync_again(pub)
    env.server.faults.clear()

    [rs] = env.slices()
    assert rs["metadata"]["name"] == slice_name(NODE, 0)
    assert rs["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert len(rs["spec"]["devices"]) == 100
    # The surviving slice announces the new count before the extra one goes away.
    assert order == [("update", slice_name(NODE, 0)), ("delete", slice_name(NODE, 1))]
    assert set(pub.published_devices()) == {f"neurondevice{i}" for i in range(100)}


async def test_workload_ids_are_published_and_visible_to_prepare(env: Env) -> None:
    env.inventory = inventory("trn2u.48xlarge", ultraserver=US)
    pub = env.publisher()
    assert pub.published_devices() == {}
    pub.start()
    async with asyncio.timeout(WAIT):
        await pub.published.wait()
    assert ATTR_WORKLOAD_ID not in pub.published_devices()["neurondevice0"]

    env.workload_ids = {"node": "ns1-train-abc123"}
    await sync_again(pub)

    published = pub.published_devices()
    assert len(published) == 17
    assert all(a[ATTR_WORKLOAD_ID] == {"string": "ns1-train-abc123"} for a in published.values())
    on_server = devices(env.slices())
    assert on_server["neuronnode"]["attributes"][ATTR_WORKLOAD_ID] == {"string": "ns1-train-abc123"}
    assert env.slices()[0]["spec"]["pool"]["generation"] == 1

    env.workload_ids = {}
    await sync_again(pub)
    assert all(ATTR_WORKLOAD_ID not in a for a in pub.published_devices().values())


async def test_missing_inventory_is_retried_until_discovery_reports(env: Env) -> None:
    env.inventory = None
    pub = env.publisher()
    pub.start()
    await wait(pub, lambda: pub.sync_failures >= 1)
    assert not pub.is_published()
    ok, message = pub.readiness_check()
    assert not ok and "device discovery has not completed" in message
    assert env.writes()["create"] == 0

    env.inventory = inventory()
    pub.request_sync()
    async with asyncio.timeout(WAIT):
        await pub.published.wait()
    assert len(env.slices()) == 1
    assert pub.readiness_check() == (True, "ok")


# --- pure planning --------------------------------------------------------------------------------


UID = "0b7c6a51-4f7e-4f0e-9d52-3c1f0d2e8a11"


def built(inv: NodeInventory, generation: int = 0, uid: str = UID) -> list[dict[str, Any]]:
    return build_resource_slices(
        inv,
        node_name=NODE,
        node_uid=uid,
        node_labels={},
        dra_driver_version=VERSION,
        generation=generation,
    )


def as_stored(slices: list[dict[str, Any]], rv: str = "7") -> list[dict[str, Any]]:
    out = copy.deepcopy(slices)
    for s in out:
        s["metadata"]["resourceVersion"] = rv
    return out


def test_plan_nothing_to_do_keeps_generation() -> None:
    existing = as_stored(built(inventory(), generation=4))
    plan = plan_slices(existing, built(inventory()))
    assert plan.writes == 0 and plan.generation == 4


def test_plan_change_updates_every_slice_at_the_next_generation() -> None:
    existing = as_stored(built(inventory("trn9.huge", count=200), generation=2))
    plan = plan_slices(existing, built(inventory("trn9.huge", count=200, unhealthy=(5,))))
    assert plan.generation == 3
    # Only slice 0 changed content, but the whole pool moves to the new generation.
    assert [s["metadata"]["name"] for s in plan.update] == [slice_name(NODE, i) for i in (0, 1)]
    assert {s["spec"]["pool"]["generation"] for s in plan.update} == {3}
    assert {s["metadata"]["resourceVersion"] for s in plan.update} == {"7"}
    assert plan.create == () and plan.delete == ()


def test_plan_recreate_after_deletion_goes_above_the_previous_generation() -> None:
    plan = plan_slices([], built(inventory()), previous_generation=6)
    assert plan.generation == 7 and len(plan.create) == 1
    # Without history (a fresh process), a first publish starts at 0.
    assert plan_slices([], built(inventory())).generation == 0


def test_plan_shrink_deletes_extra_and_keeps_others_metadata() -> None:
    existing = as_stored(built(inventory("trn9.huge", count=200)))
    existing[0]["metadata"]["labels"] = {"someone": "else"}
    plan = plan_slices(existing, built(inventory("trn9.huge", count=100)))
    assert plan.delete == ((slice_name(NODE, 1), "7"),)
    [upd] = plan.update
    assert upd["metadata"]["labels"] == {"someone": "else"}
    assert upd["spec"]["pool"]["resourceSliceCount"] == 1


def test_plan_new_owner_uid_is_an_update_without_generation_bump() -> None:
    existing = as_stored(built(inventory(), generation=2))
    plan = plan_slices(existing, built(inventory(), uid="11111111-2222-3333-4444-555555555555"))
    assert plan.generation == 2
    [upd] = plan.update
    assert upd["metadata"]["ownerReferences"][0]["uid"].startswith("11111111")


def test_node_label_patch_touches_only_owned_labels() -> None:
    current = {
        LABEL_ULTRASERVER_MODE: "1_2_4",
        LABEL_ULTRASERVER_NODE_ID_2: "0",
        LABEL_ULTRASERVER_SERVER_ID_4: "old",
        "team": "ml",
    }
    desired = {LABEL_ULTRASERVER_MODE: "1_2_4", LABEL_ULTRASERVER_SERVER_ID_4: "new", "team": "x"}
    assert node_label_patch(current, desired) == {
        LABEL_ULTRASERVER_SERVER_ID_4: "new",
        LABEL_ULTRASERVER_NODE_ID_2: None,
    }
    assert node_label_patch(desired, desired) == {}
    assert node_label_patch({"team": "ml"}, {}) == {}


# --- node labeller ------------------------------------------------------------------------------


def node_labels(env: Env) -> Mapping[str, str]:
    node = env.server.get("v1", "Node", NODE)
    assert node is not None
    labels: Mapping[str, str] = node["metadata"].get("labels") or {}
    return labels


async def test_node_labeller_adds_updates_and_removes_its_labels(env: Env) -> None:
    env.server.patch(
        "v1", "Node", NODE, {"metadata": {"labels": {LABEL_ULTRASERVER_NODE_ID_2: "9"}}}
    )
    env.inventory = inventory("trn2u.48xlarge", ultraserver=US)
    labeller = NodeLabeller(env.kube, node_name=NODE, inventory=lambda: env.inventory)

    await labeller.sync()
    labels = node_labels(env)
    assert labels[LABEL_ULTRASERVER_MODE] == "1_2_4"
    assert labels[LABEL_ULTRASERVER_SERVER_ID_2] == "a1b2c3d4e5f60718"
    assert labels[LABEL_ULTRASERVER_SERVER_ID_4] == "a1b2c3d4e5f60719"
    assert labels[LABEL_ULTRASERVER_NODE_ID_2] == "1"  # the stale value was replaced
    assert labels[LABEL_ULTRASERVER_NODE_ID_4] == "3"
    assert labels["team"] == "ml" and labels[LABEL_NETWORK_NODE_LAYER1] == "nn-111"

    patches = env.server.request_counts[("patch", "nodes")]
    assert await labeller.sync() == {}
    assert env.server.request_counts[("patch", "nodes")] == patches

    # The election is redone: the 4-node ids are gone.
    env.inventory = inventory(
        "trn2u.48xlarge", ultraserver=replace(US, server_id_4=None, node_id_4=None)
    )
    await labeller.sync()
    labels = node_labels(env)
    assert LABEL_ULTRASERVER_SERVER_ID_4 not in labels
    assert LABEL_ULTRASERVER_NODE_ID_4 not in labels
    assert labels[LABEL_ULTRASERVER_NODE_ID_2] == "1"

    # Not an UltraServer node (any more): every label of ours goes, nobody else's.
    env.inventory = inventory("trn2.48xlarge")
    await labeller.sync()
    labels = node_labels(env)
    assert not any(k.startswith("neuron.amazonaws.com/ultraserver-") for k in labels)
    assert labels["team"] == "ml"


async def test_node_labeller_keeps_labels_before_discovery(env: Env) -> None:
    env.server.patch("v1", "Node", NODE, {"metadata": {"labels": {LABEL_ULTRASERVER_MODE: "1"}}})
    env.inventory = None
    labeller = NodeLabeller(env.kube, node_name=NODE, inventory=lambda: env.inventory)
    assert await labeller.sync() == {}
    assert node_labels(env)[LABEL_ULTRASERVER_MODE] == "1"


async def test_node_labeller_restores_a_removed_label_via_the_node_watch(env: Env) -> None:
    env.inventory = inventory("trn2u.48xlarge", ultraserver=US)
    pub = env.publisher()
    labeller = NodeLabeller(
        env.kube,
        node_name=NODE,
        inventory=lambda: env.inventory,
        clock=env.clock,
        metrics=env.metrics,
    )
    labeller.watch_node(pub.node_reflector)
    pub.start()
    labeller.start()
    try:
        async with asyncio.timeout(WAIT):
            await labeller.wait_until(lambda: labeller.patches >= 1)
        env.server.patch(
            "v1", "Node", NODE, {"metadata": {"labels": {LABEL_ULTRASERVER_SERVER_ID_2: None}}}
        )
        async with asyncio.timeout(WAIT):
            await labeller.wait_until(lambda: labeller.patches >= 2)
    finally:
        await labeller.stop()
    assert node_labels(env)[LABEL_ULTRASERVER_SERVER_ID_2] == "a1b2c3d4e5f60718"
    assert env.metric("neuron_dra_node_label_patches_total") == 2


async def test_publisher_rejects_a_driver_name_slices_cannot_build(env: Env) -> None:
    with pytest.raises(ValueError, match="driver_name"):
        env.publisher(driver_name="other.example.com")


# --- device taints --------------------------------------------------------------------------


def failing(index: int) -> NodeInventory:
    """The default inventory with device ``index`` reporting a failed HBM."""
    inv = inventory()
    sick = replace(
        inv.devices[index],
        healthy=False,
        faults=(HealthFault(FailureClass.COMPONENT, "hbm", "unhealthy component: hbm"),),
    )
    return replace(inv, devices=tuple(sick if d.index == index else d for d in inv.devices))


async def test_a_failing_device_is_tainted_and_untainted_when_it_recovers(env: Env) -> None:
    env.server.core.device_taints = True  # DRADeviceTaints on (1.36+)
    pub = await env.started()
    env.inventory = failing(3)
    pub.request_sync()
    await wait(pub, lambda: env.writes()["update"] >= 1)
    await sync_again(pub)
    (taint,) = devices(env.slices())["neurondevice3"]["taints"]
    assert taint["key"] == TAINT_KEY_UNHEALTHY_COMPONENT and taint["value"] == "hbm"
    assert taint["effect"] == "NoSchedule" and taint["timeAdded"]
    assert env.writes() == {"create": 1, "update": 1, "delete": 0}

    env.inventory = inventory()
    pub.request_sync()
    await wait(pub, lambda: env.writes()["update"] >= 2)
    await sync_again(pub)
    assert "taints" not in devices(env.slices())["neurondevice3"]
    assert env.writes() == {"create": 1, "update": 2, "delete": 0}


async def test_core_sharing_is_published_where_the_server_keeps_it(env: Env) -> None:
    env.server.core.consumable_capacity = True  # DRAConsumableCapacity on (1.36+)
    pub = env.publisher(core_sharing=True)
    pub.start()
    await wait(pub, pub.is_published)
    await sync_again(pub)
    dev = devices(env.slices())["neurondevice0"]
    assert dev["allowMultipleAllocations"] is True
    assert dev["capacity"]["logicalCores"]["requestPolicy"]["default"] == "4"
    assert pub.core_sharing and env.writes() == {"create": 1, "update": 0, "delete": 0}


async def test_a_server_that_drops_core_sharing_gets_exclusive_devices_without_a_loop(
    env: Env,
) -> None:
    """1.34 and 1.35 by default (DRAConsumableCapacity off): the API server drops
    allowMultipleAllocations and the request policies. The publisher notices on the write's
    response and from then on sends the slice as the server keeps it."""
    assert not env.server.core.consumable_capacity
    pub = env.publisher(core_sharing=True)
    pub.start()
    await wait(pub, pub.is_published)
    await sync_again(pub)
    await sync_again(pub)
    dev = devices(env.slices())["neurondevice0"]
    assert "allowMultipleAllocations" not in dev
    assert dev["capacity"]["logicalCores"] == {"value": "4"}
    assert not pub.core_sharing
    assert env.writes() == {"create": 1, "update": 0, "delete": 0}


async def test_a_server_that_drops_taints_gets_the_healthy_attribute_without_a_loop(
    env: Env,
) -> None:
    """1.34 and 1.35 by default (DRADeviceTaints off): the API server drops the taints. The
    publisher notices on the write's response and stops sending them, instead of finding its
    slice different from what it wants on every watch event and republishing forever."""
    assert not env.server.core.device_taints
    env.inventory = failing(5)
    pub = await env.started()
    await sync_again(pub)
    await sync_again(pub)
    dev = devices(env.slices())["neurondevice5"]
    assert "taints" not in dev and dev["attributes"][ATTR_HEALTHY] == {"bool": False}
    assert pub.taint_effect is None
    assert env.writes() == {"create": 1, "update": 0, "delete": 0}
