"""The install script's cluster checks, against a kubectl that answers as a real one does.

A real `kubectl api-versions` writes one line per write(2). The script once piped it into
`grep -q` under `set -o pipefail`: grep exits at the match, kubectl's next write meets a closed
pipe and dies of SIGPIPE, and the check said "does not serve resource.k8s.io/v1" on a cluster
that does (a CI run on Kubernetes 1.37 failed so). The fake kubectl here writes far more than a
pipe holds after the match, so the old pipeline fails every time, not only under load.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "examples" / "scripts" / "install-dra-driver.sh"

# Answers the calls the script makes before it installs anything. api-versions lists
# resource.k8s.io/v1 first, then ~1 MiB of other groups: more than a pipe's 64 KiB buffer.
FAKE_KUBECTL = r"""#!/usr/bin/env bash
case "$*" in
  "config current-context") echo fake-context ;;
  "version -o json") echo '{"serverVersion": {"major": "1", "minor": "37"}}' ;;
  "api-versions")
    echo resource.k8s.io/v1
    for ((i = 0; i < 40; i++)); do
      printf 'group%05d.example.com/v1\n' $(seq $((i * 1000)) $((i * 1000 + 999)))
    done
    ;;
  "api-versions-without-dra") echo v1 ;;
  get\ nodes*|get\ daemonsets*) ;;
  *) echo "fake kubectl: unexpected call: $*" >&2; exit 2 ;;
esac
"""


def fake_tools(bin_dir: Path, kubectl: str) -> dict[str, str]:
    """A PATH holding the fake kubectl and a helm that only needs to exist (a dry run
    prints the helm command instead of running it)."""
    bin_dir.mkdir()
    for name, text in (("kubectl", kubectl), ("helm", "#!/bin/sh\nexit 0\n")):
        tool = bin_dir / name
        tool.write_text(text)
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def run_install(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(INSTALL), "--yes", "--dry-run", "example.com/neuron-dra:0.1.0"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip


def test_dra_is_found_however_long_the_api_list(tmp_path: Path) -> None:
    proc = run_install(fake_tools(tmp_path / "bin", FAKE_KUBECTL))
    assert proc.returncode == 0, proc.stderr
    assert "does not serve resource.k8s.io/v1" not in proc.stderr
    assert "dry run: nothing was changed" in proc.stdout


def test_a_cluster_without_dra_is_refused(tmp_path: Path) -> None:
    without_dra = FAKE_KUBECTL.replace('"api-versions")', '"api-versions-unused")').replace(
        '"api-versions-without-dra")', '"api-versions")'
    )
    proc = run_install(fake_tools(tmp_path / "bin", without_dra))
    assert proc.returncode == 1
    assert "does not serve resource.k8s.io/v1" in proc.stderr
    assert "dry run" not in proc.stdout
