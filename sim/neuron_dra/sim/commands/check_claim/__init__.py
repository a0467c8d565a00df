"""``neuron-dra check-claim``: which nodes and devices would satisfy a ResourceClaim(Template).

The claim is allocated the way kube-scheduler's DRA plugin would (the shared structured
allocator, ``neuron_dra.sim.allocation``), one node at a time, against devices from
a live cluster (``--kubeconfig``), a file of ResourceSlices (``--slices``) or freshly emulated
nodes (``--emulate TYPE``). A node where the scheduler would find devices is then checked by
the kubelet plugin's own Prepare decision
(``neuron_dra.nodeplugin.prepare.claims.plan_claim_on``: connected device set, opaque configs,
LNC, UltraServer mode, workload reservations) fed from the node's ResourceSlice, because a
claim that is allocated but cannot be prepared leaves the pod in
ContainerCreating, which is the failure this command exists to catch early.

Exit codes: 0 when every claim fits somewhere, 1 when one does not, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Final, TextIO

from neuron_dra.sim.commands.check_claim.allocation import check
from neuron_dra.sim.commands.check_claim.inputs import (
    InputError,
    claim_docs,
    classes_of,
    read_objects,
)
from neuron_dra.sim.commands.check_claim.output import render_text, report_json
from neuron_dra.sim.commands.check_claim.sources import (
    Cluster,
    from_cluster,
    from_emulation,
    from_slices_file,
)

EXIT_FITS: Final = 0
EXIT_NO_FIT: Final = 1
EXIT_BAD_INPUT: Final = 2


def load_cluster(args: argparse.Namespace) -> Cluster:
    if args.kubeconfig:
        return from_cluster(args.kubeconfig)
    if args.slices:
        return from_slices_file(args.slices)
    return from_emulation(list(args.emulate))


def run_check_claim(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        docs: list[tuple[str, list[dict[str, Any]]]] = [
            (path, read_objects(path, "-f")) for path in args.files
        ]
        claims = [(path, claim_docs(objects, path)) for path, objects in docs]
        cluster = load_cluster(args)
    except InputError as exc:
        print(f"error: {exc}", file=err)
        return EXIT_BAD_INPUT
    for _, objects in docs:
        cluster.classes.update(classes_of(objects))  # classes in the file win
    reports = [check(doc, cluster, path) for path, found in claims for doc in found]
    if args.output == "json":
        body = {
            "source": cluster.source,
            "fits": all(r.fits for r in reports),
            "claims": [report_json(r) for r in reports],
        }
        print(json.dumps(body, indent=2), file=out)
    else:
        for report in reports:
            render_text(report, out, show_file=len(args.files) > 1)
    return EXIT_FITS if all(r.fits for r in reports) else EXIT_NO_FIT
