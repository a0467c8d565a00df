"""The Preparer's metrics (docs/metrics.md lists them with the reasons of the errors)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class PreparerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.prepare_seconds = Histogram(
            "neuron_dra_prepare_seconds",
            "Time to prepare one claim (including reading it from the API server).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 45),
            registry=self.registry,
        )
        self.prepare_errors = Counter(
            "neuron_dra_prepare_errors_total",
            "Claims whose preparation failed, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.prepared_claims = Gauge(
            "neuron_dra_prepared_claims",
            "Claims currently prepared on this node (checkpoint entries).",
            registry=self.registry,
        )
