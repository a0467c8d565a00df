"""End-to-end tests that start clusters of their own: the failure strategies (a node is
killed) and ``neuron-dra sim`` as a command.

They live apart from ``tests/e2e`` because real nodes are counted: a machine runs about a
dozen at once under Linux's default inotify limit (each node's kubelet and containerd hold
8 instances, 128 per user by default). pytest finishes a package before the next, so the
shared clusters of ``tests/e2e`` are gone when these start; where the limit is higher
(``hack/k8s/node-packages`` raises it), the failure strategies run in a worker of their own
beside them (tests/conftest.py).
"""

from __future__ import annotations

import pytest
from neuron_dra.sim.worlds import world_params


@pytest.fixture(scope="package", params=world_params())
def world(request: pytest.FixtureRequest) -> str:
    """``fake`` or ``real-<minor>``: a real control plane of that minor with real nodes."""
    return str(request.param)
