"""Kubernetes client plumbing: raw-dict client, typed errors, cache, reflector, work queue,
leader election and safe write helpers.

Import from the submodules (``neuron_dra.common.k8s.client`` etc.); this package keeps its
``__init__`` free of them so importing one piece does not pull in the others; it only
makes the kubernetes_asyncio import lazy (see ``lazyimport``).
"""

from neuron_dra.common.k8s.lazyimport import install as _install_lazy_kubernetes_asyncio

# Before any submodule imports kubernetes_asyncio: load only the parts of it we touch.
_install_lazy_kubernetes_asyncio()
