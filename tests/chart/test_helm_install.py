"""``helm install``, ``helm upgrade`` and ``helm uninstall`` of the chart into the real
kube-apiserver of each pinned minor (1.34 and the newest), by the real helm.

Every object the chart renders (CRDs included) must exist afterwards as rendered (the live
object contains every rendered field; the API server adds its defaults), an upgrade with
changed values must change exactly those (the DaemonSet's rolling-update settings kept), and
an uninstall must remove everything but what helm never deletes: the CRDs of ``crds/`` (and
with them every NeuronUltraServer and workload) and the namespace ``--create-namespace``
made. docs/upgrade.md says the same for users, and its upgrade command (``--reuse-values``
with a new image tag) keeps every value an earlier upgrade set; after an uninstall the chart
installs again over the CRDs left behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from neuron_dra.sim.realcluster import APISERVER, ETCD

from .conftest import Helm, Overrides
from .realchart import (
    NS,
    RELEASE,
    ChartOnCluster,
    control_plane,
    create,
    key,
    minor_params,
    not_in,
)


@pytest.fixture(scope="module", params=minor_params())
def chart(request: pytest.FixtureRequest, helm: Helm) -> Iterator[ChartOnCluster]:
    # No scheduler or controller-manager: nothing here needs pods, and without them no pod
    # of the DaemonSet or Deployment is made (there are no kubelets to run them).
    with control_plane(request.param, components=(ETCD, APISERVER)) as cp:
        yield ChartOnCluster(helm, cp)


def _missing(chart: ChartOnCluster, rendered: list[dict[str, Any]]) -> list[str]:
    live = chart.live(rendered)
    out = []
    for obj in rendered:
        got = live.get(key(obj))
        if got is None:
            out.append(f"{key(obj)}: not in the API server")
            continue
        out += [f"{key(obj)}{d}" for d in not_in(obj, got)]
    return out


UPGRADE = Overrides.of(
    "image.tag=0.2.0-test",
    "kubeletPlugin.updateStrategy.maxSurge=2",
    "logging.verbosity=6",
)
#: docs/upgrade.md step 3 (``--reuse-values --set image.tag=<new tag>``), with one more value
#: changed: the metrics Service switched off, which helm must delete.
REUSE = Overrides.of("image.tag=0.3.0-test", "controller.metrics.service.enabled=false")
WORKLOAD = {
    "apiVersion": "neuron.aws.com/v1beta1",
    "kind": "NeuronUltraServerWorkload",
    "metadata": {"name": "survivor", "namespace": "default"},
    "spec": {"instanceType": "trn2u.48xlarge", "topologySize": 4, "serverCount": 1},
}


def _crd_versions(chart: ChartOnCluster, rendered: list[dict[str, Any]]) -> dict[Any, str]:
    crds = [o for o in rendered if o["kind"] == "CustomResourceDefinition"]
    return {k: o["metadata"]["resourceVersion"] for k, o in chart.live(crds).items()}


def test_install_upgrade_uninstall(chart: ChartOnCluster) -> None:
    # --- install ------------------------------------------------------------------------
    chart.install()
    assert chart.release()["info"]["status"] == "deployed"
    rendered = chart.rendered(include_crds=True)
    kinds = {o["kind"] for o in rendered}
    assert {
        "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
        "Role", "RoleBinding", "DeviceClass", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding", "DaemonSet", "Deployment", "PodDisruptionBudget",
        "Service",
    } <= kinds, kinds  # fmt: skip
    assert _missing(chart, rendered) == []
    crd_versions = _crd_versions(chart, rendered)
    create(chart.cp, WORKLOAD)

    # --- upgrade with changed values --------------------------------------------------------
    chart.upgrade(UPGRADE)
    release = chart.release()
    assert (release["info"]["status"], release["version"]) == ("deployed", 2)
    upgraded = chart.rendered(UPGRADE, include_crds=True)
    assert _missing(chart, upgraded) == []
    live = chart.live([o for o in upgraded if o["kind"] == "DaemonSet"])
    (daemonset,) = live.values()
    strategy = daemonset["spec"]["updateStrategy"]
    assert strategy == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 2, "maxUnavailable": 0},
    }
    images = {c["image"] for c in daemonset["spec"]["template"]["spec"]["containers"]}
    assert images == {"neuron-dra:0.2.0-test"}
    # Only what the values changed: the rest of the DaemonSet is as the first install made it.
    before = next(o for o in rendered if o["kind"] == "DaemonSet")
    after = next(o for o in upgraded if o["kind"] == "DaemonSet")
    assert not_in(before["spec"], after["spec"], "spec") == [
        "spec.updateStrategy.rollingUpdate.maxSurge: want 1, got 2",
        "spec.template.spec.containers[0].image: want 'neuron-dra:0.1.0', "
        "got 'neuron-dra:0.2.0-test'",
        "spec.template.spec.containers[0].args[0]: want '--v=2', got '--v=6'",
    ]

    # --- docs/upgrade.md's upgrade: --reuse-values keeps what the first upgrade set ---------
    chart.upgrade(REUSE, "--reuse-values")
    assert chart.release()["version"] == 3
    reused = chart.rendered(Overrides((*UPGRADE.sets, *REUSE.sets)), include_crds=True)
    assert _missing(chart, reused) == []
    (daemonset,) = chart.live([o for o in reused if o["kind"] == "DaemonSet"]).values()
    assert daemonset["spec"]["updateStrategy"]["rollingUpdate"] == {
        "maxSurge": 2,
        "maxUnavailable": 0,
    }
    dropped = [o for o in upgraded if key(o) not in {key(r) for r in reused}]
    assert [key(o) for o in dropped] == [("Service", NS, f"{RELEASE}-controller-metrics")]
    assert chart.live(dropped) == {}, "helm upgrade kept an object the values dropped"
    # helm never touches crds/ after the first install (docs/upgrade.md: apply them first).
    assert _crd_versions(chart, reused) == crd_versions

    # --- uninstall ------------------------------------------------------------------------
    chart.uninstall()
    left = chart.live(upgraded)
    crds = {key(o) for o in upgraded if o["kind"] == "CustomResourceDefinition"}
    assert set(left) == crds, sorted(set(left) - crds)
    namespaces = chart.cp.kubectl("get", "namespace", NS, "-o", "name")
    assert namespaces.strip() == f"namespace/{NS}"  # --create-namespace's is not removed
    assert RELEASE not in chart.cp.kubectl("get", "secrets", "-n", NS, "-o", "name")
    # The CRDs keep their objects (docs/upgrade.md: delete the CRDs last, if at all).
    chart.cp.kubectl("get", "neuronultraserverworkload", "survivor", "-n", "default")

    # --- installing again over the CRDs left behind (helm skips existing crds/) -------------
    chart.install()
    assert _missing(chart, rendered) == []
    assert _crd_versions(chart, rendered) == crd_versions
    chart.uninstall()
