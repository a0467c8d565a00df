"""UltraServer discovery: ResourceSlices and Nodes -> NeuronUltraServer objects.

Each kubelet plugin publishes its node's ResourceSlice with ``ultraserverId`` and
``ultraserverNodeId`` attributes; this reconciler groups the nodes by UltraServer id and keeps
one ``NeuronUltraServer`` (NUS) per id in the driver namespace.

Ownership, because two reconcilers write the same objects:

- discovery owns ``spec`` (instance type, topology) and the discovery fields of ``status``:
  ``state``, ``nodeCount``, ``allocatedNodeCount``, the ``Ready``/``Degraded`` conditions and
  ``observedGeneration``;
- ``status.allocations`` belongs to the workload reconciler. We read it (state and deletion
  depend on it) but never write it: every status write starts from the object we read and is
  guarded by its resourceVersion, so an allocation written meanwhile makes our write fail with
  409 and we recompute from the fresh object instead of overwriting it.

The modules, pure decisions first (they never raise on malformed slices or Nodes: bad input
becomes a *problem* that ends up in the ``Degraded`` condition, because one broken plugin must
not stop discovery of every other UltraServer):

- :mod:`.fields`: defensive reads of slices and Nodes;
- :mod:`.naming`: object names and the id label/annotation;
- :mod:`.grouping`: member nodes per UltraServer id, with their problems;
- :mod:`.spec`: the topology the schema accepts and the desired object;
- :mod:`.status`: the desired status and conditions;
- :mod:`.keys`: which UltraServers an event concerns, and the slice indexes behind it;
- :mod:`.reconciler`: :class:`UltraServerDiscovery`, which reads the caches and writes.

Write discipline (status-write storms and stuck deletions plague other DRA drivers): nothing is
written when the desired object equals the cached one, ``lastTransitionTime`` only moves when a
condition's status flips, and NUS objects carry no finalizer, so deleting one never hangs.

This ``__init__`` is the package's API: the names the manager and the tests use (the rest is
imported from its module).
"""

from .fields import node_state, slice_ultraserver_id
from .grouping import DesiredUltraServer, group_ultraservers
from .keys import keys_for_node, keys_for_slice, keys_for_ultraserver
from .naming import (
    ANNOTATION_ULTRASERVER_ID,
    LABEL_ULTRASERVER_ID,
    nus_name,
    ultraserver_label_value,
)
from .reconciler import UltraServerDiscovery
from .spec import plan_topology
from .status import desired_status, set_condition

__all__ = [
    "ANNOTATION_ULTRASERVER_ID",
    "LABEL_ULTRASERVER_ID",
    "DesiredUltraServer",
    "UltraServerDiscovery",
    "desired_status",
    "group_ultraservers",
    "keys_for_node",
    "keys_for_slice",
    "keys_for_ultraserver",
    "node_state",
    "nus_name",
    "plan_topology",
    "set_condition",
    "slice_ultraserver_id",
    "ultraserver_label_value",
]
