"""A node's cgroup tree: one root per kubelet (``cgroupRoot``) in every hierarchy of the
machine, made before the kubelet starts (it expects the root to exist) and removed, with
every process still in it, when the node goes."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from .namespace import kill_all

CGROUP_FS = Path("/sys/fs/cgroup")


def hierarchies(base: Path = CGROUP_FS) -> list[Path]:
    """The mounted hierarchies: the v2 root alone on a unified host; on a v1 (or hybrid)
    host every controller's and the v2 ``unified`` one."""
    if (base / "cgroup.controllers").exists():
        return [base]
    return sorted(p for p in base.iterdir() if p.is_dir() and (p / "cgroup.procs").exists())


def create(root: str, base: Path = CGROUP_FS) -> None:
    for h in hierarchies(base):
        path = h / root
        path.mkdir(exist_ok=True)
        if h.name == "cpuset":  # a v1 cpuset group takes no task until it has cpus and mems
            for knob in ("cpuset.cpus", "cpuset.mems"):
                (path / knob).write_text((h / knob).read_text())


def processes(root: str, base: Path = CGROUP_FS) -> set[int]:
    pids: set[int] = set()
    for h in hierarchies(base):
        for dirpath, _, files in os.walk(h / root):
            if "cgroup.procs" in files:
                with contextlib.suppress(OSError):
                    text = Path(dirpath, "cgroup.procs").read_text()
                    pids.update(int(p) for p in text.split())
    return pids


def remove(root: str, base: Path = CGROUP_FS, limit: float = 10.0) -> None:
    """Kill what is left in the tree (pods' processes whose shim is gone) and remove it,
    deepest first. A group whose last process is still exiting refuses rmdir: retried."""
    kill_all(sorted(processes(root, base)))
    deadline = time.monotonic() + limit
    for h in hierarchies(base):
        top = h / root
        if not top.exists():
            continue
        dirs = sorted((Path(d) for d, _, _ in os.walk(top)), key=lambda p: -len(p.parts))
        for d in dirs:
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
