"""Shared pytest configuration: the fake API server fixtures are available everywhere, and
the tests that start real nodes run one after another in one xdist worker.

README's test command runs the suite in several processes (``-n 3 --dist loadgroup``): most
of the real tier's time is waiting on processes, not computing. Real nodes are the exception
to sharing the machine freely: it runs about a dozen at once (their kubelets and containerds
hold inotify instances, 128 per user), and ``tests/e2e`` relies on its shared clusters being
gone before ``tests/e2e_clusters`` starts its own (docs/testing.md). So every test that starts
real nodes gets the xdist group ``real-nodes``: one worker runs them all, in collection order.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["neuron_dra.sim.fakeapi.pytest_plugin"]

TESTS = Path(__file__).parent
REAL_NODES = "real-nodes"
#: Test files whose every test starts real nodes.
_ALWAYS = {"realnode", "bench/test_gang_start_smoke.py"}
#: Test files whose real-world cases (ids real-<minor>, kubelet-<minor>) start real nodes.
_REAL_CASES = {"e2e", "e2e_clusters", "chart/test_identity_flow.py"}


def starts_real_nodes(item: pytest.Item) -> bool:
    rel = Path(str(item.path)).relative_to(TESTS).as_posix()
    if any(rel == k or rel.startswith(k + "/") for k in _ALWAYS):
        return True
    if not any(rel == k or rel.startswith(k + "/") for k in _REAL_CASES):
        return False
    case_id = str(getattr(getattr(item, "callspec", None), "id", ""))
    return case_id.startswith(("real-", "kubelet-"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if starts_real_nodes(item):
            item.add_marker(pytest.mark.xdist_group(REAL_NODES))
