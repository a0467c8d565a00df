"""A killed run's containerd shims are found and killed by the next fleet's start: a shim is
an orphan when it is alone (with other shims) in its node's mount namespace."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from neuron_dra.sim.realnode.fleet import kill_orphaned_shims


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root")
def test_only_shims_alone_in_their_mount_namespace_are_killed(tmp_path: Path) -> None:
    shim = tmp_path / "containerd-shim-runc-v2"
    shutil.copy("/bin/sleep", shim)
    # An orphan: the only process of a mount namespace of its own (its node is gone).
    alone = _start(["unshare", "--mount", "--", str(shim), "300"])
    # A live node's shim: its namespace also holds another process (the node's holder).
    holder = _start(["unshare", "--mount", "--", "sh", "-c", f"{shim} 300 & wait"])
    # A shim in this (the host's) namespace, beside everything else here.
    host = _start([str(shim), "300"])
    try:
        for _ in range(200):  # until unshare has exec'd the shims
            shims = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _is(p, shim)]
            if len(shims) == 3:
                break
            time.sleep(0.02)  # exec has no event to wait on
        killed = kill_orphaned_shims(shim)
        assert killed == [alone.pid]
        assert alone.wait(timeout=10) == -9
        assert holder.poll() is None and host.poll() is None
    finally:
        for proc in (alone, holder, host):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _start(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, start_new_session=True)


def _is(proc: Path, shim: Path) -> bool:
    try:
        return (proc / "cmdline").read_bytes().split(b"\0", 1)[0] == str(shim).encode()
    except OSError:
        return False
