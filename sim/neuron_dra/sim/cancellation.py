"""Telling a task's own cancellation from a library's await cancelled under it."""

from __future__ import annotations

import asyncio


def being_cancelled() -> bool:
    """Whether the current task is being cancelled. A ``CancelledError`` raised while it is
    not came from a library whose own await was cancelled under it (grpc.aio does that to a
    call whose channel closes): a work loop treats it as that item's failure and goes on,
    where re-raising it would end the loop without anyone cancelling it."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
