"""Awaiting a condition over in-process state without polling.

State that several components change (the fake API server's store, the simulated kubelets'
prepared pods, files the kubelet plugins write before telling the kubelet) is re-checked
whenever one of them reports a change through a listener list it calls."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
Listeners = list[Callable[..., None]]


async def wait_until(
    predicate: Callable[[], T | None],
    what: str,
    limit: float,
    sources: Sequence[Listeners],
    *,
    poll: float | None = None,
) -> T:
    """Return ``predicate()`` once truthy; it is evaluated now and after every call of a
    listener added to each of ``sources`` (and every ``poll`` seconds, for state no source
    reports, such as a log file another process writes). ``TimeoutError`` naming ``what``
    after ``limit`` s."""
    changed = asyncio.Event()

    def poke(*_args: Any) -> None:
        changed.set()

    for listeners in sources:
        listeners.append(poke)
    try:
        async with asyncio.timeout(limit):
            while True:
                changed.clear()
                got = predicate()
                if got:
                    return got
                if poll is None:
                    await changed.wait()
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), poll)
    except TimeoutError:
        raise TimeoutError(f"timed out after {limit:g}s waiting for {what}") from None
    finally:
        for listeners in sources:
            listeners.remove(poke)
