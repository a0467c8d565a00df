"""``neuron-dra-kubelet-plugin`` entry point.

The flags (each also read from the environment variable named in its help)
are the contract of the DaemonSet (issue #3). Discovery and the gRPC servers
are not in this release yet, so the process refuses to start instead of
registering a plugin that cannot prepare claims.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from neuron_dra.common.logsetup import add_logging_flags


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="neuron-dra-kubelet-plugin",
        description="Neuron DRA kubelet plugin: publishes ResourceSlices and prepares claims.",
    )
    p.add_argument("--node-name", default=_env("NODE_NAME"), help="this node (env NODE_NAME)")
    p.add_argument("--pod-uid", default=_env("POD_UID"), help="this pod's UID (env POD_UID)")
    p.add_argument("--kubeconfig", default=_env("KUBECONFIG"), help="default: in-cluster")
    p.add_argument(
        "--cdi-root", default=_env("CDI_ROOT", "/var/run/cdi"), help="CDI spec dir (env CDI_ROOT)"
    )
    p.add_argument(
        "--kubelet-registrar-directory-path",
        default=_env("KUBELET_REGISTRAR_DIRECTORY_PATH", "/var/lib/kubelet/plugins_registry"),
        help="kubelet plugin registry dir (env KUBELET_REGISTRAR_DIRECTORY_PATH)",
    )
    p.add_argument(
        "--kubelet-plugins-directory-path",
        default=_env("KUBELET_PLUGINS_DIRECTORY_PATH", "/var/lib/kubelet/plugins"),
        help="kubelet plugins dir (env KUBELET_PLUGINS_DIRECTORY_PATH)",
    )
    p.add_argument("--sysfs-root", default=_env("SYSFS_ROOT", "/sys"), help="env SYSFS_ROOT")
    p.add_argument("--dev-root", default=_env("DEV_ROOT", "/dev"), help="env DEV_ROOT")
    p.add_argument(
        "--emulation-mode",
        default=_env("NEURON_DRA_DRIVER_EMULATION_MODE"),
        help="emulate an instance type (env NEURON_DRA_DRIVER_EMULATION_MODE)",
    )
    p.add_argument("--emulated-ultraserver-id", default=_env("EMULATED_ULTRASERVER_ID"))
    p.add_argument("--emulated-ultraserver-node-id", default=_env("EMULATED_ULTRASERVER_NODE_ID"))
    p.add_argument("--http-port", type=int, default=int(_env("HTTP_PORT", "8081") or 8081))
    add_logging_flags(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    build_parser().parse_args(argv)
    print(
        "neuron-dra-kubelet-plugin: device discovery and the kubelet gRPC servers are not part "
        "of this build yet (tracked in issue #3); refusing to start.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
