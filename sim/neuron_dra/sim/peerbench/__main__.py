"""``hack/bench/peer``: our kubelet plugin and the Go peer, side by side, one run.

    hack/bench/peer [--cycles 10000] [--warmup 200] [--batches 100] [--starts 3]
                    [--floor-calls 300] [--minor 1.34] [--json PATH] [--profile-ours PATH]
    hack/bench/peer --kubelets real [--rounds 100] [--warmup-rounds 5] [--json PATH]
                    [--ours plugin|floor|floor-files]

Needs the real Kubernetes components (``hack/k8s/build --version 1.34``) and the peer
(``hack/bench/build-peer``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from neuron_dra.sim.frontend import machine_line, options_from

from .driver import FLOORS, OUR_INSTANCE_TYPE, OURS_PLUGIN
from .harness import Options, RunResult, run
from .realkubelet import RealOptions, RealResult, run_real
from .stats import Latency, markdown_table, real_rows, rows, targets_met


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hack/bench/peer",
        description="Our kubelet plugin and the Go peer (sigs.k8s.io/dra-example-driver) on "
        "one real control plane: Prepare/Unprepare latency, start to slice published, RSS, "
        "CPU, with ours/peer ratios.",
    )
    p.add_argument("--cycles", type=int, default=10_000, help="measured 1-claim cycles")
    p.add_argument("--warmup", type=int, default=200, help="unmeasured cycles first")
    p.add_argument("--batches", type=int, default=100, help="16-claim Prepare+Unprepare calls")
    p.add_argument("--starts", type=int, default=3, help="process starts of each driver")
    p.add_argument("--floor-calls", type=int, default=300, help="empty calls and claim GETs")
    p.add_argument("--minor", default="1.34", help="Kubernetes minor of the control plane")
    p.add_argument("--workdir", type=Path, help="keep logs and state here")
    p.add_argument("--no-compile", action="store_true", help="do not byte-compile first")
    p.add_argument("--json", type=Path, help="write every raw figure here")
    p.add_argument(
        "--kubelets",
        choices=("harness", "real"),
        default="harness",
        help="who calls the plugins: the harness itself (default: the table above), or a "
        "real kubelet per driver on two real nodes, whose own DRA histograms are read",
    )
    p.add_argument("--rounds", type=int, default=100, help="--kubelets real: measured rounds")
    p.add_argument(
        "--warmup-rounds", type=int, default=5, help="--kubelets real: unmeasured rounds first"
    )
    p.add_argument(
        "--one-at-a-time",
        dest="together",
        action="store_false",
        help="--kubelets real: each driver's pod alone, in turn (default: both at once)",
    )
    p.add_argument(
        "--ours",
        choices=(OURS_PLUGIN, *FLOORS),
        default=OURS_PLUGIN,
        help="--kubelets real: what runs in ours's slot: our kubelet plugin (default), or the "
        "floor plugin (neuron_dra.sim.peerbench.floorplugin: per claim a GET with our API "
        "client and the answer, nothing else), the least a Python plugin does per Prepare; "
        "floor-files: the same plus a CDI spec per claim and a checkpoint save",
    )
    p.add_argument(
        "--profile-ours",
        type=Path,
        metavar="PATH",
        help="sample our plugin with py-spy over the measured cycles (collapsed stacks at "
        "PATH, waits included); py-spy must be installed",
    )
    return p


def _go_version() -> str:
    go = shutil.which("go")
    if go is None:
        return "?"
    out = subprocess.run([go, "version"], capture_output=True, text=True, check=False).stdout
    return out.strip().removeprefix("go version ")


def report(result: RunResult, opts: Options, argv: list[str]) -> str:
    """The printed report: machine and versions, the table, the targets, the floor."""
    ours, peer = result.ours, result.peer
    lines = [
        f"command: hack/bench/peer {shlex.join(argv)}".rstrip(),
        f"{machine_line()}; {_go_version()}",
        f"kubernetes {result.kubernetes} (etcd, kube-apiserver, kube-controller-manager, "
        "kube-scheduler)",
        f"ours: {ours.version} (emulated {OUR_INSTANCE_TYPE}, 16 devices); peer: "
        f"{peer.version} (gpu profile, 16 devices)",
        f"run took {result.finished - result.started:.0f} s",
        "",
        markdown_table(rows(ours, peer), "ours", "peer"),
        "",
    ]
    for name, met in targets_met(ours, peer).items():
        lines.append(f"target {name}: {'met' if met else 'MISSED'}")
    get = Latency.of(result.claim_get)
    lines += [
        "",
        f"floor parts: claim GET with our API client p50 {get.p50 * 1000:.2f} ms, p99 "
        f"{get.p99 * 1000:.2f} ms (n={get.n}); empty Prepare (gRPC round trip) p50 ours "
        f"{Latency.of(ours.empty_call).p50 * 1000:.2f} ms, peer "
        f"{Latency.of(peer.empty_call).p50 * 1000:.2f} ms",
        *split(result),
        "RSS during the cycles (MiB): ours "
        + " ".join(f"{k / 1024:.1f}" for k in ours.rss_samples_kib)
        + "; peer "
        + " ".join(f"{k / 1024:.1f}" for k in peer.rss_samples_kib),
        f"RSS at the end: ours {ours.rss_end_kib / 1024:.1f} MiB, peer "
        f"{peer.rss_end_kib / 1024:.1f} MiB",
    ]
    return "\n".join(lines)


def real_report(result: RealResult, argv: list[str]) -> str:
    """The printed report of ``--kubelets real``."""
    ours, peer = result.ours, result.peer
    bounds = ", ".join(f"{b:g}" for b in result.bucket_bounds[:4])
    floor = FLOORS.get(result.ours_plugin)
    lines = [
        f"command: hack/bench/peer {shlex.join(argv)}".rstrip(),
        f"{machine_line()}; {_go_version()}",
        f"kubernetes {result.kubernetes} (control plane and both kubelets; containerd, runc)",
        (
            f"ours's slot: {ours.version}, NOT our plugin (neuron_dra.sim.peerbench."
            f"floorplugin: one CDI spec and one slice at start; {floor[2]})"
            if floor
            else f"ours: {ours.version} (emulated {OUR_INSTANCE_TYPE})"
        )
        + f"; peer: {peer.version}",
        f"run took {result.finished - result.started:.0f} s; {len(result.to_running)} rounds "
        f"of one pod per driver with one one-device claim, "
        + ("created together" if result.together else "one driver's after the other's"),
        "",
        markdown_table(real_rows(ours, peer), ours.version if floor else "ours", "peer"),
        "",
        f"the kubelet's DRA histogram buckets (s): {bounds} ... (le=0.1 is the first: every "
        "call of a few ms is in it; the per-call figures are the differences of the _sum "
        "across each round)",
        "measured rounds' Prepare calls by bucket: ours "
        + _buckets(ours.prepare_buckets)
        + "; peer "
        + _buckets(peer.prepare_buckets),
        f"rounds left out (a Prepare or Unprepare not counted once): ours {ours.skipped}, "
        f"peer {peer.skipped}",
    ]
    if result.to_running:
        lat = Latency.of(result.to_running)
        lines.append(
            f"pods created -> Running, per round: p50 {lat.p50:.2f} s, p99 {lat.p99:.2f} s"
        )
    for v in (ours, peer):
        if v.own_prepare_mean is not None and v.prepare:
            lines.append(
                f"{v.label}: the plugin's own Prepare histogram mean "
                f"{v.own_prepare_mean * 1000:.2f} ms of the kubelet's "
                f"{sum(v.prepare) / len(v.prepare) * 1000:.2f} ms"
            )
    return "\n".join(lines)


def _buckets(buckets: tuple[tuple[float, float], ...]) -> str:
    """The calls in each bucket (not cumulative), empty buckets left out."""
    out, below = [], 0.0
    for le, cumulative in buckets:
        if cumulative > below:
            out.append(f"le={le:g}: {cumulative - below:g}")
        below = cumulative
    return ", ".join(out) or "-"


def split(result: RunResult) -> list[str]:
    """Each driver's one-claim Prepare (means over the cycles) split by its own histogram."""
    ours, peer = result.ours, result.peer
    if not ours.empty_call or not result.claim_get:
        return []
    get = sum(result.claim_get) / len(result.claim_get)
    out = [
        f"means (Prepares over the cycles; the floor's claim GETs): claim GET with our API "
        f"client {get * 1000:.2f} ms"
    ]
    if ours.own_prepare_mean is not None:
        total, inside = ours.prepare_1_mean, ours.own_prepare_mean
        out.append(
            f"ours: 1-claim Prepare {total * 1000:.2f} ms = in the plugin "
            f"(neuron_dra_prepare_seconds: claim GET, plan, CDI spec, checkpoint) "
            f"{inside * 1000:.2f} ms + gRPC and the servicer {(total - inside) * 1000:.2f} ms"
        )
    if peer.own_prepare_mean is not None:
        total, work = peer.prepare_1_mean, peer.own_prepare_mean
        grpc = sum(peer.empty_call) / len(peer.empty_call)
        out.append(
            f"peer: 1-claim Prepare {total * 1000:.2f} ms = its own work (CDI spec, "
            f"checkpoint + fsync) {work * 1000:.2f} ms + an empty call's gRPC "
            f"{grpc * 1000:.2f} ms + the rest (claim GET with client-go, the helper) "
            f"{(total - work - grpc) * 1000:.2f} ms"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(args_list)
    if args.ours != OURS_PLUGIN and args.kubelets != "real":
        build_parser().error(f"--ours {args.ours} needs --kubelets real")
    if args.kubelets == "real":
        real = options_from(RealOptions, args, compile=not args.no_compile)
        got = run_real(real)
        print(real_report(got, args_list), flush=True)
        if args.json:
            args.json.write_text(json.dumps(asdict(got), indent=1))
        return 0
    opts = options_from(Options, args, compile=not args.no_compile)
    result = run(opts)
    print(report(result, opts, args_list), flush=True)
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
