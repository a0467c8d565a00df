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

A work directory is named after the process that made it (:func:`work_dir`:
``ndra-<kind>-p<pid>-<random>``), so what a killed run left (up to a few GB of RAM each in
``/dev/shm``) is found and removed by the next one (:func:`sweep_orphaned`), as real nodes'
cgroup roots are; a directory kept on purpose for a post-mortem is marked (:func:`keep`) and
left alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
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


#: The name of a work directory: its kind and the pid of the process that made it.
_OWNED = re.compile(r"^ndra-(?:[a-z0-9]+-)+p(\d+)-[a-z0-9_]+$")
#: The file that marks a work directory kept on purpose (a failed soak's, ``--keep``).
KEPT = ".kept"
#: Where work directories are made: the scratch roots this module can pick.
SWEPT = (Path("/dev/shm"), Path("/tmp"))


def work_dir(kind: str, root: Path | None = None) -> Path:
    """A new, empty work directory ``ndra-<kind>-p<pid>-<random>`` under ``root`` (default:
    :func:`scratch_root`). ``kind`` is lower-case letters, digits and dashes."""
    if not re.fullmatch(r"[a-z0-9]+(?:-[a-z0-9]+)*", kind):
        raise ValueError(f"work directory kind {kind!r}: use lower-case letters, digits, dashes")
    return Path(tempfile.mkdtemp(prefix=f"ndra-{kind}-p{os.getpid()}-", dir=root or scratch_root()))


@contextlib.contextmanager
def temporary(kind: str, root: Path | None = None) -> Iterator[Path]:
    """A :func:`work_dir` removed when the block ends (what a killed run leaves of it is
    swept like any other work directory)."""
    directory = work_dir(kind, root)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def maker(directory: Path) -> int | None:
    """The pid a work directory is named after, or None if its name is not a work
    directory's (not ours to judge)."""
    match = _OWNED.match(directory.name)
    return int(match.group(1)) if match else None


def keep(directory: Path, why: str) -> None:
    """Mark ``directory`` as kept on purpose: :func:`sweep_orphaned` leaves it alone, and the
    work directories it links to (a soak's short nodes directory, a control plane's files
    moved where its user can reach them), which belong to it."""
    with contextlib.suppress(OSError):
        (directory / KEPT).write_text(why + "\n")
        for entry in directory.iterdir():
            target = entry.resolve() if entry.is_symlink() else None
            if target is not None and maker(target) is not None and target.is_dir():
                (target / KEPT).write_text(f"{why} (linked from {entry})\n")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def orphaned(roots: Iterable[Path] = SWEPT) -> list[Path]:
    """The work directories under ``roots`` whose maker is gone and which nobody kept."""
    found = []
    for root in roots:
        with contextlib.suppress(OSError):
            for entry in root.iterdir():
                pid = maker(entry)
                if pid is None or entry.is_symlink() or not entry.is_dir():
                    continue
                if _alive(pid):  # this process's own included
                    continue
                if (entry / KEPT).exists():
                    continue
                found.append(entry)
    return sorted(found)


def sweep_orphaned(roots: Iterable[Path] = SWEPT) -> list[Path]:
    """Remove what killed runs left (:func:`orphaned`); returns what was removed. A directory
    another process removes meanwhile is no error."""
    removed = []
    for directory in orphaned(roots):
        # A killed run's files may be read-only (etcd's, a CDI root made by a test).
        shutil.rmtree(directory, ignore_errors=True)
        if not directory.exists():
            removed.append(directory)
    return removed
