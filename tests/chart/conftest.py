"""Fixtures of the chart checks: the helm-free renderer (hack/chart-render), built once."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "chart-render"))

import chartrender  # noqa: E402


@pytest.fixture(scope="session")
def renderer() -> Any:
    """A ChartRenderer whose Go binary is built (or found in the cache) once per session."""
    return chartrender.ChartRenderer(chartrender.CHART_DIR, chartrender.build_renderer())
