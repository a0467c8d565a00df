"""A node's mount and network namespaces: made by ``unshare``, held open by a ``sleep``,
entered by ``nsenter``; every process of the node (containerd and its shims, runc, the
kubelet, our plugin) runs inside them, so they all see the node's directories at the standard
paths, their mounts (overlay root file systems, tmpfs volumes, the kubelet's bind of its root
directory) never reach the host, and their ports are the node's own. The node's relay
(:mod:`.forward`) runs beside them on the host. Killing the holder, the relay and every
process inside makes them all disappear."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .layout import BOOT_ID, KUBELET_SYSCTLS, NodeLayout, namespace_script

SETPRIV = shutil.which("setpriv")


class NodeError(RuntimeError):
    """A real node could not start or stop; the message names the log to read."""


def die_with_us(argv: list[str]) -> list[str]:
    """``argv`` run so that it gets SIGKILL when the process that started it dies
    (``setpriv --pdeathsig``: unlike a ``preexec_fn`` it is safe in a threaded process)."""
    return [SETPRIV, "--pdeathsig", "KILL", "--", *argv] if SETPRIV else argv


def write_proc_sys(layout: NodeLayout, boot_id: str) -> None:
    """The node's copies of the ``/proc/sys`` files its namespace binds (layout.py)."""
    layout.sys_dir.mkdir(parents=True, exist_ok=True)
    for sysctl, value in KUBELET_SYSCTLS.items():
        (layout.sys_dir / sysctl.replace("/", "_")).write_text(value + "\n")
    set_boot_id(layout, boot_id)


def set_boot_id(layout: NodeLayout, boot_id: str) -> None:
    """Written in place: the bind mount inside the node shows the same file."""
    path = layout.sys_dir / BOOT_ID.replace("/", "_")
    with open(path, "w") as f:
        f.write(boot_id + "\n")


@dataclass(frozen=True)
class NodeNetwork:
    """The node's loopback addresses and the connections relayed across (forward.py)."""

    addresses: tuple[str, ...] = ()
    #: host:port of the host's loopback relayed to the same address inside the node
    ins: tuple[str, ...] = ()
    #: (inside, host) pairs: an address inside the node relayed to one of the host's
    outs: tuple[tuple[str, str], ...] = ()

    def relay_args(self, netns: str) -> list[str]:
        return [
            "--netns", netns,
            *(a for addr in self.ins for a in ("--in", addr)),
            *(a for inside, host in self.outs for a in ("--out", f"{inside}={host}")),
        ]  # fmt: skip


class NodeNamespace:
    #: ``ready_limit``: how long the namespace holder and the relay (a Python process: its
    #: interpreter and imports, slow on a starved CPU) may take to say they are ready; a bound
    #: for a stuck start, not a slow one.
    def __init__(
        self, layout: NodeLayout, network: NodeNetwork, *, ready_limit: float = 60.0
    ) -> None:
        self.layout = layout
        self.network = network
        self.ready_limit = ready_limit
        self.holder: subprocess.Popen[bytes] | None = None
        self.relay: subprocess.Popen[bytes] | None = None
        self._ns: str | None = None

    @property
    def pid(self) -> int:
        if self.holder is None:
            raise NodeError(f"node {self.layout.name}: no namespaces")
        return self.holder.pid

    @property
    def netns(self) -> str:
        """The node's network namespace, for :mod:`.netns` (probes of the node's ports)."""
        return f"/proc/{self.pid}/ns/net"

    def start(self) -> None:
        log = self.layout.log_dir / "namespace.log"
        script = namespace_script(self.layout, self.network.addresses)
        with log.open("ab") as err:
            self.holder = subprocess.Popen(
                die_with_us(["unshare", "--mount", "--net", "--propagation", "private", "--",
                             "/bin/sh", "-c", script]),
                stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
            self._await_ready(self.holder, "namespaces not made", log)
            self._ns = os.readlink(f"/proc/{self.holder.pid}/ns/mnt")
            self.relay = subprocess.Popen(
                die_with_us([sys.executable, "-m", "neuron_dra.sim.realnode.forward",
                             *self.network.relay_args(self.netns)]),
                stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
            self._await_ready(self.relay, "relay not serving", log)

    def _await_ready(self, proc: subprocess.Popen[bytes], what: str, log: Path) -> None:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], self.ready_limit)
        line = proc.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            self.stop()
            raise NodeError(
                f"node {self.layout.name}: {what} within {self.ready_limit:g} s ({log}):\n"
                + log.read_text(errors="replace")[-2000:]
            )

    def enter(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespaces (in ``/``: give absolute paths)."""
        return ["nsenter", f"--mount=/proc/{self.pid}/ns/mnt", f"--net={self.netns}", "--", *argv]

    def processes(self) -> list[int]:
        """Every process inside the namespace but its holder (containerd's shims among them:
        they are nobody's children once started)."""
        if self._ns is None:
            return []
        out = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == self.pid:
                continue
            try:
                if os.readlink(f"/proc/{entry.name}/ns/mnt") == self._ns:
                    out.append(int(entry.name))
            except OSError:
                continue
        return out

    def stop(self) -> None:
        """Kill every process inside, the relay, then the holder: the node's mounts and
        network go with them."""
        kill_all(self.processes())
        for proc in (self.relay, self.holder):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        self.relay = None
        self._ns = None


def kill_all(pids: list[int], limit: float = 10.0) -> None:
    """SIGKILL ``pids`` and wait until they are gone (reaped by whoever their parent is)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + limit
    for pid in pids:
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
