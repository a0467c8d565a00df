"""The NeuronUltraServerWorkload reconciler: allocate, repair, release.

Level-triggered. Each ``reconcile(key)`` reads the caches (workloads, NeuronUltraServers,
Nodes, ResourceSlices, templates), works out from them where the workload stands, and takes
the next steps towards where it should be. Nothing is remembered between calls that the API
objects do not also record, so a restarted controller (or a second replica) continues where
the first stopped:

* the reservation record is ``NeuronUltraServer.status.allocations``: one entry per unit
  (``workloadRef``, ``ultraserverIndex``), written one RV-guarded ``/status`` write at a time.
  Each write re-checks on the object it is guarded by that the nodes are still free, so two
  controllers racing for the same nodes cannot both get them: the loser gets a 409, re-reads,
  sees the nodes taken and stops;
* the workload's status says whether its pods may be using its entries: only in a running
  state (``Allocated``/``PartiallyAllocated``). An allocation writes its entries while the
  workload is still in a state that is not running (none yet, ``Pending``, ``Failed``) and
  then moves it to ``Allocated`` in one status write, so entries found under any other state
  are an interrupted allocation, never in use by pods.

Allocation is all-or-nothing: entries already on record for an interrupted allocation are
completed if the missing units can still be found, released otherwise. Release on deletion
goes ``Releasing`` → wait for the node plugins to clear their tags → remove the entries, so a
node is never handed to another workload while its slice still advertises the old workload id.

The modules, pure decisions first:

- :mod:`.model`: states, phases, queue keys, typed views (``Workload``, ``Held``);
- :mod:`.status`: the desired workload status and its conditions;
- :mod:`.entries`: the reservation record and the changes made to it;
- :mod:`.health`: whether a node can serve (Node, devices, links, tags);
- :mod:`.validation`: whether a spec fits the discovered hardware;
- :mod:`.fleet`: the reads: caches with our own writes overlaid, the free-unit index;
- :mod:`.writes`: the writes to NeuronUltraServers and workloads;
- :mod:`.generated`: the generated template and the claims made from it;
- :mod:`.tools`: what every step works with (client, caches, clock, timing, metrics);
- the steps: :mod:`.allocate`, :mod:`.repair` (interrupted allocations, failure
  strategies), :mod:`.release` (deletion), :mod:`.orphans` (what a gone workload left);
- :mod:`.reconciler`: :class:`WorkloadReconciler`, whose sync calls the steps.

This ``__init__`` is the package's API: the names the manager and the tests use.
"""

from .entries import nus_status_with, split_holdings
from .health import carries_tag, node_problem, node_ready
from .model import (
    ALLOCATED,
    ALLOCATING,
    DEALLOCATING,
    FAILED,
    PARTIALLY_ALLOCATED,
    PENDING,
    Cond,
    Held,
    orphan_claims_key,
)
from .reconciler import WorkloadReconciler
from .status import StatusUpdate, desired_workload_status, with_condition
from .validation import Validator

__all__ = [
    "ALLOCATED",
    "ALLOCATING",
    "DEALLOCATING",
    "FAILED",
    "PARTIALLY_ALLOCATED",
    "PENDING",
    "Cond",
    "Held",
    "StatusUpdate",
    "Validator",
    "WorkloadReconciler",
    "carries_tag",
    "desired_workload_status",
    "node_problem",
    "node_ready",
    "nus_status_with",
    "orphan_claims_key",
    "split_holdings",
    "with_condition",
]
