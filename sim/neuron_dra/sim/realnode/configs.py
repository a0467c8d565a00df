"""The configuration files of one real node: containerd's, the kubelet's and the CNI
network's (pure: text and dicts from ports and paths).

Each setting that differs from a default says why; together they are what a kubelet,
containerd and runc need to run real pods on a machine that is not theirs alone:

- ``restrict_oom_score_adj``: the machine's root lacks CAP_SYS_RESOURCE, so runc cannot
  lower a process's oom_score_adj below its own; without the clamp no sandbox starts
  (``failed to update /proc/self/oom_score_adj: Permission denied``).
- one containerd per kubelet: a kubelet kills every pod sandbox on its runtime that it does
  not know, and CRI has no per-node namespace;
- a cgroup root per kubelet (``cgroupRoot``): a kubelet removes the pod cgroups it does not
  know under its tree;
- ``failCgroupV1: false``: kubelets from 1.35 on refuse a cgroup v1 host unless told (this
  machine's controllers are v1);
- the kubelet serves on 127.0.0.1 and authenticates the API server by the run's CA
  (``x509.clientCAFile``): nothing leaves loopback;
- a loopback-only CNI network: containerd reports the network ready (so the Node turns
  Ready); pods use ``hostNetwork`` (no bridge, no address of our own).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .layout import CONTAINERD_SOCKET, NodeLayout

CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins
RUNC = "/usr/sbin/runc"  # Debian's runc


def containerd_config(layout: NodeLayout, *, sandbox_image: str) -> str:
    """containerd 2.x ``config.toml`` (version 3) for the node. Paths are the standard ones:
    inside the node's namespace they are the node's own."""
    cni_conf = layout.config_dir / "cni"
    return f"""\
version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
# NRI would listen on /var/run/nri/nri.sock; nothing here uses it.
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = "{CONTAINERD_SOCKET}"

[plugins]
  [plugins.'io.containerd.cri.v1.runtime']
    # CDI is always on in containerd 2.x; these are its default directories.
    cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
    # This machine's root has no CAP_SYS_RESOURCE: runc cannot lower oom_score_adj.
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          SystemdCgroup = false
          BinaryName = "{RUNC}"
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["{CNI_BIN_DIR}"]
      conf_dir = "{cni_conf}"
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "{sandbox_image}"
  [plugins.'io.containerd.grpc.v1.cri']
    disable_tcp_service = true
    # exec, attach and port-forward streams stay on loopback
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
"""


def cni_conflist(pod_subnet: str) -> dict[str, Any]:
    """The pod network of one node: each pod a veth pair to the node's network namespace
    (CNI ``ptp``; no bridge) with an address of ``pod_subnet`` and its default route to the
    node. A pod reaches the node's addresses (the ``kubernetes`` Service's ClusterIP among
    them, relayed to the API server) and the kubelet reaches the pod's ports (probes); pods
    of different nodes do not reach each other (there is no route between nodes)."""
    return {
        "cniVersion": "1.0.0",
        "name": "ndra-pods",
        "plugins": [
            {
                "type": "ptp",
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_subnet}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "loopback"},
        ],
    }


#: The kubelet's default healthz port: each node has a network of its own, so every kubelet
#: serves it there and only the node (its probes, ours through the node's network) reaches it.
KUBELET_HEALTHZ_PORT = 10248


def kubelet_config(
    *,
    port: int,
    cgroup_root: str,
    client_ca: Path,
    feature_gates: Mapping[str, bool],
) -> dict[str, Any]:
    """The ``KubeletConfiguration`` of one node (fields valid from 1.34 on)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": KUBELET_HEALTHZ_PORT,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(client_ca)},
        },
        # Only the API server (a client certificate of the run's CA) reaches this port, and
        # only over loopback.
        "authorization": {"mode": "AlwaysAllow"},
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": True,
        "cgroupRoot": cgroup_root,
        "enforceNodeAllocatable": ["pods"],
        "failSwapOn": False,
        "failCgroupV1": False,
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
        "imageServiceEndpoint": f"unix://{CONTAINERD_SOCKET}",
        "resolvConf": "",
        # Its default, /usr/libexec/kubernetes/kubelet-plugins/volume/exec, is the host's:
        # the kubelet would create it there.
        "volumePluginDir": "/var/lib/kubelet/volumeplugins",
        # The /proc/sys files the kubelet checks hold its values already (layout.py).
        "protectKernelDefaults": False,
        "evictionHard": {"memory.available": "100Mi"},
        # The images were imported by hand and cannot be pulled again: never collect them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "featureGates": dict(feature_gates),
        # Faster than the defaults (10 s, 5 min, 1 min): nodes report sooner, and a pod whose
        # sync failed (a Prepare refused, a plugin away) is tried again after syncFrequency.
        "nodeStatusUpdateFrequency": "2s",
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "3s",
        "fileCheckFrequency": "10s",
        "shutdownGracePeriod": "0s",
    }
