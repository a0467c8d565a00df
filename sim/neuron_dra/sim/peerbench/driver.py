"""One driver under test (ours or the Go peer): its node, directories, process handles and
the command line it is started with."""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from neuron_dra.nodeplugin.kubeletapi import ClaimRef
from neuron_dra.sim.kubeletclient import DraPlugin, KubeletClient
from neuron_dra.sim.peerbuild import peer_binary

from .floorplugin import FLOOR_DRIVER
from .stats import DriverFigures

NAMESPACE = "peer-bench"
#: Devices per node, and so claims per driver: a trn2.48xlarge has 16 Neuron devices; the
#: peer is started with ``--num-devices 16``.
DEVICES = 16
OUR_INSTANCE_TYPE = "trn2.48xlarge"
PEER_DRIVER = "gpu.example.com"
#: What sits in ours's slot (``--ours``): our kubelet plugin, or the floor plugin
#: (:mod:`.floorplugin`, the least a Python plugin does per Prepare).
OURS_PLUGIN = "plugin"
OURS_FLOOR = "floor"
#: The floor plugin with the file work of a correct driver (``floorplugin --files``).
OURS_FLOOR_FILES = "floor-files"
FLOOR_VERSION = "floor (python, GET + answer)"
FLOOR_FILES_VERSION = "floor + files (python, GET + per-claim CDI spec + checkpoint + answer)"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
SETPRIV = shutil.which("setpriv")


@dataclass
class Driver:
    """One driver under test: its node, directories, process and kubelet-side connection."""

    label: str
    driver_name: str
    device_class: str
    node: str
    version: str
    root: Path
    cdi_root: Path
    argv_for: Callable[[Driver, Path], list[str]]
    figures: DriverFigures = field(init=False)
    proc: asyncio.subprocess.Process | None = None
    kubelet: KubeletClient | None = None
    plugin: DraPlugin | None = None
    claims: list[ClaimRef] = field(default_factory=list)
    #: Where its Prometheus metrics are served, and the histogram of its per-claim Prepare
    #: time there (ours: neuron_dra_prepare_seconds, the claim GET included; the peer's:
    #: its own work, no GET).
    metrics_port: int | None = None
    prepare_metric: str = ""
    #: Where ``plugin.log`` goes (default: ``root``; with a real kubelet, the node's logs).
    log_dir: Path | None = None

    def __post_init__(self) -> None:
        self.figures = DriverFigures(self.label, self.version)

    @property
    def registrar(self) -> Path:
        return self.root / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.root / "plugins"

    @property
    def log(self) -> Path:
        return (self.log_dir or self.root) / "plugin.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def dra(self) -> DraPlugin:
        assert self.plugin is not None
        return self.plugin


def _common_flags(d: Driver, kubeconfig: Path) -> list[str]:
    """The flags every driver under test takes alike: its node, API access and directories."""
    return [
        "--node-name", d.node, "--kubeconfig", str(kubeconfig),
        "--cdi-root", str(d.cdi_root),
        "--kubelet-registrar-directory-path", str(d.registrar),
        "--kubelet-plugins-directory-path", str(d.plugins_dir),
    ]  # fmt: skip


def our_argv(d: Driver, kubeconfig: Path) -> list[str]:
    return [
        sys.executable, "-m", "neuron_dra.nodeplugin.main",
        *_common_flags(d, kubeconfig),
        "--emulation-mode", OUR_INSTANCE_TYPE,
        "--http-port", "0",
    ]  # fmt: skip


def floor_argv(d: Driver, kubeconfig: Path) -> list[str]:
    return [
        sys.executable, "-m", "neuron_dra.sim.peerbench.floorplugin",
        *_common_flags(d, kubeconfig),
        "--driver-name", FLOOR_DRIVER, "--num-devices", str(DEVICES),
    ]  # fmt: skip


def floor_files_argv(d: Driver, kubeconfig: Path) -> list[str]:
    return [*floor_argv(d, kubeconfig), "--files"]


#: The floor plugins by ``--ours``: (version shown, argv, what it does per claim).
FLOORS: dict[str, tuple[str, Callable[[Driver, Path], list[str]], str]] = {
    OURS_FLOOR: (
        FLOOR_VERSION,
        floor_argv,
        "per claim a GET with our API client and the CDI ids; no checkpoint, status write, metrics",
    ),
    OURS_FLOOR_FILES: (
        FLOOR_FILES_VERSION,
        floor_files_argv,
        "per claim a GET with our API client, a CDI spec (fsynced) and a checkpoint save on "
        "the loop, and the CDI ids; no node lock, metadata file, status write, metrics",
    ),
}


def peer_argv(d: Driver, kubeconfig: Path) -> list[str]:
    return [
        str(peer_binary()),
        *_common_flags(d, kubeconfig),
        "--num-devices", str(DEVICES),
        "--metrics-port", str(d.metrics_port),
        # client-go's defaults (5 QPS, burst 10) would make the benchmark measure the
        # peer's client-side throttle: each Prepare GETs its claims. Ours has none.
        "--kube-api-qps", "1000", "--kube-api-burst", "1000",
    ]  # fmt: skip
