"""Kubernetes client plumbing: raw-dict client, typed errors, cache, reflector, work queue,
leader election and safe write helpers.

Import from the submodules (``neuron_dra.common.k8s.client`` etc.); this package keeps its
``__init__`` empty so importing one piece does not pull in the others.
"""
