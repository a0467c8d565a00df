"""The built-in kinds the fake serves: the resources our code (and kubectl against the
simulator) touches, each with the field selectors, printer columns and create/update
strategy switches of kube-apiserver 1.34."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from .printing import AGE
from .resource_types import PrinterColumn, ResourceType

# What kube-apiserver 1.34 accepts for pods (pkg/registry/core/pod ToSelectableFields plus
# the label conversion func): anything else is "field label not supported".
POD_FIELDS = frozenset(
    {
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.podIPs",
        "status.nominatedNodeName",
    }
)
EVENT_FIELDS = frozenset(
    {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    }
)



def _node_status(obj: dict[str, Any], _now: datetime) -> str:
    for c in obj.get("status", {}).get("conditions", []) or []:
        if c.get("type") == "Ready":
            ready = "Ready" if c.get("status") == "True" else "NotReady"
            break
    else:
        ready = "Unknown"
    if obj.get("spec", {}).get("unschedulable"):
        ready += ",SchedulingDisabled"
    return ready


def _pod_status(obj: dict[str, Any], _now: datetime) -> str:
    if obj.get("metadata", {}).get("deletionTimestamp"):
        return "Terminating"
    return str(obj.get("status", {}).get("phase", "Pending"))


def _pod_ready(obj: dict[str, Any], _now: datetime) -> str:
    containers = obj.get("spec", {}).get("containers", []) or []
    statuses = obj.get("status", {}).get("containerStatuses", []) or []
    ready = sum(1 for s in statuses if s.get("ready"))
    return f"{ready}/{len(containers)}"


def _claim_state(obj: dict[str, Any], _now: datetime) -> str:
    st = obj.get("status", {}) or {}
    parts = []
    if obj.get("metadata", {}).get("deletionTimestamp"):
        parts.append("deleted")
    parts.append("allocated" if st.get("allocation") else "pending")
    if st.get("reservedFor"):
        parts.append("reserved")
    return ",".join(parts)


def _col(name: str, path: str, typ: str = "string", priority: int = 0) -> PrinterColumn:
    return PrinterColumn(name=name, type=typ, json_path=path, priority=priority)


def _fn(
    name: str, func: Callable[[dict[str, Any], datetime], Any], typ: str = "string"
) -> PrinterColumn:
    return PrinterColumn(name=name, type=typ, func=func)


def builtin_types() -> list[ResourceType]:
    """The built-in resources our code (and kubectl against the simulator) touches."""
    st = frozenset({"status"})
    return [
        ResourceType(
            "", "v1", "namespaces", "Namespace", False, model="V1Namespace",
            short_names=("ns",), subresources=st,
            field_selectors=frozenset({"status.phase"}),
            printer_columns=(_col("Status", ".status.phase"), AGE),
            status_on_create=lambda: {"phase": "Active"},
        ),
        ResourceType(
            "", "v1", "nodes", "Node", False, model="V1Node",
            short_names=("no",), subresources=st,
            field_selectors=frozenset({"spec.unschedulable"}),
            printer_columns=(
                _fn("Status", _node_status),
                AGE,
                _col("Version", ".status.nodeInfo.kubeletVersion"),
            ),
        ),
        ResourceType(
            "", "v1", "pods", "Pod", True, model="V1Pod",
            short_names=("po",), categories=("all",),
            subresources=frozenset({"status", "binding"}),
            field_selectors=POD_FIELDS,
            printer_columns=(
                _fn("Ready", _pod_ready),
                _fn("Status", _pod_status),
                AGE,
                _col("IP", ".status.podIP", priority=1),
                _col("Node", ".spec.nodeName", priority=1),
            ),
            status_on_create=lambda: {"phase": "Pending", "qosClass": "BestEffort"},
        ),
        ResourceType(
            "", "v1", "events", "Event", True, model="CoreV1Event",
            short_names=("ev",), field_selectors=EVENT_FIELDS, create_on_update=True,
            printer_columns=(
                _col("Type", ".type"),
                _col("Reason", ".reason"),
                _col("Object", ".involvedObject.name"),
                _col("Message", ".message"),
                AGE,
            ),
        ),
        ResourceType(
            "", "v1", "configmaps", "ConfigMap", True, short_names=("cm",), model="V1ConfigMap",
            printer_columns=(AGE,),
        ),
        ResourceType(
            "", "v1", "secrets", "Secret", True, model="V1Secret",
            field_selectors=frozenset({"type"}),
            printer_columns=(_col("Type", ".type"), AGE),
        ),
        ResourceType(
            "", "v1", "serviceaccounts", "ServiceAccount", True, short_names=("sa",),
            model="V1ServiceAccount",
            printer_columns=(AGE,),
        ),
        ResourceType(
            "events.k8s.io", "v1", "events", "Event", True, model="EventsV1Event",
            short_names=("ev",), create_on_update=True,
            field_selectors=frozenset(
                {"reason", "type", "reportingController", "regarding.kind", "regarding.name",
                 "regarding.namespace", "regarding.uid"}
            ),
            printer_columns=(_col("Reason", ".reason"), _col("Note", ".note"), AGE),
        ),
        ResourceType(
            "coordination.k8s.io", "v1", "leases", "Lease", True, model="V1Lease",
            printer_columns=(_col("Holder", ".spec.holderIdentity"), AGE),
            unconditional_update=False, create_on_update=True,
        ),
        ResourceType(
            "resource.k8s.io", "v1", "resourceslices", "ResourceSlice", False,
            model="V1ResourceSlice",
            field_selectors=frozenset({"spec.nodeName", "spec.driver"}),
            printer_columns=(
                _col("Node", ".spec.nodeName"),
                _col("Driver", ".spec.driver"),
                _col("Pool", ".spec.pool.name"),
                AGE,
            ),
        ),
        ResourceType(
            "resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True,
            model="ResourceV1ResourceClaim",
            subresources=st, status_on_create="drop",
            printer_columns=(_fn("State", _claim_state), AGE),
        ),
        ResourceType(
            "resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True,
            model="V1ResourceClaimTemplate",
            printer_columns=(AGE,),
        ),
        ResourceType(
            "resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False,
            model="V1DeviceClass",
            printer_columns=(AGE,),
        ),
        # What the Helm chart installs (tests/chart applies every rendered object). The
        # workload kinds and policies clear a client's .status on create as their strategies'
        # PrepareForCreate does; nothing here runs them (no pods, no admission).
        ResourceType(
            "", "v1", "services", "Service", True, model="V1Service",
            short_names=("svc",), categories=("all",), subresources=st,
            printer_columns=(_col("Type", ".spec.type"), _col("Cluster-IP", ".spec.clusterIP"),
                             AGE),
            status_on_create=lambda: {"loadBalancer": {}},
        ),
        ResourceType(
            "apps", "v1", "daemonsets", "DaemonSet", True, model="V1DaemonSet",
            short_names=("ds",), categories=("all",), subresources=st,
            printer_columns=(
                _col("Desired", ".status.desiredNumberScheduled", "integer"),
                _col("Ready", ".status.numberReady", "integer"),
                AGE,
            ),
            status_on_create="drop",
        ),
        ResourceType(
            "apps", "v1", "deployments", "Deployment", True, model="V1Deployment",
            short_names=("deploy",), categories=("all",), subresources=st,
            printer_columns=(
                _col("Ready", ".status.readyReplicas", "integer"),
                _col("Up-to-date", ".status.updatedReplicas", "integer"),
                AGE,
            ),
            status_on_create="drop",
        ),
        ResourceType(
            "policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True,
            model="V1PodDisruptionBudget", short_names=("pdb",), subresources=st,
            printer_columns=(
                _col("Min Available", ".spec.minAvailable"),
                _col("Allowed Disruptions", ".status.disruptionsAllowed", "integer"),
                AGE,
            ),
            status_on_create="drop",
        ),
        ResourceType(
            "rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False,
            model="V1ClusterRole", printer_columns=(AGE,),
        ),
        ResourceType(
            "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding",
            False, model="V1ClusterRoleBinding",
            printer_columns=(_col("Role", ".roleRef.name"), AGE),
        ),
        ResourceType(
            "rbac.authorization.k8s.io", "v1", "roles", "Role", True, model="V1Role",
            printer_columns=(AGE,),
        ),
        ResourceType(
            "rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True,
            model="V1RoleBinding", printer_columns=(_col("Role", ".roleRef.name"), AGE),
        ),
        ResourceType(
            "admissionregistration.k8s.io", "v1", "validatingadmissionpolicies",
            "ValidatingAdmissionPolicy", False, model="V1ValidatingAdmissionPolicy",
            categories=("api-extensions",), subresources=st, status_on_create="drop",
            printer_columns=(AGE,),
        ),
        ResourceType(
            "admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings",
            "ValidatingAdmissionPolicyBinding", False,
            model="V1ValidatingAdmissionPolicyBinding", categories=("api-extensions",),
            printer_columns=(_col("Policy", ".spec.policyName"), AGE),
        ),
        ResourceType(
            "apiextensions.k8s.io", "v1", "customresourcedefinitions",
            "CustomResourceDefinition", False,
            short_names=("crd", "crds"), categories=("api-extensions",), subresources=st,
            unconditional_update=False,
            printer_columns=(_col("Created At", ".metadata.creationTimestamp"),),
        ),
    ]
