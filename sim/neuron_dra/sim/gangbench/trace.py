"""``hack/bench/gang-start --trace``: where a gang start's time goes, pod by pod.

Two sources, both of the real control plane: the API server's audit log (every write, with
the time the server finished it and who made it: the ReplicaSet controller's pod creates,
the resourceclaim controller's claims and pod statuses, kube-scheduler's FailedScheduling
events, claim allocations and bindings, our controller's and plugins' writes) and
kube-scheduler's and kube-controller-manager's ``/metrics`` before and after each run
(scheduling attempts by result, time per extension point and in DynamicResources, the
client-side rate limiter's waits). Parsing and the report are pure; the harness collects.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from neuron_dra.sim.peerbench.stats import percentile

JsonDict = dict[str, Any]

#: Creates of pods and claims with their response (a generated name is known only there),
#: event creates with their request (reason, regarding object), every other write by name.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: RequestResponse
  verbs: [create]
  resources:
  - {group: "", resources: [pods]}
  - {group: resource.k8s.io, resources: [resourceclaims]}
- level: Request
  verbs: [create, patch, update]
  resources:
  - {group: "", resources: [events]}
  - {group: events.k8s.io, resources: [events]}
- level: Metadata
  verbs: [create, update, patch, delete]
- level: None
"""

# --- metrics ----------------------------------------------------------------------------------

MetricKey = tuple[str, tuple[tuple[str, str], ...]]
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str, prefixes: Sequence[str]) -> dict[MetricKey, float]:
    """Samples of the Prometheus text format whose name starts with one of ``prefixes``."""
    out: dict[MetricKey, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or not line.startswith(tuple(prefixes)):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        labels = tuple(sorted(_LABEL.findall(m.group(3) or "")))
        try:
            out[(m.group(1), labels)] = float(m.group(4))
        except ValueError:
            continue
    return out


def delta(before: Mapping[MetricKey, float], after: Mapping[MetricKey, float]) -> JsonDict:
    """``after - before`` of every sample that moved, keyed ``name{a=b,...}`` (JSON-able)."""
    out: JsonDict = {}
    for key, value in after.items():
        moved = value - before.get(key, 0.0)
        if moved:
            name, labels = key
            out[name + "{" + ",".join(f"{k}={v}" for k, v in labels) + "}"] = moved
    return out


SCHEDULER_METRICS = (
    "scheduler_schedule_attempts_total",
    "scheduler_scheduling_attempt_duration_seconds_sum",
    "scheduler_scheduling_attempt_duration_seconds_count",
    "scheduler_framework_extension_point_duration_seconds_sum",
    "scheduler_framework_extension_point_duration_seconds_count",
    "scheduler_plugin_execution_duration_seconds_sum",
    "scheduler_plugin_execution_duration_seconds_count",
    "scheduler_queue_incoming_pods_total",
    "scheduler_pod_scheduling_sli_duration_seconds_sum",
    "scheduler_pod_scheduling_sli_duration_seconds_count",
    "scheduler_pod_scheduling_attempts_sum",
    "scheduler_pod_scheduling_attempts_count",
    "scheduler_e2e_scheduling_duration_seconds",
    "rest_client_rate_limiter_duration_seconds_sum",
    "rest_client_rate_limiter_duration_seconds_count",
)
KCM_METRICS = (
    "rest_client_rate_limiter_duration_seconds_sum",
    "rest_client_rate_limiter_duration_seconds_count",
    "rest_client_requests_total",
    "workqueue_queue_duration_seconds_sum",
    "workqueue_queue_duration_seconds_count",
    "workqueue_work_duration_seconds_sum",
    "workqueue_work_duration_seconds_count",
    "workqueue_adds_total",
    "workqueue_retries_total",
)

# --- the audit log ----------------------------------------------------------------------------


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class Write:
    """One write the API server finished: when (wall seconds), who, what."""

    at: float
    user: str
    verb: str
    resource: str
    name: str
    code: int
    #: For creates of pods and claims: the created object's name and owner; for events:
    #: reason and the object the event is about.
    detail: JsonDict = field(default_factory=dict)


def _detail(event: Mapping[str, Any]) -> JsonDict:
    ref = event.get("objectRef") or {}
    resp = event.get("responseObject") or {}
    req = event.get("requestObject") or {}
    if ref.get("resource") in ("pods", "resourceclaims") and not ref.get("subresource"):
        meta = resp.get("metadata") or {}
        owners = [o.get("name", "") for o in meta.get("ownerReferences") or []]
        return {"name": meta.get("name", ""), "owners": owners}
    if ref.get("resource") == "events":
        about = req.get("regarding") or req.get("involvedObject") or {}
        return {
            "reason": req.get("reason", ""),
            "about": about.get("name", ""),
            "note": (req.get("note") or req.get("message") or "")[:300],
        }
    return {}


def parse_audit(lines: Iterable[str]) -> list[Write]:
    out: list[Write] = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("stage") != "ResponseComplete":
            continue
        ref = event.get("objectRef") or {}
        resource = ref.get("resource", "") + (
            "/" + ref["subresource"] if ref.get("subresource") else ""
        )
        detail = _detail(event)
        out.append(
            Write(
                at=_ts(event["stageTimestamp"]),
                user=(event.get("user") or {}).get("username", ""),
                verb=event.get("verb", ""),
                resource=resource,
                name=ref.get("name") or detail.get("name", ""),
                code=int((event.get("responseStatus") or {}).get("code", 0)),
                detail=detail,
            )
        )
    return out


def _who(user: str) -> str:
    return user.rsplit(":", 1)[-1]


@dataclass
class PodTimes:
    """One pod's way, seconds after the apply started (None: not seen)."""

    name: str
    created: float | None = None
    claim: str = ""
    claim_created: float | None = None
    status_claim: float | None = None  # resourceclaim controller wrote the claim's name
    failed: list[float] = field(default_factory=list)  # FailedScheduling events
    failed_notes: list[str] = field(default_factory=list)
    allocated: float | None = None  # scheduler wrote the claim's allocation
    bound: float | None = None


def pod_times(writes: Sequence[Write], t0: float, t1: float, prefix: str) -> list[PodTimes]:
    """Each pod named ``prefix-...`` of one run (writes between ``t0`` and ``t1``)."""
    pods: dict[str, PodTimes] = {}
    claim_pod: dict[str, str] = {}
    scoped = [w for w in writes if t0 <= w.at <= t1 and w.code < 400]
    for w in scoped:
        t = w.at - t0
        if w.resource == "pods" and w.verb == "create" and w.name.startswith(prefix):
            pods[w.name] = PodTimes(w.name, created=t)
        elif w.resource == "resourceclaims" and w.verb == "create":
            owners = w.detail.get("owners") or []
            if owners and owners[0] in pods:
                pods[owners[0]].claim, pods[owners[0]].claim_created = w.name, t
                claim_pod[w.name] = owners[0]
        elif w.resource == "pods/status" and w.name in pods and "resource-claim" in w.user:
            pods[w.name].status_claim = pods[w.name].status_claim or t
        elif w.resource == "resourceclaims/status" and w.name in claim_pod:
            p = pods[claim_pod[w.name]]
            if "scheduler" in w.user and p.allocated is None:
                p.allocated = t
        elif w.resource == "pods/binding" and w.name in pods:
            pods[w.name].bound = t
        elif w.resource == "events" and w.detail.get("reason") == "FailedScheduling":
            about = w.detail.get("about", "")
            if about in pods:
                pods[about].failed.append(t)
                pods[about].failed_notes.append(str(w.detail.get("note", "")))
    return sorted(pods.values(), key=lambda p: p.created or 0.0)


def others(writes: Sequence[Write], t0: float, t1: float, skip: Sequence[str]) -> list[str]:
    """The run's other writes, one line each, in order (``skip``: resources left out)."""
    return [
        f"{w.at - t0:6.3f} {_who(w.user):32.32} {w.verb:6} {w.resource:24.24} {w.name}"
        + (f" [{w.detail.get('reason')}]" if w.detail.get("reason") else "")
        for w in writes
        if t0 <= w.at <= t1 and w.resource not in skip
    ]


def _f(x: float | None) -> str:
    return f"{x:6.3f}" if x is not None else "     -"


def pod_table(pods: Sequence[PodTimes]) -> str:
    rows = [
        "pod                         created claim  status alloc  bound  failed(at)",
    ]
    for p in pods:
        rows.append(
            f"{p.name[-27:]:27} {_f(p.created)} {_f(p.claim_created)} {_f(p.status_claim)} "
            f"{_f(p.allocated)} {_f(p.bound)}  " + ",".join(f"{x:.3f}" for x in p.failed)
        )
    return "\n".join(rows)


def summary(runs: Sequence[Sequence[PodTimes]]) -> str:
    """p50 over runs of: first/last pod created, last claim status, last bound, the gaps
    between consecutive bindings (the scheduler's pace) and unschedulable attempts."""

    def stat(values: list[float]) -> str:
        return f"p50 {percentile(values, 50):.3f} max {max(values):.3f}" if values else "-"

    def last(pods: Sequence[PodTimes], attr: str) -> float:
        values = [getattr(p, attr) for p in pods]
        return max(v for v in values if v is not None) if any(values) else float("nan")

    first_created = [min(p.created or 0.0 for p in r) for r in runs if r]
    gaps: list[float] = []
    waits: list[float] = []
    for r in runs:
        bound = sorted(p.bound for p in r if p.bound is not None)
        gaps += [b - a for a, b in itertools.pairwise(bound)]
        waits += [
            p.bound - max(p.status_claim or 0.0, p.created or 0.0) for p in r if p.bound is not None
        ]
    failed = [sum(len(p.failed) for p in r) for r in runs]
    lines = [
        f"first pod created          {stat(first_created)}",
        f"last pod created           {stat([last(r, 'created') for r in runs if r])}",
        f"last claim created         {stat([last(r, 'claim_created') for r in runs if r])}",
        f"last pod status (claim)    {stat([last(r, 'status_claim') for r in runs if r])}",
        f"last claim allocated       {stat([last(r, 'allocated') for r in runs if r])}",
        f"last pod bound             {stat([last(r, 'bound') for r in runs if r])}",
        f"pod ready-to-schedule->bound {stat(waits)}",
        f"gap between bindings       {stat(gaps)}",
        f"FailedScheduling per run   {failed}",
    ]
    return "\n".join(lines)


def metric_lines(deltas: Sequence[Mapping[str, float]], keep: Sequence[str]) -> str:
    """Sum over runs of each metric delta whose key contains one of ``keep``."""
    total: dict[str, float] = defaultdict(float)
    for d in deltas:
        for k, v in d.items():
            if any(s in k for s in keep):
                total[k] += v
    return "\n".join(f"{v:12.4f}  {k}" for k, v in sorted(total.items()))
