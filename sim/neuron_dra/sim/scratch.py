"""Where the clusters the simulation starts keep their short-lived files.

A real control plane, a simulated cluster's nodes (emulated sysfs trees, kubelet and
containerd roots of real nodes) and a soak's work directory are written hard while they
live and removed when they stop. On a disk every write is later written back, and the
kubelet's, containerd's and our plugin's fsyncs wait for it: on this machine kind (a VM's
virtio disk) a twelve-node test spent ~15% of its time on that. A RAM-backed directory
(``/dev/shm``) takes the same files without either cost. It is also short, as the nodes'
Unix socket paths need (108 bytes at most).

``NEURON_DRA_SCRATCH`` names another directory; without it ``/dev/shm`` is used when it is
writable and has room (:data:`ROOM`), else ``/tmp``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

ENV = "NEURON_DRA_SCRATCH"
#: Free space ``/dev/shm`` must have to be used: the largest test sessions here hold a few
#: GiB at once (a dozen control planes' etcd, ~30 nodes).
ROOM = 8 << 30


def scratch_root(shm: Path = Path("/dev/shm"), fallback: Path = Path("/tmp")) -> Path:
    """The directory to make short-lived work directories in (see the module doc)."""
    named = os.environ.get(ENV)
    if named:
        return Path(named)
    try:
        if os.access(shm, os.W_OK | os.X_OK) and shutil.disk_usage(shm).free >= ROOM:
            return shm
    except OSError:
        pass
    return fallback
