"""What one served resource is: ``ResourceType`` (URL place, kind, scope, subresources,
field selectors, strategy switches) and the ``PrinterColumn`` s ``kubectl get`` shows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

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

# Store keys (group, plural) of the kinds whose writes the server treats specially.
NS_KEY = ("", "namespaces")
POD_KEY = ("", "pods")
CRD_KEY = ("apiextensions.k8s.io", "customresourcedefinitions")


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
