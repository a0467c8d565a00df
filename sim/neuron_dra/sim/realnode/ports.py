"""Loopback ports for the nodes' kubelets, leased across every process of ours on the machine.

The API server dials a kubelet at the port the kubelet reports, on the host's loopback, where
the node's relay (forward.py) binds it. A port found free now is bound a moment later, and in
between another fleet (a parallel test worker, a second ``neuron-dra sim``, or a second node of
the same fleet) may pick the same one: two nodes once got one port, and one kubelet never
turned healthy. So each pick also takes an ``flock`` on a file named after the port and holds
it while the node lives; the kernel drops the lock when the process dies, so a crashed run
leaves no lease behind.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

#: Shared by every run on the machine (the lock, not the file, is the lease).
LEASE_DIR = Path(tempfile.gettempdir()) / "ndra-port-leases"


class PortLease:
    """One leased port; :meth:`release` (or the process's end) gives it back."""

    def __init__(self, port: int, fd: int) -> None:
        self.port = port
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def below_ephemeral_range() -> range:
    """Ports the kernel never hands to a socket bound to port 0 (containerd's stream server,
    any client), so only a lease holder binds them."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return range(max(1024, low - 12000), low)


def lease_port(
    lease_dir: Path = LEASE_DIR,
    *,
    ports: range | None = None,
    rng: random.Random | None = None,
    bindable: Callable[[int], bool] | None = None,
) -> PortLease:
    """A loopback port no other lease holds and nothing has bound (``bindable``: whether
    nothing has, a parameter for tests)."""
    pool = ports if ports is not None else below_ephemeral_range()
    free = bindable or _bindable
    order = list(pool)
    # Random order: fleets starting together would otherwise race for the same first ports.
    (rng or random.Random()).shuffle(order)
    lease_dir.mkdir(mode=0o700, exist_ok=True)
    for port in order:
        fd = os.open(lease_dir / str(port), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if free(port):
            return PortLease(port, fd)
        os.close(fd)
    raise OSError(f"no free loopback port in {pool.start}-{pool.stop - 1}")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
