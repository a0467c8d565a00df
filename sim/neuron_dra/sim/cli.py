"""``neuron-dra``: the project's command-line tool.

Sub-commands are registered here and implemented in their own modules, which
are imported only when their command runs (start-up stays fast and a missing
optional piece cannot break the other commands).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from neuron_dra.common.logsetup import add_logging_flags, setup_logging


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="neuron-dra",
        description="AWS Neuron DRA driver tooling: simulated cluster, fake API server, "
        "claim checker.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sim = sub.add_parser(
        "sim",
        help="run the embedded default: a simulated cluster and the seed walkthrough",
        description="Start a simulated cluster on this machine (fake kube-apiserver, the "
        "UltraServer controller, one kubelet plugin per emulated node: two trn2u.48xlarge "
        "UltraServers, two trn2.48xlarge, one trn1.32xlarge, one inf2.48xlarge; a simulated "
        "scheduler and kubelets), walk through the examples in examples/specs/ and show what "
        "each pod got. Exits non-zero if any step fails.",
    )
    sim.add_argument(
        "--keep-running",
        action="store_true",
        help="leave the cluster up afterwards and print a kubeconfig for kubectl",
    )
    sim.add_argument("--port", type=int, default=0, help="API server port (default: any free)")
    sim.add_argument(
        "--kubernetes",
        choices=("fake", "real"),
        default="fake",
        help="which Kubernetes the cluster runs on: 'fake' (default: our in-process API "
        "server and simulated scheduler, starts in seconds, needs nothing else) or 'real' "
        "(etcd, kube-apiserver, kube-controller-manager and kube-scheduler built by "
        "`hack/k8s/build`; the same scenario judged by the real scheduler)",
    )
    sim.add_argument(
        "--kubernetes-version",
        default=None,
        help="with --kubernetes real: the pinned minor to run (default: the newest pinned)",
    )
    sim.add_argument(
        "--kubelet-version",
        default=None,
        help="with --kubernetes real: the minor of the nodes' real kubelets, at most three "
        "below the control plane's as Kubernetes' version-skew policy allows (default: the "
        "control plane's; 1.35 and 1.36 are pinned for their kubelets only); a comma list "
        "(1.35,1.36) gives the nodes the minors in turn, as in a cluster mid-upgrade",
    )
    sim.add_argument(
        "--workdir",
        help="directory for the nodes' files (emulated sysfs/dev, CDI specs, kubelet sockets); "
        "default: a new temporary directory, removed on exit",
    )
    add_logging_flags(sim)

    fake = sub.add_parser(
        "fake-apiserver",
        help="serve the fake Kubernetes API server until interrupted",
        description="Serve the project's fake kube-apiserver (with the Neuron CRDs) on "
        "127.0.0.1 and write a kubeconfig for kubectl and the components.",
    )
    fake.add_argument("--port", type=int, default=0, help="port to listen on (0 = any free)")
    fake.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    fake.add_argument(
        "--kubeconfig-out",
        metavar="FILE",
        help="write a kubeconfig pointing at the server to FILE",
    )
    fake.add_argument(
        "--crds",
        metavar="DIR",
        action="append",
        help="directory of CustomResourceDefinition YAML files to serve "
        "(default: the Neuron CRDs); may be repeated",
    )
    add_logging_flags(fake)

    check = sub.add_parser(
        "check-claim",
        help="show which nodes and devices would satisfy a ResourceClaim(Template), or why none",
        description="Allocate each ResourceClaimTemplate/ResourceClaim in FILE the way "
        "kube-scheduler would, against a live cluster, a file of ResourceSlices or emulated "
        "nodes, and check that the kubelet plugin could prepare the result. Exit code 0: every "
        "claim fits; 1: one does not; 2: bad input.",
    )
    check.add_argument(
        "-f",
        "--filename",
        dest="files",
        metavar="FILE",
        action="append",
        required=True,
        help="YAML with ResourceClaimTemplates/ResourceClaims (DeviceClasses in it are used "
        "too); may be repeated",
    )
    source = check.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="check against a live cluster: its ResourceSlices, DeviceClasses and the devices "
        "allocated claims hold",
    )
    source.add_argument(
        "--slices",
        metavar="FILE",
        help="check against the ResourceSlices in FILE (YAML/JSON list, List or documents; "
        "allocated ResourceClaims in it count as in use)",
    )
    source.add_argument(
        "--emulate",
        metavar="TYPE",
        action="append",
        help="check against a freshly emulated node of instance type TYPE (the project's "
        "DeviceClasses); may be repeated",
    )
    check.add_argument(
        "-o",
        "--output",
        choices=("text", "json"),
        default="text",
        help="output format (default text)",
    )
    add_logging_flags(check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging(args.verbosity, args.logging_format)
    try:
        if args.command == "fake-apiserver":
            from neuron_dra.sim.commands.fake_apiserver import run_fake_apiserver

            return asyncio.run(run_fake_apiserver(args))
        if args.command == "sim":
            from neuron_dra.sim.commands.sim import run_sim

            return asyncio.run(run_sim(args))
        if args.command == "check-claim":
            from neuron_dra.sim.commands.check_claim import run_check_claim

            return run_check_claim(args)
    except KeyboardInterrupt:
        return 130
    raise AssertionError(f"unhandled command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
