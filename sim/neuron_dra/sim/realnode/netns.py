"""Entering a node's network namespace from this process, one socket or one call at a time.

``setns(2)`` moves only the calling thread, so a socket made between entering and leaving
belongs to the node's network for its whole life while the rest of the process stays on the
host's. Standard library only: the port forwarder (``forward.py``) runs with ``python -I -S``.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

CLONE_NEWNET = 0x40000000

T = TypeVar("T")

_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextmanager
def entered(netns_path: str) -> Iterator[None]:
    """The calling thread in the network namespace at ``netns_path`` (``/proc/<pid>/ns/net``)
    for the block, back in its own afterwards."""
    own = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
    target = os.open(netns_path, os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)


def socket_in(netns_path: str) -> socket.socket:
    """A TCP socket of the node's network (bind or connect it as any other)."""
    with entered(netns_path):
        return socket.socket(socket.AF_INET, socket.SOCK_STREAM)


def call_in(netns_path: str, fn: Callable[[], T]) -> T:
    """``fn()`` run on a thread of its own inside the node's network (an HTTP probe of a
    port only the node's processes can reach); its result or its exception."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            with entered(netns_path):
                box["result"] = fn()
        except BaseException as err:
            box["error"] = err

    thread = threading.Thread(target=run, name="netns-call", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]
