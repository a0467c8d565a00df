"""Fixtures of the chart checks: the helm-free renderer (hack/chart-render), built once.

A cold build compiles Go's standard library (~25-40 s on a 2-core machine; later builds come
from the cache in seconds), so it starts in a background thread as soon as this directory is
collected and overlaps the collection of the rest of the suite.
"""

from __future__ import annotations

import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "chart-render"))

import chartrender  # noqa: E402

_BUILD: Future[Path] = ThreadPoolExecutor(1, thread_name_prefix="chart-render-build").submit(
    chartrender.build_renderer
)


@pytest.fixture(scope="session")
def renderer() -> Any:
    """A ChartRenderer whose Go binary is built (or found in the cache) once per session."""
    return chartrender.ChartRenderer(chartrender.CHART_DIR, _BUILD.result())
