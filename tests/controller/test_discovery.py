"""UltraServer discovery: grouping slices (pure) and converging NeuronUltraServer objects.

The API tests run the real raw-dict client against the fake API server (CRDs from the chart,
so schema and CEL rules apply). Caches are filled by listing from that server, which is what a
reflector's initial list does, so each test controls exactly when the cache catches up.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes_asyncio import client
from neuron_dra.common.constants import DRIVER_NAMESPACE, LABEL_CAPACITY_BLOCK_ID
from neuron_dra.common.events import EventRecorder
from neuron_dra.common.k8s.client import (
    EVENTS,
    NEURON_ULTRASERVERS,
    NODES,
    RESOURCE_SLICES,
    KubeClient,
)
from neuron_dra.common.profiles import UltraServerMode
from neuron_dra.controller.context import REPORTING_CONTROLLER, ControllerContext
from neuron_dra.controller.discovery import (
    ANNOTATION_ULTRASERVER_ID,
    LABEL_ULTRASERVER_ID,
    DesiredUltraServer,
    UltraServerDiscovery,
    desired_status,
    group_ultraservers,
    keys_for_node,
    keys_for_slice,
    keys_for_ultraserver,
    nus_name,
    plan_topology,
    set_condition,
    ultraserver_label_value,
)
from neuron_dra.nodeplugin.discovery.model import (
    NeuronDevice,
    NodeInventory,
    UltraServerInfo,
)
from neuron_dra.nodeplugin.publish.slices import build_resource_slices
from neuron_dra.sim.fakeapi.faults import RequestInfo
from neuron_dra.sim.fakeapi.server import FakeAPIServer

TRN2U = "trn2u.48xlarge"
MODES = (UltraServerMode.X4, UltraServerMode.X2V, UltraServerMode.X1)
NS = DRIVER_NAMESPACE
NUS_API = "neuron.aws.com/v1beta1"
T0 = datetime(2026, 3, 1, tzinfo=UTC)

# --- building realistic objects ---------------------------------------------------------------


def us_id(k: int) -> str:
    """A server_id_4 as the driver's election produces it: 16 hex chars."""
    return f"a1b2c3d4e5f6{k:04x}"


def node_name(us: int, node_id: int) -> str:
    return f"ip-10-0-{us}-{node_id}.us-east-2.compute.internal"


def node_object(name: str, *, ready: bool = True, uid: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"node.kubernetes.io/instance-type": TRN2U}}
    if uid:
        meta["uid"] = uid
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": meta,
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "KubeletReady" if ready else "KubeletNotReady",
                    "message": "",
                    "lastHeartbeatTime": "2026-03-01T00:00:00Z",
                    "lastTransitionTime": "2026-03-01T00:00:00Z",
                }
            ]
        },
    }


def node_slices(
    name: str,
    server_id: str | None,
    node_id: int | None,
    *,
    uid: str = "uid-0",
    unhealthy: Iterable[int] = (),
    labels: dict[str, str] | None = None,
    generation: int = 0,
    modes: tuple[UltraServerMode, ...] = MODES,
) -> list[dict[str, Any]]:
    """The slices the kubelet plugin would publish for an emulated trn2u.48xlarge node."""
    bad = set(unhealthy)
    inventory = NodeInventory(
        node_name=name,
        instance_type=TRN2U,
        driver_version="2.24.7.0",
        devices=tuple(
            NeuronDevice(index=i, dev_path=f"/dev/neuron{i}", core_count=8, healthy=i not in bad)
            for i in range(16)
        ),
        ultraserver=UltraServerInfo(modes=modes, server_id_4=server_id, node_id_4=node_id),
    )
    return build_resource_slices(
        inventory,
        node_name=name,
        node_uid=uid,
        node_labels=labels or {},
        dra_driver_version="0.1.0",
        generation=generation,
    )


def set_attribute(slices: list[dict[str, Any]], attr: str, value: dict[str, Any]) -> None:
    for s in slices:
        for d in s["spec"]["devices"]:
            d["attributes"][attr] = value


def cluster(n_us: int = 4) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    slices: list[dict[str, Any]] = []
    nodes: dict[str, dict[str, Any]] = {}
    for k in range(n_us):
        for i in range(4):
            name = node_name(k, i)
            slices += node_slices(name, us_id(k), i)
            nodes[name] = node_object(name)
    return slices, nodes


def allocation(nodes: list[str], ref: str = "default/train", index: int = 0) -> dict[str, Any]:
    return {
        "workloadRef": ref,
        "workloadId": f"{ref.split('/')[1]}-0badc0de",
        "allocatedNodes": nodes,
        "nodeCount": len(nodes),
        "ultraserverIndex": index,
        "phase": "Active",
    }


# --- pure: grouping ---------------------------------------------------------------------------


def test_groups_four_ultraservers_of_four_trn2u_nodes() -> None:
    slices, nodes = cluster(4)
    groups = group_ultraservers(slices, nodes)

    assert sorted(groups) == [us_id(k) for k in range(4)]
    for k in range(4):
        g = groups[us_id(k)]
        assert g.problems == ()
        assert [(n.name, n.node_id) for n in g.nodes] == [(node_name(k, i), i) for i in range(4)]
        assert {n.instance_type for n in g.nodes} == {TRN2U}
        assert g.expected_nodes == 4
        assert all(n.healthy and n.link_status == "Up" for n in g.nodes)
        plan = plan_topology(g, None)
        assert plan.instance_type == TRN2U and plan.missing_ids == ()
        assert [n.node_id for n in plan.members] == [0, 1, 2, 3]


def test_nodes_without_ultraserver_id_are_ignored() -> None:
    slices, nodes = cluster(1)
    # Election not done and no capacity block label: the plugin publishes no ultraserverId.
    slices += node_slices("lonely", None, None)
    nodes["lonely"] = node_object("lonely")
    # Another driver's slice with our attribute name must not count either.
    foreign = copy.deepcopy(node_slices("gpu-node", us_id(0), 3))
    for s in foreign:
        s["spec"]["driver"] = "gpu.example.com"
    groups = group_ultraservers([*slices, *foreign], nodes)
    assert list(groups) == [us_id(0)]
    assert "lonely" not in {n.name for n in groups[us_id(0)].nodes}
    assert "gpu-node" not in {n.name for n in groups[us_id(0)].nodes}


def test_mixed_instance_types_are_reported_and_left_out_of_the_topology() -> None:
    slices, nodes = cluster(1)
    odd = node_slices(node_name(0, 3), us_id(0), 3)
    set_attribute(odd, "instanceType", {"string": "trn3p.48xlarge"})
    slices = [s for s in slices if s["spec"]["nodeName"] != node_name(0, 3)] + odd
    group = group_ultraservers(slices, nodes)[us_id(0)]

    assert any("mixed instance types" in p and node_name(0, 3) in p for p in group.problems)
    plan = plan_topology(group, None)
    assert plan.instance_type == TRN2U  # the majority
    assert [n.node_id for n in plan.members] == [0, 1, 2]
    assert plan.missing_ids == (3,)

    # instanceType is immutable: an existing object keeps its type even if every node differs.
    existing = {"spec": {"instanceType": "trn3p.48xlarge", "topology": []}}
    plan = plan_topology(group, existing)
    assert plan.instance_type == "trn3p.48xlarge"
    assert [n.name for n in plan.members] == [node_name(0, 3)]
    assert any("immutable" in p for p in plan.problems)


def test_duplicate_node_ids_keep_the_node_already_listed() -> None:
    slices, nodes = cluster(1)
    intruder = "ip-10-0-9-9.us-east-2.compute.internal"
    slices += node_slices(intruder, us_id(0), 1)
    nodes[intruder] = node_object(intruder)
    group = group_ultraservers(slices, nodes)[us_id(0)]

    assert any("share node id 1" in p for p in group.problems)
    assert any("5 nodes claim" in p for p in group.problems)
    # Without history the smaller name wins; with history the listed node keeps its place.
    fresh = plan_topology(group, None)
    assert len(fresh.members) == 4
    assert fresh.members[1].name == min(node_name(0, 1), intruder)
    existing = {"spec": {"instanceType": TRN2U, "topology": [{"nodeName": intruder, "nodeId": 1}]}}
    assert plan_topology(group, existing).members[1].name == intruder


def test_five_nodes_and_out_of_range_ids_never_exceed_the_schema() -> None:
    slices, nodes = cluster(1)
    extra = "ip-10-0-0-7.us-east-2.compute.internal"
    slices += node_slices(extra, us_id(0), 7)
    nodes[extra] = node_object(extra)
    group = group_ultraservers(slices, nodes)[us_id(0)]

    assert any("5 nodes claim this UltraServer, at most 4" in p for p in group.problems)
    assert any("ultraserverNodeId 7, outside 0..3" in p for p in group.problems)
    plan = plan_topology(group, None)
    assert [n.node_id for n in plan.members] == [0, 1, 2, 3]
    assert [n.name for n in plan.excluded] == [extra]


def test_node_and_device_health() -> None:
    slices, nodes = cluster(1)
    sick = node_slices(node_name(0, 2), us_id(0), 2, unhealthy=(3, 5))
    slices = [s for s in slices if s["spec"]["nodeName"] != node_name(0, 2)] + sick
    nodes[node_name(0, 1)] = node_object(node_name(0, 1), ready=False)
    del nodes[node_name(0, 3)]
    group = group_ultraservers(slices, nodes)[us_id(0)]
    by_name = {n.name: n for n in group.nodes}

    assert by_name[node_name(0, 0)].healthy
    assert by_name[node_name(0, 1)].state == "NotReady"
    assert by_name[node_name(0, 2)].unhealthy_devices == ("neurondevice3", "neurondevice5")
    assert by_name[node_name(0, 3)].state == "Missing"
    assert [n.link_status for n in group.nodes] == ["Up", "Unknown", "Unknown", "Unknown"]


def test_single_node_mode_only_means_links_down() -> None:
    slices = node_slices("n0", us_id(0), 0, modes=(UltraServerMode.X1,))
    group = group_ultraservers(slices, {"n0": node_object("n0")})[us_id(0)]
    assert group.nodes[0].healthy and group.nodes[0].link_status == "Down"
    # Links down do not shrink the UltraServer: the other nodes are still expected.
    assert group.expected_nodes == 4
    assert plan_topology(group, None).missing_ids == (1, 2, 3)


def test_only_the_newest_pool_generation_counts() -> None:
    old = node_slices("n0", us_id(0), 0, generation=1)
    new = node_slices("n0", us_id(1), 0, generation=2)
    for s in new:
        s["metadata"]["name"] += "-new"
    groups = group_ultraservers([*old, *new], {"n0": node_object("n0")})
    assert list(groups) == [us_id(1)]


def test_slice_whose_ultraserver_changed_requeues_both() -> None:
    old = node_slices("n0", us_id(0), 0)[0]
    new = node_slices("n0", us_id(1), 0)[0]
    assert keys_for_slice(new, old) == {us_id(0), us_id(1)}
    assert keys_for_slice(new) == {us_id(1)}
    assert keys_for_slice(node_slices("n1", None, None)[0]) == set()


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "spec",
                    "devices",
                    "attributes",
                    "ultraserverId",
                    "string",
                    "int",
                    "bool",
                    "driver",
                    "nodeName",
                    "name",
                    "pool",
                    "generation",
                    "x",
                ]
            ),
            children,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(JSON, max_size=5), JSON)
def test_garbage_never_raises(objs: list[Any], old: Any) -> None:
    # Seed something well formed among the garbage so the grouping path runs too.
    good = node_slices("n0", us_id(0), 0)
    groups = group_ultraservers([*objs, *good], {"n0": old})
    assert us_id(0) in groups
    for obj in objs:
        keys_for_slice(obj, old)
        keys_for_ultraserver(obj)
    for g in groups.values():
        plan = plan_topology(g, old if isinstance(old, dict) else None)
        desired_status(g.ultraserver_id, plan, old if isinstance(old, dict) else {}, now=T0)


# --- pure: names, conditions, status ----------------------------------------------------------


def test_names_for_ultraserver_ids() -> None:
    assert nus_name(us_id(3)) == us_id(3)
    assert nus_name("cr-0123456789abcdef0") == "cr-0123456789abcdef0"
    weird = nus_name("CB_Upper/1")
    assert weird.startswith("cb-upper-1-") and len(weird) == len("cb-upper-1-") + 8
    # Ids that sanitize alike stay distinct, and every result is a valid object name.
    assert nus_name("cb_upper-1") != nus_name("CB_upper-1")
    for raw in ("..", "-_-", "A" * 300, "a..b", "x.-y", "Ü"):
        name = nus_name(raw)
        assert len(name) <= 253 and name[0].isalnum() and name[-1].isalnum(), name
        assert ".." not in name and ".-" not in name and "-." not in name
    assert ultraserver_label_value(us_id(1)) == us_id(1)
    label = ultraserver_label_value("CB_Upper/1")
    assert len(label) <= 63 and "/" not in label


def test_last_transition_time_moves_only_when_status_flips() -> None:
    t1 = T0 + timedelta(minutes=5)
    conds = set_condition(
        [], "Degraded", "True", "NodeNotReady", "a", observed_generation=1, now=T0
    )
    same = set_condition(
        conds, "Degraded", "True", "DeviceUnhealthy", "b", observed_generation=1, now=t1
    )
    assert same[0]["lastTransitionTime"] == "2026-03-01T00:00:00Z"
    assert same[0]["reason"] == "DeviceUnhealthy" and same[0]["message"] == "b"
    flipped = set_condition(
        same, "Degraded", "False", "AsExpected", "", observed_generation=1, now=t1
    )
    assert flipped[0]["lastTransitionTime"] == "2026-03-01T00:05:00Z"
    other = {"type": "Allocating", "status": "True"}
    assert (
        set_condition(
            [other], "Ready", "True", "AllNodesReady", "", observed_generation=None, now=T0
        )[0]
        is other
    )


def test_state_follows_allocations_not_health() -> None:
    slices, nodes = cluster(1)
    nodes[node_name(0, 0)] = node_object(node_name(0, 0), ready=False)
    group = group_ultraservers(slices, nodes)[us_id(0)]
    plan = plan_topology(group, None)
    base: dict[str, Any] = {"metadata": {"generation": 2}, "status": {}}
    assert desired_status(us_id(0), plan, base, now=T0)["state"] == "Available"
    half = {**base, "status": {"allocations": [allocation([node_name(0, 0), node_name(0, 1)])]}}
    status = desired_status(us_id(0), plan, half, now=T0)
    assert status["state"] == "PartiallyAllocated" and status["allocatedNodeCount"] == 2
    assert status["allocations"] == half["status"]["allocations"]
    assert status["observedGeneration"] == 2
    full = {
        **base,
        "status": {
            "allocations": [
                allocation([node_name(0, 0), node_name(0, 1)]),
                allocation([node_name(0, 2), node_name(0, 3)], index=1),
            ]
        },
    }
    assert desired_status(us_id(0), plan, full, now=T0)["state"] == "FullyAllocated"


# --- against the fake API server --------------------------------------------------------------


class StepClock:
    """Time only moves when the test says so; sleeps (conflict backoff) return at once."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def wall(self) -> datetime:
        return T0 + timedelta(seconds=self.t)

    async def sleep(self, seconds: float) -> None:
        self.t += max(0.0, seconds)


class Harness:
    def __init__(self, server: FakeAPIServer, kube: KubeClient) -> None:
        self.server = server
        self.kube = kube
        self.clock = StepClock()
        self.ctx = ControllerContext(
            kube=kube,
            events=EventRecorder(
                kube,
                reporting_instance="controller-0",
                clock=self.clock,
                reporting_controller=REPORTING_CONTROLLER,
            ),
            namespace=NS,
            clock=self.clock,
        )
        self.discovery = UltraServerDiscovery(self.ctx)

    def add_node(self, name: str, server_id: str | None, node_id: int | None, **kw: Any) -> None:
        node = self.server.create(node_object(name))
        for s in node_slices(name, server_id, node_id, uid=node["metadata"]["uid"], **kw):
            self.server.create(s)

    def add_ultraserver(self, k: int) -> None:
        for i in range(4):
            self.add_node(node_name(k, i), us_id(k), i)

    def set_ready(self, name: str, ready: bool) -> None:
        node = self.server.get("v1", "Node", name)
        assert node is not None
        node["status"] = node_object(name, ready=ready)["status"]
        self.server.update_status(node)

    def delete_slices(self, node: str) -> None:
        for s in self.server.list("resource.k8s.io/v1", "ResourceSlice"):
            if s["spec"]["nodeName"] == node:
                self.server.delete("resource.k8s.io/v1", "ResourceSlice", s["metadata"]["name"])

    async def sync(self) -> None:
        """Bring the caches up to date, the way a reflector's (re)list does."""
        for res, store, ns in (
            (RESOURCE_SLICES, self.ctx.slices, None),
            (NODES, self.ctx.nodes, None),
            (NEURON_ULTRASERVERS, self.ctx.ultraservers, NS),
        ):
            listed = await self.kube.resource(res).list_all(ns)
            store.replace(listed.items, listed.resource_version)
            store.mark_synced()

    async def reconcile(self, *keys: str) -> None:
        await self.sync()
        for key in keys:
            await self.discovery.reconcile(key)

    def nus(self, k: int | str) -> dict[str, Any] | None:
        name = nus_name(us_id(k) if isinstance(k, int) else k)
        return self.server.get(NUS_API, "NeuronUltraServer", name, NS)

    def writes(self) -> dict[str, int]:
        counts = self.server.request_counts
        return {
            f"{verb} {res}": counts[(verb, res)]
            for verb in ("create", "update", "patch", "delete")
            for res in ("neuronultraservers", "neuronultraservers/status", "events")
        }

    async def events(self) -> list[dict[str, Any]]:
        listed = await self.kube.resource(EVENTS).list_all(NS)
        return sorted(listed.items, key=lambda e: e["eventTime"])


@pytest_asyncio.fixture
async def h(
    fake_apiserver: FakeAPIServer, kube_api_client: client.ApiClient
) -> AsyncIterator[Harness]:
    yield Harness(fake_apiserver, KubeClient(kube_api_client))


def condition(nus: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in nus["status"]["conditions"] if c["type"] == type_)


async def test_creates_nus_objects_with_spec_topology_and_status(h: Harness) -> None:
    for k in range(4):
        h.add_ultraserver(k)
    await h.reconcile(*(us_id(k) for k in range(4)))

    for k in range(4):
        nus = h.nus(k)
        assert nus is not None
        assert nus["metadata"]["annotations"][ANNOTATION_ULTRASERVER_ID] == us_id(k)
        assert nus["metadata"]["labels"][LABEL_ULTRASERVER_ID] == us_id(k)
        assert nus["spec"] == {
            "instanceType": TRN2U,
            "topology": [
                {
                    "nodeName": node_name(k, i),
                    "nodeId": i,
                    "linkStatusHorizontal": "Up",
                    "linkStatusVertical": "Up",
                }
                for i in range(4)
            ],
        }
        status = nus["status"]
        assert status["state"] == "Available"
        assert status["nodeCount"] == 4 and status["allocatedNodeCount"] == 0
        assert status["observedGeneration"] == nus["metadata"]["generation"]
        assert condition(nus, "Ready")["status"] == "True"
        assert condition(nus, "Degraded")["status"] == "False"
        assert condition(nus, "Ready")["lastTransitionTime"] == "2026-03-01T00:00:00Z"

    discovered = [e for e in await h.events() if e["reason"] == "Discovered"]
    assert len(discovered) == 4 and all(e["type"] == "Normal" for e in discovered)

    # What `kubectl get nus` shows comes from the printer columns over these fields.
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    async with (
        aiohttp.ClientSession(base_url=h.server.url) as http,
        http.get(
            f"/apis/neuron.aws.com/v1beta1/namespaces/{NS}/neuronultraservers",
            headers={"Accept": accept},
        ) as r,
    ):
        table = await r.json()
    columns = [c["name"] for c in table["columnDefinitions"]]
    row = next(r for r in table["rows"] if r["cells"][0] == us_id(0))
    cells = dict(zip(columns, row["cells"], strict=True))
    assert (cells["State"], cells["Type"], cells["Nodes"], cells["Allocated"]) == (
        "Available",
        TRN2U,
        4,
        0,
    )


async def test_nothing_is_written_when_nothing_changed(h: Harness) -> None:
    h.add_ultraserver(0)
    await h.reconcile(us_id(0))
    before = h.writes()
    gets_before = h.server.request_counts[("get", "neuronultraservers")]

    h.clock.t += 3600  # a later resync must not touch timestamps either
    await h.reconcile(us_id(0), us_id(0), nus_name(us_id(0)))

    assert h.writes() == before
    assert h.server.request_counts[("get", "neuronultraservers")] == gets_before


async def test_node_not_ready_degrades_and_recovery_restores(h: Harness) -> None:
    h.add_ultraserver(0)
    await h.reconcile(us_id(0))
    nus = h.nus(0)
    assert nus is not None
    # An allocation made by the workload reconciler: health changes must not touch it.
    nus["status"]["allocations"] = [allocation([node_name(0, 0), node_name(0, 1)])]
    h.server.update_status(nus)
    await h.reconcile(us_id(0))
    assert h.nus(0)["status"]["state"] == "PartiallyAllocated"  # type: ignore[index]

    h.clock.t = 60
    h.set_ready(node_name(0, 2), False)
    await h.reconcile(us_id(0))
    nus = h.nus(0)
    assert nus is not None
    degraded, ready = condition(nus, "Degraded"), condition(nus, "Ready")
    assert (degraded["status"], degraded["reason"]) == ("True", "NodeNotReady")
    assert node_name(0, 2) in degraded["message"]
    assert (ready["status"], ready["reason"]) == ("False", "NodeNotReady")
    assert degraded["lastTransitionTime"] == "2026-03-01T00:01:00Z"
    assert nus["status"]["state"] == "PartiallyAllocated"
    assert nus["status"]["allocations"][0]["allocatedNodes"] == [node_name(0, 0), node_name(0, 1)]
    assert [t["linkStatusHorizontal"] for t in nus["spec"]["topology"]] == [
        "Up",
        "Up",
        "Unknown",
        "Up",
    ]
    warnings = [e for e in await h.events() if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["NodeNotReady"]
    assert warnings[0]["regarding"]["name"] == us_id(0)

    # Still degraded, for one more reason: the message changes, the transition time does not.
    h.clock.t = 120
    h.set_ready(node_name(0, 3), False)
    await h.reconcile(us_id(0))
    degraded = condition(h.nus(0), "Degraded")  # type: ignore[arg-type]
    assert node_name(0, 3) in degraded["message"]
    assert degraded["lastTransitionTime"] == "2026-03-01T00:01:00Z"

    h.clock.t = 180
    h.set_ready(node_name(0, 2), True)
    h.set_ready(node_name(0, 3), True)
    await h.reconcile(us_id(0))
    nus = h.nus(0)
    assert nus is not None
    assert condition(nus, "Ready")["status"] == "True"
    assert condition(nus, "Degraded")["status"] == "False"
    assert condition(nus, "Degraded")["lastTransitionTime"] == "2026-03-01T00:03:00Z"
    assert nus["status"]["allocations"][0]["workloadRef"] == "default/train"
    reasons = [e["reason"] for e in await h.events()]
    assert reasons[-1] == "Recovered"


async def test_unhealthy_device_degrades(h: Harness) -> None:
    h.add_node("n0", us_id(0), 0, unhealthy=(7,))
    await h.reconcile(us_id(0))
    nus = h.nus(0)
    assert nus is not None
    degraded = condition(nus, "Degraded")
    # Three nodes are missing too; that reason ranks first, the message carries both.
    assert degraded["reason"] == "NodeMissing"
    assert "missing node ids 1, 2, 3" in degraded["message"]
    assert "n0: neurondevice7" in degraded["message"]
    assert nus["status"]["nodeCount"] == 1


async def test_all_slices_gone_without_allocations_deletes(h: Harness) -> None:
    h.add_ultraserver(0)
    h.add_ultraserver(1)
    await h.reconcile(us_id(0), us_id(1))
    for i in range(4):
        h.delete_slices(node_name(0, i))
    await h.reconcile(us_id(0), us_id(1))
    assert h.nus(0) is None
    assert h.nus(1) is not None


async def test_all_slices_gone_with_an_allocation_keeps_it_degraded(h: Harness) -> None:
    h.add_ultraserver(0)
    await h.reconcile(us_id(0))
    nus = h.nus(0)
    assert nus is not None
    nus["status"]["allocations"] = [allocation([node_name(0, 0), node_name(0, 1)])]
    h.server.update_status(nus)
    for i in range(4):
        h.delete_slices(node_name(0, i))
    await h.reconcile(us_id(0))

    nus = h.nus(0)
    assert nus is not None
    degraded = condition(nus, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "NodesGone")
    assert "default/train" in degraded["message"]
    assert nus["status"]["allocations"][0]["allocatedNodes"] == [node_name(0, 0), node_name(0, 1)]
    assert nus["status"]["nodeCount"] == 0
    # The last known topology stays, so operators can see which nodes to look for.
    assert len(nus["spec"]["topology"]) == 4
    assert "NodesGone" in [e["reason"] for e in await h.events()]

    # Once the workload reconciler releases it, the object goes.
    nus["status"]["allocations"] = []
    h.server.update_status(nus)
    await h.reconcile(us_id(0))
    assert h.nus(0) is None


async def test_a_node_leaving_drops_out_of_the_topology(h: Harness) -> None:
    h.add_ultraserver(0)
    await h.reconcile(us_id(0))
    h.delete_slices(node_name(0, 3))
    await h.reconcile(us_id(0))
    nus = h.nus(0)
    assert nus is not None
    assert [t["nodeId"] for t in nus["spec"]["topology"]] == [0, 1, 2]
    assert condition(nus, "Degraded")["reason"] == "NodeMissing"
    assert nus["status"]["observedGeneration"] == nus["metadata"]["generation"]


async def test_concurrent_allocation_write_is_kept(h: Harness) -> None:
    h.add_ultraserver(0)
    await h.reconcile(us_id(0))
    h.set_ready(node_name(0, 1), False)
    await h.sync()  # our cache: NodeNotReady pending, no allocation

    # The workload reconciler writes an allocation between our read (the cache) and our write.
    def allocate_first(req: RequestInfo) -> bool:
        if req.verb == "update" and req.subresource == "status" and not raced:
            live = h.nus(0)
            assert live is not None
            live["status"]["allocations"] = [allocation([node_name(0, 2), node_name(0, 3)])]
            h.server.update_status(live)
            raced.append(True)
        return False  # never inject a failure: the real resourceVersion check must 409

    raced: list[bool] = []
    h.server.faults.fail_next(1, 500, predicate=allocate_first)
    before = h.server.request_counts[("update", "neuronultraservers/status")]
    await h.discovery.reconcile(us_id(0))

    assert raced
    assert h.server.request_counts[("update", "neuronultraservers/status")] == before + 2
    nus = h.nus(0)
    assert nus is not None
    assert nus["status"]["allocations"][0]["allocatedNodes"] == [node_name(0, 2), node_name(0, 3)]
    assert nus["status"]["allocatedNodeCount"] == 2
    assert nus["status"]["state"] == "PartiallyAllocated"
    assert condition(nus, "Degraded")["reason"] == "NodeNotReady"
    h.server.faults.clear()


async def test_ultraserver_id_that_is_not_a_dns_name(h: Harness) -> None:
    raw = "CB_Upper/1"
    for i in range(4):
        # No election result: the id comes from the capacity block label.
        h.add_node(f"cb-node-{i}", None, i, labels={LABEL_CAPACITY_BLOCK_ID: raw})
    await h.reconcile(raw)
    nus = h.nus(raw)
    assert nus is not None
    assert nus["metadata"]["name"] == nus_name(raw) != raw
    assert nus["metadata"]["annotations"][ANNOTATION_ULTRASERVER_ID] == raw
    assert nus["metadata"]["labels"][LABEL_ULTRASERVER_ID] == ultraserver_label_value(raw)
    assert nus["status"]["nodeCount"] == 4
    assert keys_for_ultraserver(nus) == {raw}

    # The manager may only know the object's name (NUS events): same object, no writes.
    before = h.writes()
    await h.reconcile(nus_name(raw))
    assert h.writes() == before

    for i in range(4):
        h.delete_slices(f"cb-node-{i}")
    await h.reconcile(nus_name(raw))
    assert h.nus(raw) is None


async def test_node_moving_to_another_ultraserver(h: Harness) -> None:
    h.add_ultraserver(0)
    h.add_node("spare", us_id(1), 0)
    await h.reconcile(us_id(0), us_id(1))
    assert keys_for_node(node_object(node_name(0, 3)), h.ctx) == {us_id(0)}
    old = next(s for s in h.ctx.slices.list() if s["spec"]["nodeName"] == node_name(0, 3))

    # The plugin republishes node 3 with a new UltraServer id (new pool generation).
    new = copy.deepcopy(old)
    new["spec"]["pool"]["generation"] += 1
    set_attribute([new], "ultraserverId", {"string": us_id(1)})
    set_attribute([new], "ultraserverNodeId", {"int": 1})
    h.server.update(new)
    await h.sync()
    keys = keys_for_slice(h.ctx.slices.get(old["metadata"]["name"]), old)
    assert keys == {us_id(0), us_id(1)}
    await h.reconcile(*sorted(keys))

    assert [t["nodeId"] for t in h.nus(0)["spec"]["topology"]] == [0, 1, 2]  # type: ignore[index]
    assert [t["nodeName"] for t in h.nus(1)["spec"]["topology"]] == [  # type: ignore[index]
        "spare",
        node_name(0, 3),
    ]


async def test_inconsistent_topology_is_reported_not_raised(h: Harness) -> None:
    h.add_ultraserver(0)
    await h.reconcile(us_id(0))
    # A misconfigured node claims node id 2 too (and sorts first by name): the node already
    # listed keeps its place, the claimant is reported.
    h.add_node("intruder", us_id(0), 2)
    await h.reconcile(us_id(0))
    nus = h.nus(0)
    assert nus is not None
    assert [t["nodeName"] for t in nus["spec"]["topology"]] == [node_name(0, i) for i in range(4)]
    degraded = condition(nus, "Degraded")
    assert degraded["reason"] == "InconsistentTopology"
    assert "share node id 2" in degraded["message"]
    warnings = [e for e in await h.events() if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["InconsistentTopology"]


def test_desired_ultraserver_expected_nodes_default() -> None:
    assert DesiredUltraServer("x", ()).expected_nodes == 4


@pytest.mark.parametrize("key", ["", "unknown-id"])
async def test_unknown_keys_are_harmless(h: Harness, key: str) -> None:
    before = h.writes()
    await h.reconcile(key)
    assert h.writes() == before


async def test_writes_never_modify_the_cached_objects_they_start_from(h: Harness) -> None:
    """Spec and status writes start from shallow copies of the cached NUS (no deep copy per
    pass): the cache must still hold exactly what the API server sent."""
    h.add_ultraserver(0)
    await h.reconcile(us_id(0))
    for change in (
        lambda: h.set_ready(node_name(0, 2), False),  # a status write
        lambda: h.delete_slices(node_name(0, 3)),  # a spec write (the node leaves) and status
    ):
        h.clock.t += 60
        change()
        await h.sync()
        cached = h.ctx.ultraservers.get_by_name(nus_name(us_id(0)), NS)
        assert cached is not None
        snapshot = copy.deepcopy(cached)
        await h.discovery.reconcile(us_id(0))
        written = h.nus(0)
        assert written is not None
        assert written["metadata"]["resourceVersion"] != snapshot["metadata"]["resourceVersion"]
        assert cached == snapshot
