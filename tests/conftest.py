"""Shared pytest configuration: the fake API server fixtures are available everywhere, and
the tests that start real nodes run in a few units of work, each in one xdist worker.

README's test command runs the suite in several processes (``-n 4``): most of the real
tier's time is waiting on processes, not computing. Real nodes are the exception to sharing
the machine freely: their kubelets and containerds hold inotify instances (8 a node, counted
against the user's ``fs.inotify.max_user_instances``), and ``tests/e2e`` relies on its shared
clusters being gone before ``tests/e2e_clusters`` starts its own when the room is Linux's
default 128 (docs/testing.md). So the tests that start real nodes form two units of work
(four where the limit allows, :func:`real_nodes_unit`) that one worker each runs in
collection order (:class:`RealNodesScheduling`); every other test is a unit of its own.

(pytest-xdist's own ``--dist loadgroup`` would do this with markers, but under pytest 9 its
worker-side renaming of node ids has no effect, so the grouping is done here, from node ids.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["neuron_dra.sim.fakeapi.pytest_plugin"]

REAL_NODES = "real-nodes"
#: Test files (or directories) whose every test starts real nodes.
_ALWAYS = ("tests/realnode/", "tests/soak/test_real_node_soak.py")
#: Test files whose real-world cases (ids real-<minor>, kubelet-<minor>) start real nodes.
_REAL_CASES = (
    "tests/e2e/",
    "tests/e2e_clusters/",
    "tests/chart/test_identity_flow.py",
    "tests/chart/test_installed_product.py",
)


def starts_real_nodes(nodeid: str) -> bool:
    """Whether the test of ``nodeid`` (``tests/<module>.py::test[id]``) starts real nodes."""
    path, _, rest = nodeid.partition("::")
    if path.startswith(_ALWAYS):
        return True
    if not path.startswith(_REAL_CASES):
        return False
    case_id = rest.partition("[")[2].rstrip("]")
    return case_id.startswith(("real-", "kubelet-"))


#: The kubelet-side tests' clusters are small (three nodes at most), the real-node soak's and
#: the chart's identity flow's have four, one after the other: they run beside the other
#: real-node tests, whose largest cluster is twelve nodes (12 + 4 nodes x 8 inotify instances
#: fit the user's default 128; docs/testing.md, "In parallel"). The identity flow is here to
#: even out the units' lengths.
KUBELET_SIDE = (
    "tests/realnode/",
    "tests/soak/test_real_node_soak.py",
    "tests/chart/test_identity_flow.py",
)
#: With room for more units, the soak and the identity flow (four nodes each) leave the
#: kubelet-side unit for one of their own: the kubelet side alone was the longest unit.
SOAK_AND_IDENTITY = (
    "tests/soak/test_real_node_soak.py",
    "tests/chart/test_identity_flow.py",
)
#: With room for four units (see :data:`ROOM_FOR_FOUR_UNITS`), the clusters of their own
#: (failure strategies) and the installed product's fleets run beside tests/e2e's shared
#: clusters instead of after them: the two halves take about as long as the kubelet side.
OWN_CLUSTERS = (
    "tests/e2e_clusters/test_failure_strategies.py",
    "tests/chart/test_installed_product.py",
)
#: inotify instances (``fs.inotify.max_user_instances``) four units need at once: 12 + 12 +
#: 4 + 5 nodes of 8 each, with room for the control planes and the rest of the session.
#: ``hack/k8s/node-packages`` raises the limit to 1024 where it may (root, writable).
ROOM_FOR_FOUR_UNITS = 512
#: Collected first. The real-node soak runs first in its unit: the other unit's first tests
#: (the chart's) run five nodes at most, its twelve-node clusters come minutes later. The soak
#: on simulated nodes (~80 s, little of it CPU) starts at once beside the rest instead of
#: last, where it ran alone at the end of the run.
FIRST = ("tests/soak/test_real_node_soak.py", "tests/soak/test_soak_checks.py::test_short_soak")


def inotify_limit(path: Path = Path("/proc/sys/fs/inotify/max_user_instances")) -> int:
    """The user's inotify instance limit; 128 (Linux's default) where it cannot be read."""
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 128


def real_nodes_unit(nodeid: str, limit: int = 128) -> str | None:
    """The unit of work of a test that starts real nodes (run in order by one worker), or
    None for a test that starts none. ``limit``: the user's inotify instances, which decide
    whether the machine has room for two units or four."""
    if not starts_real_nodes(nodeid):
        return None
    roomy = limit >= ROOM_FOR_FOUR_UNITS
    if roomy and nodeid.startswith(SOAK_AND_IDENTITY):
        return f"{REAL_NODES}-soak-and-identity"
    if nodeid.startswith(KUBELET_SIDE):
        return f"{REAL_NODES}-kubelet-side"
    if roomy and nodeid.startswith(OWN_CLUSTERS):
        return f"{REAL_NODES}-own-clusters"
    return REAL_NODES


def pytest_sessionstart(session: pytest.Session) -> None:
    """What a killed run left (its work directories in /dev/shm and /tmp, up to a few GB of
    RAM each) is removed before this one makes its own; once, by the controlling process."""
    if hasattr(session.config, "workerinput"):
        return
    from neuron_dra.sim.scratch import sweep_orphaned

    removed = sweep_orphaned()
    if removed:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        line = f"removed {len(removed)} work directories of killed runs: {removed[0]}, ..."
        if reporter is not None:
            reporter.write_line(line)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not item.nodeid.startswith(FIRST))  # stable: order kept


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class RealNodesScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """Every test its own unit of work, but the real-node tests one unit together."""

        limit = inotify_limit()

        def _split_scope(self, nodeid: str) -> str:
            return real_nodes_unit(nodeid, self.limit) or nodeid

    return RealNodesScheduling(config, log)
