"""Every Kubernetes API call the two components make, by component: the RBAC the chart must
grant, no more (least privilege) and no less. Kept next to the chart checks; each entry says
which code needs it. test_chart.py checks

- the rendered ClusterRoles/Roles grant exactly these (verbs, resources, scope);
- the API resources the components' code references are exactly the ones listed here, so a
  new resource in the code fails the check until it is added here and to the chart;
- (audit) the requests the plugin and the controller really send to the fake API server in a
  short run are all listed here.

``scope``: "cluster" is granted by the ClusterRole; "namespace" by a Role in the release
namespace (objects that live only there).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Use:
    group: str
    resource: str  # plural, "plural/subresource" for a subresource
    verbs: frozenset[str]
    scope: str  # "cluster" | "namespace"
    why: str
    resource_names: frozenset[str] = frozenset()
    #: The oldest Kubernetes minor the chart grants it on.
    since: tuple[int, int] = (1, 34)


def _use(
    group: str,
    resource: str,
    verbs: str,
    scope: str,
    why: str,
    names: str = "",
    since: tuple[int, int] = (1, 34),
) -> Use:
    return Use(
        group, resource, frozenset(verbs.split()), scope, why, frozenset(names.split()), since
    )


KUBELET_PLUGIN: tuple[Use, ...] = (
    _use(
        "resource.k8s.io",
        "resourceslices",
        "get list watch create update delete",
        "cluster",
        "publish/publisher.py: own slices watched, written, re-read after a conflict",
    ),
    _use(
        "",
        "nodes",
        "get list watch patch",
        "cluster",
        "publish/publisher.py: own Node watched; publish/nodelabels.py labels merge-patched; "
        "plugin.py, prepare/nodestate.py, reservations.py get",
    ),
    _use(
        "resource.k8s.io",
        "resourceclaims",
        "get",
        "cluster",
        "prepare/budget.py read_claim: claim to prepare",
    ),
    _use(
        "resource.k8s.io",
        "resourceclaims/status",
        "patch",
        "cluster",
        "prepare/devicestatus.py: status.devices of prepared claims (server-side apply)",
        since=(1, 36),
    ),
    _use(
        "resource.k8s.io",
        "resourceclaims/driver",
        "associated-node:patch",
        "cluster",
        "prepare/devicestatus.py: the granular permission of the same writes (1.36+)",
        names="neuron.aws.com",
        since=(1, 36),
    ),
    _use(
        "",
        "pods",
        "get",
        "cluster",
        "prepare/preparer.py _read_pods: the claims' consumer pods, for the Neuron devices "
        "each container gets",
    ),
    _use(
        "events.k8s.io",
        "events",
        "create",
        "cluster",
        "events.py via prepare/preparer.py, prepare/nodestate.py",
    ),
    _use(
        "neuron.aws.com",
        "neuronultraservers",
        "list watch",
        "namespace",
        "reservations.py: allocations naming this node",
    ),
)

CONTROLLER: tuple[Use, ...] = (
    _use("resource.k8s.io", "resourceslices", "list watch", "cluster", "manager.py reflector"),
    _use("", "nodes", "list watch", "cluster", "manager.py reflector"),
    _use(
        "neuron.aws.com",
        "neuronultraserverworkloads",
        "get list watch update",
        "cluster",
        "manager.py reflector; workloads/writes.py finalizer updates, workloads/orphans.py "
        "orphan check",
    ),
    _use(
        "neuron.aws.com",
        "neuronultraserverworkloads/status",
        "update",
        "cluster",
        "workloads/writes.py status",
    ),
    _use(
        "neuron.aws.com",
        "neuronultraserverworkloads/finalizers",
        "update",
        "cluster",
        "templates.py: blockOwnerDeletion on the RCT's owner reference",
    ),
    _use(
        "resource.k8s.io",
        "resourceclaimtemplates",
        "get list watch create patch delete",
        "cluster",
        "manager.py reflector; workloads/generated.py templates",
    ),
    _use(
        "resource.k8s.io",
        "resourceclaims",
        "list watch delete",
        "cluster",
        "manager.py reflector (workload-id label); workloads/generated.py delete_claims",
    ),
    _use("", "pods", "delete", "cluster", "workloads/generated.py: pods of deleted claims"),
    _use("events.k8s.io", "events", "create", "cluster", "events.py"),
    _use("coordination.k8s.io", "leases", "create", "namespace", "leaderelection.py"),
    _use(
        "coordination.k8s.io",
        "leases",
        "get update",
        "namespace",
        "leaderelection.py",
        names="neuron-dra-controller",
    ),
    _use(
        "neuron.aws.com",
        "neuronultraservers",
        "get list watch create update delete",
        "namespace",
        "discovery/reconciler.py",
    ),
    _use(
        "neuron.aws.com",
        "neuronultraservers/status",
        "update",
        "namespace",
        "discovery/reconciler.py + workloads/writes.py",
    ),
)

#: Component name (the chart's app.kubernetes.io/component) -> (code packages, uses).
COMPONENTS: dict[str, tuple[tuple[str, ...], tuple[Use, ...]]] = {
    "kubelet-plugin": (("nodeplugin/neuron_dra/nodeplugin",), KUBELET_PLUGIN),
    "controller": (("controller/neuron_dra/controller",), CONTROLLER),
}
