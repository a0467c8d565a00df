"""The soak's record: report.json's figures and the summary printed at the end."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from neuron_dra.sim.soak.children import PLUGIN
from neuron_dra.sim.soak.options import JsonDict

if TYPE_CHECKING:
    from neuron_dra.sim.soak.harness import Soak


def _percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def report(soak: Soak, started: bool) -> JsonDict:
    by_kind: dict[str, list[float]] = {}
    for f in soak.faults:
        if f.recovery is not None:
            by_kind.setdefault(f.kind, []).append(f.recovery)
    done = [f for f in soak.faults if f.done_at is not None]
    return {
        "command": soak.o.command(),
        "started": started,
        "duration_s": round(soak.now(), 1),
        "nodes": len(soak.nodes),
        "faults": dict(Counter(f.kind for f in done)),
        "plugins_killed": dict(Counter(f.target for f in done if f.kind == PLUGIN)),
        "self_exits": dict(soak.self_exits),
        "recovery_s": {
            k: {
                "n": len(v),
                "p50": round(_percentile(v, 50), 1),
                "p99": round(_percentile(v, 99), 1),
                "max": round(max(v), 1),
            }
            for k, v in sorted(by_kind.items())
        },
        "operations": dict(soak.ops),
        "operation_failures": dict(soak.op_failures),
        "free_latency_s": {
            "n": len(soak.free_latency),
            "p50": round(_percentile(soak.free_latency, 50), 1),
            "p99": round(_percentile(soak.free_latency, 99), 1),
        },
        "checks": soak.checks,
        "containers_looked_into": soak.node_side.containers_looked_into(),
        "container_looks_failed": soak.node_side.container_looks_failed(),
        "violations": soak.violations,
        "fault_schedule": [
            {"at": f.done_at, "kind": f.kind, "target": f.target, "down": f.downtime} for f in done
        ],
    }


def summary(r: JsonDict) -> str:
    lines = [
        f"soak: {r['command']}",
        f"  ran {r['duration_s']}s on {r['nodes']} nodes; {r['checks']} invariant rounds; "
        f"{r['containers_looked_into']} containers looked into "
        f"({len(r['container_looks_failed'])} looks failed and were tried again)",
        f"  faults: {r['faults']} (plugins: {len(r['plugins_killed'])} distinct)",
        f"  self-exits (restarted): {r['self_exits']}",
        f"  operations: {r['operations']} (failed, retried later: {r['operation_failures']})",
        f"  deleted workloads freed: {r['free_latency_s']}",
        "  recovery after restart (s):",
        *(
            f"    {k:<24} n={v['n']:<3} p50={v['p50']:<6} p99={v['p99']:<6} max={v['max']}"
            for k, v in r["recovery_s"].items()
        ),
        f"  violations: {len(r['violations'])}",
    ]
    return "\n".join(lines)
