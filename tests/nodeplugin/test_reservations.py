"""ReservationWatcher against the fake API server over real HTTP, alone and wired to the
SlicePublisher and the Preparer the way the kubelet plugin wires them.

NeuronUltraServers are written in-process (as the controller would, through the status
subresource); every wait is on the watcher's own progress (its reflector has applied the
object's resourceVersion, its leader lookups have finished) or the publisher's, with a safety
timeout, never on sleeps.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from neuron_dra.common.constants import (
    ATTR_WORKLOAD_ID,
    DRIVER_NAMESPACE,
    LABEL_INSTANCE_TYPE,
    LABEL_WORKLOAD_ID,
    NODE_DEVICE_NAME,
)
from neuron_dra.common.k8s.client import KubeClient, object_key
from neuron_dra.common.k8s.clock import InstantClock
from neuron_dra.common.ultraserver import (
    Reservation,
    ReservationError,
    UltraServerPeers,
    workload_id,
)
from neuron_dra.nodeplugin.discovery.emulation import scan_emulated, write_emulated_tree
from neuron_dra.nodeplugin.discovery.model import NodeInventory
from neuron_dra.nodeplugin.kubeletapi import ClaimRef
from neuron_dra.nodeplugin.prepare.cdi import spec_file_name
from neuron_dra.nodeplugin.prepare.node import PrepareNode
from neuron_dra.nodeplugin.prepare.preparer import Preparer
from neuron_dra.nodeplugin.publish.metrics import PublisherMetrics
from neuron_dra.nodeplugin.publish.publisher import SlicePublisher
from neuron_dra.nodeplugin.reservations import (
    LookupPolicy,
    ReservationWatcher,
    choose_reservation,
    node_address,
    workload_ids_for,
)
from neuron_dra.sim.fakeapi.server import FakeAPIServer
from prometheus_client import CollectorRegistry

NODE = "ip-10-0-0-2.us-west-2.compute.internal"
PEER = "ip-10-0-0-1.us-west-2.compute.internal"
LEADER = "ip-10-0-1-1.us-west-2.compute.internal"
OTHER = "ip-10-0-9-9.us-west-2.compute.internal"
NUS = ("neuron.aws.com/v1beta1", "NeuronUltraServer")
DRIVER = "neuron.aws.com"
WID = workload_id("train", "0b7c8a2e-0000-4000-8000-000000000001")
OTHER_WID = workload_id("infer", "0b7c8a2e-0000-4000-8000-000000000002")
WAIT = 10.0  # safety net only


def entry(
    nodes: list[str],
    *,
    wid: str = WID,
    ref: str = "ml/train",
    index: int = 0,
    leader: str | None = LEADER,
    phase: str = "Reserved",
    at: str = "2026-01-01T10:00:00Z",
) -> dict[str, Any]:
    e: dict[str, Any] = {
        "workloadRef": ref,
        "workloadId": wid,
        "allocatedNodes": nodes,
        "nodeCount": len(nodes),
        "ultraserverIndex": index,
        "phase": phase,
        "allocatedAt": at,
    }
    if leader is not None:
        e["leaderNodeName"] = leader
    return e


class Env:
    def __init__(self, server: FakeAPIServer, kube: KubeClient) -> None:
        self.server = server
        self.kube = kube
        self.registry = CollectorRegistry()
        self.clock = InstantClock()
        self.watchers: list[ReservationWatcher] = []

    def watcher(self, on_change: Callable[[], None] = lambda: None) -> ReservationWatcher:
        w = ReservationWatcher(
            self.kube,
            node_name=NODE,
            on_change=on_change,
            clock=self.clock,
            lookup=LookupPolicy(attempts=3, backoff_base=0.5, request_timeout=5.0),
            registry=self.registry,
        )
        self.watchers.append(w)
        return w

    async def started(self, on_change: Callable[[], None] = lambda: None) -> ReservationWatcher:
        w = self.watcher(on_change)
        w.start()
        async with asyncio.timeout(WAIT):
            await w.wait_synced()
        return w

    def node(
        self, name: str, addresses: list[tuple[str, str]] | None = None, **labels: str
    ) -> None:
        obj = self.server.create(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
        )
        if addresses is not None:
            # Like the kubelet: addresses live in status, written through its subresource.
            obj["status"] = {"addresses": [{"type": t, "address": a} for t, a in addresses]}
            self.server.update_status(obj)

    def nus(self, name: str, *allocations: dict[str, Any]) -> dict[str, Any]:
        """Create or replace a NeuronUltraServer with these status.allocations."""
        members = {n for a in allocations for n in a["allocatedNodes"]}
        obj = self.server.get(*NUS, name, DRIVER_NAMESPACE)
        if obj is None:
            obj = self.server.create(
                {
                    "apiVersion": NUS[0],
                    "kind": NUS[1],
                    "metadata": {"name": name, "namespace": DRIVER_NAMESPACE},
                    "spec": {
                        "instanceType": "trn2u.48xlarge",
                        "topology": [
                            {"nodeName": n, "nodeId": i} for i, n in enumerate(sorted(members))
                        ],
                    },
                }
            )
        obj["status"] = {"allocations": list(allocations)}
        return self.server.update_status(obj)

    def delete_nus(self, name: str) -> None:
        self.server.delete(*NUS, name, DRIVER_NAMESPACE)

    def gauge(self) -> float | None:
        return self.registry.get_sample_value("neuron_dra_node_ultraserver_reservations")


@pytest_asyncio.fixture
async def env(
    fake_apiserver: FakeAPIServer, kube_api_client: client.ApiClient
) -> AsyncIterator[Env]:
    e = Env(fake_apiserver, KubeClient(kube_api_client))
    try:
        yield e
    finally:
        for w in e.watchers:
            await w.stop()


async def seen(w: ReservationWatcher, obj: Mapping[str, Any] | None, *, gone: str = "") -> None:
    """Wait until the watcher has applied ``obj``'s version (or, with ``gone``, the deletion
    of that key). Handlers run before the reflector reports progress, so after this returns
    the watcher has reacted to the event."""

    def applied() -> bool:
        if gone:
            return w.store.get(gone) is None
        assert obj is not None
        cached = w.store.get(object_key(obj))
        rv = obj["metadata"]["resourceVersion"]
        return cached is not None and cached["metadata"]["resourceVersion"] == rv

    async with asyncio.timeout(WAIT):
        await w.reflector.wait_until(applied)


class Counter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


# --- the watcher alone ---------------------------------------------------------------------


async def test_on_change_fires_once_per_change_of_this_nodes_entries(env: Env) -> None:
    count = Counter()
    w = await env.started(count)
    assert (w.reservation(), w.workload_ids(), count.calls) == (None, {}, 0)

    # An UltraServer whose allocations name other nodes only: nothing to do here.
    obj = env.nus("us-a", entry([OTHER], wid=OTHER_WID, ref="ml/infer"))
    await seen(w, obj)
    assert count.calls == 0

    obj = env.nus("us-a", entry([OTHER], wid=OTHER_WID, ref="ml/infer"), entry([PEER, NODE]))
    await seen(w, obj)
    assert count.calls == 1
    r = w.reservation()
    assert r is not None
    assert (r.ultraserver, r.workload_id, r.node_index, r.topology_size) == ("us-a", WID, 1, 2)
    assert w.workload_ids() == {"node": WID}
    assert env.gauge() == 1

    # The other node's entry changes, in the same object: not our change.
    obj = env.nus(
        "us-a", entry([OTHER], wid=OTHER_WID, ref="ml/infer", phase="Active"), entry([PEER, NODE])
    )
    await seen(w, obj)
    # The same entries listed in another order: the record did not change either.
    obj = env.nus(
        "us-a", entry([PEER, NODE]), entry([OTHER], wid=OTHER_WID, ref="ml/infer", phase="Active")
    )
    await seen(w, obj)
    # Another UltraServer entirely.
    other = env.nus("us-b", entry([OTHER + "-b"], wid=OTHER_WID, ref="ml/infer", index=1))
    await seen(w, other)
    assert count.calls == 1

    obj = env.nus("us-a", entry([PEER, NODE], phase="Active"))  # an earlier version's word
    await seen(w, obj)
    assert count.calls == 2
    r = w.reservation()
    assert r is not None and r.phase == "Bound"  # read in today's words

    # Releasing: still recorded, but the tags must go so the controller can finish.
    obj = env.nus("us-a", entry([PEER, NODE], phase="Releasing"))
    await seen(w, obj)
    assert count.calls == 3
    assert w.workload_ids() == {}

    env.delete_nus("us-b")
    await seen(w, None, gone=f"{DRIVER_NAMESPACE}/us-b")
    assert count.calls == 3
    env.delete_nus("us-a")
    await seen(w, None, gone=f"{DRIVER_NAMESPACE}/us-a")
    assert count.calls == 4
    assert (w.reservation(), w.workload_ids(), env.gauge()) == (None, {}, 0)
    assert w.changes == count.calls


async def test_reservation_present_before_start_is_known_once_synced(env: Env) -> None:
    env.nus("us-a", entry([NODE, PEER], index=2))
    count = Counter()
    w = await env.started(count)
    # Synced means the handlers have seen the initial list: a publisher started now tags.
    assert count.calls == 1
    assert w.workload_ids() == {"node": WID}
    r = w.reservation()
    assert r is not None and r.rank == 4  # unit 2 of size 2, first node


async def test_inconsistent_record_keeps_the_node_reserved_for_the_earliest(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    w = await env.started()
    env.nus("us-a", entry([NODE], at="2026-01-01T10:00:00Z"))
    with caplog.at_level(logging.ERROR, logger="neuron_dra.nodeplugin.reservations"):
        obj = env.nus(
            "us-b", entry([NODE], wid=OTHER_WID, ref="ml/infer", at="2026-01-01T09:00:00Z")
        )
        await seen(w, obj)
    assert w.workload_ids() == {"node": OTHER_WID}
    assert env.gauge() == 2
    assert [r.workload_id for r in w.entries()] == [OTHER_WID, WID]
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "named by 2" in record.getMessage()
    assert WID in record.getMessage() and OTHER_WID in record.getMessage()

    # The earlier one is being released: the node must pass to the other, not become free.
    obj = env.nus(
        "us-b",
        entry([NODE], wid=OTHER_WID, ref="ml/infer", at="2026-01-01T09:00:00Z", phase="Releasing"),
    )
    await seen(w, obj)
    assert w.workload_ids() == {"node": WID}


def _entry(
    wid: str, *, at: datetime | None, phase: str = "Reserved", us: str = "us-a"
) -> Reservation:
    return Reservation(us, f"ml/{wid}", wid, 0, 1, NODE, 0, NODE, phase, at)


def test_choose_reservation_is_independent_of_order() -> None:
    t = datetime(2026, 1, 1, tzinfo=UTC)
    a = _entry("a", at=t + timedelta(minutes=1))
    b = _entry("b", at=t)
    undated = _entry("c", at=None)
    for entries in ([a, b, undated], [undated, b, a]):
        chosen = choose_reservation(entries)
        assert chosen is not None and chosen.workload_id == "b"
    # Undated entries lose to dated ones; among undated, names decide.
    chosen = choose_reservation([undated, _entry("d", at=None, us="us-0")])
    assert chosen is not None and chosen.workload_id == "d"
    released = _entry("b", at=t, phase="Releasing")
    chosen = choose_reservation([released])
    assert chosen is not None and workload_ids_for(chosen) == {}
    assert choose_reservation([]) is None


def test_node_address_preference() -> None:
    def node(*addresses: tuple[str, str]) -> dict[str, Any]:
        return {"status": {"addresses": [{"type": t, "address": a} for t, a in addresses]}}

    assert node_address(node(("InternalIP", "10.0.0.1"), ("InternalDNS", "a.internal"))) == (
        "a.internal"
    )
    assert node_address(node(("InternalIP", "10.0.0.1"), ("Hostname", "a"))) == "a"
    assert node_address(node(("ExternalIP", "1.2.3.4"), ("InternalIP", "10.0.0.1"))) == ("10.0.0.1")
    assert node_address(node(("ExternalIP", "1.2.3.4"))) is None
    assert node_address({}) is None


async def test_topology_for_the_reserved_workload_only(env: Env) -> None:
    env.node(LEADER, [("InternalIP", "10.0.1.1"), ("InternalDNS", "leader.ec2.internal")])
    w = await env.started()
    obj = env.nus("us-a", entry([PEER, NODE], index=3))
    await seen(w, obj)
    async with asyncio.timeout(WAIT):
        await w.wait_lookups()

    peers = w.topology(WID)
    assert peers == UltraServerPeers(
        ultraserver_index=3, topology_size=2, node_index=1, leader_host="leader.ec2.internal"
    )
    assert peers.global_topo_id == 7
    # Devices tagged for a workload with no entry naming this node (a stale tag, after a
    # release or a move): refused, never prepared without a rank.
    with pytest.raises(ReservationError, match=f"holds no reservation for workload {OTHER_WID}"):
        w.topology(OTHER_WID)
    assert w.topology(None) is None
    assert env.clock.sleeps == []


async def test_leader_lookup_falls_back_to_the_node_name(env: Env) -> None:
    env.node(PEER, [])  # lists no address
    w = await env.started()
    obj = env.nus(
        "us-a",
        entry([NODE], leader=LEADER),
        entry([PEER], wid=OTHER_WID, ref="ml/infer", leader=PEER),
    )
    await seen(w, obj)
    async with asyncio.timeout(WAIT):
        await w.wait_lookups()
    peers = w.topology(WID)
    assert peers is not None and peers.leader_host == LEADER  # Node not found
    assert w.leader_host(PEER) == PEER

    # No leaderNodeName recorded: rank 0 is the first node of the workload's unit 0.
    obj = env.nus("us-a", entry([PEER, NODE], leader=None))
    await seen(w, obj)
    peers = w.topology(WID)
    assert peers is not None and (peers.leader_host, peers.global_topo_id) == (PEER, 1)

    # Neither recorded nor derivable: the claim fails (and is retried) rather than getting a
    # container without its rank-0 host.
    obj = env.nus("us-a", entry([NODE], leader=None, index=1))
    await seen(w, obj)
    with pytest.raises(ReservationError, match=f"leader node of workload {WID} is unknown"):
        w.topology(WID)


async def test_leader_lookup_retries_then_caches_per_reservation(env: Env) -> None:
    env.node(LEADER, [("InternalIP", "10.0.1.1")])
    env.server.faults.fail_next(2, 503, verb="get", resource="nodes")
    w = await env.started()
    obj = env.nus("us-a", entry([NODE]))
    await seen(w, obj)
    async with asyncio.timeout(WAIT):
        await w.wait_lookups()
    assert w.leader_host(LEADER) == "10.0.1.1"
    assert env.clock.sleeps == [0.5, 1.0]
    gets = env.server.request_counts[("get", "nodes")]

    # Unrelated changes reuse the cached address: no further GET.
    obj = env.nus("us-a", entry([NODE], phase="Active"))
    await seen(w, obj)
    await w.wait_lookups()
    assert env.server.request_counts[("get", "nodes")] == gets

    # Released and reserved again later: looked up afresh (the address may have changed).
    env.delete_nus("us-a")
    await seen(w, None, gone=f"{DRIVER_NAMESPACE}/us-a")
    node = env.server.get("v1", "Node", LEADER)
    assert node is not None
    node["status"]["addresses"] = [{"type": "InternalDNS", "address": "leader.ec2.internal"}]
    env.server.update_status(node)
    obj = env.nus("us-a", entry([NODE], wid=OTHER_WID, ref="ml/infer"))
    await seen(w, obj)
    async with asyncio.timeout(WAIT):
        await w.wait_lookups()
    assert w.leader_host(LEADER) == "leader.ec2.internal"


async def test_leader_lookup_does_not_retry_a_permanent_error(env: Env) -> None:
    env.node(LEADER, [("InternalIP", "10.0.1.1")])
    env.server.faults.fail_next(1, 403, verb="get", resource="nodes")
    w = await env.started()
    await seen(w, env.nus("us-a", entry([NODE])))
    async with asyncio.timeout(WAIT):
        await w.wait_lookups()
    assert w.leader_host(LEADER) == LEADER
    assert env.clock.sleeps == []


# --- wired to the publisher and the preparer -------------------------------------------------


def ultraserver_config(nodes: int) -> dict[str, Any]:
    return {
        "source": "FromClass",
        "requests": ["node"],
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": "neuron.aws.com/v1",
                "kind": "UltraServerConfig",
                "ultraserverMode": nodes,
            },
        },
    }


def node_claim(server: FakeAPIServer, name: str, *, label: str | None) -> ClaimRef:
    """An allocated claim for the whole node, as one generated from the workload's RCT."""
    labels = {LABEL_WORKLOAD_ID: label} if label is not None else {}
    created = server.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ml", "labels": labels},
            "spec": {
                "devices": {"requests": [{"name": "node", "exactly": {"deviceClassName": DRIVER}}]}
            },
        }
    )
    created["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "node", "driver": DRIVER, "pool": NODE, "device": NODE_DEVICE_NAME}
                ],
                "config": [ultraserver_config(2)],
            }
        }
    }
    meta = server.update_status(created)["metadata"]
    return ClaimRef(namespace="ml", uid=meta["uid"], name=meta["name"])


def tags(server: FakeAPIServer) -> dict[str, str | None]:
    """workloadId of every device this node publishes (None: untagged)."""
    out: dict[str, str | None] = {}
    for s in server.list("resource.k8s.io/v1", "ResourceSlice"):
        if s["spec"].get("nodeName") != NODE:
            continue
        for d in s["spec"]["devices"]:
            out[d["name"]] = (d.get("attributes", {}).get(ATTR_WORKLOAD_ID) or {}).get("string")
    return out


async def test_tags_follow_the_record_and_prepare_uses_them(env: Env, tmp_path: Path) -> None:
    env.server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
    env.node(NODE, [("InternalIP", "10.0.0.2")], **{LABEL_INSTANCE_TYPE: "trn2u.48xlarge"})
    env.node(LEADER, [("InternalIP", "10.0.1.1"), ("InternalDNS", "leader.ec2.internal")])
    # Node id 1 of its UltraServer: in a 2-node unit it pairs with node 0 (PEER).
    paths = write_emulated_tree(
        tmp_path / "emu",
        "trn2u.48xlarge",
        node_name=NODE,
        ultraserver_id="us-a",
        ultraserver_node_id=1,
    )
    inventory: NodeInventory = scan_emulated(paths, node_name=NODE)
    assert inventory.ultraserver is not None and inventory.ultraserver.node_id_2 == 1

    publisher: SlicePublisher | None = None

    def republish() -> None:
        if publisher is not None:
            publisher.request_sync()

    watcher = await env.started(republish)
    publisher = SlicePublisher(
        env.kube,
        node_name=NODE,
        dra_driver_version="0.1.0",
        inventory=lambda: inventory,
        workload_ids=watcher.workload_ids,
        metrics=PublisherMetrics(CollectorRegistry()),
    )
    boot_id = tmp_path / "boot_id"
    boot_id.write_text("b00710d0-0000-4000-8000-000000000001\n")
    preparer = Preparer(
        env.kube,
        node_name=NODE,
        cdi_root=tmp_path / "cdi",
        checkpoint_path=tmp_path / "plugin" / "checkpoint.json",
        node=lambda: PrepareNode(inventory),
        published=publisher.published_devices,
        topology=watcher.topology,
        registry=CollectorRegistry(),
        boot_id_path=boot_id,
    )
    publisher.start()
    try:
        async with asyncio.timeout(WAIT):
            await publisher.published.wait()
        untagged = tags(env.server)
        assert NODE_DEVICE_NAME in untagged and len(untagged) == 17
        assert set(untagged.values()) == {None}

        # The controller books (PEER, NODE) as unit 1 of the workload; its unit 0 (and the
        # leader) is on another UltraServer.
        env.nus("us-a", entry([PEER, NODE], index=1))
        env.nus("us-b", entry([LEADER, LEADER + "-b"], index=0))
        async with asyncio.timeout(WAIT):
            await publisher.wait_until(lambda: set(tags(env.server).values()) == {WID})
            await watcher.wait_lookups()
        assert len(tags(env.server)) == 17  # every device and neuronnode

        await preparer.start()
        unlabelled = node_claim(env.server, "stray", label=None)
        foreign = node_claim(env.server, "other", label=OTHER_WID)
        mine = node_claim(env.server, "train-0", label=WID)
        results = await preparer.prepare([unlabelled, foreign])
        for ref, belongs in ((unlabelled, "no workload"), (foreign, f"workload {OTHER_WID}")):
            error = results[ref.uid].error
            assert f"reserved for workload {WID}" in error, error
            assert belongs in error, error
            assert not (tmp_path / "cdi" / spec_file_name(ref.uid)).exists()

        result = (await preparer.prepare([mine]))[mine.uid]
        assert result.error == "", result.error
        spec = json.loads((tmp_path / "cdi" / spec_file_name(mine.uid)).read_text())
        env_vars = dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
        us = inventory.ultraserver
        assert env_vars["NEURON_GLOBAL_TOPOID"] == "3"  # unit 1 x size 2 + node index 1
        assert env_vars["NEURON_GLOBAL_TOPOID0_HOST"] == "leader.ec2.internal"
        assert env_vars["NEURON_RT_ULTRASERVER_MODE"] == "3"  # 2 nodes over vertical links
        assert env_vars["NEURON_RT_ULTRASERVER_SERVER_ID"] == us.server_id_2
        assert env_vars["NEURON_RT_ULTRASERVER_NODE_ID"] == "1"

        # Released: the record loses the entry and every tag goes.
        env.nus("us-a")
        async with asyncio.timeout(WAIT):
            await publisher.wait_until(lambda: set(tags(env.server).values()) == {None})
        assert watcher.reservation() is None
    finally:
        await preparer.drain()
        await publisher.stop()
