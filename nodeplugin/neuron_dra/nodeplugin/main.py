"""``neuron-dra-kubelet-plugin`` entry point.

The flags (each also read from the environment variable named in its help)
are the contract of the DaemonSet; ``KubeletPlugin`` does the work.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from neuron_dra.common.constants import (
    DRIVER_NAMESPACE,
    TAINT_EFFECT_NO_EXECUTE,
    TAINT_EFFECT_NO_SCHEDULE,
    TAINT_EFFECTS_OFF,
)
from neuron_dra.common.k8s.client import connect
from neuron_dra.common.k8s.errors import PermanentError
from neuron_dra.common.logsetup import add_logging_flags, setup_logging
from neuron_dra.nodeplugin.discovery.pci import DEFAULT_KERNEL_LOG, PciSources
from neuron_dra.nodeplugin.plugin import KubeletPlugin, PluginConfig


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
        "--namespace",
        default=_env("POD_NAMESPACE", DRIVER_NAMESPACE),
        help="namespace of the NeuronUltraServer objects the controller writes (env "
        f"POD_NAMESPACE: the chart installs both in the release namespace; default "
        f"{DRIVER_NAMESPACE})",
    )
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
    p.add_argument(
        "--kernel-log",
        default=_env("KERNEL_LOG", str(DEFAULT_KERNEL_LOG)),
        help="kernel log with the Neuron driver's probe lines, which pair device indices with "
        "PCI addresses: /dev/kmsg or a capture of it; empty: do not read one (env KERNEL_LOG)",
    )
    p.add_argument(
        "--neuron-ls-json",
        default=_env("NEURON_LS_JSON"),
        help="a capture of `neuron-ls -j` on this node, another source of the device index to "
        "PCI address pairing (env NEURON_LS_JSON)",
    )
    p.add_argument("--emulated-ultraserver-id", default=_env("EMULATED_ULTRASERVER_ID"))
    p.add_argument("--emulated-ultraserver-node-id", default=_env("EMULATED_ULTRASERVER_NODE_ID"))
    p.add_argument(
        "--http-port",
        type=int,
        default=int(_env("HTTP_PORT", "8081") or 8081),
        help="healthz/readyz/metrics port; 0 picks a free one and prints it (env HTTP_PORT)",
    )
    p.add_argument(
        "--rescan-interval",
        type=float,
        default=float(_env("RESCAN_INTERVAL", "30") or 30),
        help="seconds between reads of sysfs for devices and their health: how soon a failing "
        "device is tainted and reported (env RESCAN_INTERVAL)",
    )
    p.add_argument(
        "--device-taint-effect",
        default=_env("DEVICE_TAINT_EFFECT", TAINT_EFFECT_NO_SCHEDULE),
        help="effect of the taints on devices found unhealthy: NoSchedule keeps new claims "
        "off them, NoExecute also evicts the pods using them, off publishes no taints (env "
        "DEVICE_TAINT_EFFECT; default NoSchedule)",
    )
    p.add_argument(
        "--device-metadata",
        default=_env("DEVICE_METADATA", "true"),
        help="true or false: write each prepared claim's device metadata file (KEP-5304) and "
        "mount it into the claim's containers (env DEVICE_METADATA; default true)",
    )
    p.add_argument(
        "--core-sharing",
        default=_env("CORE_SHARING", "false"),
        help="true or false: publish the devices for claims on some of their NeuronCores "
        "(capacity requests logicalCores; needs DRAConsumableCapacity, on by default from "
        "Kubernetes 1.36), so that several pods share one device, each on cores of its own "
        "(env CORE_SHARING; default false)",
    )
    add_logging_flags(p)
    return p


def config_from_args(args: argparse.Namespace) -> PluginConfig:
    if not args.node_name:
        raise SystemExit("neuron-dra-kubelet-plugin: --node-name (or NODE_NAME) is required")
    node_id = args.emulated_ultraserver_node_id
    if args.rescan_interval <= 0:
        raise SystemExit("neuron-dra-kubelet-plugin: --rescan-interval must be positive")
    effects = (TAINT_EFFECT_NO_SCHEDULE, TAINT_EFFECT_NO_EXECUTE, TAINT_EFFECTS_OFF)
    if args.device_taint_effect not in effects:
        # argparse checks choices on the command line only, not a default from the env.
        raise SystemExit(
            f"neuron-dra-kubelet-plugin: --device-taint-effect (DEVICE_TAINT_EFFECT) must be one "
            f"of {', '.join(effects)}, got {args.device_taint_effect!r}"
        )
    device_metadata = str(args.device_metadata).strip().lower()
    if device_metadata not in ("true", "false"):
        raise SystemExit("neuron-dra-kubelet-plugin: --device-metadata must be true or false")
    core_sharing = str(args.core_sharing).strip().lower()
    if core_sharing not in ("true", "false"):
        raise SystemExit("neuron-dra-kubelet-plugin: --core-sharing must be true or false")
    return PluginConfig(
        node_name=args.node_name,
        pod_uid=args.pod_uid or None,
        cdi_root=Path(args.cdi_root),
        registrar_dir=Path(args.kubelet_registrar_directory_path),
        plugins_dir=Path(args.kubelet_plugins_directory_path),
        sysfs_root=Path(args.sysfs_root),
        dev_root=Path(args.dev_root),
        pci_sources=PciSources(
            kernel_log=Path(args.kernel_log) if args.kernel_log else None,
            neuron_ls_json=Path(args.neuron_ls_json) if args.neuron_ls_json else None,
        ),
        emulation_mode=args.emulation_mode or None,
        emulated_ultraserver_id=args.emulated_ultraserver_id or None,
        emulated_ultraserver_node_id=int(node_id) if node_id not in (None, "") else None,
        http_port=args.http_port,
        namespace=args.namespace,
        rescan_interval=args.rescan_interval,
        device_taint_effect=(
            None if args.device_taint_effect == TAINT_EFFECTS_OFF else args.device_taint_effect
        ),
        device_metadata=device_metadata == "true",
        core_sharing=core_sharing == "true",
    )


async def run(config: PluginConfig, kubeconfig: str | None) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with await connect(kubeconfig) as kube:
        plugin = KubeletPlugin(config, kube)
        try:
            await plugin.start()
            print(f"neuron-dra-kubelet-plugin: http port {plugin.http.port}", flush=True)
            await stop.wait()
        finally:
            await plugin.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbosity, args.logging_format)
    try:
        return asyncio.run(run(config_from_args(args), args.kubeconfig or None))
    except PermanentError as exc:
        print(f"neuron-dra-kubelet-plugin: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
