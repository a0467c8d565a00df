"""``hack/bench/gang-start``: a 4 x 4 UltraServer workload from ``kubectl apply`` to every
pod Prepared with its rank, on the real scheduler.

    hack/bench/gang-start [--runs 20] [--ultraservers 6] [--server-count 4] [--minor 1.34]
                          [--json PATH]

Needs the real Kubernetes components (``hack/k8s/build --version 1.34``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import asdict
from pathlib import Path

from neuron_dra.sim.frontend import machine_line, options_from

from .harness import TOPOLOGY_SIZE, GangResult, Options, report_table, run


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hack/bench/gang-start",
        description="A NeuronUltraServerWorkload (topologySize 4) and a Deployment of its "
        "pods, applied with kubectl on a real control plane: time to every pod Prepared with "
        "its rank, by phase, over --runs runs.",
    )
    p.add_argument("--runs", type=int, default=20, help="measured applies (default 20)")
    p.add_argument(
        "--ultraservers",
        type=int,
        default=6,
        help="trn2u.48xlarge UltraServers of 4 nodes in the cluster (default 6: 24 nodes)",
    )
    p.add_argument(
        "--server-count", type=int, default=4, help="the workload's serverCount (default 4)"
    )
    p.add_argument(
        "--two-step",
        action="store_true",
        help="the seed's order: apply the workload, wait for its ResourceClaimTemplate, then "
        "apply the Deployment (default: both in one kubectl apply -f)",
    )
    p.add_argument(
        "--nodes",
        choices=("simulated", "real"),
        default="simulated",
        help="who runs the nodes: simulated kubelets (default; the recorded figures) or real "
        "kubelets and containerd (needs root; about a dozen nodes fit on one machine)",
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="where the time goes: the API server's audit log and kube-scheduler's and "
        "kube-controller-manager's metrics around each run, pod by pod, in WORKDIR/trace.txt",
    )
    p.add_argument(
        "--verbosity", type=int, default=0, help="-v of kube-scheduler and kcm (a diagnosis)"
    )
    p.add_argument(
        "--settle",
        type=float,
        default=2.0,
        help="idle seconds before each apply, so kube-controller-manager's client-side "
        "request budget spent by the previous run's release has refilled (default 2; 0: "
        "back to back)",
    )
    p.add_argument("--minor", default="1.34", help="Kubernetes minor of the control plane")
    p.add_argument("--limit", type=float, default=120.0, help="bound for each wait (s)")
    p.add_argument("--workdir", type=Path, help="keep logs and state here")
    p.add_argument("--json", type=Path, help="write every run's phases here")
    return p


def report(result: GangResult, argv: list[str]) -> str:
    o = result.options
    return "\n".join(
        [
            f"command: hack/bench/gang-start {shlex.join(argv)}".rstrip(),
            machine_line(),
            f"kubernetes {result.kubernetes} (etcd, kube-apiserver, kube-controller-manager, "
            f"kube-scheduler; kubectl {result.kubectl})",
            f"cluster: {result.nodes} trn2u.48xlarge nodes in {o.ultraservers} UltraServers, "
            f"up in {result.cluster_start:.1f} s (our controller, {result.nodes} kubelet "
            "plugins and simulated kubelets in one process)",
            f"workload: topologySize {TOPOLOGY_SIZE}, serverCount {o.server_count}, "
            f"{o.pods} pods (Deployment), "
            + (
                "applied in two steps (the workload, its template, then the Deployment)"
                if o.two_step
                else "both in one kubectl apply -f"
            )
            + f"; {o.runs} runs, run took "
            f"{result.finished - result.started:.0f} s",
            "",
            report_table(result.runs),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(args_list)
    opts = options_from(Options, args)
    result = run(opts)
    print(report(result, args_list), flush=True)
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
