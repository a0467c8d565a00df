"""The Prometheus metrics of the slice publisher and the node labeller (one set per registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class PublisherMetrics:
    """Prometheus metrics of the slice publisher and node labeller; one per registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.slice_writes = Counter(
            "neuron_dra_resourceslice_writes",
            "Successful ResourceSlice writes, by verb (create, update, delete).",
            ["verb"],
            registry=self.registry,
        )
        self.syncs = Counter(
            "neuron_dra_resourceslice_syncs",
            "Completed ResourceSlice syncs (with or without writes).",
            registry=self.registry,
        )
        self.sync_errors = Counter(
            "neuron_dra_resourceslice_sync_errors",
            "Failed ResourceSlice syncs, by error type.",
            ["error"],
            registry=self.registry,
        )
        self.published_devices = Gauge(
            "neuron_dra_published_devices",
            "Devices in this node's published ResourceSlices.",
            registry=self.registry,
        )
        self.pool_generation = Gauge(
            "neuron_dra_resourceslice_pool_generation",
            "pool.generation of this node's published ResourceSlices.",
            registry=self.registry,
        )
        self.first_publish_seconds = Gauge(
            "neuron_dra_resourceslice_first_publish_seconds",
            "Seconds from publisher start to the first complete publish.",
            registry=self.registry,
        )
        self.label_patches = Counter(
            "neuron_dra_node_label_patches",
            "Merge patches of this node's UltraServer labels.",
            registry=self.registry,
        )
        self.label_errors = Counter(
            "neuron_dra_node_label_errors",
            "Failed node label syncs, by error type.",
            ["error"],
            registry=self.registry,
        )
