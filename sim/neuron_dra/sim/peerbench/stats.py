"""The side-by-side benchmark's figures and table: pure functions over what the harness
measured (no processes, no clock)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

OURS = "ours"
PEER = "peer"
#: RSS may move this much between the sample after warm-up and the last one and still count
#: as "no growth" (allocator and GC noise, both runtimes).
RSS_GROWTH_TOLERANCE_KIB = 2048


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile (0-100) of ``values`` (not empty)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


@dataclass(frozen=True)
class Latency:
    """Seconds per call: its median and 99th percentile and how many calls."""

    p50: float
    p99: float
    n: int

    @staticmethod
    def of(seconds: Sequence[float]) -> Latency:
        return Latency(percentile(seconds, 50), percentile(seconds, 99), len(seconds))


@dataclass
class DriverFigures:
    """Everything measured for one driver in one run."""

    label: str
    version: str
    start_to_published: list[float] = field(default_factory=list)  # seconds, one per start
    prepare_1: list[float] = field(default_factory=list)  # seconds per 1-claim Prepare call
    unprepare_1: list[float] = field(default_factory=list)
    prepare_16: list[float] = field(default_factory=list)  # seconds per 16-claim call
    unprepare_16: list[float] = field(default_factory=list)
    empty_call: list[float] = field(default_factory=list)  # Prepare with no claims: gRPC alone
    rss_rest_kib: int = 0  # started, registered, published, idle
    rss_warm_kib: int = 0  # after the warm-up cycles
    rss_samples_kib: list[int] = field(default_factory=list)  # during the measured cycles
    rss_end_kib: int = 0  # after every phase
    cycles: int = 0
    cycle_cpu_seconds: float = 0.0  # CPU the process used over the measured cycles
    #: Mean seconds per claim of the driver's own Prepare histogram over the cycles (ours:
    #: the claim GET included; the peer's: its own work, no GET), None if not read.
    own_prepare_mean: float | None = None

    @property
    def cpu_per_1000(self) -> float:
        """CPU seconds per 1,000 one-claim Prepare + Unprepare cycles."""
        return self.cycle_cpu_seconds * 1000 / self.cycles if self.cycles else 0.0

    @property
    def prepare_1_mean(self) -> float:
        return sum(self.prepare_1) / len(self.prepare_1) if self.prepare_1 else 0.0

    @property
    def rss_after_cycles_kib(self) -> int:
        return self.rss_samples_kib[-1] if self.rss_samples_kib else self.rss_warm_kib

    @property
    def rss_growth_kib(self) -> int:
        """RSS after the measured cycles less RSS after the warm-up."""
        return self.rss_after_cycles_kib - self.rss_warm_kib


@dataclass(frozen=True)
class Row:
    measure: str
    ours: str
    peer: str
    ratio: str
    target: str


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def _mib(kib: int) -> str:
    return f"{kib / 1024:.1f} MiB"


def _ratio(ours: float, peer: float) -> float | None:
    return ours / peer if peer > 0 else None


def _fmt_ratio(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}"


def _verdict(ok: bool, what: str) -> str:
    return f"{what}: {'met' if ok else 'MISSED'}"


def _latency_rows(
    name: str, ours: Sequence[float], peer: Sequence[float], targets: bool
) -> list[Row]:
    if not ours or not peer:
        return []
    a, b = Latency.of(ours), Latency.of(peer)
    p50, p99 = _ratio(a.p50, b.p50), _ratio(a.p99, b.p99)
    t50 = _verdict(p50 is not None and p50 <= 1.0, "≤ 1.0") if targets else ""
    t99 = _verdict(p99 is not None and p99 <= 1.2, "≤ 1.2") if targets else ""
    return [
        Row(f"{name} p50 (n={a.n})", _ms(a.p50), _ms(b.p50), _fmt_ratio(p50), t50),
        Row(f"{name} p99 (n={a.n})", _ms(a.p99), _ms(b.p99), _fmt_ratio(p99), t99),
    ]


def rows(ours: DriverFigures, peer: DriverFigures) -> list[Row]:
    """The table: one row per figure, ours, the peer's, ours/peer and the target's verdict."""
    out: list[Row] = []
    out += _latency_rows("Prepare, 1 claim", ours.prepare_1, peer.prepare_1, True)
    out += _latency_rows("Unprepare, 1 claim", ours.unprepare_1, peer.unprepare_1, False)
    out += _latency_rows("Prepare, 16 claims in one call", ours.prepare_16, peer.prepare_16, True)
    out += _latency_rows(
        "Unprepare, 16 claims in one call", ours.unprepare_16, peer.unprepare_16, False
    )
    out += _latency_rows(
        "floor: empty Prepare (gRPC alone)", ours.empty_call, peer.empty_call, False
    )
    if ours.start_to_published and peer.start_to_published:
        a = percentile(ours.start_to_published, 50)
        b = percentile(peer.start_to_published, 50)
        n = len(ours.start_to_published)
        out.append(
            Row(
                f"start to slice published, median of {n}",
                f"{a:.2f} s",
                f"{b:.2f} s",
                _fmt_ratio(_ratio(a, b)),
                "",
            )
        )
    rest = _ratio(ours.rss_rest_kib, peer.rss_rest_kib)
    out.append(
        Row(
            "RSS at rest",
            _mib(ours.rss_rest_kib),
            _mib(peer.rss_rest_kib),
            _fmt_ratio(rest),
            _verdict(rest is not None and rest <= 2.0, "≤ 2"),
        )
    )
    after = _ratio(ours.rss_after_cycles_kib, peer.rss_after_cycles_kib)
    out.append(
        Row(
            f"RSS after {ours.cycles} cycles",
            _mib(ours.rss_after_cycles_kib),
            _mib(peer.rss_after_cycles_kib),
            _fmt_ratio(after),
            _verdict(after is not None and after <= 2.0, "≤ 2"),
        )
    )
    out.append(
        Row(
            "RSS growth over the cycles (after warm-up → end)",
            f"{ours.rss_growth_kib / 1024:+.1f} MiB",
            f"{peer.rss_growth_kib / 1024:+.1f} MiB",
            "",
            _verdict(
                ours.rss_growth_kib <= RSS_GROWTH_TOLERANCE_KIB,
                f"ours ≤ {RSS_GROWTH_TOLERANCE_KIB // 1024} MiB",
            ),
        )
    )
    out.append(
        Row(
            "CPU s per 1,000 Prepare + Unprepare (1 claim)",
            f"{ours.cpu_per_1000:.2f} s",
            f"{peer.cpu_per_1000:.2f} s",
            _fmt_ratio(_ratio(ours.cpu_per_1000, peer.cpu_per_1000)),
            "",
        )
    )
    return out


def targets_met(ours: DriverFigures, peer: DriverFigures) -> dict[str, bool]:
    """Each target of issue 12 by name: met or not."""
    a, b = Latency.of(ours.prepare_1), Latency.of(peer.prepare_1)
    return {
        "prepare p50 ratio ≤ 1.0": a.p50 <= 1.0 * b.p50,
        "prepare p99 ratio ≤ 1.2": a.p99 <= 1.2 * b.p99,
        "RSS ≤ 2x peer": max(ours.rss_rest_kib, ours.rss_after_cycles_kib)
        <= 2 * max(peer.rss_rest_kib, peer.rss_after_cycles_kib),
        "no RSS growth": ours.rss_growth_kib <= RSS_GROWTH_TOLERANCE_KIB,
    }


def markdown_table(table: Sequence[Row], ours_name: str, peer_name: str) -> str:
    """The rows as a Markdown table (what docs/performance.md records)."""
    lines = [
        f"| measure | {ours_name} | {peer_name} | ours/peer | target |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {r.measure} | {r.ours} | {r.peer} | {r.ratio} | {r.target} |" for r in table]
    return "\n".join(lines)


@dataclass
class KubeletView:
    """One driver as its real kubelet saw it over the measured rounds (one pod, one claim
    each): per-call seconds from the kubelet's own histograms (the difference of their
    ``_sum`` across a round, :func:`.kubeletmetrics.per_call`)."""

    label: str
    version: str
    #: ``dra_grpc_operations_duration_seconds``: the gRPC call, timed by the kubelet's client.
    prepare: list[float] = field(default_factory=list)
    unprepare: list[float] = field(default_factory=list)
    #: ``dra_operations_duration_seconds``: the kubelet's whole step for the pod (its claim
    #: lookups and checkpoint around the call).
    prepare_step: list[float] = field(default_factory=list)
    unprepare_step: list[float] = field(default_factory=list)
    #: The measured rounds' Prepare calls in the kubelet's buckets: ((le, count), ...).
    prepare_buckets: tuple[tuple[float, float], ...] = ()
    prepare_bucket_p50: float = 0.0
    prepare_bucket_p99: float = 0.0
    #: Rounds whose Prepare or Unprepare was not one observation (a retry): left out.
    skipped: int = 0
    #: Mean seconds per claim of the driver's own Prepare histogram over the rounds.
    own_prepare_mean: float | None = None


def real_rows(ours: KubeletView, peer: KubeletView) -> list[Row]:
    """The real-kubelet table: the kubelet's per-call figures, then what its buckets say."""
    out: list[Row] = []
    for name, a, b, targets in (
        ("Prepare, 1 claim (kubelet's gRPC histogram)", ours.prepare, peer.prepare, True),
        ("Unprepare, 1 claim (kubelet's gRPC histogram)", ours.unprepare, peer.unprepare, False),
        ("kubelet PrepareResources step", ours.prepare_step, peer.prepare_step, False),
        ("kubelet UnprepareResources step", ours.unprepare_step, peer.unprepare_step, False),
    ):
        out += _latency_rows(name, a, b, targets)
        if a and b:
            ma, mb = sum(a) / len(a), sum(b) / len(b)
            out.append(Row(f"{name} mean", _ms(ma), _ms(mb), _fmt_ratio(_ratio(ma, mb)), ""))
    for q, x, y in (
        ("p50", ours.prepare_bucket_p50, peer.prepare_bucket_p50),
        ("p99", ours.prepare_bucket_p99, peer.prepare_bucket_p99),
    ):
        out.append(
            Row(
                f"Prepare {q} interpolated in the kubelet's buckets",
                _ms(x),
                _ms(y),
                _fmt_ratio(_ratio(x, y)),
                "",
            )
        )
    return out
