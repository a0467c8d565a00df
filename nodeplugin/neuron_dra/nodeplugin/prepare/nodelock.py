"""A lock shared by every instance of the kubelet plugin on this node.

During a rolling update of the DaemonSet (``maxSurge: 1``) the old and the new plugin pod run
side by side, each with its own sockets, and the kubelet may send any call to either. Both
share the checkpoint and the CDI directory, so each must see the other's changes and never
act between the other's spec write and checkpoint write. Like the Go helper, we take an
``flock`` on ``serialize.lock`` in the plugin's data directory (next to the checkpoint).

:class:`NodeLock` combines two locks:

* an :class:`asyncio.Lock` orders the tasks of this process (FIFO, no polling);
* the ``flock`` keeps other processes out. It is taken with ``LOCK_NB`` and retried with a
  short, growing pause until the timeout, so the event loop never blocks and waiting stays
  cancellable. A blocking ``flock`` in a worker thread could do neither: the thread cannot be
  interrupted, and if its caller gave up it would later take the lock with nobody to let go.

The kernel drops an ``flock`` when the descriptor is closed, also when the process dies, so a
crashed instance never leaves the node locked. The file itself is never deleted: another
instance may be holding or opening it. Should someone delete it anyway, a holder checks after
locking that its descriptor still names the file at ``path`` and otherwise starts over, so two
instances can never each hold a lock on a different file.

The timeout is measured in real (monotonic) time on purpose: the wait is for another process,
which a test's virtual clock cannot speed up.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

LOCK_FILE: Final = "serialize.lock"


class NodeLockTimeout(Exception):
    """The lock stayed busy for the whole timeout; the operation is worth retrying later."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__(
            f"another instance of the plugin on this node has held {path} for more than "
            f"{timeout:g}s; try again"
        )
        self.path = path
        self.timeout = timeout


def lock_path(data_dir: Path) -> Path:
    return data_dir / LOCK_FILE


class NodeLock:
    """Exclusive across the processes of the node and the tasks of this process; not
    reentrant (a task that holds it and asks again waits for itself until the timeout)."""

    def __init__(self, path: Path, *, poll_min: float = 0.005, poll_max: float = 0.05) -> None:
        if not 0 < poll_min <= poll_max:
            raise ValueError("need 0 < poll_min <= poll_max")
        self.path = path
        self._poll_min = poll_min
        self._poll_max = poll_max
        self._mutex = asyncio.Lock()
        #: Tasks of this process waiting for ``_mutex`` (a free lock is not theirs to take).
        self._queued = 0
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    async def acquire(self, within: float) -> None:
        """Take the lock within ``within`` seconds or raise :class:`NodeLockTimeout`.

        ``within`` must be positive (with 0 even a free lock can time out). Cancellation while
        waiting leaves nothing held. OSErrors (directory not writable, ...) propagate.
        """
        deadline = time.monotonic() + within
        if not self._mutex.locked() and not self._queued:
            # Free and nobody queued (the usual case): asyncio.Lock then takes it without
            # suspending, so the task and timer of wait_for are not needed.
            await self._mutex.acquire()
        else:
            self._queued += 1
            try:
                # wait_for, not asyncio.timeout(): on Python 3.11 only wait_for hands back a
                # lock acquired at the very moment the timeout fired instead of losing it.
                await asyncio.wait_for(self._mutex.acquire(), timeout=max(0.0, within))
            except TimeoutError:
                raise NodeLockTimeout(self.path, within) from None
            finally:
                self._queued -= 1
        try:
            self._fd = await self._flock(deadline, within)
        except BaseException:
            self._mutex.release()
            raise

    def release(self) -> None:
        """Let go (closing the descriptor drops the flock). Only the holder may call this."""
        fd, self._fd = self._fd, None
        if fd is None:
            raise RuntimeError(f"{self.path}: release() without holding the lock")
        try:
            os.close(fd)
        finally:
            self._mutex.release()

    @contextlib.asynccontextmanager
    async def hold(self, within: float) -> AsyncIterator[None]:
        await self.acquire(within)
        try:
            yield
        finally:
            self.release()

    async def _flock(self, deadline: float, within: float) -> int:
        pause = self._poll_min
        while True:
            fd = self._try_once()
            if fd is not None:
                return fd
            left = deadline - time.monotonic()
            if left <= 0:
                raise NodeLockTimeout(self.path, within)
            await asyncio.sleep(min(pause, left))
            pause = min(self._poll_max, pause * 2)

    def _try_once(self) -> int | None:
        """One non-blocking attempt: the locked descriptor, or None if someone else has it."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:  # the directory, only the first time (not per Prepare)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            mine = os.fstat(fd)
            try:
                current = os.stat(self.path)
            except FileNotFoundError:
                current = None
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        if current is None or (current.st_dev, current.st_ino) != (mine.st_dev, mine.st_ino):
            os.close(fd)  # the file was replaced under us: lock the one that is there now
            return None
        return fd
