"""The simulated control plane against the fake API server with real kubelet plugins.

Two emulated nodes (trn2.48xlarge, trn1.32xlarge) each run ``KubeletPlugin`` in-process; the
simulated kubelets register them over their real sockets. Pods reference ResourceClaimTemplates
and go through the whole path: claim creation, structured allocation, binding, prepare (CDI
specs on disk), Running with CDI ids recorded, and back on deletion.

Conditions are awaited by bounded polling of the fake server's in-process state.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest_asyncio
from kubernetes_asyncio import client as k8s
from neuron_dra.common.k8s.client import KubeClient
from neuron_dra.nodeplugin.kubeletapi.model import PreparedDevice
from neuron_dra.nodeplugin.plugin import KubeletPlugin, PluginConfig
from neuron_dra.sim.allocation import allocate
from neuron_dra.sim.controlplane import (
    CDI_DEVICES_ANNOTATION,
    DELETE_PROTECTION_FINALIZER,
    POD_CLAIM_NAME_ANNOTATION,
    ControlPlane,
    container_cdi_devices,
    ensure_device_classes,
)
from neuron_dra.sim.controlplane.claims import generate_name
from neuron_dra.sim.controlplane.podsets import PodSet
from neuron_dra.sim.fakeapi.server import FakeAPIServer
from neuron_dra.sim.scratch import work_dir

DRIVER = "neuron.aws.com"
G4 = "resource.aws.com/devicegroup4_id"
NS = "default"
STEP = 20.0  # generous bound for one awaited condition on a loaded 2-core machine
NODES = {"trn2-0": "trn2.48xlarge", "trn1-0": "trn1.32xlarge"}
T = TypeVar("T")


@dataclass
class Sim:
    api: FakeAPIServer
    kube: KubeClient
    cp: ControlPlane
    roots: dict[str, Path]

    def cdi_dir(self, node: str) -> Path:
        return self.roots[node] / "cdi"

    def pod(self, name: str) -> dict[str, Any] | None:
        return self.api.get("v1", "Pod", name, NS)

    def claim(self, name: str) -> dict[str, Any] | None:
        return self.api.get("resource.k8s.io/v1", "ResourceClaim", name, NS)

    def claims(self) -> list[dict[str, Any]]:
        return self.api.list("resource.k8s.io/v1", "ResourceClaim", NS)

    def events(self, pod: str, reason: str) -> list[dict[str, Any]]:
        return [
            e
            for e in self.api.list("events.k8s.io/v1", "Event", NS)
            if e["regarding"].get("name") == pod and e["reason"] == reason
        ]

    def claim_of(self, pod: dict[str, Any], pod_claim: str = "neurons") -> dict[str, Any]:
        (status,) = [s for s in pod["status"]["resourceClaimStatuses"] if s["name"] == pod_claim]
        claim = self.claim(status["resourceClaimName"])
        assert claim is not None
        return claim


async def until(fn: Callable[[], T | None], what: str, limit: float = STEP) -> T:
    """Poll ``fn`` (the fake server's in-process state) until it returns something truthy."""
    deadline = time.monotonic() + limit
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def template(name: str, count: int, *, selector: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER, "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "metadata": {"labels": {"app": "sim-test"}},
            "spec": {
                "devices": {
                    "requests": [{"name": "neurons", "exactly": exactly}],
                    "constraints": [{"requests": ["neurons"], "matchAttribute": G4}],
                }
            },
        },
    }


def pod_spec(template_name: str) -> dict[str, Any]:
    return {
        "resourceClaims": [{"name": "neurons", "resourceClaimTemplateName": template_name}],
        "containers": [
            {"name": "main", "image": "trainer:1", "resources": {"claims": [{"name": "neurons"}]}},
            {"name": "sidecar", "image": "logger:1"},
        ],
    }


def pod(name: str, template_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": pod_spec(template_name),
    }


def devices_of(claim: dict[str, Any]) -> list[str]:
    results = claim["status"]["allocation"]["devices"]["results"]
    return sorted((r["device"] for r in results), key=lambda d: int(d.removeprefix("neurondevice")))


def row(first: int) -> list[str]:
    return [f"neurondevice{i}" for i in range(first, first + 4)]


def running(sim: Sim, name: str) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        p = sim.pod(name)
        return p if p and p["status"].get("phase") == "Running" else None

    return check


@pytest_asyncio.fixture
async def sim(fake_apiserver: FakeAPIServer, kube_api_client: k8s.ApiClient) -> AsyncIterator[Sim]:
    kube = KubeClient(kube_api_client)
    roots: dict[str, Path] = {}
    plugins: list[KubeletPlugin] = []
    try:
        for node_name, instance_type in NODES.items():
            # Unix socket paths must stay short: not under pytest's tmp_path.
            root = roots[node_name] = work_dir("cp", Path("/tmp"))
            (root / "boot_id").write_text("boot-1\n")
            fake_apiserver.create(
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name}}
            )
            plugin = KubeletPlugin(
                PluginConfig(
                    node_name=node_name,
                    cdi_root=root / "cdi",
                    registrar_dir=root / "plugins_registry",
                    plugins_dir=root / "plugins",
                    emulation_mode=instance_type,
                    http_host="127.0.0.1",
                    http_port=0,
                    boot_id_path=root / "boot_id",
                    opt_root=None,
                ),
                kube,
            )
            await plugin.start()
            plugins.append(plugin)
        await ensure_device_classes(kube)
        cp = ControlPlane(
            kube, registrar_dirs={n: r / "plugins_registry" for n, r in roots.items()}
        )
        async with cp:
            await asyncio.wait_for(
                asyncio.gather(*(k.registered.wait() for k in cp.kubelets.values())), STEP
            )
            await until(
                lambda: len(fake_apiserver.list("resource.k8s.io/v1", "ResourceSlice")) >= 2,
                "both nodes' ResourceSlices",
            )
            yield Sim(fake_apiserver, kube, cp, roots)
    finally:
        for plugin in reversed(plugins):
            with contextlib.suppress(Exception):
                await plugin.stop()
        for root in roots.values():
            shutil.rmtree(root, ignore_errors=True)


async def test_pod_with_template_gets_a_row_and_runs(sim: Sim) -> None:
    sim.api.create(template("row", 4))
    sim.api.create(pod("trainer", "row"))

    got = await until(running(sim, "trainer"), "pod trainer Running")
    assert got["spec"]["nodeName"] == "trn1-0"  # nodes are tried in name order
    claim = sim.claim_of(got)

    # The claim: generated name, template labels, annotation, owned by the pod.
    meta = claim["metadata"]
    assert meta["name"].startswith("trainer-neurons-") and len(meta["name"]) == 21
    assert meta["labels"] == {"app": "sim-test"}
    assert meta["annotations"][POD_CLAIM_NAME_ANNOTATION] == "neurons"
    (owner,) = meta["ownerReferences"]
    assert owner["uid"] == got["metadata"]["uid"]
    assert owner["controller"] is True and owner["blockOwnerDeletion"] is True

    # Allocated on one connected row of the node the pod was bound to, reserved for the pod.
    assert devices_of(claim) == row(0)
    terms = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    assert terms[0]["matchFields"][0]["values"] == ["trn1-0"]
    assert claim["status"]["reservedFor"] == [
        {"resource": "pods", "name": "trainer", "uid": got["metadata"]["uid"]}
    ]

    # Prepared: the plugin's CDI spec exists, and the container that references the claim
    # got its CDI ids (the sidecar, which does not, is not listed).
    uid = claim["metadata"]["uid"]
    spec_file = sim.cdi_dir("trn1-0") / f"k8s.neuron.aws.com-claim_{uid}.json"
    assert spec_file.exists()
    cdi = json.loads(got["metadata"]["annotations"][CDI_DEVICES_ANNOTATION])
    assert list(cdi) == ["main"]
    assert cdi["main"] and all(i.startswith("k8s.neuron.aws.com/claim=") for i in cdi["main"])
    assert {c["type"]: c["status"] for c in got["status"]["conditions"]}["Ready"] == "True"
    assert [c["name"] for c in got["status"]["containerStatuses"]] == ["main", "sidecar"]


async def test_seven_connected_on_trn1_stays_pending_with_the_allocator_message(
    sim: Sim,
) -> None:
    trn1 = "device.attributes['neuron.aws.com'].instanceType == 'trn1.32xlarge'"
    sim.api.create(template("seven", 7, selector=trn1))
    sim.api.create(pod("greedy", "seven"))

    (event,) = await until(lambda: sim.events("greedy", "FailedScheduling"), "FailedScheduling")
    assert event["type"] == "Warning"
    # Exactly what the shared allocator says for this claim on this cluster.
    claim = sim.claim_of(await until(lambda: sim.pod("greedy"), "pod"))
    expected = allocate(
        claim["spec"],
        classes={
            c["metadata"]["name"]: c for c in sim.api.list("resource.k8s.io/v1", "DeviceClass")
        },
        slices=sim.api.list("resource.k8s.io/v1", "ResourceSlice"),
        allocated=set(),
    )
    assert event["note"] == str(expected)
    assert "no 7 share" in event["note"]

    def unschedulable() -> dict[str, Any] | None:
        p = sim.pod("greedy")
        conds = {c["type"]: c for c in (p or {}).get("status", {}).get("conditions", [])}
        return conds.get("PodScheduled") if p else None

    cond = await until(unschedulable, "PodScheduled=False")
    assert cond["status"] == "False" and cond["reason"] == "Unschedulable"
    assert cond["message"] == event["note"]
    p = sim.pod("greedy")
    assert p is not None and not p["spec"].get("nodeName")
    assert p["status"]["phase"] == "Pending"
    assert "allocation" not in (sim.claim_of(p).get("status") or {})


async def test_delete_unprepares_and_frees_the_devices(sim: Sim) -> None:
    # Two trn1 rows would leave room for a second pod: ask for 16 (the whole node) instead.
    trn1 = "device.attributes['neuron.aws.com'].instanceType == 'trn1.32xlarge'"
    whole = template("whole", 16, selector=trn1)
    whole["spec"]["spec"]["devices"]["constraints"] = []
    sim.api.create(whole)
    sim.api.create(pod("first", "whole"))
    first = await until(running(sim, "first"), "first Running")
    claim = sim.claim_of(first)
    spec_file = sim.cdi_dir("trn1-0") / f"k8s.neuron.aws.com-claim_{claim['metadata']['uid']}.json"
    assert spec_file.exists()

    sim.api.create(pod("second", "whole"))
    await until(lambda: sim.events("second", "FailedScheduling"), "second unschedulable")

    sim.api.delete("v1", "Pod", "first", NS)
    await until(lambda: not spec_file.exists(), "first's CDI spec removed (unprepared)")
    await until(lambda: sim.claim(claim["metadata"]["name"]) is None, "claim garbage-collected")
    second = await until(running(sim, "second"), "second Running on the freed devices")
    assert second["spec"]["nodeName"] == "trn1-0"
    assert len(devices_of(sim.claim_of(second))) == 16


async def test_a_claim_with_a_driver_the_node_lacks_is_prepared_with_no_driver(sim: Sim) -> None:
    # Another driver's device on trn1-0 (no kubelet plugin of it runs there), claimed together
    # with a Neuron device: scheduled, but the kubelet finds no plugin for it and prepares
    # nothing, so nothing has to be unprepared when the pod goes.
    other = "nic.test.example"
    sim.api.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": other},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{other}"'}}]},
        }
    )
    sim.api.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"trn1-0-{other}"},
            "spec": {
                "driver": other,
                "nodeName": "trn1-0",
                "pool": {"name": "trn1-0", "generation": 0, "resourceSliceCount": 1},
                "devices": [{"name": "nic0"}],
            },
        }
    )
    both = template("both", 1)
    both["spec"]["spec"]["devices"]["requests"].append(
        {"name": "nic", "exactly": {"deviceClassName": other}}
    )
    sim.api.create(both)
    sim.api.create(pod("mixed", "both"))
    (event,) = await until(
        lambda: sim.events("mixed", "FailedPrepareDynamicResources"), "the prepare failure"
    )
    assert event["note"] == f"DRA driver {other} is not registered"
    p = sim.pod("mixed")
    assert p is not None and p["spec"]["nodeName"] == "trn1-0"
    claim = sim.claim_of(p)
    assert {r["driver"] for r in claim["status"]["allocation"]["devices"]["results"]} == {
        DRIVER,
        other,
    }
    assert not list(sim.cdi_dir("trn1-0").glob("*.json")), "no driver prepared anything"
    sim.api.delete("v1", "Pod", "mixed", NS)
    await until(lambda: sim.pod("mixed") is None, "the pod gone")
    await until(lambda: sim.claim(claim["metadata"]["name"]) is None, "its claim gone")
    assert not sim.events("mixed", "FailedUnprepareDynamicResources")


def running_set(sim: Sim, workload: PodSet) -> Callable[[], list[dict[str, Any]] | None]:
    """The workload's pods not being deleted, once it has all it wants and they are Running."""

    def check() -> list[dict[str, Any]] | None:
        pods = [
            p
            for p in sim.api.list("v1", "Pod", NS, label_selector=workload.label_selector)
            if not p["metadata"].get("deletionTimestamp")
        ]
        if len(pods) != workload.expected:
            return None
        return pods if all(p["status"].get("phase") == "Running" for p in pods) else None

    return check


async def test_replica_set_pods_get_disjoint_rows_and_are_replaced_at_once(sim: Sim) -> None:
    trn2 = "device.attributes['neuron.aws.com'].instanceType == 'trn2.48xlarge'"
    sim.api.create(template("row2", 4, selector=trn2))
    rs = await sim.cp.replica_set(
        NS, "workers", 2, {"metadata": {"labels": {"app": "w"}}, "spec": pod_spec("row2")}
    )
    pods = await until(running_set(sim, rs), "2 workers Running")
    # Named by the server from generateName <deployment>-<pod-template-hash>-, as a real
    # Deployment's pods are.
    for p in pods:
        prefix, template_hash, suffix = p["metadata"]["name"].rsplit("-", 2)
        assert (prefix, len(suffix)) == ("workers", 5), p["metadata"]["name"]
        assert p["metadata"]["labels"]["pod-template-hash"] == template_hash
    assert all(p["metadata"]["labels"]["sim.neuron.aws.com/replicaset"] == "workers" for p in pods)
    rows = [devices_of(sim.claim_of(p)) for p in pods]
    assert all(p["spec"]["nodeName"] == "trn2-0" for p in pods)
    assert sorted(rows) == [row(0), row(4)]
    assert all(p["metadata"]["labels"]["app"] == "w" for p in pods)
    assert rs.pod_names() == sorted(p["metadata"]["name"] for p in pods)

    # A deleted replica is replaced by a new pod (another name) and gets a row again; the
    # deleted one is Terminating until its kubelet has unprepared its claim.
    old, kept = pods
    sim.api.delete("v1", "Pod", old["metadata"]["name"], NS)

    def replaced() -> list[dict[str, Any]] | None:
        now = running_set(sim, rs)()
        names = {p["metadata"]["name"] for p in now or []}
        return now if now and old["metadata"]["name"] not in names else None

    again = await until(replaced, "a replacement Running")
    (new,) = [p for p in again if p["metadata"]["uid"] != kept["metadata"]["uid"]]
    assert devices_of(sim.claim_of(new)) != devices_of(sim.claim_of(kept))
    await until(lambda: sim.pod(old["metadata"]["name"]) is None, "the old pod gone")
    # Only the live pods' claims remain.
    await until(lambda: len(sim.claims()) == 2, "the old claim garbage-collected")


async def test_replica_set_scales_down_and_up(sim: Sim) -> None:
    trn2 = "device.attributes['neuron.aws.com'].instanceType == 'trn2.48xlarge'"
    sim.api.create(template("row2", 4, selector=trn2))
    rs = await sim.cp.replica_set(NS, "scaled", 3, {"spec": pod_spec("row2")})
    three = await until(running_set(sim, rs), "3 pods Running")
    rs.scale(1)
    (left,) = await until(running_set(sim, rs), "1 pod left")
    assert left["metadata"]["uid"] in {p["metadata"]["uid"] for p in three}
    await until(lambda: len(sim.claims()) == 1, "the deleted pods' claims gone")
    rs.scale(2)
    assert len(await until(running_set(sim, rs), "2 pods Running")) == 2


async def test_group_of_four_fills_the_trn2_rows(sim: Sim) -> None:
    trn2 = "device.attributes['neuron.aws.com'].instanceType == 'trn2.48xlarge'"
    sim.api.create(template("row2", 4, selector=trn2))
    group = await sim.cp.group(NS, "lws", {"spec": pod_spec("row2")}, size=4)
    pods = [await until(running(sim, n), f"{n} Running") for n in group.pod_names()]
    rows = sorted((devices_of(sim.claim_of(p)) for p in pods), key=lambda r: (len(r[0]), r[0]))
    assert rows == [row(i) for i in (0, 4, 8, 12)]
    leader, *workers = pods
    assert leader["metadata"]["name"] == "lws-0"
    assert leader["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    assert all(
        w["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/leader-name"] == "lws-0"
        and w["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/size"] == "4"
        for w in workers
    )
    keys = {p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-key"] for p in pods}
    assert len(keys) == 1

    # A fifth pod asking for a trn2 row waits; removing the group lets it run.
    sim.api.create(pod("late", "row2"))
    await until(lambda: sim.events("late", "FailedScheduling"), "late unschedulable")
    await sim.cp.remove(group)
    await until(running(sim, "late"), "late Running once the group is gone")


def shared_claim(name: str, count: int, selector: str) -> dict[str, Any]:
    exactly = {
        "deviceClassName": DRIVER,
        "count": count,
        "selectors": [{"cel": {"expression": selector}}],
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "neurons", "exactly": exactly}]}},
    }


def pod_using(name: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "resourceClaims": [{"name": "neurons", "resourceClaimName": claim}],
            "containers": [
                {"name": "main", "image": "x", "resources": {"claims": [{"name": "neurons"}]}}
            ],
        },
    }


async def test_a_claim_in_use_is_deleted_only_once_its_pod_is_gone(sim: Sim) -> None:
    trn1 = "device.attributes['neuron.aws.com'].instanceType == 'trn1.32xlarge'"
    sim.api.create(shared_claim("shared", 1, trn1))
    sim.api.create(pod_using("user", "shared"))
    await until(running(sim, "user"), "user Running")
    claim = sim.claim("shared")
    assert claim is not None
    # The scheduler protected the claim when it allocated it.
    assert claim["metadata"]["finalizers"] == [DELETE_PROTECTION_FINALIZER]
    assert claim["status"]["allocation"] and claim["status"]["reservedFor"]

    sim.api.delete("resource.k8s.io/v1", "ResourceClaim", "shared", NS)
    held = sim.claim("shared")
    assert held is not None and held["metadata"].get("deletionTimestamp")
    assert held["status"]["reservedFor"] and held["status"]["allocation"]
    # A new pod cannot start using a claim being deleted.
    sim.api.create(pod_using("late", "shared"))
    (event,) = await until(lambda: sim.events("late", "FailedScheduling")[:1], "late refused")
    assert "being deleted" in event["note"]

    sim.api.delete("v1", "Pod", "user", NS)
    await until(lambda: sim.pod("user") is None, "user gone once its kubelet stopped it")
    await until(lambda: sim.claim("shared") is None, "the claim released, then removed")


async def test_an_unused_claim_is_deallocated_and_unprotected(sim: Sim) -> None:
    trn1 = "device.attributes['neuron.aws.com'].instanceType == 'trn1.32xlarge'"
    sim.api.create(shared_claim("kept", 1, trn1))
    sim.api.create(pod_using("user", "kept"))
    await until(running(sim, "user"), "user Running")
    sim.api.delete("v1", "Pod", "user", NS)

    def released() -> dict[str, Any] | None:
        c = sim.claim("kept")
        return c if c and not c["metadata"].get("finalizers") else None

    claim = await until(released, "the finalizer removed")
    assert not claim["status"].get("reservedFor") and not claim["status"].get("allocation")
    assert sim.pod("user") is None


async def test_a_pod_without_its_kubelet_stays_terminating_and_is_replaced_at_once(
    sim: Sim,
) -> None:
    trn2 = "device.attributes['neuron.aws.com'].instanceType == 'trn2.48xlarge'"
    sim.api.create(template("row2", 4, selector=trn2))
    rs = await sim.cp.replica_set(NS, "lonely", 1, {"spec": pod_spec("row2")})
    (old,) = await until(running_set(sim, rs), "the pod Running")
    await sim.cp.kubelets["trn2-0"].stop()  # the node dies
    sim.api.delete("v1", "Pod", old["metadata"]["name"], NS)

    def replacement() -> dict[str, Any] | None:
        pods = sim.api.list("v1", "Pod", NS, label_selector=rs.label_selector)
        new = [p for p in pods if p["metadata"]["uid"] != old["metadata"]["uid"]]
        return new[0] if new and new[0]["spec"].get("nodeName") else None

    new = await until(replacement, "a replacement created and scheduled")
    stuck = sim.pod(old["metadata"]["name"])
    assert stuck is not None and stuck["metadata"]["deletionTimestamp"]
    assert stuck["metadata"]["deletionGracePeriodSeconds"] == 30
    # Its claim stays reserved and allocated: the devices may still be in use.
    claim = sim.claim_of(stuck)
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [old["metadata"]["uid"]]
    assert devices_of(sim.claim_of(new)) != devices_of(claim)
    assert rs.pod_names() == [new["metadata"]["name"]]


async def test_group_is_recreated_as_a_whole_when_one_pod_is_deleted(sim: Sim) -> None:
    trn2 = "device.attributes['neuron.aws.com'].instanceType == 'trn2.48xlarge'"
    sim.api.create(template("row2", 4, selector=trn2))
    group = await sim.cp.group(NS, "g", {"spec": pod_spec("row2")}, size=2)
    before = {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in await until(running_set(sim, group), "the group Running")
    }
    sim.api.delete("v1", "Pod", "g-1", NS)

    def recreated() -> list[dict[str, Any]] | None:
        pods = running_set(sim, group)()
        if not pods or any(p["metadata"]["uid"] in before.values() for p in pods):
            return None
        return pods

    pods = await until(recreated, "both pods recreated and Running")
    assert sorted(p["metadata"]["name"] for p in pods) == ["g-0", "g-1"]


async def test_group_without_recreation_replaces_only_the_deleted_pod(sim: Sim) -> None:
    trn2 = "device.attributes['neuron.aws.com'].instanceType == 'trn2.48xlarge'"
    sim.api.create(template("row2", 4, selector=trn2))
    group = await sim.cp.group(NS, "g", {"spec": pod_spec("row2")}, size=2, restart_policy="None")
    before = {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in await until(running_set(sim, group), "the group Running")
    }
    sim.api.delete("v1", "Pod", "g-1", NS)

    def replaced() -> list[dict[str, Any]] | None:
        pods = running_set(sim, group)()
        uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods or []}
        return pods if pods and uids.get("g-1") not in (None, before["g-1"]) else None

    pods = await until(replaced, "g-1 recreated and Running")
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}["g-0"] == before["g-0"]


def test_container_cdi_devices_follow_claim_and_request_references() -> None:
    def dev(name: str, request: str) -> PreparedDevice:
        return PreparedDevice((request,), "pool", name, (f"k8s.neuron.aws.com/claim={name}",))

    prepared = {"a": [dev("d0", "x"), dev("d1", "y")], "b": [dev("d2", "z")]}
    spec = {
        "initContainers": [{"name": "init", "resources": {"claims": [{"name": "b"}]}}],
        "containers": [
            {"name": "all", "resources": {"claims": [{"name": "a"}, {"name": "b"}]}},
            {"name": "only-y", "resources": {"claims": [{"name": "a", "request": "y"}]}},
            {"name": "none"},
        ],
    }
    assert container_cdi_devices({"spec": spec}, prepared) == {
        "init": ["k8s.neuron.aws.com/claim=d2"],
        "all": [f"k8s.neuron.aws.com/claim=d{i}" for i in range(3)],
        "only-y": ["k8s.neuron.aws.com/claim=d1"],
    }


def test_generated_claim_names_stay_within_63_characters() -> None:
    assert generate_name("trainer", "neurons") == "trainer-neurons-"
    long = generate_name("p" * 60, "c" * 30)
    assert len(long) == 56 and long.startswith("ppp") and long.endswith("cc-")
