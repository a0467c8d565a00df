"""Where the project's non-Python files live (chart, examples) at run time."""

from __future__ import annotations

from pathlib import Path


def repo_root() -> Path:
    """The source checkout this package runs from.

    ``pip install -e .`` (how README.md installs) keeps the package inside the
    checkout, so the chart's CRDs and ``examples/`` are found beside it.
    """
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file() and (parent / "charts").is_dir():
            return parent
    raise FileNotFoundError(
        f"cannot find the neuron-dra source tree above {here}: run from a checkout "
        "installed with `pip install -e .`"
    )


def chart_crd_dir() -> Path:
    return repo_root() / "charts" / "neuron-dra-driver" / "crds"
