"""``neuron-dra sim``: the embedded default, a simulated cluster and the seed walkthrough.

Starts the fake API server, the UltraServer controller and one real kubelet plugin per
emulated node (two trn2u.48xlarge UltraServers, two trn2.48xlarge, one trn1.32xlarge, one
inf2.48xlarge), with a simulated scheduler and kubelets, then walks through the examples in
``examples/specs/`` (:mod:`.walkthrough`). Exits non-zero if any step fails.
``--keep-running`` leaves the cluster up afterwards and prints a kubeconfig for kubectl.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from neuron_dra.common.logsetup import TextFormatter
from neuron_dra.sim.commands.walkthrough import Walkthrough, run_walkthrough
from neuron_dra.sim.commands.walkthrough.tables import render_table
from neuron_dra.sim.scratch import sweep_orphaned
from neuron_dra.sim.simcluster import SimCluster, default_nodes


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def _log_to_file(path: Path) -> None:
    """The components' logs go to ``path`` (at the ``-v`` level setup_logging chose); the
    terminal keeps the walkthrough readable and shows errors only."""
    root = logging.getLogger()
    file_handler = logging.FileHandler(path, encoding="utf-8")
    file_handler.setFormatter(TextFormatter())
    for handler in root.handlers:
        handler.setLevel(logging.ERROR)
    root.addHandler(file_handler)


async def run_sim(args: argparse.Namespace) -> int:
    out = sys.stdout
    log_file = Path(tempfile.gettempdir()) / f"neuron-dra-sim-{os.getpid()}.log"
    _log_to_file(log_file)
    print(f"component logs: {log_file}", file=out)
    removed = sweep_orphaned()
    if removed:
        print(f"removed {len(removed)} work directories of killed runs", file=out)
    workdir = Path(args.workdir) if getattr(args, "workdir", None) else None
    started = time.monotonic()
    real = getattr(args, "kubernetes", "fake") == "real"
    if real:
        from neuron_dra.sim.kubebuild import newest_minor
        from neuron_dra.sim.realcluster import RealTierUnavailable, bin_dir_for
        from neuron_dra.sim.realnode.fleet import node_tier_problem

        minor = args.kubernetes_version or newest_minor()
        kubelet_minor = args.kubelet_version or minor
        try:
            bin_dir_for(minor)
        except RealTierUnavailable as err:
            print(f"neuron-dra sim --kubernetes real: {err}", file=sys.stderr)
            return 2
        problem = next(
            (p for m in kubelet_minor.split(",") if (p := node_tier_problem(m.strip()))), None
        )
        if problem:
            print(f"neuron-dra sim --kubernetes real: {problem}", file=sys.stderr)
            return 2
        world = (
            f"real Kubernetes {minor} (etcd, kube-apiserver, kube-controller-manager, "
            f"kube-scheduler), real nodes (kubelet {kubelet_minor}, containerd, runc), "
            "neuron-dra-controller and one neuron-dra-kubelet-plugin per emulated node"
        )
    else:
        minor = kubelet_minor = None
        world = (
            "fake kube-apiserver, neuron-dra-controller, one neuron-dra-kubelet-plugin per "
            "emulated node, scheduler and kubelets"
        )
    print(f"Starting the simulated cluster: {world} ...", file=out)
    async with SimCluster(
        default_nodes(),
        workdir=workdir,
        api_port=args.port,
        kubernetes="real" if real else "fake",
        minor=minor,
        kubelet_minor=kubelet_minor,
    ) as sim:
        print(
            f"  ready in {time.monotonic() - started:.1f} s; API server {sim.url}, "
            f"node files under {sim.workdir}\n",
            file=out,
        )
        results = await run_walkthrough(Walkthrough(sim, out))
        failed = [r for r in results if r[1] is not None]
        print("Summary", file=out)
        rows = [(title, "FAILED" if err else "ok", f"{secs:.1f}s") for title, err, secs in results]
        for line in render_table(("STEP", "RESULT", "TIME"), rows).splitlines():
            print("    " + line, file=out)
        print(
            f"\n{'all steps passed' if not failed else f'{len(failed)} step(s) FAILED'} "
            f"({time.monotonic() - started:.1f} s in all)",
            file=out,
        )
        if args.keep_running:
            print(
                f"\nThe cluster stays up. kubeconfig: {sim.kubeconfig}\n"
                f"  kubectl --kubeconfig {sim.kubeconfig} get nodes,resourceslices\n"
                f"  kubectl --kubeconfig {sim.kubeconfig} get nus -n neuron-dra-driver\n"
                f"  kubectl --kubeconfig {sim.kubeconfig} apply -f examples/specs/"
                "connected-4-devices.yaml\n"
                + (
                    "Pods run on real nodes: give them hostNetwork: true and one of the "
                    "local images (neuron_dra.sim.realnode.images.LOCAL_IMAGES).\n"
                    if real
                    else "Pods you create are scheduled and prepared like the walkthrough's "
                    "(Deployments and LeaderWorkerSets are not served by the fake API "
                    "server).\n"
                )
                + "Ctrl-C to stop.",
                file=out,
            )
            out.flush()
            await _wait_for_signal()
    return 1 if failed else 0
