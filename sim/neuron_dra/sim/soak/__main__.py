"""``python -m neuron_dra.sim.soak`` (what ``hack/soak`` runs)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from neuron_dra.sim.frontend import options_from
from neuron_dra.sim.scratch import sweep_orphaned
from neuron_dra.sim.soak.harness import Soak
from neuron_dra.sim.soak.options import Options


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hack/soak",
        description="Chaos soak: the driver's processes on a real control plane under a churn "
        "of workloads and claims, every kind of process killed with SIGKILL at random times, "
        "invariants checked throughout and at the end. Exit 1 on any violation.",
    )
    p.add_argument("--minutes", type=float, default=5.0, help="churn duration (default 5)")
    p.add_argument("--seed", type=int, default=1, help="fault schedule and churn seed")
    p.add_argument("--nodes", type=int, default=16, help="nodes, a multiple of 4 (default 16)")
    p.add_argument("--minor", default="1.34", help="Kubernetes minor (default 1.34)")
    p.add_argument("--fault-interval", type=float, default=20.0, help="mean s between faults")
    p.add_argument("--op-interval", type=float, default=1.5, help="mean s between operations")
    p.add_argument(
        "--free-bound",
        type=float,
        default=60.0,
        help="s a deleted workload may take to be freed once the system is whole",
    )
    p.add_argument(
        "--real-nodes",
        action="store_true",
        help="real kubelets, containerd and containers (root; hack/k8s/node-packages); adds "
        "kill -9 of kubelets and containerds and node reboots to the faults",
    )
    p.add_argument(
        "--until-faults",
        action="store_true",
        help="churn past --minutes until every planned fault has fired and the system was "
        "whole again after it (a slow machine takes longer, it does not miss faults)",
    )
    p.add_argument(
        "--churn-limit",
        type=float,
        default=900.0,
        help="with --until-faults: s of churn after which the faults not reached are a "
        "violation (default 900)",
    )
    p.add_argument(
        "--fault",
        dest="faults",
        action="append",
        default=[],
        metavar="AT:KIND:TARGET:DOWNTIME",
        help="inject this fault instead of the seed's draw (repeat for more): at AT s, kill -9 "
        "KIND (on node TARGET for a plugin's or a node's, else TARGET is KIND), DOWNTIME s "
        "before its restart; e.g. 8:plugin:trn2u-0-n2:1",
    )
    p.add_argument("--workdir", type=Path, help="default: a new /tmp/ndra-soak-* directory")
    p.add_argument("--keep", action="store_true", help="keep the work directory and logs")
    p.add_argument("--quiet", action="store_true", help="print only violations and the summary")
    return p


def options_of(args: argparse.Namespace) -> Options:
    return options_from(Options, args, faults=tuple(args.faults))


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    # A simulated kubelet's failed sync (its plugin is down: the point of the soak) is
    # retried with back-off; its traceback is noise here.
    logging.getLogger("neuron_dra.sim.controlplane").setLevel(logging.CRITICAL)
    options = options_of(args)
    try:
        soak = Soak(options)
    except ValueError as e:
        p.error(str(e))
    for removed in sweep_orphaned():
        print(f"removed a killed run's work directory: {removed}", flush=True)
    return asyncio.run(soak.run())


if __name__ == "__main__":
    sys.exit(main())
