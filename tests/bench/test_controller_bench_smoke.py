"""Smoke of the controller benchmarks: ``hack/bench/controller-scale`` on a small fleet on the
real 1.34 control plane, and ``hack/bench/controller`` on the fake API server. Not timed
tests: they check that each harness runs to the end and prints a full, sane table, not how
fast anything is (how fast, and the targets, are the benchmarks': the scripts print the
figures, docs/performance.md records them). The API writes that the controller's design
fixes for this scenario (none on a restart, one workload status write per allocation) are
checked exactly: they do not depend on the machine's speed. Off CI the real one skips when
the components are not built; with CI=true it fails."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

from neuron_dra.sim.worlds import require_built

BENCH = Path(__file__).resolve().parents[2] / "hack" / "bench"


def _run(script: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def _cells(out: str, label: str) -> list[str]:
    """The cells of the last table row whose label starts with ``label``."""
    rows = [line for line in out.splitlines() if line.startswith(f"| {label}")]
    assert rows, f"no row {label!r} in:\n{out}"
    return [c.strip() for c in rows[-1].strip("|").split("|")[1:]]


def test_controller_scale_runs_on_the_real_apiserver() -> None:
    require_built("1.34")
    out = _run("controller-scale", "--nodes", "40", "--workloads", "4", "--rest", "0.5")
    assert "4 workloads: {'Allocated': 4}" in out, out
    (exist,) = _cells(out, "all NeuronUltraServers exist")
    (writes,) = _cells(out, "restart: API writes")
    (per_alloc,) = _cells(out, "API writes per allocation")
    (rss,) = _cells(out, "controller RSS after sync")
    assert 0 < float(exist) < math.inf  # measured: positive and finite
    assert writes == "0"  # a restart on an unchanged fleet writes nothing
    assert float(per_alloc) >= 4.0  # finalizer, template, NUS status, workload status
    assert 30 < float(rss) < 2000
    # A workload with room goes to Allocated in one status write (no node plugins tag the
    # nodes here, so Ready never flips and nothing writes it again).
    assert re.search(r"'update neuronultraserverworkloads/status': 1\.0[,}]", out), out


def test_controller_bench_runs_on_the_fake_apiserver() -> None:
    out = _run("controller", "--ultraservers", "10", "--workloads", "5")
    assert "final states {'Allocated': 5}" in out, out
    assert "(4) controller RSS" in out
