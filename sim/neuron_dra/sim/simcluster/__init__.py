"""The simulated cluster (``neuron-dra sim`` and the end-to-end tests): the fake API server,
the controller, one real kubelet plugin per emulated node and the simulated control plane.

- :class:`SimCluster` starts and stops them and reads their state;
- :mod:`.topology`: the nodes (:func:`default_nodes`: two trn2u.48xlarge UltraServers, two
  trn2.48xlarge, one trn1.32xlarge, one inf2.48xlarge);
- :mod:`.containers`: what a CDI runtime would inject into each container.
"""

from neuron_dra.sim.simcluster.cluster import SimCluster
from neuron_dra.sim.simcluster.containers import ContainerDevices, resolve
from neuron_dra.sim.simcluster.topology import (
    SimNode,
    default_nodes,
    ultraserver,
    ultraservers,
)

__all__ = [
    "ContainerDevices",
    "SimCluster",
    "SimNode",
    "default_nodes",
    "resolve",
    "ultraserver",
    "ultraservers",
]
