"""NeuronUltraServer and NeuronUltraServerWorkload (docs/configuration.md documents both).

These models are the single source of truth for the CRD schemas: ``crdgen`` derives the
OpenAPI schema from them, including the CEL rules attached with ``json_schema_extra``. A
constraint added here is enforced both by the API server and by ``model_validate``.

Spec models forbid unknown fields (a typo in a user's spec must not be silently ignored);
status models, written only by our controller, are equally strict so that a misspelt status
key is caught in tests rather than pruned by the API server.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Literal

from neuron_dra.common.constants import (
    KIND_ULTRASERVER,
    KIND_WORKLOAD,
    WORKLOAD_ID_MAX_LENGTH,
)
from neuron_dra.common.models.configs import LogicalNeuronCore, one_of
from neuron_dra.common.models.k8s import (
    CONDITIONS_LIST,
    DNS_SUBDOMAIN_MAX_LENGTH,
    DNS_SUBDOMAIN_PATTERN,
    LIST_SET,
    NODE_NAME_MAX_LENGTH,
    CamelModel,
    Condition,
    NonNegativeInt,
    ObjectMeta,
    immutable,
    list_map,
    rule,
    rules,
)
from neuron_dra.common.names import DNS1123_LABEL_FMT
from pydantic import AfterValidator, ConfigDict, Field, StrictInt

#: An instance type is free-form (Trn3 names are not a stable public list, and the seed's
#: example uses a placeholder), but bounded so it fits in a label value.
InstanceType = Annotated[str, Field(min_length=1, max_length=63)]

#: Nodes per UltraServer unit. Enforced by a CEL rule rather than ``enum`` so that the
#: rejection message explains the value instead of listing it.
TopologySize = Annotated[
    StrictInt,
    one_of("topologySize", (1, 2, 4)),
    Field(
        json_schema_extra=rules(
            rule(
                "self in [1, 2, 4]",
                "topologySize must be 1, 2 or 4 (nodes per UltraServer unit)",
            ),
            immutable("topologySize"),
        )
    ),
]

WorkloadRef = Annotated[
    str,
    Field(
        max_length=317,  # 63-char namespace + "/" + 253-char name
        pattern=f"^{DNS1123_LABEL_FMT}/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="The workload holding this allocation, as namespace/name.",
    ),
]
WorkloadId = Annotated[str, Field(min_length=1, max_length=WORKLOAD_ID_MAX_LENGTH)]
NodeName = Annotated[str, Field(min_length=1, max_length=NODE_NAME_MAX_LENGTH)]
ObjectName = Annotated[str, Field(min_length=1, max_length=DNS_SUBDOMAIN_MAX_LENGTH)]
Timestamp = Annotated[datetime, Field(description="RFC 3339 date-time.")]


def _object_name(field: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if not re.fullmatch(DNS_SUBDOMAIN_PATTERN, value):
            raise ValueError(f"{field} must be {OBJECT_NAME_WORDS}, got {value!r}")
        return value

    return check


#: What an object name must look like, in the words of the API server's own message for
#: metadata.name (a ``pattern`` would answer with the regular expression instead).
OBJECT_NAME_WORDS = (
    "a lowercase RFC 1123 subdomain: lower case alphanumeric characters, '-' or '.', "
    "starting and ending with an alphanumeric character (e.g. 'train-claims')"
)
TemplateName = Annotated[
    str,
    AfterValidator(_object_name("resourceClaimTemplate.name")),
    Field(
        min_length=1,
        max_length=DNS_SUBDOMAIN_MAX_LENGTH,
        json_schema_extra=rules(
            rule(
                f"self.matches(r'{DNS_SUBDOMAIN_PATTERN}')",
                f"resourceClaimTemplate.name must be {OBJECT_NAME_WORDS}",
            )
        ),
    ),
]

SERVER_COUNT_MAX = 1000
#: ``config.logicalNeuronCore`` when ``config`` is given without it.
DEFAULT_WORKLOAD_LNC = 2

# ---------------------------------------------------------------------------------------------
# NeuronUltraServerWorkload
# ---------------------------------------------------------------------------------------------

#: ``MigrateAffected`` is what AWS's shipped operator calls ``ReplaceAffected`` (the spelling
#: of its documentation, and ours): both are accepted and mean the same; the controller reads
#: one as the other (docs/configuration.md, "Compatibility with AWS's UltraServer operator").
FailureStrategy = Literal["NoOp", "RestartAll", "ReplaceAffected", "MigrateAffected"]
WorkloadState = Literal[
    "Pending", "Allocating", "Allocated", "PartiallyAllocated", "Failed", "Deallocating"
]


class AllocationPolicy(CamelModel):
    """How the controller reacts when an allocated node fails."""

    model_config = ConfigDict(extra="forbid")

    failure_strategy: FailureStrategy = Field(
        default="NoOp",
        description="NoOp: report only. RestartAll: release everything, reallocate and "
        "restart all pods. ReplaceAffected: swap the failed unit and evict only its pods. "
        "MigrateAffected: the same as ReplaceAffected (the name AWS's operator uses).",
    )


class ResourceClaimTemplateRef(CamelModel):
    """The ResourceClaimTemplate the controller generates for the workload."""

    model_config = ConfigDict(extra="forbid")

    name: TemplateName | None = Field(
        default=None,
        description="Name of the generated ResourceClaimTemplate; defaults to the workload's name.",
    )


class WorkloadDeviceConfig(CamelModel):
    """Neuron device settings applied to every claim of the workload."""

    model_config = ConfigDict(extra="forbid")

    # Defaulted to 2 inside ``config``, as AWS's operator defaults it: a workload written for
    # that operator with ``config: {}`` gets what it got there. Without ``config`` the claims
    # carry no NeuronConfig and the nodes' default applies (2 on Trn2/Trn3 unless the node's
    # logical_nc_config says otherwise), which is also what that operator documents.
    logical_neuron_core: LogicalNeuronCore = Field(
        default=DEFAULT_WORKLOAD_LNC,
        json_schema_extra={"enum": [1, 2]},
        description="Logical NeuronCore size (1 or 2); Trn2/Trn3 only. Default 2; without "
        "config at all, the nodes' default.",
    )


class NeuronUltraServerWorkloadSpec(CamelModel):
    """What a user asks for: serverCount units of topologySize nodes each."""

    model_config = ConfigDict(
        extra="forbid",
        # Optional immutable fields need a second rule: a transition rule on the field itself
        # is skipped when the field is being added or removed.
        json_schema_extra=rules(
            rule(
                "has(self.resourceClaimTemplate) == has(oldSelf.resourceClaimTemplate)",
                "resourceClaimTemplate cannot be added or removed after creation",
                field_path=".resourceClaimTemplate",
            ),
            rule(
                "has(self.config) == has(oldSelf.config)",
                "config cannot be added or removed after creation",
                field_path=".config",
            ),
        ),
    )

    instance_type: InstanceType = Field(
        description="Instance type of the UltraServer nodes, e.g. trn2u.48xlarge.",
        json_schema_extra=rules(immutable("instanceType")),
    )
    topology_size: TopologySize = Field(description="Nodes per UltraServer unit: 1, 2 or 4.")
    server_count: StrictInt = Field(
        ge=1,
        le=SERVER_COUNT_MAX,
        description="How many units of topologySize nodes to allocate.",
        json_schema_extra=rules(immutable("serverCount")),
    )
    allocation_policy: AllocationPolicy = Field(
        default_factory=AllocationPolicy, json_schema_extra={"default": {}}
    )
    resource_claim_template: ResourceClaimTemplateRef | None = Field(
        default=None, json_schema_extra=rules(immutable("resourceClaimTemplate"))
    )
    config: WorkloadDeviceConfig | None = Field(
        default=None, json_schema_extra=rules(immutable("config"))
    )


class NeuronUltraServerWorkloadStatus(CamelModel):
    """What the controller has done for the workload."""

    model_config = ConfigDict(extra="forbid")

    state: WorkloadState | None = None
    workload_id: WorkloadId | None = Field(
        default=None,
        description="Cluster-unique id; reserved devices carry it as their workloadId attribute.",
    )
    allocated_ultra_servers: list[ObjectName] = Field(
        default_factory=list,
        description="Names of the NeuronUltraServer objects holding this workload's nodes.",
        json_schema_extra={"maxItems": SERVER_COUNT_MAX},
    )
    total_nodes_allocated: NonNegativeInt | None = None
    allocation_time: Timestamp | None = None
    allocated_at: Timestamp | None = Field(
        default=None,
        description="The same time as allocationTime, under the name AWS's operator uses.",
    )
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=CONDITIONS_LIST)
    observed_generation: NonNegativeInt | None = None


class NeuronUltraServerWorkload(CamelModel):
    """A user's request for gang-allocated UltraServer nodes."""

    model_config = ConfigDict(extra="forbid")

    api_version: Literal["neuron.aws.com/v1beta1"] = "neuron.aws.com/v1beta1"
    kind: Literal["NeuronUltraServerWorkload"] = KIND_WORKLOAD
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: NeuronUltraServerWorkloadSpec
    status: NeuronUltraServerWorkloadStatus = Field(default_factory=NeuronUltraServerWorkloadStatus)

    @property
    def resource_claim_template_name(self) -> str:
        """The generated RCT's name: the explicit one, else the workload's own name."""
        rct = self.spec.resource_claim_template
        return rct.name if rct is not None and rct.name else self.metadata.name

    @property
    def ref(self) -> str:
        """``namespace/name``, the form NeuronUltraServer allocations use."""
        return f"{self.metadata.namespace or 'default'}/{self.metadata.name}"

    @property
    def node_count(self) -> int:
        return self.spec.topology_size * self.spec.server_count


# ---------------------------------------------------------------------------------------------
# NeuronUltraServer
# ---------------------------------------------------------------------------------------------

LinkStatus = Literal["Up", "Down", "Unknown"]
UltraServerState = Literal["Available", "PartiallyAllocated", "FullyAllocated"]
#: Pending: written by the controller, node plugins not yet tagged. Bound: devices tagged,
#: claims may be prepared. Releasing: being released, tags still being cleared. Pending and
#: Bound are the words (and meanings) of AWS's operator; Reserved and Active are how earlier
#: versions of neuron-dra spelt them, still valid in stored objects and read as Pending and
#: Bound (the controller rewrites them).
AllocationPhase = Literal["Pending", "Bound", "Releasing", "Reserved", "Active"]

ULTRASERVER_MAX_NODES = 4


def _not_empty(field: str) -> Callable[[list[str]], list[str]]:
    # Mirrors the CEL rule next to it; expressed as CEL rather than minItems because CEL is
    # the validation vocabulary we rely on throughout (and test for compilation).
    def check(value: list[str]) -> list[str]:
        if not value:
            raise ValueError(f"{field} must not be empty")
        return value

    return check


class UltraServerNode(CamelModel):
    """One member node of the UltraServer and the state of its NeuronLinks."""

    model_config = ConfigDict(extra="forbid")

    node_name: NodeName
    node_id: StrictInt = Field(ge=0, le=ULTRASERVER_MAX_NODES - 1)
    link_status_horizontal: LinkStatus = "Unknown"
    link_status_vertical: LinkStatus = "Unknown"


class NeuronUltraServerSpec(CamelModel):
    """The UltraServer as discovered from its nodes' ResourceSlices."""

    model_config = ConfigDict(extra="forbid")

    instance_type: InstanceType = Field(json_schema_extra=rules(immutable("instanceType")))
    topology: list[UltraServerNode] = Field(
        default_factory=list,
        json_schema_extra=rules(
            rule(
                "self.all(a, self.exists_one(b, b.nodeId == a.nodeId))",
                "topology nodeId values must be unique",
            ),
            **list_map("nodeName"),
            maxItems=ULTRASERVER_MAX_NODES,
        ),
    )


class UltraServerAllocation(CamelModel):
    """One workload unit placed on (some of) this UltraServer's nodes."""

    model_config = ConfigDict(extra="forbid")

    workload_ref: WorkloadRef
    workload_id: WorkloadId
    allocated_nodes: Annotated[list[NodeName], AfterValidator(_not_empty("allocatedNodes"))] = (
        Field(
            max_length=ULTRASERVER_MAX_NODES,
            json_schema_extra=rules(
                rule("size(self) > 0", "allocatedNodes must not be empty"), **LIST_SET
            ),
        )
    )
    leader_node_name: NodeName | None = None
    node_count: StrictInt = Field(ge=1, le=ULTRASERVER_MAX_NODES)
    ultraserver_index: NonNegativeInt = Field(
        description="Position of this unit within the workload; global topology id of a node "
        "= ultraserverIndex * topologySize + node index.",
    )
    phase: AllocationPhase = Field(
        default="Pending",
        description="Pending: recorded, the nodes' devices not yet tagged. Bound: tagged, the "
        "workload's claims may be allocated and prepared. Releasing: being released. "
        "Reserved and Active: how earlier versions spelt Pending and Bound.",
    )
    allocated_at: Timestamp | None = None


class NeuronUltraServerStatus(CamelModel):
    """Allocations of this UltraServer's nodes and its health (conditions Ready, Degraded)."""

    model_config = ConfigDict(extra="forbid")

    state: UltraServerState | None = None
    allocations: list[UltraServerAllocation] = Field(
        default_factory=list,
        # A workload may hold both node pairs of one UltraServer, so workloadRef alone is not
        # a key; the unit index within the workload makes it one.
        json_schema_extra={
            **list_map("workloadRef", "ultraserverIndex"),
            "maxItems": ULTRASERVER_MAX_NODES,
        },
    )
    node_count: NonNegativeInt | None = Field(default=None, description="Member nodes.")
    allocated_node_count: NonNegativeInt | None = Field(
        default=None, description="Member nodes allocated to workloads."
    )
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=CONDITIONS_LIST)
    observed_generation: NonNegativeInt | None = None


class NeuronUltraServer(CamelModel):
    """A physical UltraServer (system-owned; one per UltraServer id)."""

    model_config = ConfigDict(extra="forbid")

    api_version: Literal["neuron.aws.com/v1beta1"] = "neuron.aws.com/v1beta1"
    kind: Literal["NeuronUltraServer"] = KIND_ULTRASERVER
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: NeuronUltraServerSpec
    status: NeuronUltraServerStatus = Field(default_factory=NeuronUltraServerStatus)
