"""Smoke of the gang-start benchmark (hack/bench/gang-start): one run of a 2 x 4 workload on
3 UltraServers (12 simulated nodes, as the recorded figures: one spare, so allocation still
has a choice; the benchmark's default is 4 x 4 on 6), and the table's arithmetic on made-up
figures. Not a timed test: it
checks that the harness runs, that the phases happen in causal order and the ranks are right
(the harness raises otherwise), not how fast. How fast, and the target, are the benchmark's:
``hack/bench/gang-start`` prints the figures, docs/performance.md records them.

Off CI it skips when the Kubernetes components are not built (``hack/k8s/build --version
1.34``); with CI=true it fails.
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml
from neuron_dra.sim import scratch
from neuron_dra.sim.gangbench.__main__ import report
from neuron_dra.sim.gangbench.harness import (
    PHASES,
    GangRun,
    Options,
    manifests,
    report_table,
    run,
)
from neuron_dra.sim.simcluster.cluster import PODS_LIMIT
from neuron_dra.sim.worlds import require_built

MINOR = "1.34"


def test_manifests_are_the_seed_at_4_by_4() -> None:
    workload, deployment = manifests("gang-7", 4)
    assert workload["kind"] == "NeuronUltraServerWorkload"
    assert workload["metadata"] == {"name": "gang-7"}
    spec = workload["spec"]
    assert (spec["instanceType"], spec["topologySize"], spec["serverCount"]) == (
        "trn2u.48xlarge",
        4,
        4,
    )
    assert spec["resourceClaimTemplate"] == {"name": "gang-7-rct"}
    assert deployment["kind"] == "Deployment" and deployment["spec"]["replicas"] == 16
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["labels"] == deployment["spec"]["selector"]["matchLabels"]
    (claim,) = pod["spec"]["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == "gang-7-rct"
    # What kubectl is given: both documents in one file.
    assert len(list(yaml.safe_load_all(yaml.safe_dump_all([workload, deployment])))) == 2


def test_table_percentiles_and_steps() -> None:
    runs = [
        GangRun(i, {p: (k + 1) * (1.0 + i / 10) for k, (p, _) in enumerate(PHASES)}, [], 2.0)
        for i in range(10)
    ]
    lines = report_table(runs).splitlines()
    assert len(lines) == 2 + len(PHASES) + 1
    first = [cell.strip() for cell in lines[2].split("|")[1:-1]]
    # Nearest rank over 1.0 .. 1.9: p50 is index round(4.5) = 4 (1.4), p90 index 8 (1.8).
    assert first[1:] == ["1.40", "1.80", "1.90", "1.40"]
    second = [cell.strip() for cell in lines[3].split("|")[1:-1]]
    assert second[1:] == ["2.80", "3.60", "3.80", "1.40"]  # step: 2x - x at the median


def test_gang_start_smoke() -> None:
    require_built(MINOR)
    # Small (2 x 4 on 3 UltraServers, one run): CI runs it; the recorded run is 4 x 4. With
    # --trace, so the audit log and the components' /metrics are read as the real ones are.
    # A short path: the plugins' sockets live under it (107-byte limit).
    with scratch.temporary("gt", Path("/tmp")) as root:
        workdir = root / "g"
        opts = Options(
            runs=1,
            ultraservers=3,
            server_count=2,
            minor=MINOR,
            limit=PODS_LIMIT,  # a stuck-guard: each phase is still asserted
            progress=False,
            trace=True,
            settle=0.0,
            workdir=workdir,
        )
        result = run(opts)
        trace = (workdir / "trace.txt").read_text()
    assert result.kubernetes.startswith("v1.34.") and result.nodes == 12
    assert len(result.runs) == 1
    for r in result.runs:
        assert set(r.phases) == {p for p, _ in PHASES}
        # Causal order: the template before its claims, claims before their allocation,
        # allocation before the kubelets prepare.
        t = r.phases
        assert t["applied"] > 0 and t["allocated"] > 0 and t["tagged"] > 0
        assert 0 < t["template"] <= t["created"] <= t["claims"] <= t["prepared"]
        # Sane figures (measured: finite), whatever the machine's speed.
        assert all(math.isfinite(s) for s in t.values()), t
        assert len(r.ultraservers) == 2 and 0 < r.release < math.inf
        # The trace: both components scraped, every pod's way read from the audit log.
        assert r.metrics is not None and set(r.metrics) == {
            "kube-scheduler",
            "kube-controller-manager",
        }
        assert any("scheduler_schedule_attempts_total" in k for k in r.metrics["kube-scheduler"])
    assert "== summary" in trace and trace.count("gang-0-") >= 8, trace[:2000]
    text = report(result, ["--runs", "1"])
    assert "every pod Prepared with its rank" in text and "n=1" in text
