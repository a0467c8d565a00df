"""The gang-start trace's pure parts (sim/neuron_dra/sim/gangbench/trace.py): Prometheus
text, metric deltas, audit events into a pod's way, on made-up input."""

from __future__ import annotations

import json

from neuron_dra.sim.gangbench import trace

T0 = 1_700_000_000.0


def _iso(seconds_after: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(T0 + seconds_after, UTC).isoformat().replace("+00:00", "Z")


def _event(at: float, user: str, verb: str, resource: str, name: str = "", **extra: object) -> str:
    res, _, sub = resource.partition("/")
    ref = {"resource": res, "name": name, "namespace": "default"}
    if sub:
        ref["subresource"] = sub
    return json.dumps(
        {
            "stage": "ResponseComplete",
            "stageTimestamp": _iso(at),
            "user": {"username": user},
            "verb": verb,
            "objectRef": ref,
            "responseStatus": {"code": 201 if verb == "create" else 200},
            **extra,
        }
    )


def test_metrics_parse_and_delta() -> None:
    text = "\n".join(
        [
            "# HELP scheduler_schedule_attempts_total x",
            'scheduler_schedule_attempts_total{profile="p",result="scheduled"} 3',
            'scheduler_schedule_attempts_total{profile="p",result="unschedulable"} 1',
            "other_metric 7",
        ]
    )
    before = trace.parse_metrics(text, ("scheduler_schedule_attempts_total",))
    assert len(before) == 2
    after = dict(before)
    key = next(k for k in after if ("result", "unschedulable") in k[1])
    after[key] = 4.0
    assert trace.delta(before, after) == {
        "scheduler_schedule_attempts_total{profile=p,result=unschedulable}": 3.0
    }


def test_a_pods_way_from_the_audit_log() -> None:
    rcc = "system:serviceaccount:kube-system:resource-claim-controller"
    pod, claim = "gang-0-abc-x1", "gang-0-abc-x1-neuron-claim-q"
    lines = [
        _event(
            0.10,
            "system:serviceaccount:kube-system:replicaset-controller",
            "create",
            "pods",
            responseObject={"metadata": {"name": pod}},
        ),
        _event(
            0.15,
            rcc,
            "create",
            "resourceclaims",
            responseObject={"metadata": {"name": claim, "ownerReferences": [{"name": pod}]}},
        ),
        _event(0.20, rcc, "patch", "pods/status", pod),
        _event(
            0.25,
            "system:kube-scheduler",
            "create",
            "events",
            requestObject={
                "reason": "FailedScheduling",
                "regarding": {"name": pod},
                "note": "0/24",
            },
        ),
        _event(0.40, "system:kube-scheduler", "update", "resourceclaims/status", claim),
        _event(0.45, "system:kube-scheduler", "create", "pods/binding", pod),
        _event(9.00, "system:kube-scheduler", "create", "pods/binding", pod),  # after the run
        "not json",
    ]
    writes = trace.parse_audit(lines)
    assert len(writes) == 7
    (p,) = trace.pod_times(writes, T0, T0 + 5.0, "gang-0-")
    assert p.name == pod and p.claim == claim
    got = (p.created, p.claim_created, p.status_claim, p.allocated, p.bound)
    assert [round(x or -1, 3) for x in got] == [0.1, 0.15, 0.2, 0.4, 0.45]
    assert [round(x, 3) for x in p.failed] == [0.25]
    text = trace.summary([[p]])
    assert "FailedScheduling per run   [1]" in text
    assert "ready-to-schedule->bound p50 0.250" in text
