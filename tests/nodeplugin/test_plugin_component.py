"""The whole kubelet plugin against the fake API server, driven over its real sockets.

``KubeletPlugin`` runs in-process on an emulated node; a kubelet-side client finds it in the
registration directory, registers it and prepares claims created in the fake API server the
way the scheduler leaves them (status.allocation). One test also runs the console script as
a subprocess and stops it with SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from kubernetes_asyncio import client as k8s
from neuron_dra.common.k8s.client import KubeClient
from neuron_dra.nodeplugin.kubeletapi import ClaimRef
from neuron_dra.nodeplugin.plugin import KubeletPlugin, PluginConfig
from neuron_dra.sim.fakeapi.server import FakeAPIServer
from neuron_dra.sim.kubeletclient import DraPlugin, KubeletClient
from neuron_dra.sim.scratch import work_dir

DRIVER = "neuron.aws.com"
STEP = 15.0  # generous bound for one awaited condition on a loaded 2-core machine


@dataclass
class Dirs:
    root: Path

    @property
    def registrar(self) -> Path:
        return self.root / "plugins_registry"

    @property
    def plugins(self) -> Path:
        return self.root / "plugins"

    @property
    def cdi(self) -> Path:
        return self.root / "cdi"

    @property
    def boot_id(self) -> Path:
        return self.root / "boot_id"


@pytest.fixture
def dirs() -> Iterator[Dirs]:
    # Unix socket paths must stay under 107 bytes: pytest's tmp_path can be longer.
    root = work_dir("plugin", Path("/tmp"))
    d = Dirs(root)
    d.boot_id.write_text("boot-1\n")
    yield d
    shutil.rmtree(root, ignore_errors=True)


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def config(dirs: Dirs, node_name: str, instance_type: str, **kw: Any) -> PluginConfig:
    return PluginConfig(
        node_name=node_name,
        cdi_root=dirs.cdi,
        registrar_dir=dirs.registrar,
        plugins_dir=dirs.plugins,
        emulation_mode=instance_type,
        http_host="127.0.0.1",
        http_port=0,
        boot_id_path=dirs.boot_id,
        opt_root=None,
        **kw,
    )


@dataclass
class Cluster:
    api: FakeAPIServer
    kube: KubeClient
    dirs: Dirs

    def claim(
        self,
        name: str,
        node_name: str,
        devices: list[str],
        *,
        config: list[dict[str, Any]] | None = None,
        request: str = "neurons",
    ) -> ClaimRef:
        created = self.api.create(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": request,
                                "exactly": {"deviceClassName": DRIVER, "count": len(devices)},
                            }
                        ]
                    }
                },
            }
        )
        created["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": request, "driver": DRIVER, "pool": node_name, "device": d}
                        for d in devices
                    ],
                    "config": config or [],
                }
            }
        }
        created = self.api.update_status(created)
        meta = created["metadata"]
        return ClaimRef(namespace="default", uid=meta["uid"], name=meta["name"])

    def slices(self, node_name: str) -> list[dict[str, Any]]:
        return [
            s
            for s in self.api.list("resource.k8s.io/v1", "ResourceSlice")
            if s["spec"].get("nodeName") == node_name
        ]


@pytest_asyncio.fixture
async def cluster(
    fake_apiserver: FakeAPIServer, kube_api_client: k8s.ApiClient, dirs: Dirs
) -> AsyncIterator[Cluster]:
    yield Cluster(fake_apiserver, KubeClient(kube_api_client), dirs)


@contextlib.asynccontextmanager
async def running(plugin: KubeletPlugin) -> AsyncIterator[KubeletPlugin]:
    await plugin.start()
    try:
        yield plugin
    finally:
        await plugin.stop()


async def register(dirs: Dirs) -> tuple[KubeletClient, DraPlugin]:
    kubelet = KubeletClient(dirs.registrar)
    plugins = await kubelet.register_all()
    assert len(plugins) == 1, plugins
    return kubelet, plugins[0]


def neuron_config(kind: str, **fields: Any) -> dict[str, Any]:
    return {
        "source": "FromClaim",
        "requests": [],
        "opaque": {
            "driver": DRIVER,
            "parameters": {"apiVersion": "neuron.aws.com/v1", "kind": kind, **fields},
        },
    }


def cdi_spec(dirs: Dirs, uid: str) -> dict[str, Any]:
    return dict(json.loads((dirs.cdi / f"k8s.neuron.aws.com-claim_{uid}.json").read_text()))


def spec_env(spec: dict[str, Any]) -> dict[str, str]:
    env = spec.get("containerEdits", {}).get("env", [])
    return dict(e.split("=", 1) for e in env)


def device_paths(spec: dict[str, Any]) -> list[str]:
    return sorted(
        (n["path"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])),
        key=lambda p: int(p.removeprefix("/dev/neuron")),
    )


async def readyz(plugin: KubeletPlugin) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{plugin.http.port}/readyz?verbose") as r,
    ):
        return r.status, await r.text()


async def test_register_publish_prepare_unprepare_v1(cluster: Cluster) -> None:
    cluster.api.create(node("trn2-0"))
    plugin = KubeletPlugin(config(cluster.dirs, "trn2-0", "trn2.48xlarge"), cluster.kube)
    async with running(plugin):
        status, text = await readyz(plugin)
        assert status == 503 and "registered" in text  # not registered yet
        kubelet, dra = await register(cluster.dirs)
        assert dra.service == "v1.DRAPlugin"
        await asyncio.wait_for(plugin.publisher.published.wait(), STEP)
        assert (await readyz(plugin))[0] == 200

        (published,) = cluster.slices("trn2-0")
        names = {d["name"] for d in published["spec"]["devices"]}
        assert names == {f"neurondevice{i}" for i in range(16)}

        # Seed 001's example 1: four connected devices (one torus row) at LNC 1.
        row = [f"neurondevice{i}" for i in range(4, 8)]
        ref = cluster.claim(
            "row", "trn2-0", row, config=[neuron_config("NeuronConfig", logicalNeuronCore=1)]
        )
        got = await dra.prepare([ref])
        assert got[ref.uid].error == ""
        assert sorted(d.device_name for d in got[ref.uid].devices) == sorted(row)
        assert all(d.request_names == ("neurons",) for d in got[ref.uid].devices)
        spec = cdi_spec(cluster.dirs, ref.uid)
        assert device_paths(spec) == [f"/dev/neuron{i}" for i in range(4, 8)]
        # Emulated devices reach the container as complete char device nodes (the emulated
        # host files are placeholders a runtime would refuse to stat as devices).
        nodes = [n for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]]
        assert all(
            n == {"path": f"/dev/neuron{i}", "type": "c", "major": 1, "minor": 3}
            for n, i in zip(nodes, range(4, 8), strict=True)
        )
        env = spec_env(spec)
        assert env["NEURON_RT_VISIBLE_CORES"] == "32-63"
        assert env["NEURON_LOGICAL_NC_CONFIG"] == "1"

        again = await dra.prepare([ref])  # idempotent
        assert again[ref.uid] == got[ref.uid]

        assert (await dra.unprepare([ref]))[ref.uid].error == ""
        assert not (cluster.dirs.cdi / f"k8s.neuron.aws.com-claim_{ref.uid}.json").exists()
        await kubelet.close()


async def test_bad_claims_fail_alone_with_clear_messages(cluster: Cluster) -> None:
    cluster.api.create(node("trn1-0"))
    plugin = KubeletPlugin(config(cluster.dirs, "trn1-0", "trn1.32xlarge"), cluster.kube)
    async with running(plugin):
        kubelet, dra = await register(cluster.dirs)
        await asyncio.wait_for(plugin.publisher.published.wait(), STEP)
        seven = cluster.claim("seven", "trn1-0", [f"neurondevice{i}" for i in range(7)])
        lnc = cluster.claim(
            "lnc",
            "trn1-0",
            ["neurondevice8"],
            config=[neuron_config("NeuronConfig", logicalNeuronCore=2)],
        )
        typo = cluster.claim(
            "typo",
            "trn1-0",
            ["neurondevice9"],
            config=[neuron_config("NeuronConfig", logicalNeuronCores=1)],
        )
        good = cluster.claim("good", "trn1-0", [f"neurondevice{i}" for i in range(12, 16)])
        got = await dra.prepare([seven, lnc, typo, good])
        assert got[seven.uid].error.endswith(
            "Instance type trn1.32xlarge does not support requests for device: 7. "
            "Please request a different number of devices."
        )
        assert "logicalNeuronCore" in got[lnc.uid].error
        assert "logicalNeuronCores" in got[typo.uid].error
        assert got[good.uid].error == ""
        # A device can serve one claim at a time: the second claim names the first.
        other = cluster.claim("other", "trn1-0", [f"neurondevice{i}" for i in range(12, 16)])
        clash = await dra.prepare([other])
        assert "good" in clash[other.uid].error
        await kubelet.close()


async def test_ultraserver_claim_gets_mode_server_and_node_ids(cluster: Cluster) -> None:
    cluster.api.create(node("us-a-2"))
    plugin = KubeletPlugin(
        config(
            cluster.dirs,
            "us-a-2",
            "trn2u.48xlarge",
            emulated_ultraserver_id="us-a",
            emulated_ultraserver_node_id=2,
        ),
        cluster.kube,
    )
    async with running(plugin):
        kubelet, dra = await register(cluster.dirs)
        await asyncio.wait_for(plugin.publisher.published.wait(), STEP)
        (published,) = cluster.slices("us-a-2")
        assert "neuronnode" in {d["name"] for d in published["spec"]["devices"]}
        # Seed 001's example 3: a 4-node UltraServer claim on the whole node.
        ref = cluster.claim(
            "us4",
            "us-a-2",
            ["neuronnode"],
            config=[neuron_config("UltraServerConfig", ultraserverMode=4)],
        )
        got = await dra.prepare([ref])
        assert got[ref.uid].error == ""
        spec = cdi_spec(cluster.dirs, ref.uid)
        assert len(device_paths(spec)) == 16
        env = spec_env(spec)
        assert env["NEURON_RT_ULTRASERVER_MODE"] == "1"  # driver enum for 4 nodes
        assert env["NEURON_RT_ULTRASERVER_NODE_ID"] == "2"
        assert len(env["NEURON_RT_ULTRASERVER_SERVER_ID"]) == 16
        node_labels = cluster.api.get("v1", "Node", "us-a-2")["metadata"]["labels"]
        assert node_labels["neuron.amazonaws.com/ultraserver-mode"] == "1_2_4"
        assert node_labels["neuron.amazonaws.com/ultraserver-node-id-4"] == "2"
        await kubelet.close()


async def test_restart_recovers_and_kubelet_slice_deletion_is_repaired(cluster: Cluster) -> None:
    cluster.api.create(node("trn2-1"))
    cfg = config(cluster.dirs, "trn2-1", "trn2.48xlarge")
    plugin = KubeletPlugin(cfg, cluster.kube)
    async with running(plugin):
        kubelet, dra = await register(cluster.dirs)
        await asyncio.wait_for(plugin.publisher.published.wait(), STEP)
        ref = cluster.claim("keep", "trn2-1", [f"neurondevice{i}" for i in range(8)])
        assert (await dra.prepare([ref]))[ref.uid].error == ""
        await kubelet.close()
    spec_file = cluster.dirs.cdi / f"k8s.neuron.aws.com-claim_{ref.uid}.json"
    spec_file.unlink()  # lost while the plugin was down

    # A new plugin instance (new pod UID) on the same node: the checkpoint survives.
    plugin2 = KubeletPlugin(PluginConfig(**{**cfg.__dict__, "pod_uid": "pod-2"}), cluster.kube)
    async with running(plugin2):
        assert spec_file.exists()  # recreated from the checkpoint before serving
        kubelet, dra = await register(cluster.dirs)
        again = await dra.prepare([ref])
        assert again[ref.uid].error == ""
        await asyncio.wait_for(plugin2.publisher.published.wait(), STEP)
        # The kubelet deletes all of a node's slices when it starts: we publish them again.
        for s in cluster.slices("trn2-1"):
            cluster.api.delete("resource.k8s.io/v1", "ResourceSlice", s["metadata"]["name"])
        await asyncio.wait_for(
            plugin2.publisher.wait_until(lambda: bool(cluster.slices("trn2-1"))), STEP
        )
        await kubelet.close()


async def test_reboot_drops_prepared_claims(cluster: Cluster) -> None:
    cluster.api.create(node("trn2-2"))
    cfg = config(cluster.dirs, "trn2-2", "trn2.48xlarge")
    async with running(KubeletPlugin(cfg, cluster.kube)) as plugin:
        kubelet, dra = await register(cluster.dirs)
        await asyncio.wait_for(plugin.publisher.published.wait(), STEP)
        ref = cluster.claim("before", "trn2-2", ["neurondevice0"])
        assert (await dra.prepare([ref]))[ref.uid].error == ""
        await kubelet.close()
    cluster.dirs.boot_id.write_text("boot-2\n")
    async with running(KubeletPlugin(cfg, cluster.kube)) as plugin:
        assert ref.uid not in plugin.preparer.checkpoint.claims
        assert not (cluster.dirs.cdi / f"k8s.neuron.aws.com-claim_{ref.uid}.json").exists()


async def test_console_script_runs_and_cleans_up_on_sigterm(
    fake_apiserver: FakeAPIServer, dirs: Dirs
) -> None:
    fake_apiserver.create(node("cli-0"))
    kubeconfig = dirs.root / "kubeconfig"
    fake_apiserver.write_kubeconfig(kubeconfig)
    env = {
        **os.environ,
        "NODE_NAME": "cli-0",
        "POD_UID": "pod-cli",
        "CDI_ROOT": str(dirs.cdi),
        "KUBELET_REGISTRAR_DIRECTORY_PATH": str(dirs.registrar),
        "KUBELET_PLUGINS_DIRECTORY_PATH": str(dirs.plugins),
        "NEURON_DRA_DRIVER_EMULATION_MODE": "inf2.48xlarge",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "neuron_dra.nodeplugin.main",
        "--kubeconfig",
        str(kubeconfig),
        "--http-port",
        "0",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert b"http port" in line, line
        reg = dirs.registrar / f"{DRIVER}-pod-cli-reg.sock"
        assert reg.exists()
        kubelet = KubeletClient(dirs.registrar)
        (dra,) = await kubelet.register_all()
        assert dra.endpoint == str(dirs.plugins / DRIVER / "dra-pod-cli.sock")
        await kubelet.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert not (dirs.registrar / f"{DRIVER}-pod-cli-reg.sock").exists()
    assert not (dirs.plugins / DRIVER / "dra-pod-cli.sock").exists()
