"""What the kubelet plugin imports before its first ResourceSlice publish.

Start-up time to the first publish is mostly imports (issue #3 wants the slice within 1 s
of the process starting). What only serving needs is imported after the publish
(``plugin.load_serving_stack``); these tests keep it that way.
"""

from __future__ import annotations

import json
import subprocess
import sys

from neuron_dra.nodeplugin.kubeletapi import _proto
from neuron_dra.nodeplugin.kubeletapi.model import DRA_VERSIONS, HEALTH_VERSIONS

#: Module prefixes that only serving needs.
SERVING_ONLY = ("grpc", "grpc_health", "google.protobuf", "aiohttp.web", "pydantic")


def _modules_after(code: str) -> set[str]:
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


def _serving_only(modules: set[str]) -> set[str]:
    return {m for m in modules if any(m == p or m.startswith(p + ".") for p in SERVING_ONLY)}


def test_the_entry_point_leaves_the_serving_stack_for_later() -> None:
    before = _modules_after("import neuron_dra.nodeplugin.main")
    assert _serving_only(before) == set()
    assert "neuron_dra.common.models.configs" not in before

    after = _modules_after(
        "import neuron_dra.nodeplugin.main\n"
        "from neuron_dra.nodeplugin.plugin import load_serving_stack\n"
        "load_serving_stack()"
    )
    assert {"grpc", "aiohttp.web", "neuron_dra.common.models.configs"} <= after
    assert "neuron_dra.nodeplugin.kubeletapi.wiring" in after


def test_advertised_versions_match_the_codecs_in_order() -> None:
    # PluginServer advertises DRA_VERSIONS without importing the codecs; they must agree.
    assert tuple(c.registration_name for c in _proto.DRA_CODECS) == DRA_VERSIONS
    assert tuple(c.registration_name for c in _proto.HEALTH_CODECS) == HEALTH_VERSIONS
