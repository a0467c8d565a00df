"""Where a real node's files are, on the host and inside the node (pure: paths only).

Each node lives in a mount namespace of its own (:mod:`.namespace`) in which four host
directories are replaced by the node's own, so that the kubelet, containerd, runc and our
plugin all use the standard paths (``/var/lib/kubelet``, ``/var/run/cdi``,
``/run/containerd``, ``/var/log/pods``) as on any node, the chart's default hostPaths
included, while the host's own directories never change:

========================  ===============================  ================================
inside the node           on the host                      who uses it
========================  ===============================  ================================
``/var/lib``              ``<node>/fs/var-lib``            kubelet root dir, containerd root
``/run`` (= ``/var/run``) ``<node>/fs/run``                CDI specs, containerd and shim
                                                           sockets, runc state
``/var/log``              ``<node>/fs/var-log``            pod and container logs
``/opt``                  ``<node>/fs/opt``                containerd's ``/opt/containerd``,
                                                           the Neuron node LNC file
========================  ===============================  ================================

and five ``/proc/sys`` files are bind-mounted from the node's own copies: the four sysctls
the kubelet insists on setting (``vm.overcommit_memory``, ``vm.panic_on_oom``,
``kernel.panic``, ``kernel.panic_on_oops``: it finds its values already there and the
host's stay untouched) and ``kernel/random/boot_id`` (a node reboot is a new boot id, which
the kubelet and our plugin both read).

Each node also has a network namespace of its own with a loopback and nothing else: the
node's address and the ``kubernetes`` Service's ClusterIP are addresses of that loopback, and
:mod:`.forward` relays the only connections that cross (the API server to the kubelet; the
node's processes and hostNetwork pods to the API server). hostNetwork pods of different nodes
bind the same ports without colliding, as on separate machines.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

#: Directory inside the node -> its name under ``<node>/fs`` on the host.
PRIVATE_DIRS: Final = {"/var/lib": "var-lib", "/run": "run", "/var/log": "var-log", "/opt": "opt"}
#: The sysctls the kubelet sets at start (container_manager_linux.go setupKernelTunables)
#: and the values it wants.
KUBELET_SYSCTLS: Final = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
}
BOOT_ID: Final = "kernel/random/boot_id"

# Standard paths inside every node.
KUBELET_ROOT: Final = "/var/lib/kubelet"
PLUGINS_REGISTRY: Final = "/var/lib/kubelet/plugins_registry"
PLUGINS_DIR: Final = "/var/lib/kubelet/plugins"
CDI_DIR: Final = "/var/run/cdi"
CONTAINERD_SOCKET: Final = "/run/containerd/containerd.sock"


@dataclass(frozen=True)
class NodeLayout:
    """One node's directory on the host (``root``) and what is where in it."""

    name: str
    root: Path

    def host_path(self, inside: str) -> Path:
        """The host path of a path inside the node (under one of :data:`PRIVATE_DIRS`);
        other paths are the host's own."""
        path = "/run" + inside.removeprefix("/var/run") if inside.startswith("/var/run") else inside
        for private, name in PRIVATE_DIRS.items():
            if path == private or path.startswith(private + "/"):
                return self.root / "fs" / name / path.removeprefix(private).lstrip("/")
        return Path(path)

    @property
    def sys_dir(self) -> Path:
        """The node's copies of the ``/proc/sys`` files it sees."""
        return self.root / "proc-sys"

    @property
    def boot_id_file(self) -> Path:
        return self.sys_dir / BOOT_ID.replace("/", "_")

    @property
    def config_dir(self) -> Path:
        return self.root / "config"

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    @property
    def cdi_dir(self) -> Path:
        return self.host_path(CDI_DIR)

    @property
    def containerd_socket(self) -> Path:
        return self.host_path(CONTAINERD_SOCKET)

    @property
    def kubelet_root(self) -> Path:
        return self.host_path(KUBELET_ROOT)

    def directories(self) -> list[Path]:
        """Every directory the node needs before its namespace is made."""
        return [
            *(self.root / "fs" / name for name in PRIVATE_DIRS.values()),
            self.sys_dir,
            self.config_dir,
            self.log_dir,
            self.cdi_dir,
        ]


#: Node addresses: TEST-NET-2 (RFC 5737), never routed, never one of a real network's; each
#: exists only on its node's own loopback.
NODE_NETWORK: Final = "198.51.100."


#: Pod addresses: a /24 per node of 198.18.0.0/15 (RFC 2544's, not a private range); each
#: exists only inside its node.
POD_NETWORK: Final = "198.18."


def node_address(index: int) -> str:
    return f"{NODE_NETWORK}{index % 254 + 1}"


def pod_subnet(index: int) -> str:
    return f"{POD_NETWORK}{index % 256}.0/24"


def namespace_script(layout: NodeLayout, addresses: tuple[str, ...] = ()) -> str:
    """The shell script that makes the node's mounts inside new mount and network
    namespaces, brings up the loopback with ``addresses``, says ``ready`` and then holds the
    namespaces open (pure)."""
    # -n: no userspace mount table (utab under the host's /run/mount) to write.
    lines = ["set -e", "ip link set lo up"]
    lines += [f"ip addr add {a}/32 dev lo" for a in addresses]
    for inside, name in PRIVATE_DIRS.items():
        lines.append(f"mount -n --bind '{layout.root / 'fs' / name}' '{inside}'")
    for sysctl in (*KUBELET_SYSCTLS, BOOT_ID):
        source = layout.sys_dir / sysctl.replace("/", "_")
        lines.append(f"mount -n --bind '{source}' '/proc/sys/{sysctl}'")
    lines += ["echo ready", "exec sleep infinity"]
    return "\n".join(lines) + "\n"
