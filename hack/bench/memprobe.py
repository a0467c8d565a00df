"""Runs ``neuron-dra-controller`` and, on SIGUSR1, appends where its memory goes to the JSON
lines file ``$MEMPROBE_OUT`` (``hack/bench/controller-scale --memory-breakdown``).

One line: VmRSS; glibc's heap (``mallinfo2``: size, in use, free but kept); pymalloc's
blocks in use; the size of each cache's objects and of its indexes (``sys.getsizeof`` over
everything reachable from them, objects shared between caches counted once, for the first;
without the collector's 16-byte header per object); the controller's other objects
(allocator state, queues) likewise; and VmRSS after ``malloc_trim(0)``. The walk itself
allocates (its ``seen`` set), so the process's peak RSS after a probe means nothing.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import runpy
import signal
import sys
import tempfile
import types
from collections.abc import Iterable
from typing import Any

MiB = 2**20
STORES = ("slices", "nodes", "ultraservers", "workloads", "templates", "claims", "device_claims")
# Not followed: code and the interpreter's own objects, reachable from anything.
STOP = (
    types.ModuleType,
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.FrameType,
    types.CodeType,
    types.CoroutineType,
)


class Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


LIBC = ctypes.CDLL("libc.so.6")
LIBC.mallinfo2.restype = Mallinfo2


def vm_rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


def glibc_heap() -> dict[str, float]:
    m = LIBC.mallinfo2()
    return {
        "heap_MiB": round(m.arena / MiB, 1),
        "in_use_MiB": round(m.uordblks / MiB, 1),
        "free_kept_MiB": round(m.fordblks / MiB, 1),
        "mmapped_MiB": round(m.hblkhd / MiB, 1),
    }


def pymalloc_in_use_mib() -> float:
    with tempfile.TemporaryFile("w+") as f:
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        for line in f:
            if line.startswith("# bytes in allocated blocks"):
                return round(int(line.split("=")[-1].strip().replace(",", "")) / MiB, 1)
    return 0.0


def deep_mib(roots: Iterable[Any], seen: set[int], skip: set[int]) -> float:
    total = 0
    stack = list(roots)
    while stack:
        o = stack.pop()
        if id(o) in seen or id(o) in skip or isinstance(o, STOP):
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        stack.extend(gc.get_referents(o))
    return round(total / MiB, 1)


def report(*_: Any) -> None:
    from neuron_dra.common.k8s.cache import Store
    from neuron_dra.controller.context import ControllerContext

    out: dict[str, Any] = {"rss_MiB": round(vm_rss_mib(), 1), "glibc": glibc_heap()}
    out["pymalloc_in_use_MiB"] = pymalloc_in_use_mib()
    gc.unfreeze()  # main() froze the caches: gc.get_objects() would not list them
    objects = gc.get_objects()
    ctx = next(o for o in objects if isinstance(o, ControllerContext))
    skip = {id(ctx)} | {id(o) for o in objects if isinstance(o, Store)}
    seen: set[int] = set()
    for name in STORES:
        store = getattr(ctx, name)
        out[name] = {
            "n": len(store),
            "MiB": deep_mib([store._items], seen, skip),
            "index_MiB": deep_mib([store._indices, store._values_of], seen, skip),
        }
    ours = [
        vars(o) if hasattr(o, "__dict__") else o
        for o in objects
        if str(getattr(type(o), "__module__", "")).startswith("neuron_dra.controller")
        and not isinstance(o, (Store, ControllerContext))
    ]
    out["controller_objects_MiB"] = deep_mib(ours, seen, skip)
    del objects, ours, seen
    gc.freeze()
    LIBC.malloc_trim(0)
    out["rss_after_trim_MiB"] = round(vm_rss_mib(), 1)
    with open(os.environ["MEMPROBE_OUT"], "a") as f:
        f.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, report)
    sys.argv = ["neuron-dra-controller", *sys.argv[1:]]
    runpy.run_module("neuron_dra.controller.main", run_name="__main__")
