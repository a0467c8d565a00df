"""The resource type table of the fake API server.

Every served resource (built-in or from a CustomResourceDefinition) is one
``ResourceType``: where it lives in the URL space, its kind, scope, subresources,
which field selectors the real server accepts for it, and how ``kubectl get``
prints it. The same table produces the discovery documents kubectl reads before
it does anything else.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kubernetes_asyncio import client as k8s_models

# Verbs as kube-apiserver advertises them in APIResourceList; kubectl refuses
# e.g. `kubectl delete` when "delete" is missing, so advertise what we serve.
ALL_VERBS = (
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
)

# Fields every kind accepts in a field selector (the apiserver adds them for all types).
BASE_FIELDS = frozenset({"metadata.name", "metadata.namespace"})

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


@dataclass(frozen=True)
class PrinterColumn:
    """One column of server-side printing (a ``meta.k8s.io/v1`` Table column).

    CRD columns carry a JSONPath; a few built-in columns are computed (``func``)
    because kube-apiserver's printers derive them (e.g. a node's Ready status).
    """

    name: str
    type: str = "string"
    json_path: str | None = None
    description: str = ""
    priority: int = 0
    format: str = ""
    func: Callable[[dict[str, Any], datetime], Any] | None = None

    def definition(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        }


@dataclass
class ResourceType:
    """One served group/version/resource."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    # Subresources served under .../NAME/<sub>: "status" (spec/status split) and "binding".
    subresources: frozenset[str] = frozenset()
    # Field-selector labels accepted in addition to BASE_FIELDS.
    field_selectors: frozenset[str] = frozenset()
    printer_columns: tuple[PrinterColumn, ...] = ()
    # CRDSchema for custom resources (duck-typed: apply_defaults/prune/validate).
    schema: Any = None
    # The CRD version's openAPIV3Schema, served in /openapi/v3 for kubectl.
    raw_schema: dict[str, Any] | None = None
    # Name of the CustomResourceDefinition that defines this type, None for built-ins.
    crd: str | None = None
    # What create does with a client-supplied .status: "keep" (nodes, like the real
    # server), "drop" (CRs with a status subresource, ResourceClaims), or a callable
    # returning the initial status (pods start Pending, namespaces Active).
    status_on_create: str | Callable[[], dict[str, Any]] = "keep"
    # Storage is shared by all versions of one group/resource.
    verbs: tuple[str, ...] = ALL_VERBS
    # The strategy's AllowUnconditionalUpdate: False means a PUT must carry
    # metadata.resourceVersion (leases, CRDs and custom resources), else 422.
    unconditional_update: bool = True
    # The strategy's AllowCreateOnUpdate: a PUT of a missing object creates it (201).
    create_on_update: bool = False
    # The kubernetes_asyncio model of a built-in kind: its field table is the schema that
    # unknown fields are pruned against (what decoding into the Go struct does).
    model: str = ""

    def __post_init__(self) -> None:
        if not self.singular:
            self.singular = self.kind.lower()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    @property
    def store_key(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def qualified(self) -> str:
        """``plural.group`` as used in error messages (``pods`` for the core group)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def allowed_fields(self) -> frozenset[str]:
        return BASE_FIELDS | self.field_selectors


# --------------------------------------------------------------------------- JSONPath subset


def _parse_path(path: str) -> list[str]:
    """Split the printer-column JSONPath subset (``.a.b``, ``.a[*].b``, ``.a[0]``, ``{...}``)."""
    p = path.strip()
    if p.startswith("{") and p.endswith("}"):
        p = p[1:-1]
    out: list[str] = []
    for part in p.lstrip(".").split("."):
        if not part:
            continue
        while "[" in part:
            head, _, rest = part.partition("[")
            if head:
                out.append(head)
            idx, _, part = rest.partition("]")
            out.append(f"[{idx}]")
        if part:
            out.append(part)
    return out


def eval_jsonpath(obj: Any, path: str) -> list[Any]:
    """All values at ``path`` (empty list when the path does not resolve)."""
    current: list[Any] = [obj]
    for seg in _parse_path(path):
        nxt: list[Any] = []
        for v in current:
            if seg.startswith("["):
                if not isinstance(v, list):
                    continue
                idx = seg[1:-1]
                if idx == "*":
                    nxt.extend(v)
                else:
                    try:
                        nxt.append(v[int(idx)])
                    except (ValueError, IndexError):
                        continue
            elif isinstance(v, dict) and seg in v:
                nxt.append(v[seg])
        current = nxt
    return current


def human_duration(seconds: float) -> str:
    """kubectl's age format (apimachinery duration.HumanDuration)."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rem = s % 60
        return f"{minutes}m{rem}s" if rem else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        rem_m = (s % 3600) // 60
        return f"{hours}h{rem_m}m" if rem_m else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 192:
        rem_h = hours % 24
        return f"{hours // 24}d{rem_h}h" if rem_h else f"{hours // 24}d"
    days = hours // 24
    if days < 365 * 2:
        return f"{days}d"
    years, rem_d = days // 365, days % 365
    if years < 8:
        return f"{years}y{rem_d}d" if rem_d else f"{years}y"
    return f"{years}y"


def parse_time(value: str) -> datetime | None:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None


def age_of(obj: dict[str, Any], now: datetime) -> str:
    ts = parse_time(obj.get("metadata", {}).get("creationTimestamp", ""))
    return "<unknown>" if ts is None else human_duration((now - ts).total_seconds())


def cell_value(col: PrinterColumn, obj: dict[str, Any], now: datetime) -> Any:
    """A Table cell as the real server renders it (dates become ages)."""
    if col.func is not None:
        return col.func(obj, now)
    if not col.json_path:
        return None
    values = eval_jsonpath(obj, col.json_path)
    if not values:
        return None
    if col.type == "date":
        ts = parse_time(values[0]) if isinstance(values[0], str) else None
        return "<unknown>" if ts is None else human_duration((now - ts).total_seconds())
    if len(values) == 1:
        v = values[0]
        if isinstance(v, (dict, list)):
            return json.dumps(v, separators=(",", ":"))
        if col.type == "string" and not isinstance(v, str):
            return json.dumps(v) if isinstance(v, bool) else str(v)
        return v
    return ",".join(v if isinstance(v, str) else json.dumps(v) for v in values)


# --------------------------------------------------------------------------- built-ins


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


AGE = PrinterColumn(
    name="Age",
    type="string",
    description="CreationTimestamp is a timestamp representing the server time when this "
    "object was created.",
    func=age_of,
)


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


# --------------------------------------------------------------------------- unknown fields

# Fields kubernetes_asyncio's models (Kubernetes 1.36 OpenAPI) have that a 1.34 server does
# not know, and so drops: per model, by JSON name.
_NEWER_THAN_SERVED: dict[str, frozenset[str]] = {
    "V1DeviceAttribute": frozenset({"bools", "ints", "strings", "versions"}),
    "V1Device": frozenset({"nodeAllocatableResourceMappings"}),
}
_LEAF_TYPES = frozenset({"str", "int", "bool", "float", "datetime", "date", "object"})


class _Shape:
    """A compiled openapi type of kubernetes_asyncio: ``model`` (fields by JSON name),
    ``list``/``dict`` of an inner shape, or a leaf (None, nothing to prune)."""

    __slots__ = ("fields", "inner", "kind", "leafy")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.inner: _Shape | None = None
        self.fields: dict[str, _Shape | None] = {}
        self.leafy = False  # a model whose fields are all leaves: only its keys to check


_SHAPES: dict[str, _Shape | None] = {}


def _shape(typ: str) -> _Shape | None:
    if typ in _SHAPES:
        return _SHAPES[typ]
    if typ in _LEAF_TYPES:
        _SHAPES[typ] = None
        return None
    if typ.startswith("list[") or typ.startswith("dict("):
        inner_typ = typ[5:-1] if typ.startswith("list[") else typ[typ.index(",") + 1:-1]
        inner = _shape(inner_typ.strip())
        shape = None if inner is None else _Shape("list" if typ[0] == "l" else "dict")
        if shape is not None:
            shape.inner = inner
        _SHAPES[typ] = shape
        return shape
    cls = getattr(k8s_models, typ, None)
    if cls is None or not hasattr(cls, "openapi_types"):
        _SHAPES[typ] = None
        return None
    shape = _Shape("model")
    _SHAPES[typ] = shape  # before recursing: models may refer to themselves
    newer = _NEWER_THAN_SERVED.get(typ, frozenset())
    for attr, ftyp in cls.openapi_types.items():
        name = cls.attribute_map[attr]
        if name not in newer:
            shape.fields[name] = _shape(ftyp)
    shape.leafy = all(f is None for f in shape.fields.values())
    return shape


def _prune_shape(shape: _Shape, value: Any, stack: list[str], removed: list[str]) -> None:
    """Prune ``value`` in place; ``stack`` holds the path segments (joined only for a
    removal, since this runs on every write of every built-in object)."""
    kind = shape.kind
    if kind == "model":
        if not isinstance(value, dict):
            return
        fields = shape.fields
        if not value.keys() <= fields.keys():
            for key in [k for k in value if k not in fields]:
                removed.append(_join([*stack, key]))
                del value[key]
        if shape.leafy:
            return
        for key, sub in value.items():
            fshape = fields[key]
            if fshape is not None:
                stack.append(key)
                _prune_shape(fshape, sub, stack, removed)
                stack.pop()
    elif kind == "list":
        if isinstance(value, list):
            inner = shape.inner
            assert inner is not None
            for i, item in enumerate(value):
                stack.append(f"[{i}]")
                _prune_shape(inner, item, stack, removed)
                stack.pop()
    elif isinstance(value, dict):
        inner = shape.inner
        assert inner is not None
        if inner.leafy:
            # Maps of small leaf-only structs (device attributes): one key check each.
            known = inner.fields.keys()
            if all(not isinstance(v, dict) or v.keys() <= known for v in value.values()):
                return
        for k, v in value.items():
            stack.append(k)
            _prune_shape(inner, v, stack, removed)
            stack.pop()


def _join(segments: list[str]) -> str:
    out = ""
    for seg in segments:
        out += seg if seg.startswith("[") or not out else "." + seg
    return out


def prune_builtin(model: str, obj: dict[str, Any]) -> list[str]:
    """Drop (in place) the fields of ``obj`` its kind does not have; return their paths
    (``spec.devices[0].attributez``), as decoding into the Go type does on a real server."""
    removed: list[str] = []
    shape = _shape(model) if model else None
    if shape is not None:
        _prune_shape(shape, obj, [], removed)
    return removed


# --------------------------------------------------------------------------- registry


@dataclass
class _Group:
    name: str
    versions: list[str] = field(default_factory=list)


class Registry:
    """Lookup by group/version/plural and by apiVersion/kind; discovery documents."""

    def __init__(self, types: Iterable[ResourceType] = ()) -> None:
        self._by_gvr: dict[tuple[str, str, str], ResourceType] = {}
        self._by_gvk: dict[tuple[str, str, str], ResourceType] = {}
        self._groups: dict[str, _Group] = {}
        for rt in types:
            self.add(rt)

    # -- mutation
    def add(self, rt: ResourceType) -> None:
        self._by_gvr[(rt.group, rt.version, rt.plural)] = rt
        self._by_gvk[(rt.group, rt.version, rt.kind)] = rt
        grp = self._groups.setdefault(rt.group, _Group(rt.group))
        if rt.version not in grp.versions:
            grp.versions.append(rt.version)

    def remove_crd(self, crd_name: str) -> list[ResourceType]:
        gone = [rt for rt in self._by_gvr.values() if rt.crd == crd_name]
        for rt in gone:
            del self._by_gvr[(rt.group, rt.version, rt.plural)]
            self._by_gvk.pop((rt.group, rt.version, rt.kind), None)
        for grp in list(self._groups.values()):
            grp.versions = [
                v for v in grp.versions
                if any(k[0] == grp.name and k[1] == v for k in self._by_gvr)
            ]
            if not grp.versions:
                del self._groups[grp.name]
        return gone

    def add_crd(self, crd: dict[str, Any], schemas: dict[str, Any]) -> list[ResourceType]:
        """Register every served version of ``crd``; ``schemas`` maps version → CRDSchema."""
        spec = crd.get("spec", {})
        names = spec.get("names", {})
        group = spec["group"]
        namespaced = spec.get("scope", "Namespaced") == "Namespaced"
        crd_name = crd["metadata"]["name"]
        self.remove_crd(crd_name)
        added: list[ResourceType] = []
        # Storage version first so it becomes the group's preferred version.
        versions = sorted(
            (v for v in spec.get("versions", []) if v.get("served", True)),
            key=lambda v: not v.get("storage", False),
        )
        for ver in versions:
            cols = tuple(
                PrinterColumn(
                    name=c["name"],
                    type=c.get("type", "string"),
                    json_path=c.get("jsonPath"),
                    description=c.get("description", ""),
                    priority=int(c.get("priority", 0)),
                    format=c.get("format", ""),
                )
                for c in ver.get("additionalPrinterColumns", []) or []
            )
            subs = ver.get("subresources", {}) or {}
            selectable = frozenset(
                s["jsonPath"].lstrip(".") for s in ver.get("selectableFields", []) or []
            )
            rt = ResourceType(
                group=group,
                version=ver["name"],
                plural=names["plural"],
                kind=names["kind"],
                namespaced=namespaced,
                singular=names.get("singular") or names["kind"].lower(),
                short_names=tuple(names.get("shortNames", []) or []),
                categories=tuple(names.get("categories", []) or []),
                subresources=frozenset(k for k in subs if k == "status"),
                field_selectors=selectable,
                printer_columns=cols,
                schema=schemas.get(ver["name"]),
                raw_schema=(ver.get("schema") or {}).get("openAPIV3Schema"),
                crd=crd_name,
                status_on_create="drop" if "status" in subs else "keep",
                unconditional_update=False,
            )
            self.add(rt)
            added.append(rt)
        return added

    # -- lookup
    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._by_gvr.get((group, version, plural))

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        group, _, version = api_version.rpartition("/")
        return self._by_gvk.get((group, version, kind))

    def types(self) -> list[ResourceType]:
        return list(self._by_gvr.values())

    def versions_of(self, group: str, plural: str) -> list[ResourceType]:
        return [rt for (g, _, p), rt in self._by_gvr.items() if g == group and p == plural]

    def group_known(self, group: str, version: str) -> bool:
        grp = self._groups.get(group)
        return grp is not None and version in grp.versions

    # -- discovery documents
    def core_versions(self, server_address: str) -> dict[str, Any]:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
            ],
        }

    def _group_doc(self, grp: _Group) -> dict[str, Any]:
        versions = [
            {"groupVersion": f"{grp.name}/{v}", "version": v} for v in grp.versions
        ]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": grp.name,
            "versions": versions,
            "preferredVersion": versions[0],
        }

    def group_list(self) -> dict[str, Any]:
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                self._group_doc(g) for name, g in sorted(self._groups.items()) if name
            ],
        }

    def group(self, name: str) -> dict[str, Any] | None:
        grp = self._groups.get(name)
        return self._group_doc(grp) if grp and name else None

    def resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        if not self.group_known(group, version):
            return None
        resources: list[dict[str, Any]] = []
        for (g, v, _), rt in sorted(self._by_gvr.items()):
            if g != group or v != version:
                continue
            entry: dict[str, Any] = {
                "name": rt.plural,
                "singularName": rt.singular,
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": list(rt.verbs),
            }
            if rt.short_names:
                entry["shortNames"] = list(rt.short_names)
            if rt.categories:
                entry["categories"] = list(rt.categories)
            resources.append(entry)
            if "status" in rt.subresources:
                resources.append(
                    {
                        "name": f"{rt.plural}/status",
                        "singularName": "",
                        "namespaced": rt.namespaced,
                        "kind": rt.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
            if "binding" in rt.subresources:
                resources.append(
                    {
                        "name": f"{rt.plural}/binding",
                        "singularName": "",
                        "namespaced": rt.namespaced,
                        "kind": "Binding",
                        "verbs": ["create"],
                    }
                )
        gv = f"{group}/{version}" if group else version
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
                "resources": resources}

    # -- OpenAPI v3 (just enough for kubectl)
    def openapi_v3_root(self) -> dict[str, Any]:
        """The /openapi/v3 index. kubectl reads it to learn that the server validates fields
        itself (``fieldValidation``); without it kubectl refuses to apply with validation on."""
        paths: dict[str, Any] = {}
        for name, grp in sorted(self._groups.items()):
            for v in grp.versions:
                gv = f"api/{v}" if not name else f"apis/{name}/{v}"
                doc = self.openapi_v3_gv(name, v)
                digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
                paths[gv] = {"serverRelativeURL": f"/openapi/v3/{gv}?hash={digest[:32].upper()}"}
        return {"paths": paths}

    def openapi_v3_gv(self, group: str, version: str) -> dict[str, Any] | None:
        """A per-group-version OpenAPI document: PATCH operations (with their query
        parameters and media types) per kind, and the CRD schemas as components."""
        if not self.group_known(group, version):
            return None
        prefix = f"/api/{version}" if not group else f"/apis/{group}/{version}"
        params = [
            {"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
            for n in ("dryRun", "fieldManager", "fieldValidation", "force")
        ]
        paths: dict[str, Any] = {}
        schemas: dict[str, Any] = {}
        for (g, v, _), rt in sorted(self._by_gvr.items()):
            if g != group or v != version:
                continue
            gvk = {"group": g, "version": v, "kind": rt.kind}
            ref_name = ".".join(reversed(g.split("."))) + f".{v}.{rt.kind}" if g else (
                f"io.k8s.api.core.{v}.{rt.kind}")
            schema: dict[str, Any] = {"type": "object", "x-kubernetes-group-version-kind": [gvk]}
            if rt.crd is not None and rt.raw_schema is not None:
                schema = {**rt.raw_schema, "x-kubernetes-group-version-kind": [gvk]}
            schemas[ref_name] = schema
            body = {"schema": {"type": "object"}}
            ns = "/namespaces/{namespace}" if rt.namespaced else ""
            paths[f"{prefix}{ns}/{rt.plural}/{{name}}"] = {
                "patch": {
                    "operationId": f"patch{rt.kind}",
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": gvk,
                    "parameters": params,
                    # No strategic-merge entry: kubectl then computes strategic patches for
                    # built-ins from its compiled-in types, which is what we approximate.
                    "requestBody": {"content": {
                        "application/json-patch+json": body,
                        "application/merge-patch+json": body,
                        "application/apply-patch+yaml": body,
                    }},
                    "responses": {"200": {"description": "OK", "content": {
                        "application/json": {
                            "schema": {"$ref": f"#/components/schemas/{ref_name}"}}}}},
                }
            }
        return {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": "v1.34.2"},
            "paths": paths,
            "components": {"schemas": schemas},
        }
