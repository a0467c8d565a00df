"""The soak's own child processes: started so they die with the soak, restarted, killed,
their HTTP port read from their log, and the check that none outlives the soak."""

from __future__ import annotations

import calendar
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from neuron_dra.sim.realcluster.processes import die_with_parent

#: The kinds of child: a node's kubelet plugin, a controller replica.
PLUGIN = "plugin"
CONTROLLER = "controller"
SETPRIV = shutil.which("setpriv")

#: The steps of a plugin's start its log reports, by the first words of their line.
START_STEPS = (
    ("published", "published "),
    ("serving", "kubelet plugin serving"),
    ("registered", "registered with the kubelet"),
)
#: A text log line (``I1128 13:10:00.123456 name] message``, the klog-like format).
_LOG_LINE = re.compile(r"[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{6}) [^\]]*\] (.*)")


def start_phases(text: str, started: float) -> str:
    """When a (re)started process's log says it reached each step of its start, in seconds
    after ``started`` (wall clock): its first line (the interpreter up and the imports done)
    and the :data:`START_STEPS`. What a slow recovery spent its time on; "" for a log with
    no text-format line."""
    year = time.gmtime(started).tm_year
    seen: dict[str, float] = {}
    for line in text.splitlines():
        found = _LOG_LINE.match(line)
        if found is None:
            continue
        month, day, hour, minute, second, micros, message = found.groups()
        at = calendar.timegm(
            (year, int(month), int(day), int(hour), int(minute), int(second), 0, 0, 0)
        ) + int(micros) / 1e6
        seen.setdefault("first log", at)
        for step, opening in START_STEPS:
            if message.startswith(opening):
                seen.setdefault(step, at)
    return ", ".join(f"{step} +{at - started:.1f}s" for step, at in seen.items())


def popen(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start a child in its own session that dies with us (parent-death signal).

    The signal is set by ``setpriv --pdeathsig KILL`` (util-linux) where there is one: a
    ``preexec_fn`` runs Python between fork and exec, which is unsafe in a process with
    threads (gRPC's, asyncio's workers) and was seen to kill a freshly forked etcd with
    SIGSEGV before it ran."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [SETPRIV, "--pdeathsig", "KILL", "--", *argv] if SETPRIV else argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=None if SETPRIV else die_with_parent,
        )


@dataclass
class Child:
    """One of our processes: a controller replica or a node's plugin."""

    name: str
    kind: str  # "controller" | "plugin"
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    started_wall: float = 0.0
    log_offset: int = 0
    #: Down on purpose (a fault in progress): the supervisor leaves it alone.
    held: bool = False
    pids: list[int] = field(default_factory=list)
    starts: int = 0
    #: Where the process runs, as an argv prefix made at each start: a real node's plugin
    #: enters the node's namespaces, which are new after the node reboots.
    enter: Callable[[list[str]], list[str]] | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log_offset = self.log.stat().st_size if self.log.exists() else 0
        self.proc = popen(self.enter(self.argv) if self.enter else self.argv, self.log)
        self.pids.append(self.proc.pid)
        self.started_at = time.monotonic()
        self.started_wall = time.time()
        self.starts += 1

    def start_phases(self) -> str:
        """:func:`start_phases` of the current process's log."""
        try:
            with self.log.open("rb") as f:
                f.seek(self.log_offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return start_phases(text, self.started_wall)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def terminate(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=20)

    def http_port(self) -> int | None:
        """The port the current process printed (``...: http port N``)."""
        try:
            with self.log.open("rb") as f:
                f.seek(self.log_offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return None
        found = re.findall(r": http port (\d+)", text)
        return int(found[-1]) if found else None

    @property
    def identity(self) -> str | None:
        """A controller's leader-election identity (``default_identity()``)."""
        if self.proc is None:
            return None
        return f"{socket.gethostname()}_{self.proc.pid}"


class PluginStartError(RuntimeError):
    """A plugin died before registering: no retry helps (bad flags, a path too long)."""


def leaked(pids: list[int], marker: str) -> str | None:
    """What is still running of the soak's processes: ``pids`` that are alive, and any
    process whose command line names ``marker`` (the work directory); None when nothing."""
    time.sleep(0.5)
    alive = [p for p in pids if _alive(p)]
    strays = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            strays.append(f"{entry.name}: {cmdline[:100]}")
    if alive or strays:
        return f"alive {alive}; strays {strays}"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead (reaped by nobody yet).
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
