"""The product as users install it, on real nodes: the image built from the Dockerfile
(``hack/build-image --local``: buildah, a base made from Debian's packages) is imported into
every node's containerd, the install script users run (``helm upgrade --install`` of the chart
with emulation values; examples/scripts/install-dra-driver.sh) runs the plugin
DaemonSet and the controller Deployment as pods started by the real kubelets, with the
chart's default host paths and security contexts, on the pod network; then the smoke test
users run after an install (examples/scripts/smoke-test.sh, also hack/kind-e2e.sh's check)
passes and the seed's UltraServer workload runs end to end, as on EKS (docs/testing.md, "The
installed product").
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from e2e.operator import NAME, RCT, deployment, seed_workload
from neuron_dra.sim.kubebuild import newest_minor
from neuron_dra.sim.paths import repo_root
from neuron_dra.sim.realcluster import RealControlPlane
from neuron_dra.sim.realnode.fleet import RealNodeFleet
from neuron_dra.sim.realnode.images import ALIASES
from neuron_dra.sim.realnode.podspec import for_real_nodes
from neuron_dra.sim.scratch import work_dir
from neuron_dra.sim.worlds import require_real_nodes

from .conftest import Helm, Overrides
from .realchart import NS, RELEASE, ChartOnCluster, control_plane, minor_params, require_image

INSTANCE_TYPE = "trn2u.48xlarge"
SCRIPTS = repo_root() / "examples" / "scripts"
INSTALL = SCRIPTS / "install-dra-driver.sh"
SMOKE = SCRIPTS / "smoke-test.sh"
#: One UltraServer and one node of a second: the plugin derives the UltraServer from the
#: node name (trn2u-<n>: node n % 4 of UltraServer trn2u-<n // 4>), as emulation does on any
#: cluster. The fifth node's devices stay free for one-device claims while a workload holds
#: the whole first UltraServer.
NODES = [f"trn2u-{i}" for i in range(5)]
ULTRASERVER = NODES[:4]
#: A public image name the nodes serve from their own store (not ``latest``: pulled Always).
SMOKE_IMAGE = next(a for a in ALIASES if not a.endswith(":latest"))
#: values.yaml: --leader-elect takes a Lease of this name in the release namespace.
LEASE = "neuron-dra-controller"


@dataclass
class Installed:
    cp: RealControlPlane
    chart: ChartOnCluster
    image: str
    fleet: RealNodeFleet

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

    def apply(self, *docs: dict[str, Any]) -> None:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir="/tmp") as f:
            yaml.safe_dump_all(list(docs), f)
            f.flush()
            self.kubectl("apply", "-f", f.name)

    def workload(self, name: str) -> Any:
        return self.json("get", "nusw", name)

    def workload_state(self, name: str) -> str | None:
        return (self.workload(name).get("status") or {}).get("state")

    def lease_holder(self) -> str:
        """Who holds the controller's Lease ("" while there is none)."""
        out = self.kubectl("get", "lease", "-n", NS, LEASE, "-o", "json", check=False)
        return str((json.loads(out or "{}").get("spec") or {}).get("holderIdentity") or "")


#: The limit of a wait for a rollout or for pods under load: a bound on being stuck, not on a
#: slow machine (every wait's event is still asserted).
STUCK = 600.0


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
    workdir = work_dir("inst")
    with control_plane(minor) as cp:
        fleet = RealNodeFleet(cp, workdir=workdir / "nodes", extra_images=[archive])
        try:
            fleet.start([(n, {"node.kubernetes.io/instance-type": INSTANCE_TYPE}) for n in NODES])
            chart = ChartOnCluster(helm, cp)
            # As users install it (and hack/kind-e2e.sh does): the install script, which
            # checks the cluster, applies the CRDs, labels the namespace and waits for the
            # pods. Nothing is pulled: the image is the one each node imported.
            chart.run_script(
                INSTALL, "--yes", "--emulation", INSTANCE_TYPE, "--timeout", "4m",
                "--set", "image.pullPolicy=Never", image,
            )  # fmt: skip
            yield Installed(cp, chart, image, fleet)
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
    holder = wait_for("the controller's Lease held", installed.lease_holder)
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


def test_the_smoke_test_passes_on_the_installed_product(installed: Installed) -> None:
    """What a user runs after the install (and hack/kind-e2e.sh runs on kind): a pod with
    four connected devices gets them and its claim is unprepared when it goes."""
    out = installed.chart.run_script(SMOKE, "--image", SMOKE_IMAGE, "--timeout", "120")
    assert "NEURON_RT_VISIBLE_CORES=" in out and out.rstrip().endswith("PASSED"), out


def test_the_seed_workload_runs_on_the_installed_product(installed: Installed) -> None:
    workload = seed_workload()
    workload["spec"]["serverCount"] = 1
    pods_doc = for_real_nodes(deployment())
    pods_doc["spec"]["replicas"] = 4
    # Off the host network: in-cluster, as on EKS (the image is the seed's, imported).
    pods_doc["spec"]["template"]["spec"].pop("hostNetwork", None)
    installed.apply(workload)
    wait_for("the workload Allocated", lambda: installed.workload_state(NAME) == "Allocated")
    wait_for(
        "the generated template",
        lambda: installed.kubectl(
            "get", "resourceclaimtemplate", RCT, "--ignore-not-found", "-o", "name"
        ),
    )
    installed.apply(pods_doc)
    selector = "app=ultraserver-training"
    pods = wait_for(
        "4 training pods Running",
        lambda: (
            (p := installed.pods(selector, "default"))
            and len([x for x in p if x["status"].get("phase") == "Running"]) == 4
            and p
        ),
    )
    assert sorted(p["spec"]["nodeName"] for p in pods) == ULTRASERVER
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
    if tuple(int(p) for p in installed.cp.minor.split(".")[:2]) >= (1, 36):
        # The claims of the generated template carry its opaque config: the API server
        # takes the plugin's status.devices report on them too (it refused every one while
        # our client wrote the config with JSON's spaces).
        for pod in pods:
            (claim_status,) = pod["status"]["resourceClaimStatuses"]
            name = claim_status["resourceClaimName"]

            def reported(name: str = name) -> list[dict[str, Any]]:
                got = installed.json("get", "resourceclaim", name)
                return list((got.get("status") or {}).get("devices") or [])

            entries = wait_for(f"{name}'s status.devices", reported, 60)
            assert [e["conditions"][0]["status"] for e in entries] == ["True"] * len(entries)
    installed.kubectl("delete", "deployment", pods_doc["metadata"]["name"], "--wait=false")
    installed.kubectl("delete", "nusw", NAME, "--wait=false")


# --- helm upgrade and rollback under load ------------------------------------------------

#: Load pods take devices in turn: pod i gets device i % 16 of the free node, so a device is
#: taken again only 16 pods later: the upgrade is judged apart from taking a device again at
#: once (its own test below).
DEVICES = 16


def one_device(k: int) -> dict[str, Any]:
    cel = f"device.attributes['neuron.aws.com'].deviceId == {k}"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"device-{k}", "namespace": "default"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "d",
                            "exactly": {
                                "deviceClassName": "neuron.aws.com",
                                "selectors": [{"cel": {"expression": cel}}],
                            },
                        }
                    ]
                }
            }
        },
    }


def load_pod(i: int) -> dict[str, Any]:
    return device_pod(f"load-{i}", f"device-{i % DEVICES}", {"load": "yes"})


def device_pod(name: str, template: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "neuron", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": "c",
                    "image": "local.test/busybox:1.35",
                    "command": ["sleep", "infinity"],
                    "resources": {"claims": [{"name": "neuron"}]},
                }
            ],
        },
    }


@dataclass
class LoadPod:
    name: str
    created: float  # monotonic, before its create
    running: float | None = None  # monotonic, once it was seen Running


#: How long one pod may take to be Running (a scheduling, a Prepare, a container start): a
#: bound on a stuck Prepare, not on a slow machine (each pod's Running is asserted; the
#: upgrade is judged by its Prepare failures).
POD_RUNNING_LIMIT = "300s"


class Load:
    """Pods with a one-device claim, created, run and deleted in turn while a release
    changes: each must reach Running (its claim prepared by whichever plugin instance the
    kubelet calls). Each pod's times are kept, so the test can tell that the load ran through
    a change (a pod in flight during it, another started after it), however long it took."""

    def __init__(self, installed: Installed) -> None:
        self.installed = installed
        self.pods: list[LoadPod] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=360)

    def ran_since(self, since: float) -> bool:
        """A pod created at or after ``since`` reached Running."""
        return any(p.created >= since and p.running is not None for p in self.pods)

    def in_flight(self, start: float, end: float) -> list[str]:
        """The pods that were on their way to Running at some moment of [start, end]."""
        return [
            p.name
            for p in self.pods
            if p.created <= end and (p.running is None or p.running >= start)
        ]

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            i += 1
            pod = LoadPod(f"load-{i}", time.monotonic())
            self.pods.append(pod)
            try:
                self.installed.apply(load_pod(i))
                self.installed.kubectl(
                    "wait", "--for=jsonpath={.status.phase}=Running", f"pod/{pod.name}",
                    f"--timeout={POD_RUNNING_LIMIT}",
                )  # fmt: skip
                pod.running = time.monotonic()
            except Exception as err:  # every failure is reported
                self.failures.append(f"{pod.name}: {err}")
                if len(self.failures) >= 3:
                    return  # the test fails on them; more would say nothing new
            finally:
                self.installed.kubectl("delete", "pod", pod.name, "--wait=false", check=False)


def test_a_device_taken_again_at_once_is_prepared_without_a_retry(installed: Installed) -> None:
    """Pods one after another on one device, each created as the last is deleted: the
    scheduler gives the device to the new claim as soon as the old one is deallocated, often
    before the kubelet has unprepared the old claim. The plugin releases the old claim
    (deleted in the API) instead of refusing the new one until that Unprepare comes."""
    installed.apply(one_device(DEVICES - 1))
    names = [f"again-{i}" for i in range(5)]
    for name in names:
        installed.apply(device_pod(name, f"device-{DEVICES - 1}", {"again": "yes"}))
        installed.kubectl(
            "wait",
            "--for=jsonpath={.status.phase}=Running",
            f"pod/{name}",
            f"--timeout={POD_RUNNING_LIMIT}",
        )
        installed.kubectl("delete", "pod", name, "--wait=false")
    refused = [f for f in failed_prepares(installed) if f.startswith("again-")]
    assert not refused, refused


def test_a_prepared_claim_reports_its_device_status(installed: Installed) -> None:
    """From 1.36 the plugin writes the claim's ``status.devices`` (a Ready condition and the
    device's data) under the chart's pod-bound token, with the granular
    ``resourceclaims/driver`` permission; on 1.34 the chart grants nothing for it, the one
    refused write is logged and the pod runs all the same."""
    k = DEVICES - 2
    installed.apply(one_device(k))
    installed.apply(device_pod("status-report", f"device-{k}", {"status": "yes"}))
    try:
        installed.kubectl(
            "wait",
            "--for=jsonpath={.status.phase}=Running",
            "pod/status-report",
            f"--timeout={POD_RUNNING_LIMIT}",
        )
        pod = installed.json("get", "pod", "status-report")
        (claim_status,) = pod["status"]["resourceClaimStatuses"]
        claim = claim_status["resourceClaimName"]
        node = pod["spec"]["nodeName"]

        def reported() -> list[dict[str, Any]]:
            got = installed.json("get", "resourceclaim", claim)
            return list((got.get("status") or {}).get("devices") or [])

        minor = tuple(int(p) for p in installed.cp.minor.split(".")[:2])
        if minor >= (1, 36):
            (entry,) = wait_for("the claim's status.devices", reported, 60)
            assert (entry["driver"], entry["pool"], entry["device"]) == (
                "neuron.aws.com",
                node,
                f"neurondevice{k}",
            )
            (ready_condition,) = entry["conditions"]
            assert ready_condition["type"] == "Ready" and ready_condition["status"] == "True"
            assert entry["data"]["deviceId"] == k and entry["data"]["visibleCores"]
        else:
            (plugin,) = [
                p
                for p in installed.pods("app.kubernetes.io/component=kubelet-plugin")
                if p["spec"]["nodeName"] == node
            ]
            name = plugin["metadata"]["name"]
            wait_for(
                "the plugin's note that it may not write status.devices",
                lambda: (
                    "not permitted to write ResourceClaim status.devices"
                    in installed.kubectl("logs", "-n", NS, name)
                ),
                60,
            )
            assert reported() == []
    finally:
        installed.kubectl("delete", "pod", "status-report", "--wait=false")


def rolled_out(installed: Installed, image: str) -> bool:
    pods = installed.pods("app.kubernetes.io/instance=" + RELEASE)
    running = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    return (
        bool(running)
        and all(ready(p) and p["spec"]["containers"][0]["image"] == image for p in running)
        and len(running) == len(NODES) + 2
    )


def allocated_devices(installed: Installed) -> list[tuple[str, str]]:
    claims = installed.json("get", "resourceclaims", "-A")["items"]
    return [
        (r["pool"], r["device"])
        for c in claims
        for r in ((c.get("status") or {}).get("allocation") or {})
        .get("devices", {})
        .get("results", [])
    ]


def failed_prepares(installed: Installed) -> list[str]:
    events = installed.json(
        "get", "events", "-A", "--field-selector", "reason=FailedPrepareDynamicResources"
    )["items"]
    return [f"{e['involvedObject']['name']}: {e['message']}" for e in events]


# CI time: the upgrade runs on the newest minor only (the install itself on every minor).
@pytest.mark.parametrize(
    "installed", [p for p in minor_params() if p.values[0] == newest_minor()], indirect=True
)
def test_upgrade_and_rollback_under_load_fail_no_prepare(installed: Installed) -> None:
    old = installed.image
    new = old + "-next"
    # A new image name for the same content: what a release changes (pods replaced, new pod
    # UIDs and sockets, a new leader) without a registry.
    for node in installed.fleet.nodes.values():
        node.ctr("images", "tag", old, new)
    installed.apply(*(one_device(k) for k in range(DEVICES)))
    workload = seed_workload()
    workload["metadata"]["name"] = "kept"
    workload["spec"]["serverCount"] = 1
    workload["spec"]["resourceClaimTemplate"]["name"] = "kept-rct"
    installed.apply(workload)
    wait_for("the workload Allocated", lambda: installed.workload_state("kept") == "Allocated")
    kept = installed.workload("kept")
    wait_for("the release rolled out", lambda: rolled_out(installed, old))
    leader = installed.lease_holder()
    tag = new.rpartition(":")[2]
    with Load(installed) as load:
        try:
            wait_for("a load pod Running", lambda: load.ran_since(0) or load.failures, limit=STUCK)
        except AssertionError as err:
            raise AssertionError(
                f"{err}; failures {load.failures[:3]}; "
                + installed.kubectl("describe", "pods", "-l", "load=yes", check=False)[-3000:]
            ) from err

        def through(change: str, make: Callable[[], object], image: str) -> tuple[float, float]:
            """When ``change`` began and when it had rolled out, once a load pod started
            after it is Running too."""
            began = time.monotonic()
            make()
            wait_for(f"the {change} rolled out", lambda: rolled_out(installed, image), STUCK)
            done = time.monotonic()
            wait_for(
                f"a load pod started after the {change} Running",
                lambda: load.ran_since(done) or load.failures,
                STUCK,
            )
            return began, done

        # Every node's new plugin pod at once beside its old one (the default surges one node
        # at a time: the same per node, slower here).
        upgrade = through(
            "upgrade",
            lambda: installed.chart.upgrade(
                Overrides.of(f"image.tag={tag}", "kubeletPlugin.updateStrategy.maxSurge=100%"),
                "--reuse-values",
            ),
            new,
        )
        rollback = through("rollback", lambda: installed.chart.rollback(1), old)
    # The load ran through both changes: a pod was on its way to Running while each rolled
    # out (its claim prepared by an old, a new or both plugin instances), however long that
    # took, and none failed.
    assert not load.failures, load.failures
    times = [(p.name, p.created, p.running) for p in load.pods]
    assert load.in_flight(*upgrade), ("no load pod during the upgrade", times)
    assert load.in_flight(*rollback), ("no load pod during the rollback", times)
    assert not failed_prepares(installed)
    assert installed.lease_holder() != leader, "the leader handed over to a new pod"
    after = installed.workload("kept")
    assert after["status"]["state"] == "Allocated"
    assert after["status"].get("allocatedUltraServers") == kept["status"].get(
        "allocatedUltraServers"
    ), "the allocation is kept through the upgrade and the rollback"
    devices = allocated_devices(installed)
    assert len(devices) == len(set(devices)), "no device in two claims"
    installed.kubectl("delete", "nusw", "kept", "--wait=false")
