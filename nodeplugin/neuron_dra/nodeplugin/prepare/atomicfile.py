"""Atomic, durable replacement and cheap reads of the plugin's state files.

The checkpoint and the claims' CDI specs are written on every Prepare and Unprepare before
the kubelet gets its answer, and the checkpoint is read two or three times per call (another
plugin instance may have changed it). So this uses plain ``os`` calls: a system call costs
several microseconds on our nodes, and ``tempfile.mkstemp`` with ``os.fdopen`` or
``Path.read_bytes`` add four or five per file (pid check, fstat, isatty ioctl, lseek) to the
ones the work needs.

:func:`replace_file`: readers, and crashes at any point, see the old file or the complete new
one; when it returns, the file and its directory entry are on disk. The temporary file is
``.<target name>.<random hex>.tmp`` next to the target (same file system, so the rename is
atomic; hidden and not ``*.json``, so CDI ignores it; start-up sweeps match that pattern).
"""

from __future__ import annotations

import contextlib
import os
import random
from pathlib import Path
from typing import Final

#: Temporary-file names only, so no cryptographic source (and no system call per name); a
#: name that exists already (a leftover of a crash) is caught by O_EXCL and another drawn.
_names = random.Random()
_NAME_ATTEMPTS: Final = 100
_READ_CHUNK: Final = 1 << 16


def temp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{_names.getrandbits(40):010x}.tmp")


def replace_file(path: Path, data: bytes, *, mode: int = 0o600, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically (see the module docstring), creating its
    directory if needed. The file gets ``mode`` whatever the umask. ``durable=False`` skips
    the two fsyncs: still atomic for readers and for a crash of the process (the page cache
    survives it), only not across a power loss or kernel crash."""
    fd, tmp = _create_temp(path, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if mode & ~0o700:
                os.fchmod(fd, mode)  # the umask may have taken group/other bits away
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def _create_temp(path: Path, mode: int) -> tuple[int, Path]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    for _ in range(_NAME_ATTEMPTS):
        tmp = temp_path(path)
        try:
            return os.open(tmp, flags, mode), tmp
        except FileExistsError:
            continue
        except FileNotFoundError:
            # Only the first write into a new directory gets here.
            path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(tmp, flags, mode), tmp
    raise FileExistsError(f"no free temporary file name next to {path}")


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (a rename, a removal) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_file(path: Path) -> bytes | None:
    """The file's bytes, None if it does not exist (other OSErrors propagate)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, _READ_CHUNK):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
