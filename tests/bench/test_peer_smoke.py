"""Smoke of the side-by-side benchmark (hack/bench/peer): a few cycles of both drivers on
the real 1.34 control plane, a few rounds of the floor plugin and the peer behind real
kubelets (``--kubelets real --ours floor``), and the table's arithmetic on made-up figures.
Not a timed test: it checks that the harness runs and its numbers are sane (present, finite,
positive, ordered), not how fast anything is. How fast, and the targets, are the benchmark's:
``hack/bench/peer`` prints the figures, docs/performance.md records them.

Off CI it skips when the Kubernetes components or the Go peer are not built
(``hack/k8s/build --version 1.34``, ``hack/bench/build-peer``), or real nodes cannot run
here (root, ``hack/k8s/node-packages``); with CI=true it fails. The real-kubelet smoke starts
real nodes: run it under ``flock /tmp/neuron-dra-realnodes.lock``.
"""

from __future__ import annotations

import math
import os

import pytest
from neuron_dra.sim.peerbench import kubeletmetrics as km
from neuron_dra.sim.peerbench.__main__ import _buckets, real_report
from neuron_dra.sim.peerbench.driver import FLOOR_VERSION, OURS_FLOOR
from neuron_dra.sim.peerbench.harness import Options, run
from neuron_dra.sim.peerbench.observe import parse_sum_count
from neuron_dra.sim.peerbench.realkubelet import RealOptions, run_real
from neuron_dra.sim.peerbench.stats import (
    OURS,
    PEER,
    DriverFigures,
    KubeletView,
    Latency,
    markdown_table,
    percentile,
    real_rows,
    rows,
    targets_met,
)
from neuron_dra.sim.peerbuild import PeerUnavailable, peer_binary
from neuron_dra.sim.worlds import require_built, require_real_nodes

MINOR = "1.34"


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 51.0  # round(0.5 * 99) = 50 -> the 51st value
    assert percentile(values, 99) == 99.0
    assert percentile([3.0], 99) == 3.0
    with pytest.raises(ValueError):
        percentile([], 50)


def _figures(label: str, scale: float, rss_kib: int, growth_kib: int) -> DriverFigures:
    f = DriverFigures(label, "v")
    f.prepare_1 = [0.004 * scale] * 99 + [0.010 * scale]
    f.unprepare_1 = [0.002 * scale] * 100
    f.prepare_16 = [0.030 * scale] * 10
    f.unprepare_16 = [0.010 * scale] * 10
    f.empty_call = [0.001] * 10
    f.start_to_published = [0.5 * scale]
    f.rss_rest_kib = rss_kib
    f.rss_warm_kib = rss_kib
    f.rss_samples_kib = [rss_kib, rss_kib + growth_kib]
    f.cycles = 100
    f.cycle_cpu_seconds = 0.5 * scale
    return f


def test_table_ratios_and_targets() -> None:
    ours = _figures(OURS, 0.9, 60 * 1024, 0)
    peer = _figures(PEER, 1.0, 40 * 1024, 3 * 1024)
    table = {r.measure: r for r in rows(ours, peer)}
    p50 = table["Prepare, 1 claim p50 (n=100)"]
    assert (p50.ours, p50.peer, p50.ratio) == ("3.60 ms", "4.00 ms", "0.90")
    assert p50.target.endswith("met") and "MISSED" not in p50.target
    assert table["Prepare, 1 claim p99 (n=100)"].ratio == "0.90"
    assert table["RSS at rest"].ratio == "1.50"
    assert table["CPU s per 1,000 Prepare + Unprepare (1 claim)"].ours == "4.50 s"
    assert all(targets_met(ours, peer).values())
    # Ours slower at the median, twice the peer's memory plus growth: three targets missed.
    worse = _figures(OURS, 1.1, 90 * 1024, 4 * 1024)
    met = targets_met(worse, peer)
    assert not met["prepare p50 ratio ≤ 1.0"]
    assert met["prepare p99 ratio ≤ 1.2"]
    assert not met["RSS ≤ 2x peer"]
    assert not met["no RSS growth"]
    md = markdown_table(rows(worse, peer), "ours", "peer")
    assert md.splitlines()[0] == "| measure | ours | peer | ours/peer | target |"
    assert "MISSED" in md


def _require_peer() -> None:
    try:
        peer_binary()
    except PeerUnavailable as err:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{err} (CI=true: the peer benchmark's smoke must run, not skip)")
        pytest.skip(str(err))


def test_peer_bench_smoke() -> None:
    require_built(MINOR)
    _require_peer()
    cycles = 20
    result = run(Options(minor=MINOR, starts=1, warmup=5, cycles=cycles, batches=3, floor_calls=10))
    for f in (result.ours, result.peer):
        assert len(f.prepare_1) == len(f.unprepare_1) == cycles
        assert len(f.prepare_16) == len(f.unprepare_16) == 3
        assert len(f.start_to_published) == 1
        assert 0 < f.start_to_published[0] < math.inf  # measured: positive and finite
        for calls in (f.prepare_1, f.unprepare_1, f.prepare_16, f.empty_call):
            lat = Latency.of(calls)
            assert 0 < lat.p50 <= lat.p99 < math.inf, (f.label, lat)
        assert 1024 < f.rss_rest_kib < 1024 * 1024  # between 1 MiB and 1 GiB
        assert len(f.rss_samples_kib) == 10
        assert f.cpu_per_1000 > 0
    for f in (result.ours, result.peer):  # from each driver's own metrics
        assert f.own_prepare_mean is not None
        # Not a speed bound: the driver's own time of each measured Prepare lies inside the
        # harness's time of the same call, so their mean is below the longest of the latter.
        assert 0 < f.own_prepare_mean < max(f.prepare_1), f.label
    assert result.kubernetes.startswith("v1.34.")
    assert len(result.claim_get) == 10
    table = markdown_table(rows(result.ours, result.peer), "ours", "peer")
    assert "Prepare, 1 claim p50" in table and "RSS at rest" in table
    body = [line.split("|") for line in table.splitlines()[2:]]
    assert all(cells[2].strip() and cells[3].strip() for cells in body), table


def test_real_kubelets_floor_smoke() -> None:
    """The floor plugin in ours's slot behind a real kubelet: its containers start (the CDI
    ids it answers resolve in containerd), and the kubelet counts every call of both."""
    require_built(MINOR)
    require_real_nodes(MINOR)
    _require_peer()
    rounds = 3
    result = run_real(RealOptions(minor=MINOR, rounds=rounds, warmup_rounds=1, ours=OURS_FLOOR))
    assert result.ours_plugin == OURS_FLOOR and result.ours.version == FLOOR_VERSION
    for v in (result.ours, result.peer):
        assert v.skipped == 0, v.label
        assert len(v.prepare) == len(v.unprepare) == rounds, v.label
        assert all(0 < s < math.inf for s in v.prepare + v.unprepare), v
    assert result.ours.own_prepare_mean is None  # the floor serves no metrics
    assert len(result.to_running) == rounds
    report = real_report(result, ["--kubelets", "real", "--ours", "floor"])
    assert f"| measure | {FLOOR_VERSION} | peer |" in report
    assert "NOT our plugin" in report


def test_parse_sum_count_adds_label_sets() -> None:
    text = "\n".join(
        [
            "# HELP m_seconds help",
            "# TYPE m_seconds histogram",
            'm_seconds_bucket{le="0.005"} 3',
            'm_seconds_sum{result="ok"} 0.25',
            'm_seconds_count{result="ok"} 4',
            'm_seconds_sum{result="error"} 0.05',
            'm_seconds_count{result="error"} 1',
            "m_seconds_other_sum 9",
        ]
    )
    assert parse_sum_count(text, "m_seconds") == (0.30, 5)
    assert parse_sum_count(text, "absent") is None


_METHOD = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
_OK = f'driver_name="d.example.com",grpc_status_code="OK",method_name="{_METHOD}"'
_FAILED = f'driver_name="d.example.com",grpc_status_code="Unavailable",method_name="{_METHOD}"'
_STEP = 'is_error="true",operation_name="PrepareResources"'  # 1.34: true on success
_GRPC = "dra_grpc_operations_duration_seconds"
_OPS = "dra_operations_duration_seconds"
#: A kubelet's /metrics, cut down: one driver's Prepare calls (one failed), a pod step.
_KUBELET_PAGE = "\n".join(
    [
        f"# HELP {_GRPC} [ALPHA] Duration in seconds of the DRA gRPC operations",
        f"# TYPE {_GRPC} histogram",
        f'{_GRPC}_bucket{{{_OK},le="0.1"}} 3',
        f'{_GRPC}_bucket{{{_OK},le="0.15"}} 4',
        f'{_GRPC}_bucket{{{_OK},le="+Inf"}} 4',
        f"{_GRPC}_sum{{{_OK}}} 0.125",
        f"{_GRPC}_count{{{_OK}}} 4",
        f'{_GRPC}_bucket{{{_FAILED},le="+Inf"}} 1',
        f"{_GRPC}_sum{{{_FAILED}}} 5",
        f"{_GRPC}_count{{{_FAILED}}} 1",
        f"# HELP {_OPS} [ALPHA] Latency histogram",
        f"# TYPE {_OPS} histogram",
        f'{_OPS}_bucket{{{_STEP},le="0.1"}} 4',
        f'{_OPS}_bucket{{{_STEP},le="+Inf"}} 4',
        f"{_OPS}_sum{{{_STEP}}} 0.2",
        f"{_OPS}_count{{{_STEP}}} 4",
        "kubelet_other_seconds_sum 3",
    ]
)


def test_kubelet_histograms_per_call_and_buckets() -> None:
    prepare = km.grpc_match("d.example.com", km.PREPARE_METHOD)
    h = km.histogram(_KUBELET_PAGE, km.GRPC_METRIC, prepare)
    assert h is not None
    assert (h.sum, h.count) == (0.125, 4)  # the Unavailable call is not counted
    assert h.buckets == ((0.1, 3), (0.15, 4), (math.inf, 4))
    assert h.finite_bounds == [0.1, 0.15]
    assert km.histogram(_KUBELET_PAGE, km.GRPC_METRIC, km.grpc_match("x", "y")) is None
    step = km.histogram(_KUBELET_PAGE, km.OPERATIONS_METRIC, km.operation_match("PrepareResources"))
    assert step is not None and step.count == 4
    # One more call of 7 ms between two scrapes: its duration is the sums' difference.
    later = km.Histogram(((0.1, 4), (0.15, 5), (math.inf, 5)), 0.132, 5)
    assert km.per_call(later, h) == pytest.approx(0.007)
    assert km.per_call(h, h) is None  # none yet
    assert km.per_call(later, None) is None  # five observations, not one
    # Interpolated within buckets, as histogram_quantile: rank 2 of 4 in [0, 0.1] with 3.
    assert km.bucket_quantile(h, 0.5) == pytest.approx(0.1 * 2 / 3)
    assert km.bucket_quantile(h, 0.99) == pytest.approx(0.1 + 0.05 * (3.96 - 3))
    inf = km.Histogram(((0.1, 0), (math.inf, 2)), 1.0, 2)
    assert km.bucket_quantile(inf, 0.5) == 0.1  # in +Inf: the last finite bound
    assert math.isnan(km.bucket_quantile(km.Histogram((), 0.0, 0), 0.5))


def test_real_kubelet_table() -> None:
    ours = KubeletView(OURS, "v", prepare=[0.004] * 98 + [0.020] * 2, unprepare=[0.002] * 100)
    peer = KubeletView(PEER, "v", prepare=[0.005] * 98 + [0.010] * 2, unprepare=[0.002] * 100)
    ours.prepare_bucket_p50 = peer.prepare_bucket_p50 = 0.05
    table = {r.measure: r for r in real_rows(ours, peer)}
    p50 = table["Prepare, 1 claim (kubelet's gRPC histogram) p50 (n=100)"]
    assert (p50.ours, p50.peer, p50.ratio) == ("4.00 ms", "5.00 ms", "0.80")
    assert p50.target.endswith("met") and "MISSED" not in p50.target
    p99 = table["Prepare, 1 claim (kubelet's gRPC histogram) p99 (n=100)"]
    assert p99.ratio == "2.00" and "MISSED" in p99.target
    assert table["Prepare p50 interpolated in the kubelet's buckets"].ratio == "1.00"
    assert not any("step" in m for m in table)  # no step figures: no rows for them
    assert _buckets(((0.1, 3.0), (0.15, 3.0), (math.inf, 4.0))) == "le=0.1: 3, le=inf: 1"
