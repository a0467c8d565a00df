"""``neuron-dra-controller`` entry point.

The flags are the contract of the Deployment (issue #4). The reconcilers are
not in this release yet, so the process refuses to start instead of pretending
to manage UltraServers.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from neuron_dra.common.constants import DRIVER_NAMESPACE
from neuron_dra.common.logsetup import add_logging_flags


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
    parser.add_argument("--http-port", type=int, default=8080, help="metrics/health port")
    add_logging_flags(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    build_parser().parse_args(argv)
    print(
        "neuron-dra-controller: the UltraServer reconcilers are not part of this build yet "
        "(tracked in issue #4); refusing to start.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
