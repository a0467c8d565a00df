"""README's first command: ``neuron-dra sim`` runs the whole walkthrough and exits 0, on the
fake world, and with ``--kubernetes real`` on the newest control plane with the real kubelets
of the minors pinned for their nodes only (1.35 and 1.36, taken by the nodes in turn): the
real-node smoke of those minors.
(The same steps run on every full minor's real nodes in tests/e2e.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from neuron_dra.sim.kubebuild import kube_modules, newest_minor
from neuron_dra.sim.realcluster import enabled_minors
from neuron_dra.sim.worlds import minor_of, require_built, require_real_nodes


def _console_script() -> list[str]:
    script = Path(sys.executable).with_name("neuron-dra")
    if script.exists():
        return [str(script)]
    found = shutil.which("neuron-dra")
    if found is None:
        pytest.skip("neuron-dra console script not installed")
    return [found]


def _runs() -> list[str]:
    """``fake``, and ``kubelet-<minor>`` for each node-only minor: ``--kubernetes real`` on
    the newest control plane with those kubelets. (The same steps run on each full minor's
    real nodes in tests/e2e, and the command's real path is this one.)"""
    nodes_only = ",".join(m.name for m in kube_modules() if not m.has_control_plane)
    if not nodes_only or newest_minor() not in enabled_minors():
        return ["fake"]
    # One cluster, its nodes taking the minors in turn (as in the middle of an upgrade): both
    # minors' kubelets prepare the walkthrough's pods.
    return ["fake", f"kubelet-{nodes_only}"]


def _sim_args(run: str) -> list[str]:
    if run == "fake":
        return []
    newest = newest_minor()
    # skip off CI (or fail on CI) when the minor is not built or nodes cannot run here
    require_built(newest)
    kubelet = run.removeprefix("kubelet-") if run.startswith("kubelet-") else minor_of(run)
    assert kubelet is not None
    for minor in kubelet.split(","):
        require_real_nodes(minor)
    args = ["--kubernetes", "real", "--kubernetes-version", newest]
    return [*args, "--kubelet-version", kubelet]


@pytest.mark.parametrize("run", _runs())
def test_sim_walks_through_every_step_and_exits_zero(tmp_path: Path, run: str) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [*_console_script(), "sim", *_sim_args(run)],
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
    # Component logs go to a file, not over the tables: the in-process plugins' on the fake
    # world; on real nodes the plugins are processes of their own (logs under each node's
    # directory) and the file has the controller's.
    (log,) = tmp_path.glob("neuron-dra-sim-*.log")
    logged = "prepared ResourceClaim" if run == "fake" else "neuron_dra.controller"
    assert logged in log.read_text()
