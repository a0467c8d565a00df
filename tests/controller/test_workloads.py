"""WorkloadReconciler against the fake API server (docs/architecture.md, "UltraServer allocation").

Real objects all the way: Nodes, ResourceSlices built by the node plugin's own slice builder
for emulated trn2u.48xlarge nodes, NeuronUltraServers, workloads, claims and pods live in the
fake API server; the reconciler reads them through real reflector-fed caches and writes
through the real client. The node plugins' part (tagging slices with the workload id of the
NeuronUltraServer entry naming their node) is played by ``Cluster.publish_tags``.

Nothing sleeps: a test waits for the caches to reach the server's current resourceVersions,
and "converged" means a reconcile that wrote nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client as k8s_client
from neuron_dra.common.constants import (
    DRIVER_NAMESPACE,
    FINALIZER_WORKLOAD,
    LABEL_CAPACITY_BLOCK_ID,
    LABEL_WORKLOAD_ID,
)
from neuron_dra.common.events import EventRecorder
from neuron_dra.common.k8s.cache import Store
from neuron_dra.common.k8s.client import (
    NEURON_ULTRASERVER_WORKLOADS,
    NEURON_ULTRASERVERS,
    NODES,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    KubeClient,
)
from neuron_dra.common.k8s.errors import KubeError
from neuron_dra.common.k8s.reflector import Reflector, ReflectorMetrics
from neuron_dra.common.models.crds import NeuronUltraServer, NeuronUltraServerWorkload
from neuron_dra.common.profiles import UltraServerMode
from neuron_dra.common.ultraserver import (
    AllocationEntry,
    node_reservations,
    read_allocations,
    workload_id,
)
from neuron_dra.controller.allocation.planner import Unit
from neuron_dra.controller.caches import DeviceClaimStore, claim_nodes_in_use, slim_claim
from neuron_dra.controller.context import REPORTING_CONTROLLER, ControllerContext
from neuron_dra.controller.workloads import (
    ALLOCATED,
    ALLOCATING,
    DEALLOCATING,
    FAILED,
    PARTIALLY_ALLOCATED,
    PENDING,
    Cond,
    Held,
    StatusUpdate,
    Validator,
    WorkloadReconciler,
    desired_workload_status,
    nus_status_with,
    orphan_claims_key,
    split_holdings,
    with_condition,
)
from neuron_dra.nodeplugin.discovery.model import (
    NeuronDevice,
    NodeInventory,
    UltraServerInfo,
)
from neuron_dra.nodeplugin.publish.slices import WHOLE_NODE, build_resource_slices
from neuron_dra.sim.fakeapi.faults import RequestInfo
from neuron_dra.sim.fakeapi.server import FakeAPIServer
from prometheus_client import CollectorRegistry

IT = "trn2u.48xlarge"
WAIT = 10.0  # safety net only: every wait is on an event
NS = "default"
WORKLOADS_API = "neuron.aws.com/v1beta1"
MODES_ALL = (UltraServerMode.X4, UltraServerMode.X2V, UltraServerMode.X1)


class StepClock:
    """Sleeps return at once (conflict-retry pauses), time only moves by ``advance``."""

    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    def wall(self) -> datetime:
        return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=self.t)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)

    def advance(self, seconds: float) -> None:
        self.t += seconds


# --------------------------------------------------------------------------------------------
# The cluster: nodes, slices, UltraServers


def inventory(
    node: str,
    instance_type: str,
    *,
    us_id: str,
    node_id: int,
    modes: tuple[UltraServerMode, ...] = MODES_ALL,
    unhealthy: Iterable[int] = (),
) -> NodeInventory:
    bad = set(unhealthy)
    return NodeInventory(
        node_name=node,
        instance_type=instance_type,
        driver_version="2.24.7.0",
        devices=tuple(
            NeuronDevice(index=i, dev_path=f"/dev/neuron{i}", core_count=8, healthy=i not in bad)
            for i in range(16)
        ),
        ultraserver=UltraServerInfo(modes=modes, server_id_4=us_id, node_id_4=node_id),
    )


class Cluster:
    """The server-side world the reconciler looks at, and the node plugins' tagging."""

    def __init__(self, server: FakeAPIServer) -> None:
        self.server = server
        self.inventories: dict[str, NodeInventory] = {}
        self.node_uids: dict[str, str] = {}
        self.generation = 0

    def add_ultraserver(
        self, name: str, *, instance_type: str = IT, modes: tuple[UltraServerMode, ...] = MODES_ALL
    ) -> list[str]:
        us_id = f"{abs(hash(name)) % 16**16:016x}"
        nodes = [f"{name}-n{i}" for i in range(4)]
        for i, node in enumerate(nodes):
            created = self.server.create(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": node, "labels": {LABEL_CAPACITY_BLOCK_ID: name}},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]},
                }
            )
            self.node_uids[node] = created["metadata"]["uid"]
            self.set_ready(node, True)
            self.inventories[node] = inventory(
                node, instance_type, us_id=us_id, node_id=i, modes=modes
            )
            self._publish(node, {})
        self.server.create(
            {
                "apiVersion": WORKLOADS_API,
                "kind": "NeuronUltraServer",
                "metadata": {"name": name, "namespace": DRIVER_NAMESPACE},
                "spec": {
                    "instanceType": instance_type,
                    "topology": [{"nodeName": n, "nodeId": i} for i, n in enumerate(nodes)],
                },
            }
        )
        return nodes

    def set_ready(self, node: str, ready: bool) -> None:
        obj = self.server.get("v1", "Node", node)
        assert obj is not None
        obj["status"] = {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "KubeletReady" if ready else "NodeStatusUnknown",
                    "message": "test",
                }
            ]
        }
        self.server.update_status(obj)

    def set_link(self, us: str, node: str, status: str) -> None:
        obj = self.nus(us)
        for t in obj["spec"]["topology"]:
            if t["nodeName"] == node:
                t["linkStatusHorizontal"] = status
        self.server.update(obj)

    def _slices(self, node: str, workload_ids: dict[int | str, str]) -> list[dict[str, Any]]:
        self.generation += 1
        return build_resource_slices(
            self.inventories[node],
            node_name=node,
            node_uid=self.node_uids[node],
            node_labels={},
            dra_driver_version="0.1.0",
            workload_ids=workload_ids,
            generation=self.generation,
        )

    def _publish(self, node: str, workload_ids: dict[int | str, str]) -> None:
        for s in self._slices(node, workload_ids):
            current = self.server.get("resource.k8s.io/v1", "ResourceSlice", s["metadata"]["name"])
            if current is None:
                self.server.create(s)
            elif current["spec"]["devices"] != s["spec"]["devices"]:
                current["spec"] = s["spec"]
                self.server.update(current)

    def delete_slices(self, node: str) -> None:
        rt = self.server.resource_type("resource.k8s.io/v1", "ResourceSlice")
        for s in self.server.list("resource.k8s.io/v1", "ResourceSlice"):
            if s["spec"].get("nodeName") == node:
                self.server.core.delete(rt, "", s["metadata"]["name"])

    def set_unhealthy(self, node: str, devices: Iterable[int]) -> None:
        inv = self.inventories[node]
        us = inv.ultraserver
        assert us is not None and us.server_id_4 is not None and us.node_id_4 is not None
        self.inventories[node] = inventory(
            node,
            str(inv.instance_type),
            us_id=us.server_id_4,
            node_id=us.node_id_4,
            unhealthy=devices,
        )
        self.publish_tags()

    def publish_tags(self, *, dead: Iterable[str] = ()) -> None:
        """What each node plugin does: tag the node with its (non-releasing) reservation.
        The plugins of ``dead`` nodes do nothing."""
        nus_objects = self.server.list(WORKLOADS_API, "NeuronUltraServer", DRIVER_NAMESPACE)
        for node in self.inventories:
            if node in set(dead):
                continue
            if not any(
                s["spec"].get("nodeName") == node
                for s in self.server.list("resource.k8s.io/v1", "ResourceSlice")
            ):
                continue  # the node's plugin is gone
            live = [r for r in node_reservations(nus_objects, node) if r.phase != "Releasing"]
            assert len(live) <= 1, f"{node} double-booked: {live}"
            self._publish(node, {WHOLE_NODE: live[0].workload_id} if live else {})

    # -- reads --------------------------------------------------------------------------------

    def nus(self, name: str) -> dict[str, Any]:
        obj = self.server.get(WORKLOADS_API, "NeuronUltraServer", name, DRIVER_NAMESPACE)
        assert obj is not None
        return obj

    def all_nus(self) -> list[dict[str, Any]]:
        return self.server.list(WORKLOADS_API, "NeuronUltraServer", DRIVER_NAMESPACE)

    def entries(self, ref: str | None = None) -> list[tuple[str, dict[str, Any]]]:
        return [
            (n["metadata"]["name"], e)
            for n in self.all_nus()
            for e in (n.get("status") or {}).get("allocations") or []
            if ref is None or e["workloadRef"] == ref
        ]

    def assert_no_double_booking(self) -> None:
        held = Counter(node for _, e in self.entries() for node in e["allocatedNodes"])
        assert all(c == 1 for c in held.values()), held
        for nus in self.all_nus():
            NeuronUltraServer.model_validate(nus)  # the record stays schema-valid
            members = {t["nodeName"] for t in nus["spec"]["topology"]}
            for e in (nus.get("status") or {}).get("allocations") or []:
                assert set(e["allocatedNodes"]) <= members

    def workload(self, name: str, ns: str = NS) -> dict[str, Any] | None:
        return self.server.get(WORKLOADS_API, "NeuronUltraServerWorkload", name, ns)

    def templates(self, ns: str = NS) -> list[dict[str, Any]]:
        return self.server.list("resource.k8s.io/v1", "ResourceClaimTemplate", ns)

    def events(self, ns: str = NS, reason: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self.server.list("events.k8s.io/v1", "Event", ns)
            if reason is None or e["reason"] == reason
        ]

    # -- workloads, claims, pods ----------------------------------------------------------

    def create_workload(
        self,
        name: str,
        *,
        size: int,
        count: int,
        ns: str = NS,
        strategy: str = "NoOp",
        instance_type: str = IT,
        template: str | None = None,
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "instanceType": instance_type,
            "topologySize": size,
            "serverCount": count,
            "allocationPolicy": {"failureStrategy": strategy},
        }
        if template:
            spec["resourceClaimTemplate"] = {"name": template}
        return self.server.create(
            {
                "apiVersion": WORKLOADS_API,
                "kind": "NeuronUltraServerWorkload",
                "metadata": {"name": name, "namespace": ns},
                "spec": spec,
            }
        )

    def create_plain_claim(self, name: str, node: str, device: str = "neurondevice3") -> None:
        """A claim of no workload, allocated one device of ``node`` (a plain pod's)."""
        claim = self.server.create(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": NS},
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "d", "exactly": {"deviceClassName": "neuron.aws.com"}}
                        ]
                    }
                },
            }
        )
        result = {"request": "d", "driver": "neuron.aws.com", "pool": node, "device": device}
        claim["status"] = {"allocation": {"devices": {"results": [result]}}}
        self.server.update_status(claim)

    def create_claim_with_pod(self, name: str, wid: str, node: str, ns: str = NS) -> None:
        pod = self.server.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"{name}-pod", "namespace": ns},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
            }
        )
        claim = self.server.create(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": ns, "labels": {LABEL_WORKLOAD_ID: wid}},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "neuron-node",
                                "exactly": {"deviceClassName": "ultraserver.neuron.aws.com"},
                            }
                        ]
                    }
                },
            }
        )
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "neuron-node",
                            "driver": "neuron.aws.com",
                            "pool": node,
                            "device": "neuronnode",
                        }
                    ]
                }
            },
            "reservedFor": [
                {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
            ],
        }
        self.server.update_status(claim)

    def claims(self, ns: str = NS) -> set[str]:
        return {
            c["metadata"]["name"]
            for c in self.server.list("resource.k8s.io/v1", "ResourceClaim", ns)
        }

    def pods(self, ns: str = NS) -> set[str]:
        """Pods not being deleted. An evicted pod bound to a node stays Terminating until its
        kubelet confirms (there is none here), as with a real API server."""
        return {
            p["metadata"]["name"]
            for p in self.server.list("v1", "Pod", ns)
            if not p["metadata"].get("deletionTimestamp")
        }

    def terminating_pods(self, ns: str = NS) -> set[str]:
        return {
            p["metadata"]["name"]
            for p in self.server.list("v1", "Pod", ns)
            if p["metadata"].get("deletionTimestamp")
        }

    def writes(self) -> int:
        """API writes so far, Events excluded (they are best-effort side notes)."""
        return sum(
            c
            for (verb, res), c in self.server.request_counts.items()
            if verb in ("create", "update", "patch", "delete") and not res.startswith("events")
        )


# --------------------------------------------------------------------------------------------
# A controller replica: its own client, caches and reconciler


class Controller:
    def __init__(self, server: FakeAPIServer, *, workload_namespace: str | None = None) -> None:
        self.server = server
        self.api_client = k8s_client.ApiClient(configuration=server.client_configuration())
        self.kube = KubeClient(self.api_client)
        self.clock = StepClock()
        self.ctx = ControllerContext(
            kube=self.kube,
            events=EventRecorder(
                self.kube,
                reporting_instance="test",
                reporting_controller=REPORTING_CONTROLLER,
                clock=self.clock,
            ),
            clock=self.clock,
            device_claims=DeviceClaimStore(),
        )
        metrics = ReflectorMetrics(CollectorRegistry())
        self.sources: list[tuple[Reflector, str, str, str | None]] = []
        for api, store, kind_api, kind, ns in (
            (RESOURCE_SLICES, self.ctx.slices, "resource.k8s.io/v1", "ResourceSlice", None),
            (NODES, self.ctx.nodes, "v1", "Node", None),
            (
                NEURON_ULTRASERVERS,
                self.ctx.ultraservers,
                WORKLOADS_API,
                "NeuronUltraServer",
                DRIVER_NAMESPACE,
            ),
            (
                NEURON_ULTRASERVER_WORKLOADS,
                self.ctx.workloads,
                WORKLOADS_API,
                "NeuronUltraServerWorkload",
                workload_namespace,
            ),
            (
                RESOURCE_CLAIM_TEMPLATES,
                self.ctx.templates,
                "resource.k8s.io/v1",
                "ResourceClaimTemplate",
                None,
            ),
            # The manager watches only claims with the workload-id label; every claim these
            # tests create carries one.
            (RESOURCE_CLAIMS, self.ctx.claims, "resource.k8s.io/v1", "ResourceClaim", None),
            # Every claim, slim: the nodes plain claims use (the manager's second claim watch).
            (
                RESOURCE_CLAIMS,
                self.ctx.device_claims,
                "resource.k8s.io/v1",
                "ResourceClaim",
                None,
            ),
        ):
            r = Reflector(
                self.kube.resource(api),
                store,
                namespace=ns,
                metrics=metrics,
                min_watch_duration=0.0,
            )
            self.sources.append((r, kind_api, kind, ns))
        self.reconciler = WorkloadReconciler(self.ctx, tag_poll=0.5, tag_clear_timeout=60.0)

    async def start(self) -> Controller:
        for r, *_ in self.sources:
            r.start()
        await asyncio.wait_for(asyncio.gather(*(r.wait_synced() for r, *_ in self.sources)), WAIT)
        return self

    async def stop(self) -> None:
        for r, *_ in self.sources:
            await r.stop()
        await self.api_client.close()

    def _current(self, store: Store, kind_api: str, kind: str, ns: str | None) -> bool:
        want = {
            (o["metadata"].get("namespace", ""), o["metadata"]["name"]): o["metadata"][
                "resourceVersion"
            ]
            for o in self.server.list(kind_api, kind, ns)
        }
        have = {
            (o["metadata"].get("namespace", ""), o["metadata"]["name"]): o["metadata"][
                "resourceVersion"
            ]
            for o in store.list()
        }
        return want == have

    async def catch_up(self, *, only: Callable[[str], bool] = lambda kind: True) -> None:
        """Wait until every cache holds exactly what the server holds now."""
        for r, kind_api, kind, ns in self.sources:
            if not only(kind):
                continue

            def current(
                r: Reflector = r, a: str = kind_api, k: str = kind, n: str | None = ns
            ) -> bool:
                return self._current(r.store, a, k, n)

            await asyncio.wait_for(r.wait_until(current), WAIT)

    async def reconcile(self, key: str) -> float | None:
        await self.catch_up()
        return (await self.reconciler.reconcile(key)).requeue_after

    async def converge(self, *keys: str, rounds: int = 12) -> None:
        """Reconcile ``keys`` until a whole round writes nothing."""
        cluster_writes = Cluster(self.server).writes
        for _ in range(rounds):
            before = cluster_writes()
            for key in keys:
                await self.reconcile(key)
            if cluster_writes() == before:
                return
        raise AssertionError(f"{keys} did not converge in {rounds} rounds")


@pytest_asyncio.fixture
async def cluster(fake_apiserver: FakeAPIServer) -> Cluster:
    return Cluster(fake_apiserver)


@pytest_asyncio.fixture
async def ctl(fake_apiserver: FakeAPIServer) -> AsyncIterator[Controller]:
    c = await Controller(fake_apiserver).start()
    yield c
    await c.stop()


def state(cluster: Cluster, name: str, ns: str = NS) -> str | None:
    obj = cluster.workload(name, ns)
    return None if obj is None else (obj.get("status") or {}).get("state")


def condition(cluster: Cluster, name: str, type_: str, ns: str = NS) -> dict[str, Any]:
    obj = cluster.workload(name, ns)
    assert obj is not None
    return next(c for c in obj["status"]["conditions"] if c["type"] == type_)


def wid_of(obj: dict[str, Any]) -> str:
    return workload_id(obj["metadata"]["name"], obj["metadata"]["uid"])


async def allocate(ctl: Controller, cluster: Cluster, name: str, **kw: Any) -> dict[str, Any]:
    obj = cluster.create_workload(name, **kw)
    await ctl.converge(f"{kw.get('ns', NS)}/{name}")
    assert state(cluster, name, kw.get("ns", NS)) == ALLOCATED
    return obj


# --------------------------------------------------------------------------------------------
# Pure parts


def test_conditions_keep_transition_time_unless_status_flips() -> None:
    first = with_condition([], Cond("Ready", False, "Waiting", "a"), "T1", 1)
    same = with_condition(first, Cond("Ready", False, "Waiting", "b"), "T2", 1)
    flipped = with_condition(same, Cond("Ready", True, "Done", "c"), "T3", 2)
    assert same[0]["lastTransitionTime"] == "T1" and same[0]["message"] == "b"
    assert flipped[0]["lastTransitionTime"] == "T3" and flipped[0]["observedGeneration"] == 2


def test_status_allocation_time_is_stamped_once() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    up = StatusUpdate(ALLOCATED, "w-1", (), ("us-a",), 4, allocated=True)
    s1 = desired_workload_status({"state": PENDING}, up, now, 1)
    s2 = desired_workload_status(s1, up, now + timedelta(hours=1), 1)
    assert s1["allocationTime"] == s2["allocationTime"] == "2026-01-01T00:00:00Z"
    degraded = StatusUpdate(PARTIALLY_ALLOCATED, "w-1", (), allocated=True)
    assert (
        desired_workload_status(s2, degraded, now + timedelta(hours=2), 1)["allocationTime"]
        == "2026-01-01T00:00:00Z"
    )
    pending = StatusUpdate(PENDING, "w-1", (), (), 0, allocated=False)
    assert "allocationTime" not in desired_workload_status(s2, pending, now, 1)


def _entry(raw: dict[str, Any]) -> AllocationEntry:
    (entry,) = read_allocations({"status": {"allocations": [raw]}})
    return entry


def test_split_holdings_drops_foreign_duplicate_and_out_of_range_entries() -> None:
    def held(us: str, index: int, wid: str = "w-1") -> Held:
        return Held(
            us,
            _entry(
                {
                    "workloadRef": "ns/w",
                    "workloadId": wid,
                    "ultraserverIndex": index,
                    "allocatedNodes": [f"{us}-n0"],
                }
            ),
        )

    usable, surplus = split_holdings(
        [held("a", 0), held("b", 0), held("c", 1, "w-old"), held("d", 5), held("e", 1)], "w-1", 2
    )
    assert [(h.ultraserver, h.index) for h in usable] == [("a", 0), ("e", 1)]
    assert sorted(h.ultraserver for h in surplus) == ["b", "c", "d"]


def test_validator_profile_wins_over_degraded_modes_and_unknown_types_use_slices() -> None:
    nus = [
        {
            "metadata": {"name": "x"},
            "spec": {"instanceType": "trn9.new", "topology": [{"nodeName": "n0", "nodeId": 0}]},
        },
        {
            "metadata": {"name": "y"},
            "spec": {"instanceType": IT, "topology": [{"nodeName": "m0", "nodeId": 0}]},
        },
    ]
    slices = {
        "n0": [
            {
                "spec": {
                    "devices": [
                        {
                            "name": "neuronnode",
                            "attributes": {"ultraserverModes": {"string": "1_4"}},
                        }
                    ]
                }
            }
        ],
        # A trn2u node whose links are down reports single-node mode only.
        "m0": [
            {
                "spec": {
                    "devices": [
                        {"name": "neuronnode", "attributes": {"ultraserverModes": {"string": "1"}}}
                    ]
                }
            }
        ],
    }
    validate = Validator(nus, lambda n: slices.get(n, []))

    def w(it: str, size: int) -> dict[str, Any]:
        return {"spec": {"instanceType": it, "topologySize": size, "serverCount": 1}}

    assert validate(w(IT, 4)).ok
    bad = validate(w("trn9.new", 2))
    assert bad.state == FAILED and "topologySize 2 is not supported by trn9.new" in bad.message
    assert "supported: 1, 4" in bad.message
    unknown = validate(w("trn7.big", 4))
    assert unknown.state == PENDING and "trn2u.48xlarge, trn9.new" in unknown.message


# --------------------------------------------------------------------------------------------
# The seed's example


async def test_seed_example_allocates_two_ultraservers(ctl: Controller, cluster: Cluster) -> None:
    for us in ("us-a", "us-b", "us-c", "us-d"):
        cluster.add_ultraserver(us)
    obj = cluster.create_workload(
        "my-training-job", size=4, count=2, template="my-training-job-rct"
    )
    key = f"{NS}/my-training-job"
    await ctl.converge(key)

    w = cluster.workload("my-training-job")
    assert w is not None
    NeuronUltraServerWorkload.model_validate(w)
    st = w["status"]
    wid = wid_of(obj)
    assert st["state"] == ALLOCATED
    assert st["workloadId"] == wid and wid.startswith("my-training-job-")
    assert st["allocatedUltraServers"] == ["us-a", "us-b"]
    assert st["totalNodesAllocated"] == 8
    assert st["allocationTime"]
    assert st["observedGeneration"] == w["metadata"]["generation"]
    assert FINALIZER_WORKLOAD in w["metadata"]["finalizers"]
    assert condition(cluster, "my-training-job", "Allocated")["status"] == "True"
    ready = condition(cluster, "my-training-job", "Ready")
    assert ready["status"] == "False" and ready["reason"] == "WaitingForNodeTags"

    (template,) = cluster.templates()
    assert template["metadata"]["name"] == "my-training-job-rct"
    (owner,) = template["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "NeuronUltraServerWorkload",
        obj["metadata"]["uid"],
        True,
    )

    entries = cluster.entries(key)
    assert sorted((us, e["ultraserverIndex"]) for us, e in entries) == [("us-a", 0), ("us-b", 1)]
    for us, e in entries:
        assert e["workloadId"] == wid and e["nodeCount"] == 4 and e["phase"] == "Pending"
        assert e["allocatedNodes"] == [f"{us}-n{i}" for i in range(4)]
        assert e["leaderNodeName"] == "us-a-n0" and e["allocatedAt"]
    assert cluster.nus("us-a")["status"]["state"] == "FullyAllocated"
    assert (cluster.nus("us-c").get("status") or {}).get("allocations", []) == []
    cluster.assert_no_double_booking()

    nus_objects = cluster.all_nus()
    ranks = {
        n: node_reservations(nus_objects, n)[0].rank
        for us in ("us-a", "us-b")
        for n in (f"{us}-n{i}" for i in range(4))
    }
    assert sorted(ranks.values()) == list(range(8))
    assert ranks["us-a-n0"] == 0 and ranks["us-b-n3"] == 7
    (event,) = cluster.events(reason="Allocated")
    assert "us-a, us-b" in event["note"] and "us-b-n3" in event["note"]

    # The node plugins tag their slices: Ready, and the entries become Bound.
    cluster.publish_tags()
    await ctl.converge(key)
    assert condition(cluster, "my-training-job", "Ready")["status"] == "True"
    assert {e["phase"] for _, e in cluster.entries(key)} == {"Bound"}

    # Steady state: another reconcile writes nothing at all.
    before = cluster.writes()
    await ctl.reconcile(key)
    assert cluster.writes() == before
    assert len(cluster.events(reason="Allocated")) == 1


async def test_reconcile_reads_its_own_writes_before_the_cache_does(
    ctl: Controller, cluster: Cluster
) -> None:
    """The manager may run the next reconcile before the watch delivered our last writes;
    re-planning from that stale cache must not redo (or undo) anything."""
    cluster.add_ultraserver("us-a")
    cluster.add_ultraserver("us-b")
    cluster.create_workload("job", size=2, count=2)
    await ctl.catch_up()
    for r, *_ in ctl.sources:
        await r.stop()  # the caches freeze: they never see what we write from here on
    first = await ctl.reconciler.reconcile(f"{NS}/job")
    assert first.requeue_after is None and state(cluster, "job") == ALLOCATED
    before = cluster.writes()
    await ctl.reconciler.reconcile(f"{NS}/job")
    assert cluster.writes() == before
    assert state(cluster, "job") == ALLOCATED
    assert len(cluster.entries()) == 2
    cluster.assert_no_double_booking()


async def test_unsynced_caches_do_nothing(fake_apiserver: FakeAPIServer) -> None:
    cluster = Cluster(fake_apiserver)
    cluster.add_ultraserver("us-a")
    cluster.create_workload("job", size=4, count=1)
    ctl = Controller(fake_apiserver)  # reflectors never started: caches empty, unsynced
    try:
        before = cluster.writes()
        result = await ctl.reconciler.reconcile(f"{NS}/job")
        assert result.requeue_after == ctl.reconciler.retry_requeue
        assert cluster.writes() == before
    finally:
        await ctl.api_client.close()


async def test_best_fit_packs_small_units_together(ctl: Controller, cluster: Cluster) -> None:
    cluster.add_ultraserver("us-a")
    cluster.add_ultraserver("us-b")
    cluster.create_workload("pair", size=2, count=1)
    await ctl.converge(f"{NS}/pair")
    for name in ("one", "two"):
        cluster.create_workload(name, size=1, count=1)
        await ctl.converge(f"{NS}/{name}")
    used = {us for us, _ in cluster.entries()}
    assert used == {"us-a"}, "small units share one UltraServer"
    assert sum(len(e["allocatedNodes"]) for _, e in cluster.entries()) == 4
    cluster.assert_no_double_booking()
    cluster.create_workload("whole", size=4, count=1)
    await ctl.converge(f"{NS}/whole")
    assert state(cluster, "whole") == ALLOCATED
    assert [us for us, _ in cluster.entries(f"{NS}/whole")] == ["us-b"]


async def test_pending_until_capacity_appears(ctl: Controller, cluster: Cluster) -> None:
    cluster.add_ultraserver("us-a")
    cluster.add_ultraserver("us-b")
    await allocate(ctl, cluster, "small", size=1, count=1)
    cluster.create_workload("big", size=4, count=2)
    key = f"{NS}/big"
    requeue = await ctl.reconcile(key)
    assert requeue is not None and requeue > 0, "a safety-net requeue while pending"
    await ctl.converge(key)
    assert state(cluster, "big") == PENDING
    cond = condition(cluster, "big", "Allocated")
    assert cond["status"] == "False" and cond["reason"] == "InsufficientCapacity"
    assert "needs 2 free 4-node units of trn2u.48xlarge; 1 available" in cond["message"]
    # Its template exists already (made when the workload is accepted, before units are
    # free): its pods' claims wait for tagged devices, not for the template.
    assert cluster.entries(key) == [] and len(cluster.templates()) == 2
    await ctl.catch_up()
    assert ctl.reconciler.pending_keys() == [key]

    cluster.add_ultraserver("us-c")
    await ctl.converge(key)
    assert state(cluster, "big") == ALLOCATED
    await ctl.catch_up()
    assert ctl.reconciler.pending_keys() == []
    assert ctl.reconciler.keys_for_ultraserver(cluster.nus("us-c")) == {key}
    cluster.assert_no_double_booking()


async def test_ultraservers_whose_devices_plain_claims_use_are_left_out(
    ctl: Controller, cluster: Cluster
) -> None:
    """A plain claim's pod on a node: an UltraServer unit there would wait until it goes
    (a workload's claims take whole nodes), so the allocator takes another one, and a gang
    that needs it waits; when the claim goes, the gang is allocated."""
    cluster.add_ultraserver("us-a")
    cluster.add_ultraserver("us-b")
    cluster.create_plain_claim("plain", "us-a-n2")
    await allocate(ctl, cluster, "one", size=4, count=1)
    assert [us for us, _ in cluster.entries(f"{NS}/one")] == ["us-b"]
    cluster.create_workload("two", size=4, count=1)
    key = f"{NS}/two"
    await ctl.converge(key)
    assert state(cluster, "two") == PENDING
    cond = condition(cluster, "two", "Allocated")
    assert "1 are busy" in cond["message"] or "2 are busy" in cond["message"], cond
    cluster.server.delete("resource.k8s.io/v1", "ResourceClaim", "plain", NS)
    await ctl.converge(key)
    assert state(cluster, "two") == ALLOCATED
    assert [us for us, _ in cluster.entries(key)] == ["us-a"]
    cluster.assert_no_double_booking()


def test_a_slim_claim_says_which_nodes_plain_claims_use() -> None:
    def claim(labels: dict[str, str], *results: dict[str, Any]) -> dict[str, Any]:
        return {
            "metadata": {"name": "c", "namespace": NS, "uid": "u", "labels": labels},
            "spec": {"devices": {}},
            "status": {"allocation": {"devices": {"results": list(results)}}},
        }

    ours = {"driver": "neuron.aws.com", "pool": "n1", "device": "neurondevice0"}
    other = {"driver": "gpu.example.com", "pool": "n2", "device": "gpu0"}
    admin = {**ours, "pool": "n3", "adminAccess": True}
    slim = slim_claim(claim({"team": "x"}, ours, other, admin))
    assert slim["neuronNodes"] == ["n1"] and "spec" not in slim and "labels" not in slim["metadata"]
    assert claim_nodes_in_use(slim) == ["n1"] and slim_claim(slim) is slim
    workload = slim_claim(claim({LABEL_WORKLOAD_ID: "w-1"}, ours))
    assert claim_nodes_in_use(workload) == []


async def test_more_than_the_cluster_has_says_so(ctl: Controller, cluster: Cluster) -> None:
    cluster.add_ultraserver("us-a")
    cluster.create_workload("huge", size=4, count=2)
    await ctl.converge(f"{NS}/huge")
    assert state(cluster, "huge") == PENDING
    assert "more than the type can offer" in condition(cluster, "huge", "Allocated")["message"]


async def test_unknown_type_pending_and_unsupported_size_failed(
    ctl: Controller, cluster: Cluster
) -> None:
    cluster.add_ultraserver("us-a")
    cluster.add_ultraserver(
        "us-x", instance_type="trn9.new", modes=(UltraServerMode.X4, UltraServerMode.X1)
    )
    cluster.create_workload("typo", size=4, count=1, instance_type="trn2u.48xlarg")
    cluster.create_workload("pairs", size=2, count=1, instance_type="trn9.new")
    await ctl.converge(f"{NS}/typo", f"{NS}/pairs")
    assert state(cluster, "typo") == PENDING
    assert condition(cluster, "typo", "Allocated")["reason"] == "UnknownInstanceType"
    assert state(cluster, "pairs") == FAILED
    failed = condition(cluster, "pairs", "Allocated")
    assert "topologySize 2 is not supported by trn9.new" in failed["message"]
    assert cluster.entries() == []
    assert cluster.events(reason="UnsupportedTopologySize")


async def test_fifo_older_gang_is_not_starved(ctl: Controller, cluster: Cluster) -> None:
    cluster.add_ultraserver("us-a")
    small = await allocate(ctl, cluster, "small", size=1, count=1)
    cluster.create_workload("gang", size=4, count=1)
    await ctl.converge(f"{NS}/gang")
    cluster.create_workload("later", size=1, count=1)
    await ctl.converge(f"{NS}/later")
    assert state(cluster, "gang") == PENDING
    assert state(cluster, "later") == PENDING
    assert condition(cluster, "later", "Allocated")["reason"] == "Queued"
    # Freeing the UltraServer serves the older gang, not the newer single node.
    await delete_and_release(ctl, cluster, small)
    await ctl.converge(*ctl.reconciler.pending_keys())
    assert state(cluster, "gang") == ALLOCATED and state(cluster, "later") == PENDING


# --------------------------------------------------------------------------------------------
# Deletion


async def delete_and_release(ctl: Controller, cluster: Cluster, obj: dict[str, Any]) -> None:
    name = obj["metadata"]["name"]
    await ctl.kube.resource(NEURON_ULTRASERVER_WORKLOADS).delete(name, NS)
    for _ in range(5):
        await ctl.converge(f"{NS}/{name}")
        cluster.publish_tags()
        if cluster.workload(name) is None:
            return
    raise AssertionError(f"{name} not released")


async def test_deletion_releases_waits_for_tags_then_drops_finalizer(
    ctl: Controller, cluster: Cluster
) -> None:
    cluster.add_ultraserver("us-a")
    obj = await allocate(ctl, cluster, "job", size=4, count=1)
    wid, key = wid_of(obj), f"{NS}/job"
    cluster.publish_tags()
    cluster.create_claim_with_pod("job-claim-0", wid, "us-a-n0")
    await ctl.converge(key)

    await ctl.kube.resource(NEURON_ULTRASERVER_WORKLOADS).delete("job", NS)
    requeue = await ctl.reconcile(key)
    assert requeue == ctl.reconciler.tag_poll, "waits for the plugins to clear the tag"
    assert state(cluster, "job") == DEALLOCATING
    (entry,) = [e for _, e in cluster.entries(key)]
    assert entry["phase"] == "Releasing", "nodes stay held while their slices carry the tag"
    assert len(cluster.templates()) == 1 and cluster.workload("job") is not None

    # Still tagged: nothing moves, however often we look.
    before = cluster.writes()
    assert await ctl.reconcile(key) == ctl.reconciler.tag_poll
    assert cluster.writes() == before

    cluster.publish_tags()  # the plugins see Releasing and untag
    assert await ctl.reconcile(key) is None
    assert cluster.entries() == []
    assert cluster.nus("us-a")["status"]["state"] == "Available"
    assert cluster.templates() == []
    assert "job-claim-0" not in cluster.claims()
    assert cluster.workload("job") is None
    assert cluster.events(reason="Deallocated")


async def test_deletion_does_not_wait_for_nodes_that_cannot_answer(
    ctl: Controller, cluster: Cluster
) -> None:
    cluster.add_ultraserver("us-a")
    obj = await allocate(ctl, cluster, "job", size=4, count=1)
    wid = wid_of(obj)
    cluster.publish_tags()
    cluster.delete_slices("us-a-n1")  # node and plugin gone with its slice
    cluster.set_ready("us-a-n2", False)  # plugin dead: its tagged slice stays as it is
    await ctl.kube.resource(NEURON_ULTRASERVER_WORKLOADS).delete("job", NS)
    assert await ctl.reconcile(f"{NS}/job") == ctl.reconciler.tag_poll  # n0, n3 still tagged
    cluster.publish_tags(dead=["us-a-n2"])
    assert await ctl.reconcile(f"{NS}/job") is None
    assert cluster.workload("job") is None and cluster.entries() == []
    stale = [
        s
        for s in cluster.server.list("resource.k8s.io/v1", "ResourceSlice")
        if s["spec"]["nodeName"] == "us-a-n2"
    ]
    assert any(
        d["attributes"].get("workloadId", {}).get("string") == wid
        for s in stale
        for d in s["spec"]["devices"]
    ), "n2 was not waited for"


async def test_deletion_gives_up_waiting_after_timeout(ctl: Controller, cluster: Cluster) -> None:
    cluster.add_ultraserver("us-a")
    await allocate(ctl, cluster, "job", size=2, count=1)
    cluster.publish_tags()
    await ctl.kube.resource(NEURON_ULTRASERVER_WORKLOADS).delete("job", NS)
    assert await ctl.reconcile(f"{NS}/job") == ctl.reconciler.tag_poll
    ctl.clock.advance(ctl.reconciler.tag_clear_timeout + 1)  # the plugins never react
    assert await ctl.reconcile(f"{NS}/job") is None
    assert cluster.workload("job") is None and cluster.entries() == []
    assert cluster.events(reason="TagsNotCleared")


async def test_orphaned_entries_of_a_vanished_workload_are_released(
    ctl: Controller, cluster: Cluster
) -> None:
    cluster.add_ultraserver("us-a")
    await allocate(ctl, cluster, "job", size=4, count=1)
    # Someone strips the finalizer by hand and the workload disappears behind our back.
    wl = ctl.kube.resource(NEURON_ULTRASERVER_WORKLOADS)
    current = await wl.get("job", NS)
    current["metadata"]["finalizers"] = []
    await wl.replace(current)
    await wl.delete("job", NS)
    await ctl.converge(f"{NS}/job")
    assert cluster.entries() == []


# --------------------------------------------------------------------------------------------
# Failures


FAILURES: dict[str, Callable[[Cluster, str], None]] = {
    "not-ready": lambda c, n: c.set_ready(n, False),
    "slice-gone": lambda c, n: c.delete_slices(n),
    "device-unhealthy": lambda c, n: c.set_unhealthy(n, [3]),
    "link-down": lambda c, n: c.set_link(n.rsplit("-", 1)[0], n, "Down"),
}


@pytest.mark.parametrize("failure", sorted(FAILURES))
async def test_noop_reports_and_keeps_everything(
    ctl: Controller, cluster: Cluster, failure: str
) -> None:
    for us in ("us-a", "us-b", "us-c"):
        cluster.add_ultraserver(us)
    obj = await allocate(ctl, cluster, "job", size=4, count=2)
    cluster.publish_tags()
    await ctl.converge(f"{NS}/job")
    before = sorted((us, tuple(e["allocatedNodes"])) for us, e in cluster.entries())

    FAILURES[failure](cluster, "us-b-n2")
    await ctl.converge(f"{NS}/job")
    assert state(cluster, "job") == PARTIALLY_ALLOCATED
    degraded = condition(cluster, "job", "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "NodeFailure"
    assert "us-b-n2" in degraded["message"]
    assert sorted((us, tuple(e["allocatedNodes"])) for us, e in cluster.entries()) == before
    assert len(cluster.templates()) == 1
    (event,) = cluster.events(reason="NodeFailure")
    assert event["type"] == "Warning" and "us-b-n2" in event["note"]
    allocated_at = cluster.workload("job")["status"]["allocationTime"]  # type: ignore[index]

    if failure == "not-ready":  # recovery
        cluster.set_ready("us-b-n2", True)
        await ctl.converge(f"{NS}/job")
        assert state(cluster, "job") == ALLOCATED
        assert condition(cluster, "job", "Degraded")["status"] == "False"
        w = cluster.workload("job")
        assert w is not None and w["status"]["allocationTime"] == allocated_at
    del obj


async def test_restart_all_releases_restarts_and_reallocates(
    ctl: Controller, cluster: Cluster
) -> None:
    for us in ("us-a", "us-b", "us-c"):
        cluster.add_ultraserver(us)
    obj = await allocate(ctl, cluster, "job", size=4, count=2, strategy="RestartAll")
    wid = wid_of(obj)
    cluster.publish_tags()
    for us in ("us-a", "us-b"):
        cluster.create_claim_with_pod(f"claim-{us}", wid, f"{us}-n0")
    cluster.create_claim_with_pod("unrelated", "other-wid", "us-c-n0")
    await ctl.converge(f"{NS}/job")

    cluster.set_ready("us-a-n1", False)
    await ctl.converge(f"{NS}/job")
    assert state(cluster, "job") == ALLOCATED
    assert sorted(us for us, _ in cluster.entries(f"{NS}/job")) == ["us-b", "us-c"]
    assert cluster.claims() == {"unrelated"}, "every claim of the workload is deleted"
    assert cluster.pods() == {"unrelated-pod"}, "and its pods, so they restart"
    assert cluster.terminating_pods() == {"claim-us-a-pod", "claim-us-b-pod"}
    assert cluster.events(reason="NodeFailure")
    cluster.assert_no_double_booking()
    assert len(cluster.templates()) == 1


async def test_restart_all_goes_pending_without_capacity(ctl: Controller, cluster: Cluster) -> None:
    cluster.add_ultraserver("us-a")
    await allocate(ctl, cluster, "job", size=4, count=1, strategy="RestartAll")
    cluster.set_ready("us-a-n3", False)
    await ctl.converge(f"{NS}/job")
    assert state(cluster, "job") == PENDING
    assert cluster.entries() == []
    cluster.set_ready("us-a-n3", True)
    await ctl.converge(f"{NS}/job")
    assert state(cluster, "job") == ALLOCATED


# MigrateAffected: AWS's operator's name for it, the same strategy.
@pytest.mark.parametrize("strategy", ["ReplaceAffected", "MigrateAffected"])
async def test_replace_affected_swaps_only_the_failed_unit(
    ctl: Controller, cluster: Cluster, strategy: str
) -> None:
    for us in ("us-a", "us-b", "us-c"):
        cluster.add_ultraserver(us)
    obj = await allocate(ctl, cluster, "job", size=4, count=2, strategy=strategy)
    wid = wid_of(obj)
    cluster.publish_tags()
    for us in ("us-a", "us-b"):
        cluster.create_claim_with_pod(f"claim-{us}", wid, f"{us}-n2")
    await ctl.converge(f"{NS}/job")

    cluster.set_ready("us-b-n2", False)
    await ctl.converge(f"{NS}/job")
    assert state(cluster, "job") == ALLOCATED
    entries = {e["ultraserverIndex"]: (us, e) for us, e in cluster.entries(f"{NS}/job")}
    assert entries[0][0] == "us-a" and entries[1][0] == "us-c", "unit 1 moved, unit 0 stayed"
    assert all(e["leaderNodeName"] == "us-a-n0" for _, e in entries.values())
    assert cluster.claims() == {"claim-us-a"}, "only the failed unit's claims go"
    assert cluster.pods() == {"claim-us-a-pod"}
    assert cluster.terminating_pods() == {"claim-us-b-pod"}
    assert cluster.events(reason="UnitsReplaced")
    cluster.assert_no_double_booking()


async def test_replace_affected_names_the_new_unit_before_the_old_claims_go(
    ctl: Controller, cluster: Cluster, fake_apiserver: FakeAPIServer
) -> None:
    """Deleting the failed unit's claims is what lets its pods be replaced: by then the
    status must already name the replacement UltraServer (what users rely on)."""
    for us in ("us-a", "us-b", "us-c"):
        cluster.add_ultraserver(us)
    obj = await allocate(ctl, cluster, "job", size=4, count=2, strategy="ReplaceAffected")
    cluster.publish_tags()
    cluster.create_claim_with_pod("claim-us-b", wid_of(obj), "us-b-n2")
    await ctl.converge(f"{NS}/job")
    seen: list[str] = []

    def recording(req: RequestInfo) -> bool:
        if (req.resource, req.subresource) == ("neuronultraserverworkloads", "status"):
            seen.append("status " + ",".join(req.body["status"]["allocatedUltraServers"]))
        elif req.resource == "resourceclaims" and req.verb == "delete":
            seen.append("delete claim")
        return False

    fake_apiserver.faults.fail_next_write(recording, n=10_000)
    cluster.set_ready("us-b-n2", False)
    await ctl.converge(f"{NS}/job")
    fake_apiserver.faults.clear()
    assert "delete claim" in seen
    first_delete = seen.index("delete claim")
    assert "status us-a,us-c" in seen[:first_delete], seen


async def test_replace_affected_moves_the_leader_with_unit_zero(
    ctl: Controller, cluster: Cluster
) -> None:
    for us in ("us-a", "us-b", "us-c"):
        cluster.add_ultraserver(us)
    await allocate(ctl, cluster, "job", size=4, count=2, strategy="ReplaceAffected")
    cluster.set_ready("us-a-n0", False)
    await ctl.converge(f"{NS}/job")
    entries = {e["ultraserverIndex"]: (us, e) for us, e in cluster.entries(f"{NS}/job")}
    assert entries[0][0] == "us-c" and entries[1][0] == "us-b"
    assert {e["leaderNodeName"] for _, e in entries.values()} == {"us-c-n0"}


async def test_replace_affected_without_spare_reports(ctl: Controller, cluster: Cluster) -> None:
    cluster.add_ultraserver("us-a")
    cluster.add_ultraserver("us-b")
    await allocate(ctl, cluster, "job", size=4, count=2, strategy="ReplaceAffected")
    cluster.set_ready("us-b-n1", False)
    await ctl.converge(f"{NS}/job")
    assert state(cluster, "job") == PARTIALLY_ALLOCATED
    assert "no healthy replacement" in condition(cluster, "job", "Degraded")["message"]
    assert len(cluster.entries()) == 2


# --------------------------------------------------------------------------------------------
# Two controllers


async def test_split_brain_controllers_never_double_book(fake_apiserver: FakeAPIServer) -> None:
    """Two replicas that each see only one of two workloads (the worst case: neither knows
    the other's request), racing for the one UltraServer both fit."""
    cluster = Cluster(fake_apiserver)
    for ns in ("team-a", "team-b"):
        fake_apiserver.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    cluster.add_ultraserver("us-a")
    cluster.create_workload("a", size=4, count=1, ns="team-a")
    cluster.create_workload("b", size=4, count=1, ns="team-b")
    one = await Controller(fake_apiserver, workload_namespace="team-a").start()
    two = await Controller(fake_apiserver, workload_namespace="team-b").start()
    try:
        await one.catch_up()
        await two.catch_up()
        await asyncio.gather(
            one.reconciler.reconcile("team-a/a"), two.reconciler.reconcile("team-b/b")
        )
        await asyncio.gather(one.converge("team-a/a"), two.converge("team-b/b"))
        states = sorted(str(state(cluster, n, ns)) for n, ns in (("a", "team-a"), ("b", "team-b")))
        assert states == [ALLOCATED, PENDING]
        assert len(cluster.entries()) == 1
        cluster.assert_no_double_booking()
    finally:
        await one.stop()
        await two.stop()


async def test_stale_cache_loses_the_race_at_the_guarded_write(
    fake_apiserver: FakeAPIServer,
) -> None:
    """The second replica plans from a cache that has not seen the first one's entry (and
    does not see the first workload at all); the RV-guarded write re-checks on the fresh
    object and refuses."""
    cluster = Cluster(fake_apiserver)
    fake_apiserver.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-b"}})
    cluster.add_ultraserver("us-a")
    cluster.create_workload("a", size=4, count=1)
    cluster.create_workload("b", size=4, count=1, ns="team-b")
    one = await Controller(fake_apiserver).start()
    two = await Controller(fake_apiserver, workload_namespace="team-b").start()
    try:
        await two.catch_up()
        for r, *_ in two.sources:
            if r.store is two.ctx.ultraservers:
                await r.stop()  # its view of the UltraServers freezes: us-a looks free
        await one.converge(f"{NS}/a")
        assert state(cluster, "a") == ALLOCATED
        result = await two.reconciler.reconcile("team-b/b")
        assert result.requeue_after == two.reconciler.retry_requeue
        # Its write from the stale cache was refused by the server's resourceVersion guard
        # (409), and the re-check on the freshly read object sent nothing more.
        assert fake_apiserver.request_counts[("update", "neuronultraservers/status")] == 2
        assert [e["workloadRef"] for _, e in cluster.entries()] == [f"{NS}/a"]
        cluster.assert_no_double_booking()
        assert state(cluster, "b", "team-b") != ALLOCATED
    finally:
        await one.stop()
        await two.stop()


async def test_write_that_loses_on_resource_version_rechecks_and_stops(
    ctl: Controller, cluster: Cluster
) -> None:
    """Another replica's entry lands between our read and our write: 409, re-read, the
    nodes are taken, stop (no retry onto them, no partial state)."""
    cluster.add_ultraserver("us-a")
    cluster.create_workload("b", size=4, count=1)
    server = cluster.server
    competing = {"done": False}

    def other_replica_writes_first(req: RequestInfo) -> bool:
        if (req.verb, req.resource, req.subresource) == (
            "update",
            "neuronultraservers",
            "status",
        ) and not competing["done"]:
            competing["done"] = True
            nus = cluster.nus("us-a")
            nus.setdefault("status", {})["allocations"] = [
                {
                    "workloadRef": "other/a",
                    "workloadId": "a-12345678",
                    "nodeCount": 4,
                    "allocatedNodes": [f"us-a-n{i}" for i in range(4)],
                    "ultraserverIndex": 0,
                    "leaderNodeName": "us-a-n0",
                    "phase": "Reserved",
                }
            ]
            server.update_status(nus)
        return False

    server.faults.fail_next_write(other_replica_writes_first)
    await ctl.catch_up()
    result = await ctl.reconciler.reconcile(f"{NS}/b")
    assert competing["done"]
    assert result.requeue_after == ctl.reconciler.retry_requeue
    assert [e["workloadRef"] for _, e in cluster.entries()] == ["other/a"]
    await ctl.converge(f"{NS}/b")
    assert state(cluster, "b") == PENDING
    cluster.assert_no_double_booking()


async def test_same_workload_on_two_replicas_gets_one_allocation(
    fake_apiserver: FakeAPIServer,
) -> None:
    cluster = Cluster(fake_apiserver)
    for us in ("us-a", "us-b", "us-c"):
        cluster.add_ultraserver(us)
    cluster.create_workload("job", size=2, count=3)
    one = await Controller(fake_apiserver).start()
    two = await Controller(fake_apiserver).start()
    try:
        await one.catch_up()
        await two.catch_up()
        await asyncio.gather(
            *(c.reconciler.reconcile(f"{NS}/job") for c in (one, two)), return_exceptions=True
        )
        for _ in range(3):
            await one.converge(f"{NS}/job")
            await two.converge(f"{NS}/job")
        assert state(cluster, "job") == ALLOCATED
        assert sorted(e["ultraserverIndex"] for _, e in cluster.entries()) == [0, 1, 2]
        cluster.assert_no_double_booking()
        assert len(cluster.templates()) == 1
    finally:
        await one.stop()
        await two.stop()


# --------------------------------------------------------------------------------------------
# Crash safety


def allocation_write(req: RequestInfo) -> bool:
    return req.is_write and req.resource in (
        "neuronultraservers",
        "neuronultraserverworkloads",
        "resourceclaimtemplates",
    )


def describe_write(req: RequestInfo) -> str:
    """``verb resource[/subresource]``, and the state a workload status write sets."""
    what = f"{req.verb} {req.resource}" + (f"/{req.subresource}" if req.subresource else "")
    if (req.resource, req.subresource) == ("neuronultraserverworkloads", "status"):
        what += f" {req.body['status']['state']}"
    return what


async def record_allocation_writes(server: FakeAPIServer) -> list[str]:
    """The writes a clean allocation of the crash scenario makes, in order."""
    seen: list[str] = []

    def recording(req: RequestInfo) -> bool:
        if allocation_write(req):
            seen.append(describe_write(req))
        return False

    server.faults.fail_next_write(recording, n=10_000)
    ctl = await Controller(server).start()
    try:
        await ctl.converge(f"{NS}/job")
    finally:
        await ctl.stop()
        server.faults.clear()
    return seen


def crash_scenario(server: FakeAPIServer) -> Cluster:
    cluster = Cluster(server)
    for us in ("us-a", "us-b", "us-c"):
        cluster.add_ultraserver(us)
    cluster.create_workload("job", size=4, count=2)
    return cluster


#: The writes of a clean allocation in the crash scenario (the test below pins them).
CLEAN_ALLOCATION_WRITES = 5


async def test_clean_allocation_writes_the_minimum(fake_apiserver: FakeAPIServer) -> None:
    crash_scenario(fake_apiserver)
    # The template (first: pods applied with the workload find it), the finalizer, one entry
    # write per UltraServer used, and one workload status write: Pending (here: no state
    # yet) straight to Allocated, no "Allocating" record before the entries. The crash test
    # below kills the controller after each.
    assert await record_allocation_writes(fake_apiserver) == [
        "create resourceclaimtemplates",
        "update neuronultraserverworkloads",
        "update neuronultraservers/status",
        "update neuronultraservers/status",
        "update neuronultraserverworkloads/status Allocated",
    ]
    assert len(Cluster(fake_apiserver).events(reason="Allocated")) == 1


@pytest.mark.parametrize("crash_at", range(CLEAN_ALLOCATION_WRITES))
async def test_crash_after_each_allocation_write_converges(
    fake_apiserver: FakeAPIServer, crash_at: int
) -> None:
    cluster = crash_scenario(fake_apiserver)
    seen = -1

    def nth(req: RequestInfo) -> bool:
        nonlocal seen
        if not allocation_write(req):
            return False
        seen += 1
        return seen == crash_at

    fake_apiserver.faults.fail_next_write(nth, after_commit=True)
    first = await Controller(fake_apiserver).start()
    try:
        with contextlib.suppress(KubeError):
            for _ in range(crash_at + 2):
                await first.reconcile(f"{NS}/job")  # dies on the lost response
    finally:
        await first.stop()
    assert fake_apiserver.faults.pending_rules == 0, "the crash happened"

    fresh = await Controller(fake_apiserver).start()
    try:
        await fresh.converge(f"{NS}/job")
    finally:
        await fresh.stop()
    assert state(cluster, "job") == ALLOCATED
    assert sorted(e["ultraserverIndex"] for _, e in cluster.entries()) == [0, 1]
    cluster.assert_no_double_booking()
    assert [t["metadata"]["name"] for t in cluster.templates()] == ["job"]


def lose_entries(cluster: Cluster) -> None:
    """Every allocation entry vanishes from the record (the workload's status stays)."""
    for nus in cluster.all_nus():
        nus["status"] = nus_status_with(nus, [])
        cluster.server.update_status(nus)


@pytest.mark.parametrize("crash_at", range(4))
async def test_running_workload_holding_nothing_reallocates_crash_safely(
    fake_apiserver: FakeAPIServer, crash_at: int
) -> None:
    """A workload still marked Allocated while it holds no entries (they were lost, or
    RestartAll was interrupted between releasing them and writing Pending) is allocated
    again. Its state must leave the running states before the first entry is written: a
    restart finding entries under Allocated would take them for a running workload that lost
    a unit (NoOp: PartiallyAllocated for good) instead of finishing the allocation. Writes:
    Allocating, 2 entries, Allocated (the template is still there)."""
    cluster = crash_scenario(fake_apiserver)
    setup = await Controller(fake_apiserver).start()
    try:
        await setup.converge(f"{NS}/job")
    finally:
        await setup.stop()
    assert state(cluster, "job") == ALLOCATED
    lose_entries(cluster)

    seen = -1
    written: list[str] = []

    def nth(req: RequestInfo) -> bool:
        nonlocal seen
        if not allocation_write(req):
            return False
        written.append(describe_write(req))
        seen += 1
        return seen == crash_at

    fake_apiserver.faults.fail_next_write(nth, after_commit=True)
    first = await Controller(fake_apiserver).start()
    try:
        with pytest.raises(KubeError):
            for _ in range(crash_at + 2):
                await first.reconcile(f"{NS}/job")  # dies on the lost response
    finally:
        await first.stop()
    assert written[0] == "update neuronultraserverworkloads/status Allocating"
    assert len(written) == crash_at + 1
    if 0 < crash_at < 3:
        assert state(cluster, "job") == ALLOCATING, "entries are never under a running state"

    fresh = await Controller(fake_apiserver).start()
    try:
        await fresh.converge(f"{NS}/job")
    finally:
        await fresh.stop()
    assert state(cluster, "job") == ALLOCATED
    assert condition(cluster, "job", "Degraded")["status"] == "False"
    assert cluster.events(reason="NodeFailure") == []
    assert sorted(e["ultraserverIndex"] for _, e in cluster.entries()) == [0, 1]
    cluster.assert_no_double_booking()
    assert [t["metadata"]["name"] for t in cluster.templates()] == ["job"]


async def test_interrupted_allocation_is_rolled_back_when_it_cannot_complete(
    fake_apiserver: FakeAPIServer,
) -> None:
    cluster = Cluster(fake_apiserver)
    cluster.add_ultraserver("us-a")
    cluster.add_ultraserver("us-b")
    cluster.create_workload("job", size=4, count=2)
    # us-b's entry write fails (the writes go out together): us-a's entry exists, us-b's not.
    fake_apiserver.faults.fail_next_write(
        lambda r: r.resource == "neuronultraservers" and r.name == "us-b"
    )
    first = await Controller(fake_apiserver).start()
    try:
        with pytest.raises(KubeError):
            await first.reconcile(f"{NS}/job")
    finally:
        await first.stop()
    assert len(cluster.entries()) == 1
    cluster.set_ready("us-b-n0", False)  # the rest cannot be had any more

    fresh = await Controller(fake_apiserver).start()
    try:
        await fresh.converge(f"{NS}/job")
    finally:
        await fresh.stop()
    assert state(cluster, "job") == PENDING
    assert cluster.entries() == [], "no leaked reservation"
    # The template stays while the workload waits (it was made when it was accepted).
    assert [t["metadata"]["name"] for t in cluster.templates()] == ["job"]


def test_unit_type_is_the_allocators() -> None:
    # The reconciler builds units from the record with the allocator's own type.
    h = Held(
        "us-a", _entry({"ultraserverIndex": 1, "allocatedNodes": ["n0", "n1"], "workloadId": "x"})
    )
    assert h.unit == Unit("us-a", ("n0", "n1"), 1)


async def test_a_claim_placed_outside_the_workload_is_moved(
    ctl: Controller, cluster: Cluster
) -> None:
    # After a move the old nodes keep the workload's tag until their plugins republish, and
    # the scheduler may place a new claim there by it; the plugin refuses to prepare it, so
    # the controller deletes the claim and its pod to have them scheduled again.
    for us in ("us-a", "us-b"):
        cluster.add_ultraserver(us)
    obj = await allocate(ctl, cluster, "job", size=4, count=1)
    wid = wid_of(obj)
    (held,) = {us for us, _ in cluster.entries(f"{NS}/job")}
    other = "us-b" if held == "us-a" else "us-a"
    cluster.publish_tags()
    cluster.create_claim_with_pod("inside", wid, f"{held}-n0")
    cluster.create_claim_with_pod("stray", wid, f"{other}-n2")
    cluster.create_claim_with_pod("foreign", "other-wid", f"{other}-n3")
    await ctl.converge(f"{NS}/job")

    assert cluster.claims() == {"inside", "foreign"}
    assert cluster.pods() == {"inside-pod", "foreign-pod"}
    assert cluster.terminating_pods() == {"stray-pod"}, "the stray claim's pod is evicted"
    (event,) = cluster.events(reason="ClaimsMoved")
    assert "stray" in event["note"] and f"{other}-n2" in event["note"]
    assert state(cluster, "job") == ALLOCATED
    cluster.assert_no_double_booking()


async def test_claims_of_a_deleted_workload_are_deleted_with_their_pods(
    ctl: Controller, cluster: Cluster
) -> None:
    # The resourceclaim controller works from its own cache: after a workload's deletion has
    # evicted its pods for the last time, it may still make a claim from the deleted template
    # for a recreated pod (the real control plane did, in the e2e suite). Nobody holds that
    # workloadId any more, so the claim and its pod go; a live workload's claims stay.
    cluster.add_ultraserver("us-a")
    obj = await allocate(ctl, cluster, "job", size=4, count=1)
    wid = wid_of(obj)
    cluster.publish_tags()
    cluster.create_claim_with_pod("live", wid, "us-a-n0")
    cluster.create_claim_with_pod("late", "job-0123abcd", "us-a-n1")
    await ctl.converge(orphan_claims_key(NS, wid), orphan_claims_key(NS, "job-0123abcd"))

    assert cluster.claims() == {"live"}
    assert cluster.terminating_pods() == {"late-pod"}
    assert state(cluster, "job") == ALLOCATED
