"""Bad input to the CRDs, sent to the real kube-apiserver (1.34 and the newest minor) the way
a user sends it (``kubectl create --validate=strict``, i.e. ``fieldValidation=Strict``):
every case is rejected, with the message listed for it in docs/crd-validation.md. The test
reads the cases' messages from that document, so the document cannot drift from what users
see."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from neuron_dra.sim.realcluster import ADMIN, RealControlPlane, enabled_minors
from neuron_dra.sim.worlds import real_control_plane

DOC = Path(__file__).resolve().parents[2] / "docs" / "crd-validation.md"
NS = "crd-bad-input"
API = "neuron.aws.com/v1beta1"

WORKLOAD: dict[str, Any] = {
    "apiVersion": API,
    "kind": "NeuronUltraServerWorkload",
    "metadata": {"name": "job", "namespace": NS},
    "spec": {
        "instanceType": "trn2u.48xlarge",
        "topologySize": 4,
        "serverCount": 2,
        "allocationPolicy": {"failureStrategy": "RestartAll"},
        "resourceClaimTemplate": {"name": "job-claims"},
        "config": {"logicalNeuronCore": 2},
    },
}
ULTRASERVER: dict[str, Any] = {
    "apiVersion": API,
    "kind": "NeuronUltraServer",
    "metadata": {"name": "us-a", "namespace": NS},
    "spec": {
        "instanceType": "trn2u.48xlarge",
        "topology": [{"nodeName": f"node-{i}", "nodeId": i} for i in range(4)],
    },
}


def _set(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``obj`` with ``path`` (dotted; ``[i]`` for list items) set, or removed when
    ``value`` is ``DELETE``."""
    out = copy.deepcopy(obj)
    parts = [int(p) if p.isdigit() else p for p in re.split(r"\.|\[|\]\.?", path) if p != ""]
    node: Any = out
    for part in parts[:-1]:
        node = node[part]
    if value is DELETE:
        del node[parts[-1]]
    else:
        node[parts[-1]] = value
    return out


DELETE = object()

#: case id -> (object as created; for updates, the object first created and then the change)
CREATES: dict[str, dict[str, Any]] = {
    "workload-topology-size-3": _set(WORKLOAD, "spec.topologySize", 3),
    "workload-topology-size-string": _set(WORKLOAD, "spec.topologySize", "four"),
    "workload-server-count-0": _set(WORKLOAD, "spec.serverCount", 0),
    "workload-server-count-negative": _set(WORKLOAD, "spec.serverCount", -2),
    "workload-server-count-too-many": _set(WORKLOAD, "spec.serverCount", 1001),
    "workload-server-count-missing": _set(WORKLOAD, "spec.serverCount", DELETE),
    "workload-instance-type-empty": _set(WORKLOAD, "spec.instanceType", ""),
    "workload-failure-strategy": _set(WORKLOAD, "spec.allocationPolicy.failureStrategy", "Retry"),
    "workload-template-name": _set(WORKLOAD, "spec.resourceClaimTemplate.name", "Job_Claims"),
    "workload-lnc-3": _set(WORKLOAD, "spec.config.logicalNeuronCore", 3),
    "workload-unknown-field": _set(WORKLOAD, "spec.replicas", 8),
    "workload-bad-name": _set(WORKLOAD, "metadata.name", "Train_Job"),
    "ultraserver-node-id-4": _set(ULTRASERVER, "spec.topology[3].nodeId", 4),
    "ultraserver-duplicate-node-id": _set(ULTRASERVER, "spec.topology[3].nodeId", 0),
    "ultraserver-five-nodes": _set(
        ULTRASERVER,
        "spec.topology",
        [{"nodeName": f"node-{i}", "nodeId": i % 4} for i in range(5)],
    ),
    "ultraserver-link-status": _set(ULTRASERVER, "spec.topology[0].linkStatusHorizontal", "Flaky"),
    "ultraserver-instance-type-missing": _set(ULTRASERVER, "spec.instanceType", DELETE),
    "ultraserver-unknown-field": _set(ULTRASERVER, "spec.nodes", 4),
}
UPDATES: dict[str, tuple[str, Any]] = {
    "workload-server-count-changed": ("spec.serverCount", 3),
    "workload-topology-size-changed": ("spec.topologySize", 2),
    "workload-template-removed": ("spec.resourceClaimTemplate", DELETE),
}


def documented() -> dict[str, tuple[str, str]]:
    """case id -> (field, message) the document promises (its row's last two cells)."""
    out = {}
    for line in DOC.read_text().splitlines():
        found = re.match(r"\| `([a-z0-9-]+)` \|.*\| `([^`]+)` \| `(.+)` \|$", line)
        if found:
            out[found[1]] = (found[2], found[3])
    return out


def _answers(error: str, case: str) -> None:
    field, message = documented()[case]
    assert field in error and message in error, f"{case}: {error}"


def _kubectl(cp: RealControlPlane, verb: str, obj: dict[str, Any], tmp: Path) -> str:
    path = tmp / f"{obj['metadata']['name']}.json"
    path.write_text(json.dumps(obj))
    proc = subprocess.run(
        [str(cp.bin_dir / "kubectl"), "--kubeconfig", str(cp.kubeconfig(ADMIN)), verb,
         "--validate=strict", "-f", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return proc.stderr.strip() if proc.returncode else ""


@pytest.fixture(scope="module", params=[pytest.param(m, id=f"real-{m}") for m in enabled_minors()])
def cp(request: pytest.FixtureRequest) -> Iterator[RealControlPlane]:
    plane = real_control_plane(request.param)
    plane.kubectl("create", "namespace", NS, check=False)
    yield plane
    # The shared control plane hosts other tests' controllers next: leave no workload
    # behind for them to allocate.
    plane.kubectl("delete", "namespace", NS, "--wait=false")


def test_the_document_lists_exactly_the_cases() -> None:
    assert set(documented()) == set(CREATES) | set(UPDATES)


@pytest.mark.parametrize("case", sorted(CREATES))
def test_bad_input_is_rejected_with_the_documented_message(
    cp: RealControlPlane, case: str, tmp_path: Path
) -> None:
    error = _kubectl(cp, "create", CREATES[case], tmp_path)
    assert error, f"{case}: accepted"
    _answers(error, case)


@pytest.mark.parametrize("case", sorted(UPDATES))
def test_immutable_fields_refuse_changes_with_the_documented_message(
    cp: RealControlPlane, case: str, tmp_path: Path
) -> None:
    good = _set(WORKLOAD, "metadata.name", case)
    cp.kubectl("delete", "nusw", case, "-n", NS, "--ignore-not-found", "--wait=false")
    assert _kubectl(cp, "create", good, tmp_path) == ""
    live = json.loads(cp.kubectl("get", "nusw", case, "-n", NS, "-o", "json"))
    path, value = UPDATES[case]
    error = _kubectl(cp, "replace", _set(live, path, value), tmp_path)
    assert error, f"{case}: accepted"
    _answers(error, case)
