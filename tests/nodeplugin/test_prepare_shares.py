"""Prepare of core claims (core sharing) against the fake API server with the feature on (a
1.36+ server), with real CDI and checkpoint files: claims allocated on cores of one device get
disjoint cores, a whole-device claim and core claims exclude each other, a release makes room,
and the kubelet's answer carries each allocation's shareID."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio
from kubernetes_asyncio import client
from neuron_dra.common.constants import CAPACITY_LOGICAL_CORES
from neuron_dra.common.k8s.client import KubeClient
from neuron_dra.common.k8s.clock import InstantClock
from neuron_dra.common.profiles import PROFILES
from neuron_dra.nodeplugin.discovery.model import NeuronDevice, NodeInventory
from neuron_dra.nodeplugin.kubeletapi import ClaimRef, PrepareResult
from neuron_dra.nodeplugin.prepare import checkpoint as ckpt
from neuron_dra.nodeplugin.prepare import metadata
from neuron_dra.nodeplugin.prepare.budget import PrepareLimits
from neuron_dra.nodeplugin.prepare.cdi import spec_file_name
from neuron_dra.nodeplugin.prepare.node import PrepareNode
from neuron_dra.nodeplugin.prepare.preparer import Preparer
from neuron_dra.nodeplugin.publish.slices import build_resource_slices
from neuron_dra.sim.fakeapi.server import FakeAPIServer
from prometheus_client import CollectorRegistry

NODE = "trn2-node-0"
DRIVER = "neuron.aws.com"
BOOT = "b00710d0-0000-4000-8000-000000000001"


def inventory() -> NodeInventory:
    p = PROFILES["trn2.48xlarge"]
    return NodeInventory(
        node_name=NODE,
        instance_type="trn2.48xlarge",
        driver_version="2.24.7.0",
        devices=tuple(
            NeuronDevice(index=i, dev_path=f"/dev/neuron{i}", core_count=p.cores_per_device)
            for i in range(p.device_count)
        ),
    )


class Env:
    def __init__(self, api: FakeAPIServer, kube: KubeClient, root: Path) -> None:
        self.api = api
        self.kube = kube
        self.root = root
        api.core.consumable_capacity = True  # DRAConsumableCapacity on (1.36+)
        (root / "boot_id").write_text(BOOT + "\n")
        self.inventory = inventory()
        slices = build_resource_slices(
            self.inventory, node_name=NODE, node_uid="node-uid", node_labels={},
            dra_driver_version="0.1.0", generation=0, core_sharing=True,
        )  # fmt: skip
        self.published = {d["name"]: d["attributes"] for s in slices for d in s["spec"]["devices"]}
        self.n = 0

    def preparer(self, **kw: Any) -> Preparer:
        return Preparer(
            self.kube,
            node_name=NODE,
            cdi_root=self.root / "cdi",
            checkpoint_path=self.root / "plugins" / DRIVER / "checkpoint.json",
            node=lambda: PrepareNode(self.inventory),
            published=lambda: self.published,
            clock=InstantClock(start=1000.0),
            boot_id_path=self.root / "boot_id",
            limits=PrepareLimits(budget=30.0, attempts=5, backoff_base=0.1),
            registry=CollectorRegistry(),
            **kw,
        )

    def claim(self, device: int, cores: int | None, *, config: list[Any] | None = None) -> ClaimRef:
        """An allocated claim as the 1.37 scheduler leaves it on a sharable device: ``cores``
        logical cores (None: asked nothing, so the whole device, the policy's default)."""
        self.n += 1
        request: dict[str, Any] = {"deviceClassName": "neuron.aws.com"}
        if cores is not None:
            request["capacity"] = {"requests": {CAPACITY_LOGICAL_CORES: str(cores)}}
        created = self.api.create(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"c{self.n}", "namespace": "default"},
                "spec": {"devices": {"requests": [{"name": "r", "exactly": request}]}},
            }
        )
        consumed = {CAPACITY_LOGICAL_CORES: str(cores or 4), "cores": "0", "memory": "0"}
        created["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "r", "driver": DRIVER, "pool": NODE,
                            "device": f"neurondevice{device}",
                            "shareID": f"00000000-0000-4000-8000-{self.n:012d}",
                            "consumedCapacity": consumed,
                        }
                    ],
                    "config": config or [],
                }
            }
        }  # fmt: skip
        created = self.api.update_status(created)
        meta = created["metadata"]
        return ClaimRef(meta["namespace"], meta["uid"], meta["name"])

    def env_of(self, ref: ClaimRef) -> dict[str, str]:
        spec = json.loads((self.root / "cdi" / spec_file_name(ref.uid)).read_text())
        return dict(e.split("=", 1) for e in spec["containerEdits"]["env"])


@pytest_asyncio.fixture
async def env(
    fake_apiserver: FakeAPIServer, kube_api_client: client.ApiClient, tmp_path: Path
) -> AsyncIterator[Env]:
    yield Env(fake_apiserver, KubeClient(kube_api_client), tmp_path)


def ok(result: PrepareResult) -> PrepareResult:
    assert result.error == "", result.error
    return result


async def test_core_claims_on_one_device_get_cores_of_their_own(env: Env) -> None:
    p = env.preparer()
    a, b, c, d = env.claim(3, 1), env.claim(3, 1), env.claim(3, 2), env.claim(5, 1)
    ok((await p.prepare([a]))[a.uid])
    # Several in one call (a pod with several claims): each beside those before it.
    results = await p.prepare([b, c, d])
    (device,) = ok(results[c.uid]).devices
    assert device.share_id == "00000000-0000-4000-8000-000000000003"
    cores = {ref.uid: env.env_of(ref)["NEURON_RT_VISIBLE_CORES"] for ref in (a, b, c, d)}
    assert cores == {a.uid: "12", b.uid: "13", c.uid: "14-15", d.uid: "20"}
    recorded = ckpt.load(env.root / "plugins" / DRIVER / "checkpoint.json", boot_id=BOOT)
    shares = {uid: e.share for uid, e in recorded.checkpoint.claims.items()}
    assert shares[c.uid] == ckpt.CoreShare(3, 2, 2, 4)


async def test_the_device_metadata_file_shows_the_shares_cores(env: Env) -> None:
    p = env.preparer(device_metadata=True)
    a, b = env.claim(3, 1), env.claim(3, 2)
    for ref in (a, b):
        ok((await p.prepare([ref]))[ref.uid])
    path = env.root / "plugins" / DRIVER / metadata.HOST_SUBDIR / f"{b.uid}_r.json"
    (doc, _) = metadata.decode(path.read_text())
    ((device,),) = [r["devices"] for r in doc["requests"]]
    attrs = device["attributes"]
    assert attrs["neuron.aws.com/visibleCores"] == {"string": "14-15"}
    assert attrs["neuron.aws.com/logicalCoreCount"] == {"int": 2}
    assert env.env_of(b)["NEURON_RT_VISIBLE_CORES"] == "14-15"


async def test_whole_device_and_core_claims_wait_for_each_other(env: Env) -> None:
    p = env.preparer()
    share = env.claim(3, 1)
    ok((await p.prepare([share]))[share.uid])
    whole = env.claim(3, None)
    refused = (await p.prepare([whole]))[whole.uid].error
    assert "neurondevice3 has cores prepared for ResourceClaim default/c1" in refused
    # The share's claim deallocated (its pod gone) before the kubelet unprepared it: the
    # whole-device claim is prepared, the share released in the same write.
    env.api.delete("resource.k8s.io/v1", "ResourceClaim", "c1", "default")
    (device,) = ok((await p.prepare([whole]))[whole.uid]).devices
    assert device.share_id is not None
    assert env.env_of(whole)["NEURON_RT_VISIBLE_CORES"] == "12-15"
    late = env.claim(3, 2)
    refused = (await p.prepare([late]))[late.uid].error
    assert "neurondevice3 is already prepared for ResourceClaim default/c2" in refused


async def test_fragmented_cores_are_a_retryable_refusal(env: Env) -> None:
    p = env.preparer()
    refs = [env.claim(3, 1) for _ in range(3)]
    for ref in refs:
        ok((await p.prepare([ref]))[ref.uid])
    assert (await p.unprepare([refs[1]]))[refs[1].uid].error == ""
    pair = env.claim(3, 2)
    refused = (await p.prepare([pair]))[pair.uid].error
    assert "fragmented" in refused and "waits until a share of the device ends" in refused
    assert (await p.unprepare([refs[0]]))[refs[0].uid].error == ""
    ok((await p.prepare([pair]))[pair.uid])
    assert env.env_of(pair)["NEURON_RT_VISIBLE_CORES"] == "12-13"


async def test_a_share_at_another_lnc_is_refused_for_good(env: Env) -> None:
    config = [
        {
            "source": "FromClaim",
            "opaque": {
                "driver": DRIVER,
                "parameters": {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig",
                               "logicalNeuronCore": 1},
            },
        }
    ]  # fmt: skip
    ref = env.claim(3, 1, config=config)
    refused = (await env.preparer().prepare([ref]))[ref.uid].error
    assert "logicalNeuronCore 1" in refused and "remove the NeuronConfig" in refused
