"""The workload reconciler's vocabulary: states, phases, condition types, the queue keys, and
typed views of the few object parts every step reads (a workload's identity and spec, one
allocation entry). Reads here are defensive: a malformed object reads as empty, never raises.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from neuron_dra.common.constants import LABEL_WORKLOAD_ID
from neuron_dra.common.k8s.client import object_key
from neuron_dra.common.ultraserver import AllocationEntry, read_allocations, workload_id
from neuron_dra.controller.allocation.planner import Unit

JsonDict = dict[str, Any]

# Workload states (crds.WorkloadState).
PENDING: Final = "Pending"
ALLOCATING: Final = "Allocating"
ALLOCATED: Final = "Allocated"
PARTIALLY_ALLOCATED: Final = "PartiallyAllocated"
FAILED: Final = "Failed"
DEALLOCATING: Final = "Deallocating"
#: States in which the workload's pods may be running on its units. Entries found under any
#: other state belong to an interrupted allocation (``allocate`` keeps it that way).
RUNNING_STATES: Final = frozenset({ALLOCATED, PARTIALLY_ALLOCATED})

# Allocation entry phases: common/ultraserver.py reads and names them for both components.

# Condition types.
COND_ALLOCATED: Final = "Allocated"
COND_READY: Final = "Ready"
COND_DEGRADED: Final = "Degraded"
#: True while allocating (AWS's operator's condition; derived from the state).
COND_PROGRESSING: Final = "Progressing"

# Failure strategies (crds.FailureStrategy).
NOOP: Final = "NoOp"
RESTART_ALL: Final = "RestartAll"
REPLACE_AFFECTED: Final = "ReplaceAffected"
#: AWS's operator's name for ReplaceAffected (its documentation says ReplaceAffected).
MIGRATE_AFFECTED: Final = "MigrateAffected"
STRATEGY_ALIASES: Final = {MIGRATE_AFFECTED: REPLACE_AFFECTED}

#: Index on ``ctx.slices``: node name → slice keys (a reconcile looks at a few nodes, not at
#: every slice of the cluster).
#: Index on ``ctx.ultraservers``: workloadRef → keys of the NeuronUltraServers holding an
#: allocation entry of it (``pending_keys`` runs on every NeuronUltraServer event).
NUS_BY_WORKLOAD: Final = "workloads/by-workload-ref"
#: Index on ``ctx.claims``: "namespace/workloadId" → the claims of that workload (every
#: healthy reconcile looks for strays among its own claims, not the fleet's).
CLAIMS_BY_WORKLOAD: Final = "workloads/claims-by-workload-id"
#: Workload-queue keys ``<namespace>/:claims-of:<workloadId>`` (no workload name has a colon):
#: the claims of a workloadId that no workload holds any more.
ORPHAN_CLAIMS_MARK: Final = ":claims-of:"


def orphan_claims_key(namespace: str, wid: str) -> str:
    return f"{namespace}/{ORPHAN_CLAIMS_MARK}{wid}"


class AllocationRaceError(Exception):
    """A unit could not be recorded: its nodes were taken, left the UltraServer, or the
    NeuronUltraServer kept changing under us. Nothing is wrong; re-plan from fresh caches."""


@dataclass(frozen=True)
class ReconcileResult:
    #: Seconds until this key should be reconciled again; None: only when something changes.
    requeue_after: float | None = None


@dataclass(frozen=True)
class Cond:
    """A condition as the reconciler decides it (times are filled in by ``with_condition``)."""

    type: str
    status: bool
    reason: str
    message: str


# --- defensive reads ------------------------------------------------------------------------


def meta_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def status_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    status = obj.get("status")
    return status if isinstance(status, Mapping) else {}


def spec_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def state_of(obj: Mapping[str, Any]) -> Any:
    return status_of(obj).get("state")


def is_deleting(obj: Mapping[str, Any]) -> bool:
    return bool(meta_of(obj).get("deletionTimestamp"))


def nus_members(nus: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """A NeuronUltraServer's topology members by node name."""
    return {
        str(t.get("nodeName")): t
        for t in spec_of(nus).get("topology") or []
        if isinstance(t, Mapping) and t.get("nodeName")
    }


def nus_instance_type(nus: Mapping[str, Any]) -> str:
    """The instance type a NeuronUltraServer counts as discovered under."""
    return str(spec_of(nus).get("instanceType"))


def fifo_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    """First come first served: creation time, then key."""
    return (str(meta_of(obj).get("creationTimestamp") or ""), object_key(obj))


# --- typed views ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """What one reconcile reads of a workload besides its status: who it is and what it asks
    for. Built once per reconcile; the status (which our own writes change) is read from the
    current object instead."""

    key: str
    namespace: str
    name: str
    uid: str
    #: The workloadId of this incarnation (name + uid): what its entries, slices and claims
    #: are tagged with.
    wid: str
    server_count: int
    topology_size: int
    failure_strategy: str

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Workload:
        meta, spec = meta_of(obj), spec_of(obj)
        name, uid = str(meta.get("name")), str(meta.get("uid") or "")
        return cls(
            key=object_key(obj),
            namespace=str(meta.get("namespace")),
            name=name,
            uid=uid,
            wid=workload_id(name, uid),
            server_count=int(spec.get("serverCount") or 0),
            topology_size=int(spec.get("topologySize") or 0),
            failure_strategy=failure_strategy(spec),
        )


def failure_strategy(spec: Mapping[str, Any]) -> str:
    """The workload's failure strategy with aliases resolved (MigrateAffected is
    ReplaceAffected). Any other value, which AWS's schema let through, acts as NoOp does:
    it is not one of the actions."""
    policy = spec.get("allocationPolicy")
    raw = str((policy.get("failureStrategy") if isinstance(policy, Mapping) else None) or NOOP)
    return STRATEGY_ALIASES.get(raw, raw)


@dataclass(frozen=True)
class Held:
    """One allocation entry of a workload, as recorded in a NeuronUltraServer's status."""

    ultraserver: str
    entry: AllocationEntry

    @property
    def index(self) -> int:
        return self.entry.unit_index

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.entry.nodes

    @property
    def workload_id(self) -> str:
        return self.entry.workload_id

    @property
    def unit(self) -> Unit:
        return Unit(ultraserver=self.ultraserver, nodes=self.nodes, index=self.index)

    @property
    def identity(self) -> tuple[str, int, str]:
        """(workloadRef, index, workloadId): how a release finds the entry again."""
        return self.entry.identity


# --- cache indexes --------------------------------------------------------------------------


def allocation_refs(nus: Mapping[str, Any]) -> list[str]:
    """The workloadRef of every allocation entry of ``nus`` (index ``NUS_BY_WORKLOAD``)."""
    return [e.workload_ref for e in read_allocations(nus)]


def claim_workload(claim: JsonDict) -> list[str]:
    """``namespace/workloadId`` of a claim's workload label (index ``CLAIMS_BY_WORKLOAD``)."""
    meta = meta_of(claim)
    wid = (meta.get("labels") or {}).get(LABEL_WORKLOAD_ID)
    return [f"{meta.get('namespace', '')}/{wid}"] if wid else []


def count(counter: Counter[str], keys: Iterable[str], delta: int) -> None:
    """Add ``delta`` to each key's count, dropping keys that reach zero."""
    for key in keys:
        value = counter[key] + delta
        if value > 0:
            counter[key] = value
        else:
            del counter[key]
