"""The digest at the end of ``.ci/run`` (``hack/ci-digest``): from a real pytest run's output,
each failing test's id with its first error line, whole, though pytest's own summary cuts it to
the terminal's width."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIGEST = ROOT / "hack" / "ci-digest"

FAILING = '''
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("the fixture broke: " + "x" * 120)

@pytest.mark.parametrize("minor", ["1.34"])
def test_compares(minor):
    assert minor == "1.37", "not the newest minor: " + "y" * 150

def test_errors_in_setup(broken):
    pass

class TestGroup:
    def test_times_out(self):
        raise TimeoutError("the plugin was not ready")

def test_passes():
    pass
'''


def digest_of(tmp_path: Path, source: str) -> list[str]:
    (tmp_path / "test_sample.py").write_text(source)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "test_sample.py"],
        cwd=tmp_path, capture_output=True, text=True, env={"COLUMNS": "80", "PATH": "/usr/bin"},
    )  # fmt: skip
    log = tmp_path / "tests.log"
    log.write_text(run.stdout + run.stderr)
    out = subprocess.run(
        [sys.executable, str(DIGEST), str(log)], capture_output=True, text=True, check=True
    )
    return out.stdout.splitlines()


def test_each_failure_with_its_whole_first_error_line(tmp_path: Path) -> None:
    lines = digest_of(tmp_path, FAILING)
    assert lines[0] == "  FAILED test_sample.py::test_compares[1.34]"
    assert lines[1].strip() == "AssertionError: not the newest minor: " + "y" * 150
    assert lines[2] == "  FAILED test_sample.py::TestGroup::test_times_out"
    assert lines[3].strip() == "TimeoutError: the plugin was not ready"
    assert lines[4] == "  ERROR test_sample.py::test_errors_in_setup"
    assert lines[5].strip() == "RuntimeError: the fixture broke: " + "x" * 120
    assert lines[6].strip().startswith("2 failed, 1 passed, 1 error in ")
    assert len(lines) == 7


def test_nothing_when_nothing_failed(tmp_path: Path) -> None:
    assert digest_of(tmp_path, "def test_passes():\n    pass\n") == []


def test_ci_run_prints_the_digest_on_exit() -> None:
    """The digest runs from an EXIT trap, so a failing step before the tests reports too."""
    run = (ROOT / ".ci" / "run").read_text()
    assert "trap digest EXIT" in run
    assert 'hack/ci-digest "$tests_log"' in run
    assert '| tee "$tests_log"' in run
