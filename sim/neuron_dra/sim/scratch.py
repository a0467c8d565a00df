"""Where the clusters the simulation starts keep their short-lived files.

A real control plane, a simulated cluster's nodes (emulated sysfs trees, kubelet and
containerd roots of real nodes) and a soak's work directory are written hard while they
live and removed when they stop. On a disk every write is later written back, and the
kubelet's, containerd's and our plugin's fsyncs wait for it: on this machine kind (a VM's
virtio disk) a twelve-node test spent ~15% of its time on that. A RAM-backed directory
(``/dev/shm``) takes the same files without either cost. It is also short, as the nodes'
Unix socket paths need (108 bytes at most).

``NEURON_DRA_SCRATCH`` names another directory; without it ``/dev/shm`` is used when it is
writable and both it and the machine's available memory have room (:data:`ROOM`: a tmpfs
reports free space against its size limit, not against the memory left), else ``/tmp``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

ENV = "NEURON_DRA_SCRATCH"
#: Free space ``/dev/shm`` and available memory it takes to use it: the largest test
#: sessions here hold a few GiB there at once (a dozen control planes' etcd, ~30 nodes, an
#: installed product's five nodes with the 300 MB image imported: ~3 GB).
ROOM = 8 << 30


def memory_available(meminfo: Path = Path("/proc/meminfo")) -> int:
    """The kernel's estimate of the memory available to new work, in bytes (0 if unknown)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def scratch_root(
    shm: Path = Path("/dev/shm"),
    fallback: Path = Path("/tmp"),
    meminfo: Path = Path("/proc/meminfo"),
) -> Path:
    """The directory to make short-lived work directories in (see the module doc)."""
    named = os.environ.get(ENV)
    if named:
        return Path(named)
    try:
        if (
            os.access(shm, os.W_OK | os.X_OK)
            and shutil.disk_usage(shm).free >= ROOM
            and memory_available(meminfo) >= ROOM
        ):
            return shm
    except OSError:
        pass
    return fallback
