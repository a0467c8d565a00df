"""Kubelet ports are leased across processes: a port one fleet holds is never handed to
another (the flaky 'kubelet not healthy after 60 s' of two nodes sharing a port)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from neuron_dra.sim.realnode.ports import lease_port


def unbound(port: int) -> bool:
    """The ports of these tests are in the kernel's ephemeral range, where a busy machine's
    client sockets come and go: the lease logic is tested apart from what is bound."""
    return True


def test_leases_in_one_process_never_share_a_port(tmp_path: Path) -> None:
    pool = range(40100, 40104)
    leases = [lease_port(tmp_path, ports=pool, bindable=unbound) for _ in pool]
    assert sorted(lease.port for lease in leases) == list(pool)
    with pytest.raises(OSError, match="no free loopback port in 40100-40103"):
        lease_port(tmp_path, ports=pool, bindable=unbound)
    leases[2].release()
    assert lease_port(tmp_path, ports=pool, bindable=unbound).port == leases[2].port


def test_a_port_another_process_holds_is_skipped_until_it_exits(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path\n"
            "from neuron_dra.sim.realnode.ports import lease_port\n"
            f"lease = lease_port(Path({str(tmp_path)!r}), ports=range(40110, 40111),"
            " bindable=lambda port: True)\n"
            "print(lease.port, flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "40110"
        assert lease_port(tmp_path, ports=range(40110, 40112), bindable=unbound).port == 40111
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    # The kernel dropped the holder's lock with the process: nothing to clean up.
    assert lease_port(tmp_path, ports=range(40110, 40111), bindable=unbound).port == 40110


def test_a_bound_port_is_not_leased(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        taken = s.getsockname()[1]
        with pytest.raises(OSError, match="no free loopback port"):
            lease_port(tmp_path, ports=range(taken, taken + 1))
