"""The product as users install it, on real nodes: the image built from the Dockerfile
(``hack/build-image --local``: buildah, a base made from Debian's packages) is imported into
every node's containerd, ``helm install`` of the chart with emulation values runs the plugin
DaemonSet and the controller Deployment as pods started by the real kubelets, with the
chart's default host paths and security contexts, on the pod network; then the seed's
UltraServer workload runs end to end, as on EKS (docs/testing.md, "The installed product").
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e.operator import NAME, RCT, deployment, seed_workload
from neuron_dra.sim.realcluster import RealControlPlane
from neuron_dra.sim.realnode.fleet import RealNodeFleet
from neuron_dra.sim.realnode.podspec import for_real_nodes
from neuron_dra.sim.worlds import require_real_nodes

from .conftest import Helm, Overrides
from .realchart import NS, ChartOnCluster, control_plane, minor_params, require_image

INSTANCE_TYPE = "trn2u.48xlarge"
#: One UltraServer: the plugin derives the UltraServer from the node name (trn2u-<n>: node
#: n % 4 of UltraServer trn2u-<n // 4>), as emulation does on any cluster.
NODES = [f"trn2u-{i}" for i in range(4)]
#: values.yaml: --leader-elect takes a Lease of this name in the release namespace.
LEASE = "neuron-dra-controller"


@dataclass
class Installed:
    cp: RealControlPlane
    chart: ChartOnCluster
    image: str

    def kubectl(self, *args: str, check: bool = True) -> str:
        return self.cp.kubectl(*args, check=check)

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def pods(self, selector: str, namespace: str = NS) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.json("get", "pods", "-n", namespace, "-l", selector)[
            "items"
        ]
        return items

    def exec(self, pod: dict[str, Any], *argv: str) -> str:
        ns = pod["metadata"]["namespace"]
        return self.kubectl("exec", "-n", ns, pod["metadata"]["name"], "--", *argv)


def wait_for(what: str, check: Any, limit: float = 180.0) -> Any:
    deadline = time.monotonic() + limit
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out after {limit:g} s waiting for {what}"
        time.sleep(0.5)  # the state of pods other processes run, polled as kubectl wait does


@pytest.fixture(scope="module", params=minor_params())
def installed(request: pytest.FixtureRequest, helm: Helm) -> Iterator[Installed]:
    minor = request.param
    archive, image = require_image()
    require_real_nodes(minor)
    # A short directory: each node's containerd socket is reached by a path under it.
    workdir = Path(tempfile.mkdtemp(prefix="ndra-inst-", dir="/tmp"))
    with control_plane(minor) as cp:
        fleet = RealNodeFleet(cp, workdir=workdir / "nodes", extra_images=[archive])
        try:
            fleet.start([(n, {"node.kubernetes.io/instance-type": INSTANCE_TYPE}) for n in NODES])
            chart = ChartOnCluster(helm, cp)
            repository, _, tag = image.rpartition(":")
            chart.install(
                Overrides.of(
                    f"image.repository={repository}",
                    f"image.tag={tag}",
                    # Nothing is pulled: the image is the one each node imported.
                    "image.pullPolicy=Never",
                    "kubeletPlugin.emulation.enabled=true",
                    f"kubeletPlugin.emulation.instanceType={INSTANCE_TYPE}",
                )
            )
            yield Installed(cp, chart, image)
        finally:
            fleet.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_the_plugin_runs_on_every_node_and_publishes(installed: Installed) -> None:
    selector = "app.kubernetes.io/component=kubelet-plugin"
    pods = wait_for(
        "a Ready plugin pod on every node",
        lambda: (
            (p := installed.pods(selector))
            and sorted(x["spec"]["nodeName"] for x in p if ready(x)) == NODES
            and p
        ),
    )
    for pod in pods:
        assert pod["spec"]["containers"][0]["image"] == installed.image
        assert not pod["spec"].get("hostNetwork"), "the chart's plugin is on the pod network"
        assert pod["status"]["podIP"].startswith("198.18.")
    slices = wait_for(
        "a slice per node",
        lambda: (
            (
                s := [
                    x
                    for x in installed.json("get", "resourceslices")["items"]
                    if x["spec"]["driver"] == "neuron.aws.com"
                ]
            )
            and sorted(x["spec"]["nodeName"] for x in s) == NODES
            and s
        ),
    )
    for s in slices:
        assert len(s["spec"]["devices"]) >= 16, s["metadata"]["name"]


def test_the_controller_runs_two_replicas_with_one_leader(installed: Installed) -> None:
    selector = "app.kubernetes.io/component=controller"
    pods = wait_for(
        "2 Ready controller pods",
        lambda: (p := [x for x in installed.pods(selector) if ready(x)]) and len(p) == 2 and p,
    )
    names = {p["metadata"]["name"] for p in pods}
    lease = wait_for(
        "the controller's Lease held",
        lambda: (
            (
                x := json.loads(
                    installed.kubectl(
                        "get", "lease", "-n", NS, LEASE, "-o", "json", check=False
                    )
                    or "{}"
                )
            )
            .get("spec", {})
            .get("holderIdentity")
            and x
        ),
    )
    holder = lease["spec"]["holderIdentity"]
    assert any(holder.startswith(n) for n in names), (holder, names)


@pytest.mark.parametrize(("component", "uid"), [("kubelet-plugin", "0"), ("controller", "65532")])
def test_the_image_runs_as_the_chart_says(installed: Installed, component: str, uid: str) -> None:
    pods = wait_for(
        f"a Ready {component} pod",
        lambda: [x for x in installed.pods(f"app.kubernetes.io/component={component}") if ready(x)],
    )
    probe = (
        "import os, sys\n"
        "print(os.getuid(), os.getgid())\n"
        "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0])\n"
        "try:\n"
        "    open('/written', 'w')\n"
        "    print('root writable')\n"
        "except OSError as e:\n"
        "    print('root read-only' if e.errno == 30 else e)\n"
        "try:\n"
        "    import neuron_dra.sim\n"
        "    print('sim present')\n"
        "except ImportError:\n"
        "    print('no sim')\n"
    )
    lines = installed.exec(pods[0], "python", "-c", probe).split("\n")
    assert lines[0] == f"{uid} {uid}"
    assert lines[1] == "0000000000000000", "no capabilities (the chart drops ALL)"
    assert lines[2] == "root read-only"
    assert lines[3] == "no sim", "the simulation is never in the product image"


def test_the_seed_workload_runs_on_the_installed_product(installed: Installed) -> None:
    workload = seed_workload()
    workload["spec"]["serverCount"] = 1
    pods_doc = for_real_nodes(deployment())
    pods_doc["spec"]["replicas"] = 4
    # Off the host network: in-cluster, as on EKS (the image is the seed's, imported).
    pods_doc["spec"]["template"]["spec"].pop("hostNetwork", None)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "seed.yaml"
        path.write_text(yaml.safe_dump_all([workload]))
        installed.kubectl("apply", "-f", str(path))
        wait_for(
            "the workload Allocated",
            lambda: (
                (
                    json.loads(installed.kubectl("get", "nusw", NAME, "-o", "json")).get("status")
                    or {}
                ).get("state")
                == "Allocated"
            ),
        )
        wait_for(
            "the generated template",
            lambda: installed.kubectl(
                "get", "resourceclaimtemplate", RCT, "--ignore-not-found", "-o", "name"
            ),
        )
        path.write_text(yaml.safe_dump(pods_doc))
        installed.kubectl("apply", "-f", str(path))
    selector = "app=ultraserver-training"
    pods = wait_for(
        "4 training pods Running",
        lambda: (
            (p := installed.pods(selector, "default"))
            and len([x for x in p if x["status"].get("phase") == "Running"]) == 4
            and p
        ),
    )
    assert sorted(p["spec"]["nodeName"] for p in pods) == NODES
    ranks = set()
    for pod in pods:
        listing = installed.exec(pod, "ls", "-l", "/dev/").splitlines()
        devices = [line for line in listing if line.split()[-1].startswith("neuron")]
        assert len(devices) == 16 and all(line.startswith("c") for line in devices), listing
        out = installed.exec(pod, "env")
        env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        assert env["NEURON_RT_VISIBLE_CORES"], env
        ranks.add(env["NEURON_GLOBAL_TOPOID"])
    assert ranks == {"0", "1", "2", "3"}
    installed.kubectl("delete", "deployment", pods_doc["metadata"]["name"], "--wait=false")
    installed.kubectl("delete", "nusw", NAME, "--wait=false")
