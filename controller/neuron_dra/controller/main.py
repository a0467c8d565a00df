"""``neuron-dra-controller`` entry point.

The flags are the contract of the Deployment; ``ControllerManager`` does the work.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import gc
import signal
import sys
from collections.abc import Sequence

from neuron_dra.common.constants import DRIVER_NAMESPACE
from neuron_dra.common.k8s.client import connect
from neuron_dra.common.k8s.errors import PermanentError
from neuron_dra.common.logsetup import add_logging_flags, setup_logging
from neuron_dra.controller.manager import ControllerManager, ManagerConfig, default_identity

#: Allocations between young-generation collections (CPython's default is 700).
GC_GEN0_THRESHOLD = 50_000


def release_free_heap() -> bool:
    """Give the C heap's free memory back to the system (glibc's ``malloc_trim``); False
    where there is no glibc.

    The first LIST of the fleet reads pages of several MB each; once they are freed, glibc
    keeps the space in its heap (~20 MiB, measured at 5,000 nodes), counted in the process's
    RSS, until something trims it. Only done once, after the caches have synced.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
    return True


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="neuron-dra-controller",
        description="Neuron UltraServer controller: discovers UltraServers and "
        "gang-allocates NeuronUltraServerWorkloads.",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config)")
    parser.add_argument(
        "--namespace",
        default=DRIVER_NAMESPACE,
        help=f"namespace for NeuronUltraServers and the leader Lease (default {DRIVER_NAMESPACE})",
    )
    parser.add_argument("--leader-elect", action="store_true", help="use Lease leader election")
    parser.add_argument(
        "--http-port",
        type=int,
        default=8080,
        help="healthz/readyz/metrics port; 0 picks a free one and prints it",
    )
    add_logging_flags(parser)
    return parser


async def run(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    config = ManagerConfig(
        namespace=args.namespace,
        leader_elect=args.leader_elect,
        identity=default_identity(),
        http_port=args.http_port,
    )
    async with await connect(args.kubeconfig) as kube:
        manager = ControllerManager(kube, config)
        try:
            await manager.start()
            # The caches now hold millions of long-lived objects (10,000 slices...); every
            # full collection of the cyclic GC would walk them all (pauses of ~0.5-1 s, right
            # in an allocation decision). Move them out of its reach (they are freed by
            # refcount), and collect less often: a decision allocates tens of thousands of
            # short-lived objects, and each collection walks everything cached since.
            gc.freeze()
            gc.set_threshold(GC_GEN0_THRESHOLD, 20, 20)
            release_free_heap()
            print(f"neuron-dra-controller: http port {manager.http.port}", flush=True)
            stopped = asyncio.create_task(stop.wait())
            lost = asyncio.create_task(manager.wait_lost())
            done, pending = await asyncio.wait({stopped, lost}, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            if lost in done and not stop.is_set():
                # As client-go controllers do: a replica that lost its lease exits and is
                # restarted, so it never acts on a stale view of leadership.
                print("neuron-dra-controller: lost leadership; exiting", file=sys.stderr)
                return 1
        finally:
            await manager.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbosity, args.logging_format)
    try:
        return asyncio.run(run(args))
    except PermanentError as exc:
        print(f"neuron-dra-controller: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
