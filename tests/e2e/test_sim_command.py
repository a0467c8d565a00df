"""README's first command: ``neuron-dra sim`` runs the whole walkthrough and exits 0, on the
fake world and (``--kubernetes real``) on the real control plane of each pinned minor."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from neuron_dra.sim.worlds import minor_of, require_built


def _console_script() -> list[str]:
    script = Path(sys.executable).with_name("neuron-dra")
    if script.exists():
        return [str(script)]
    found = shutil.which("neuron-dra")
    if found is None:
        pytest.skip("neuron-dra console script not installed")
    return [found]


def _sim_args(world: str) -> list[str]:
    minor = minor_of(world)
    if minor is None:
        return []
    require_built(minor)  # skip off CI (or fail on CI) when the minor is not built
    return ["--kubernetes", "real", "--kubernetes-version", minor]


def test_sim_walks_through_every_step_and_exits_zero(tmp_path: Path, world: str) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [*_console_script(), "sim", *_sim_args(world)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "all steps passed" in out
    for title in (
        "The simulated cluster",
        "Connected devices",
        "Logical NeuronCore size 1",
        "4-node UltraServer groups",
        "UltraServer operator",
        "Invalid device count on trn1.32xlarge",
        "Cleanup",
    ):
        assert title in out
    # What each pod got is shown, not only that it ran.
    assert "NEURON_RT_VISIBLE_CORES" in out and "RANK-0 HOST" in out
    assert "does not support requests for device: 7" in out
    # Component logs go to a file, not over the tables.
    (log,) = tmp_path.glob("neuron-dra-sim-*.log")
    assert "prepared ResourceClaim" in log.read_text()
