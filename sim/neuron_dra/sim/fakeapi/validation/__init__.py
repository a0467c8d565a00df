"""Validation of built-in objects as kube-apiserver does it, kept to what the fake tier and
``neuron-dra check-claim`` rely on (docs/sim.md lists what went and what covers it now).

``builtin`` is the entry (ObjectMeta, defaults, dispatch per kind); ``claims`` the
resource.k8s.io claim, template and DeviceClass specs; ``device_selectors`` compiles their CEL;
``fields`` and ``names`` are the shared field and name-format checks.
"""
