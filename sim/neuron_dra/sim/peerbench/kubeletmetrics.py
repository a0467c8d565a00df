"""The kubelet's own DRA histograms, read from its ``/metrics`` text (pure: no I/O).

The kubelet (``pkg/kubelet/metrics`` of 1.34) times every unary DRA gRPC call in a client
interceptor, ``dra_grpc_operations_duration_seconds{driver_name, method_name,
grpc_status_code}``, and the whole PrepareResources / UnprepareResources step of a pod
(claim lookups, its checkpoint and the calls) in ``dra_operations_duration_seconds
{operation_name, is_error}``. Both use the same buckets, ``ExponentialBucketsRange(0.1, 40,
15)``: 0.1, 0.153, 0.235 ... 40 s. A one-claim Prepare takes a few milliseconds, so every
call lands in the first bucket, and a quantile interpolated within the buckets says only
"under 100 ms" (:func:`bucket_quantile` returns it anyway, to show that). The ``_sum`` is
exact (float seconds of each observation added), so a scrape after every call gives each
call's duration as the difference of two sums: :func:`per_call`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

GRPC_METRIC = "dra_grpc_operations_duration_seconds"
OPERATIONS_METRIC = "dra_operations_duration_seconds"
PREPARE_METHOD = "NodePrepareResources"
UNPREPARE_METHOD = "NodeUnprepareResources"

Labels = Mapping[str, str]


@dataclass(frozen=True)
class Histogram:
    """One histogram (label sets added): cumulative bucket counts by upper bound (``+Inf``
    last), the sum of the observations and their count."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    def minus(self, before: Histogram | None) -> Histogram:
        """The observations made since ``before`` (a scrape of the same histogram)."""
        if before is None:
            return self
        old = dict(before.buckets)
        return Histogram(
            tuple((le, n - old.get(le, 0.0)) for le, n in self.buckets),
            self.sum - before.sum,
            self.count - before.count,
        )

    @property
    def finite_bounds(self) -> list[float]:
        return [le for le, _ in self.buckets if not math.isinf(le)]


def histogram(text: str, metric: str, match: Callable[[Labels], bool]) -> Histogram | None:
    """``metric``'s series whose labels ``match``, added together; None when there is none.

    Only the lines of ``metric`` are parsed: a kubelet's page holds hundreds of series."""
    mine = "\n".join(line for line in text.splitlines() if line.startswith(metric))
    buckets: dict[float, float] = {}
    total, count, seen = 0.0, 0.0, False
    for family in text_string_to_metric_families(mine + "\n"):
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k != "le"}
            if not match(labels):
                continue
            seen = True
            if s.name == f"{metric}_bucket":
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
            elif s.name == f"{metric}_sum":
                total += s.value
            elif s.name == f"{metric}_count":
                count += s.value
    if not seen:
        return None
    return Histogram(tuple(sorted(buckets.items())), total, count)


def grpc_match(driver: str, method: str) -> Callable[[Labels], bool]:
    """The successful calls of ``method`` (either DRA API version) to ``driver``."""

    def match(labels: Labels) -> bool:
        return (
            labels.get("driver_name") == driver
            and labels.get("method_name", "").endswith("/" + method)
            and labels.get("grpc_status_code") == "OK"
        )

    return match


def operation_match(operation: str) -> Callable[[Labels], bool]:
    """The ``PrepareResources`` or ``UnprepareResources`` steps of pods, failed or not: the
    1.34 kubelet labels a step ``is_error=strconv.FormatBool(err == nil)``, so a success
    reads ``is_error="true"``; either label is taken rather than trusting one meaning."""

    def match(labels: Labels) -> bool:
        return labels.get("operation_name") == operation

    return match


def per_call(after: Histogram | None, before: Histogram | None) -> float | None:
    """The one observation made between two scrapes, in seconds; None unless exactly one
    was (none yet, or the kubelet called again: a retry)."""
    if after is None:
        return None
    delta = after.minus(before)
    return delta.sum if delta.count == 1 else None


def bucket_quantile(h: Histogram, q: float) -> float:
    """The ``q`` quantile (0-1) by linear interpolation within the bucket that holds it, as
    Prometheus' ``histogram_quantile`` does (the first bucket's lower bound is 0; a rank in
    the ``+Inf`` bucket gives the last finite bound). NaN for an empty histogram."""
    if h.count <= 0:
        return math.nan
    rank = q * h.count
    lower, below = 0.0, 0.0
    for le, cumulative in h.buckets:
        if cumulative >= rank:
            if math.isinf(le):
                return lower
            inside = cumulative - below
            return lower + (le - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = le, cumulative
    return lower
