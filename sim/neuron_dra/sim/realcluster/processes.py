"""The control plane's child processes: the components' names, one component's process
(launched so it dies with us, stopped), its log's telling lines, and free loopback ports."""

from __future__ import annotations

import ctypes
import os
import pwd
import re
import signal
import socket
import stat
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

ETCD = "etcd"
APISERVER = "kube-apiserver"
CONTROLLER_MANAGER = "kube-controller-manager"
SCHEDULER = "kube-scheduler"
COMPONENTS = (ETCD, APISERVER, CONTROLLER_MANAGER, SCHEDULER)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ControlPlaneError(RuntimeError):
    """A component failed to start or to become ready; the message names its log."""


@dataclass
class Component:
    name: str
    argv: list[str]
    log: Path
    health_url: str | None
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0


#: Who the control plane's processes run as when we are root: none of them needs root
#: (loopback ports above 1024, files under the run's work directory), and every inotify
#: instance they hold (the API server's and controllers' certificate watchers) would
#: otherwise count against root's, which the real nodes' kubelets and containerds need
#: (``fs.inotify.max_user_instances`` is per user).
UNPRIVILEGED_USER = "nobody"


def unprivileged_ids() -> tuple[int, int] | None:
    """(uid, gid) to run the control plane as, or None when we are not root (then it runs
    as us) or the machine has no such user."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(UNPRIVILEGED_USER)
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


def reachable(ids: tuple[int, int], path: Path) -> bool:
    """Whether the user ``ids`` may walk down to ``path`` (x on every directory above it): a
    work directory under pytest's private temporary root is not reachable to others."""
    uid, gid = ids
    for parent in path.resolve().parents:
        st = parent.stat()
        bit = (
            stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid == gid else stat.S_IXOTH
        )
        if not st.st_mode & bit:
            return False
    return True


def as_user(ids: tuple[int, int] | None, argv: list[str]) -> list[str]:
    """``argv`` run as ``ids`` (``setpriv``), keeping the parent-death signal that a change of
    credentials clears; unchanged when ``ids`` is None."""
    if ids is None:
        return argv
    uid, gid = ids
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
            "--pdeathsig=KILL", "--", *argv]  # fmt: skip


def give_to(ids: tuple[int, int] | None, root: Path) -> None:
    """Make ``root`` and everything under it ``ids``' (the control plane's files)."""
    if ids is None:
        return
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in (*dirnames, *filenames))]:
            os.lchown(name, *ids)


def with_hosts_file(hosts: Path, argv: list[str]) -> list[str]:
    """``argv`` run in a mount namespace of its own whose /etc/hosts is ``hosts``: the
    machine's /etc/hosts stays as it is."""
    script = 'mount -n --bind "$0" /etc/hosts && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script,
            str(hosts), *argv]  # fmt: skip


def launch(comp: Component) -> None:
    """Start ``comp``'s process, its output appended to its log."""
    out = comp.log.open("ab")
    try:
        comp.proc = subprocess.Popen(
            comp.argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C to the test run reaches us, not them
            # PR_SET_PDEATHSIG fires when the *thread* that forked exits: only the main
            # thread lives as long as the process (elsewhere, atexit stops them).
            preexec_fn=(
                die_with_parent if threading.current_thread() is threading.main_thread() else None
            ),
        )
    finally:
        out.close()


def terminate(comp: Component) -> None:
    """SIGTERM, then SIGKILL after 15 s; nothing if it is not running."""
    proc = comp.proc
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=15)


def tail(path: Path, lines: int = 30) -> str:
    """The log's klog error and fatal lines (``E1125 ...``, ``F1125 ...``) if it has any,
    else its last ``lines`` lines: what says why a component stopped."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    errors = [line for line in text if re.match(r"[EF]\d{4} ", line)]
    return "\n".join((errors or text)[-lines:])


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
