"""The real kubectl (a subprocess) against the fake API server."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
import yaml
from neuron_dra.sim.fakeapi.server import FakeAPIServer

pytestmark = [
    pytest.mark.kubectl,
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not on PATH"),
]

WORKLOAD = """\
apiVersion: neuron.aws.com/v1beta1
kind: NeuronUltraServerWorkload
metadata:
  name: my-training-job
spec:
  instanceType: trn3pds.48xlarge
  topologySize: 4
  serverCount: 2
  allocationPolicy:
    failureStrategy: NoOp
  resourceClaimTemplate:
    name: my-training-job-rct
"""


class Kubectl:
    def __init__(self, server: FakeAPIServer, tmp: Path) -> None:
        self.kubeconfig = tmp / "kubeconfig"
        server.write_kubeconfig(self.kubeconfig)
        self.cache = tmp / "cache"  # discovery cache per test: ports are reused
        self.tmp = tmp

    async def __call__(self, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
        # A subprocess, awaited: the fake server runs on this same event loop.
        proc = await asyncio.create_subprocess_exec(
            "kubectl", "--kubeconfig", str(self.kubeconfig), "--cache-dir", str(self.cache),
            *args,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(60):
            out, err = await proc.communicate(stdin.encode() if stdin is not None else None)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    async def ok(self, *args: str, stdin: str | None = None) -> str:
        code, out, err = await self(*args, stdin=stdin)
        assert code == 0, f"kubectl {' '.join(args)} failed: {err}"
        return out

    def file(self, name: str, text: str) -> str:
        path = self.tmp / name
        path.write_text(text)
        return str(path)


@pytest.fixture
def kubectl(fake_apiserver: FakeAPIServer, tmp_path: Path) -> Kubectl:
    return Kubectl(fake_apiserver, tmp_path)


async def test_workload_lifecycle(kubectl: Kubectl, fake_apiserver: FakeAPIServer) -> None:
    path = kubectl.file("w.yaml", WORKLOAD)
    out = await kubectl.ok("apply", "-f", path)
    assert "neuronultraserverworkload.neuron.aws.com/my-training-job created" in out
    assert "unchanged" in await kubectl.ok("apply", "-f", path)

    table = await kubectl.ok("get", "nusw")
    header = table.splitlines()[0].split()
    assert header == ["NAME", "STATE", "TYPE", "SIZE", "SERVERS", "NODES", "AGE"]
    row = table.splitlines()[1].split()
    assert row[:4] == ["my-training-job", "trn3pds.48xlarge", "4", "2"]

    doc = yaml.safe_load(await kubectl.ok("get", "nusw", "my-training-job", "-o", "yaml"))
    assert doc["spec"]["topologySize"] == 4
    assert "kubectl.kubernetes.io/last-applied-configuration" in doc["metadata"]["annotations"]

    await kubectl.ok("label", "nusw", "my-training-job", "team=ml")
    await kubectl.ok("patch", "nusw", "my-training-job", "--type", "merge",
                     "-p", '{"spec":{"allocationPolicy":{"failureStrategy":"RestartAll"}}}')
    stored = fake_apiserver.get("neuron.aws.com/v1beta1", "nusw", "my-training-job",
                                "default")
    assert stored is not None
    assert stored["metadata"]["labels"] == {"team": "ml"}
    assert stored["spec"]["allocationPolicy"]["failureStrategy"] == "RestartAll"
    assert stored["metadata"]["generation"] == 2

    names = await kubectl.ok("get", "nusw", "-l", "team=ml", "-o", "name")
    assert names.strip() == "neuronultraserverworkload.neuron.aws.com/my-training-job"

    out = await kubectl.ok("delete", "nusw", "my-training-job")
    assert "deleted" in out
    assert fake_apiserver.get("neuron.aws.com/v1beta1", "nusw", "my-training-job",
                              "default") is None


async def test_invalid_workload_is_rejected(kubectl: Kubectl) -> None:
    bad = WORKLOAD.replace("topologySize: 4", "topologySize: 3")
    code, _, err = await kubectl("apply", "-f", kubectl.file("bad.yaml", bad))
    assert code != 0
    assert "spec.topologySize" in err
    assert "topologySize must be 1, 2 or 4" in err


async def test_unknown_field_rejected_by_strict_validation(kubectl: Kubectl) -> None:
    bad = WORKLOAD.replace("serverCount: 2", "serverCount: 2\n  bogus: 1")
    code, _, err = await kubectl("create", "-f", kubectl.file("bad.yaml", bad))
    assert code != 0
    assert 'unknown field "spec.bogus"' in err


async def test_server_side_apply_and_builtins(kubectl: Kubectl,
                                              fake_apiserver: FakeAPIServer) -> None:
    path = kubectl.file("w.yaml", WORKLOAD)
    assert "serverside-applied" in await kubectl.ok("apply", "--server-side", "-f", path)
    stored = fake_apiserver.get("neuron.aws.com/v1beta1", "nusw", "my-training-job",
                                "default")
    assert stored is not None
    assert stored["metadata"]["managedFields"][0]["manager"] == "kubectl"

    node = kubectl.file("node.yaml", "apiVersion: v1\nkind: Node\nmetadata:\n  name: n1\n"
                                     "  labels: {a: '1'}\n")
    await kubectl.ok("apply", "-f", node)
    await kubectl.ok("label", "node", "n1", "b=2")  # strategic merge patch for built-ins
    await kubectl.ok("apply", "-f", node)  # three-way merge keeps the label kubectl added
    n1 = fake_apiserver.get("v1", "Node", "n1")
    assert n1 is not None and n1["metadata"]["labels"] == {"a": "1", "b": "2"}
    out = await kubectl.ok("get", "nodes")
    assert out.splitlines()[0].split() == ["NAME", "STATUS", "AGE", "VERSION"]
    # (`kubectl create configmap` would send protobuf, which the fake does not speak; files
    # go through the dynamic client as JSON.)
    await kubectl.ok("create", "-n", "kube-system", "-f", kubectl.file(
        "cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  k: v\n"))
    cm = yaml.safe_load(await kubectl.ok("get", "cm", "c", "-n", "kube-system", "-o", "yaml"))
    assert cm["data"] == {"k": "v"}
    assert "c" in await kubectl.ok("get", "cm", "-A")
    assert "neuronultraserverworkloads" in await kubectl.ok("api-resources")


async def test_get_watch_prints_table_rows(kubectl: Kubectl,
                                           fake_apiserver: FakeAPIServer) -> None:
    fake_apiserver.create({
        "apiVersion": "neuron.aws.com/v1beta1", "kind": "NeuronUltraServerWorkload",
        "metadata": {"name": "first", "namespace": "default"},
        "spec": {"instanceType": "trn2u.48xlarge", "topologySize": 2, "serverCount": 1}})
    proc = await asyncio.create_subprocess_exec(
        "kubectl", "--kubeconfig", str(kubectl.kubeconfig), "--cache-dir", str(kubectl.cache),
        "get", "nusw", "-w", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(30):
            header = (await proc.stdout.readline()).decode().split()
            assert header[:3] == ["NAME", "STATE", "TYPE"]
            assert (await proc.stdout.readline()).decode().split()[0] == "first"
            # Only now is the watch certainly established; a new object must stream in.
            fake_apiserver.create({
                "apiVersion": "neuron.aws.com/v1beta1", "kind": "NeuronUltraServerWorkload",
                "metadata": {"name": "second", "namespace": "default"},
                "spec": {"instanceType": "trn2u.48xlarge", "topologySize": 1,
                         "serverCount": 1}})
            line = (await proc.stdout.readline()).decode().split()
            assert line[:2] == ["second", "trn2u.48xlarge"]
    finally:
        proc.kill()
        await proc.wait()
