"""A real node runs a pod on its pod network, which reaches the API server as in-cluster
clients do, and goes, and the machine is as it was: no directory of the kubelet's or
containerd's on the host, no sysctl changed, no /etc/hosts entry, no mount, no network
interface or address, no cgroup, no process left behind (docs/testing.md, "Real nodes")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from neuron_dra.sim.kubebuild import newest_minor
from neuron_dra.sim.realcluster import enabled_minors
from neuron_dra.sim.realnode import cgroups
from neuron_dra.sim.realnode.fleet import RealNodeFleet
from neuron_dra.sim.realnode.layout import KUBELET_SYSCTLS
from neuron_dra.sim.scratch import work_dir
from neuron_dra.sim.worlds import real_control_plane, require_real_nodes

#: Where a kubelet, containerd, runc, CNI or mount(8) would leave something on a host.
HOST_PATHS = (
    "/var/lib/kubelet",
    "/var/lib/containerd",
    "/var/lib/cni",
    "/run/containerd",
    "/run/cdi",
    "/run/mount",
    "/run/nri",
    "/etc/cdi",
    "/etc/cni",
    "/etc/containerd",
    "/etc/kubernetes",
    "/opt/containerd",
    "/opt/cni",
    "/usr/libexec/kubernetes",
    "/var/log/pods",
    "/var/log/containers",
)


REACH_API = (
    "nc -w 5 $KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT </dev/null"
    " && echo reached the API server; sleep infinity"
)


def snapshot() -> dict[str, object]:
    return {
        "paths": {p: os.path.lexists(p) for p in HOST_PATHS},
        "sysctls": {k: Path("/proc/sys", k).read_text() for k in KUBELET_SYSCTLS},
        "hosts": Path("/etc/hosts").read_text(),
        "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text(),
        "mounts": Path("/proc/self/mountinfo").read_text().count("\n"),
        "links": sorted(os.listdir("/sys/class/net")),
        "addresses": subprocess.run(
            ["ip", "-o", "addr"], capture_output=True, text=True, check=True
        ).stdout,
    }


@pytest.mark.skipif(not enabled_minors(), reason="no real Kubernetes minor enabled")
def test_a_node_that_ran_a_pod_leaves_the_host_as_it_was() -> None:
    # A short directory: the node's containerd socket is reached by a path under it.
    tmp_path = work_dir("host", Path("/tmp"))
    minor = newest_minor()
    require_real_nodes(minor)
    cp = real_control_plane(minor)
    before = snapshot()
    fleet = RealNodeFleet(cp, workdir=tmp_path / "nodes")
    (node,) = fleet.start([("host-check", {})])
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "host-check", "namespace": "default"},
        "spec": {
            "nodeName": "host-check",
            # On the pod network (a veth to the node's namespace), as in-cluster clients are:
            # the API server is at the kubernetes Service's address.
            "containers": [
                {
                    "name": "c",
                    "image": "local.test/busybox:1.35",
                    "command": ["sh", "-c", REACH_API],
                }
            ],
        },
    }
    manifest = tmp_path / "pod.json"
    manifest.write_text(json.dumps(pod))
    try:
        deadline = time.monotonic() + 120  # a bound on a stuck controller-manager
        while not cp.kubectl("get", "sa", "default", "-o", "name", check=False):
            assert time.monotonic() < deadline, "no default ServiceAccount"
            time.sleep(0.2)  # a fresh control plane's controller-manager makes it soon
        cp.kubectl("apply", "-f", str(manifest))
        cp.kubectl("wait", "--for=condition=Ready", "pod/host-check", "--timeout=300s")
        pod_ip = cp.kubectl("get", "pod", "host-check", "-o", "jsonpath={.status.podIP}")
        assert pod_ip.startswith("198.18."), pod_ip
        deadline = time.monotonic() + 30
        while "reached the API server" not in cp.kubectl("logs", "host-check", check=False):
            assert time.monotonic() < deadline, cp.kubectl("logs", "host-check", check=False)
            time.sleep(0.2)  # the pod's first lines, read through the kubelet
        assert node.namespace.processes(), "the node's processes run in its namespace"
    finally:
        cp.kubectl("delete", "pod", "host-check", "--wait=false", check=False)
        fleet.stop()
        cp.kubectl("delete", "node", "host-check", "--ignore-not-found", check=False)
    deadline = time.monotonic() + 10
    while snapshot() != before and time.monotonic() < deadline:
        time.sleep(0.1)  # a mount namespace goes with its last process, asynchronously
    assert snapshot() == before
    assert not any((h / node.spec.cgroup_root).exists() for h in cgroups.hierarchies())
    leftovers = subprocess.run(
        ["pgrep", "-f", str(tmp_path)], capture_output=True, text=True, check=False
    ).stdout.split()
    assert not leftovers, f"processes of the node still running: {leftovers}"
    shutil.rmtree(tmp_path)
