"""``neuron-dra fake-apiserver``: serve the fake API server until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from neuron_dra.sim.fakeapi.server import FakeAPIServer


async def run_fake_apiserver(args: argparse.Namespace) -> int:
    crd_paths = [Path(p) for p in args.crds] if args.crds else None
    server = FakeAPIServer(crd_paths=crd_paths, host=args.host, port=args.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        print(f"fake kube-apiserver listening on {server.url}", flush=True)
        if args.kubeconfig_out:
            path = Path(args.kubeconfig_out)
            server.write_kubeconfig(path)
            print(f"kubeconfig written to {path}", flush=True)
            print(f"  try: kubectl --kubeconfig {path} get nusw -A", flush=True)
        await stop.wait()
    return 0
