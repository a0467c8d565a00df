"""Where each kind lives in the REST API (:class:`ApiResource`), the kinds we use, and the
PATCH content types.

One code path serves every kind (core, ``resource.k8s.io/v1``, ``coordination.k8s.io/v1``,
our CRDs), described by an :class:`ApiResource`. Patches always say which content type they
are: the generated ``CustomObjectsApi`` silently sends JSON-patch for dict bodies, which the
real API server rejects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import quote

from neuron_dra.common import constants


@dataclass(frozen=True)
class ApiResource:
    """Where a kind lives in the REST API. ``group`` is ``""`` for the core group."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def _prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def path(
        self,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> str:
        """The URL path. ``namespace=None`` on a namespaced kind means all namespaces (lists)."""
        if not self.namespaced and namespace:
            raise ValueError(f"{self.kind} is cluster-scoped; got namespace {namespace!r}")
        if self.namespaced and name is not None and not namespace:
            raise ValueError(f"{self.kind} is namespaced; a namespace is required for {name!r}")
        parts = [self._prefix()]
        if namespace:
            parts.append(f"namespaces/{quote(namespace, safe='')}")
        parts.append(self.plural)
        if name is not None:
            if not name:
                raise ValueError("empty object name")
            parts.append(quote(name, safe=""))
            if subresource:
                parts.append(subresource)
        elif subresource:
            raise ValueError("a subresource needs an object name")
        return "/".join(parts)

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


NAMESPACES = ApiResource("", "v1", "namespaces", "Namespace", namespaced=False)
NODES = ApiResource("", "v1", "nodes", "Node", namespaced=False)
PODS = ApiResource("", "v1", "pods", "Pod", namespaced=True)
CONFIG_MAPS = ApiResource("", "v1", "configmaps", "ConfigMap", namespaced=True)
EVENTS = ApiResource("events.k8s.io", "v1", "events", "Event", namespaced=True)
LEASES = ApiResource("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
RESOURCE_SLICES = ApiResource(
    "resource.k8s.io", "v1", "resourceslices", "ResourceSlice", namespaced=False
)
RESOURCE_CLAIMS = ApiResource(
    "resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", namespaced=True
)
RESOURCE_CLAIM_TEMPLATES = ApiResource(
    "resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", namespaced=True
)
DEVICE_CLASSES = ApiResource("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False)
CUSTOM_RESOURCE_DEFINITIONS = ApiResource(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False
)
NEURON_ULTRASERVERS = ApiResource(
    constants.CRD_GROUP,
    constants.CRD_VERSION,
    constants.PLURAL_ULTRASERVER,
    constants.KIND_ULTRASERVER,
    namespaced=True,
)
NEURON_ULTRASERVER_WORKLOADS = ApiResource(
    constants.CRD_GROUP,
    constants.CRD_VERSION,
    constants.PLURAL_WORKLOAD,
    constants.KIND_WORKLOAD,
    namespaced=True,
)


class PatchType(StrEnum):
    """PATCH content types. There is deliberately no default: pick one."""

    #: RFC 7386. Works for every kind, including CRDs. Lists are replaced wholesale.
    MERGE = "application/merge-patch+json"
    #: Built-in kinds only; the API server rejects it for custom resources.
    STRATEGIC = "application/strategic-merge-patch+json"
    #: RFC 6902 operations list.
    JSON = "application/json-patch+json"
    #: Server-side apply; needs a field manager.
    APPLY = "application/apply-patch+yaml"


# --- reading any object (pure: modules that must not depend on the client import these) ------


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` (or ``name`` for cluster-scoped objects), as client-go keys them."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    name = str(meta.get("name") or "")
    return f"{ns}/{name}" if ns else name


def resource_version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")
