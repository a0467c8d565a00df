"""Which nodes may run a pod, before any device is considered: kube-scheduler's node filters
that the scenarios rely on, as pure functions.

- the node is Ready and not cordoned (``spec.unschedulable``);
- the pod tolerates the node's ``NoSchedule``/``NoExecute`` taints;
- ``spec.nodeSelector`` and required node affinity (``matchExpressions`` on labels,
  ``matchFields`` on ``metadata.name``);
- required inter-pod affinity and anti-affinity by ``topologyKey`` (what LeaderWorkerSet's
  ``exclusive-topology`` annotation turns into), including the scheduler's rule that the first
  pod of a group, which matches its own affinity term, may go anywhere the key is set.

Not modelled: preferred terms (scoring), the symmetric check of existing pods' anti-affinity,
``namespaceSelector``, ``matchLabelKeys``. Messages follow kube-scheduler's
``0/N nodes are available: ...`` summary so a reader recognises them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

JsonDict = dict[str, Any]

REASON_NOT_READY: Final = "node(s) were not ready"
REASON_UNSCHEDULABLE: Final = "node(s) were unschedulable"
REASON_TAINT: Final = "node(s) had untolerated taint"
REASON_SELECTOR: Final = "node(s) didn't match Pod's node affinity/selector"
REASON_AFFINITY: Final = "node(s) didn't match pod affinity rules"
REASON_ANTI_AFFINITY: Final = "node(s) didn't match pod anti-affinity rules"


@dataclass(frozen=True)
class PlacedPod:
    """A pod already bound (or being bound) to a node: what affinity terms look at."""

    namespace: str
    labels: Mapping[str, str]
    node: str


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return _meta(obj).get("labels") or {}


def node_ready(node: Mapping[str, Any]) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    # A Node object without conditions: the sim's nodes are created Ready; treat a bare
    # object (tests that only create the name) as Ready rather than refuse everything.
    return True


def _tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for tol in tolerations:
        effect = tol.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        key = tol.get("key")
        if tol.get("operator", "Equal") == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (tol.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def tolerates_taints(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    return all(
        _tolerates(tolerations, taint)
        for taint in (node.get("spec") or {}).get("taints") or []
        if taint.get("effect") in ("NoSchedule", "NoExecute")
    )


def _expression_matches(expr: Mapping[str, Any], value: str | None) -> bool:
    op = expr.get("operator")
    values = [str(v) for v in expr.get("values") or []]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and values:
        try:
            left, right = int(value), int(values[0])
        except ValueError:
            return False
        return left > right if op == "Gt" else left < right
    return False


def _term_matches(term: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    labels = _labels(node)
    fields = {"metadata.name": str(_meta(node).get("name") or "")}
    exprs = term.get("matchExpressions") or []
    field_exprs = term.get("matchFields") or []
    if not exprs and not field_exprs:
        return False  # an empty term matches nothing (as in Kubernetes)
    return all(_expression_matches(e, labels.get(str(e.get("key")))) for e in exprs) and all(
        _expression_matches(e, fields.get(str(e.get("key")))) for e in field_exprs
    )


def matches_node_selector(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    labels = _labels(node)
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms")
    if terms is None:
        return True
    return any(_term_matches(t, node) for t in terms)  # terms are ORed


def label_selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector; ``None`` matches nothing, ``{}`` everything (Kubernetes' rule
    for affinity terms)."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    return all(
        _expression_matches(e, labels.get(str(e.get("key"))))
        for e in selector.get("matchExpressions") or []
    )


def _required_terms(pod: Mapping[str, Any], kind: str) -> list[Mapping[str, Any]]:
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get(kind) or {}
    return list(affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or [])


def _term_namespaces(term: Mapping[str, Any], pod_namespace: str) -> set[str]:
    return set(term.get("namespaces") or [pod_namespace])


def _peers(
    term: Mapping[str, Any], pod_namespace: str, placed: Iterable[PlacedPod]
) -> list[PlacedPod]:
    namespaces = _term_namespaces(term, pod_namespace)
    selector = term.get("labelSelector")
    return [
        p
        for p in placed
        if p.namespace in namespaces and label_selector_matches(selector, p.labels)
    ]


def _domain(node: Mapping[str, Any] | None, key: str) -> str | None:
    return None if node is None else _labels(node).get(key)


def affinity_ok(
    pod: Mapping[str, Any],
    node: Mapping[str, Any],
    nodes: Mapping[str, Mapping[str, Any]],
    placed: Sequence[PlacedPod],
) -> bool:
    namespace = str(_meta(pod).get("namespace") or "")
    for term in _required_terms(pod, "podAffinity"):
        key = str(term.get("topologyKey") or "")
        mine = _domain(node, key)
        if mine is None:
            return False
        peers = _peers(term, namespace, placed)
        if peers:
            if not any(_domain(nodes.get(p.node), key) == mine for p in peers):
                return False
        elif not (
            namespace in _term_namespaces(term, namespace)
            and label_selector_matches(term.get("labelSelector"), _labels(pod))
        ):
            return False  # nobody to be near, and the pod is not the group's first member
    return True


def anti_affinity_ok(
    pod: Mapping[str, Any],
    node: Mapping[str, Any],
    nodes: Mapping[str, Mapping[str, Any]],
    placed: Sequence[PlacedPod],
) -> bool:
    namespace = str(_meta(pod).get("namespace") or "")
    for term in _required_terms(pod, "podAntiAffinity"):
        key = str(term.get("topologyKey") or "")
        mine = _domain(node, key)
        if mine is None:
            continue  # a node outside every domain conflicts with nobody
        if any(_domain(nodes.get(p.node), key) == mine for p in _peers(term, namespace, placed)):
            return False
    return True


@dataclass(frozen=True)
class Feasibility:
    nodes: list[str]
    #: reason → how many nodes it excluded (first failing filter per node)
    rejected: Mapping[str, int]
    total: int

    def message(self) -> str:
        """kube-scheduler's summary: ``0/6 nodes are available: 2 node(s) were not ready, ...``."""
        parts = ", ".join(f"{n} {reason}" for reason, n in sorted(self.rejected.items()))
        return f"0/{self.total} nodes are available: {parts}."


def feasible_nodes(
    pod: Mapping[str, Any],
    nodes: Iterable[Mapping[str, Any]],
    placed: Sequence[PlacedPod],
) -> Feasibility:
    """The nodes (in name order) that pass every filter, and why the others did not."""
    by_name = {str(_meta(n).get("name")): n for n in nodes}
    ok: list[str] = []
    rejected: Counter[str] = Counter()
    for name in sorted(by_name):
        node = by_name[name]
        if not node_ready(node):
            rejected[REASON_NOT_READY] += 1
        elif (node.get("spec") or {}).get("unschedulable"):
            rejected[REASON_UNSCHEDULABLE] += 1
        elif not tolerates_taints(pod, node):
            rejected[REASON_TAINT] += 1
        elif not matches_node_selector(pod, node):
            rejected[REASON_SELECTOR] += 1
        elif not affinity_ok(pod, node, by_name, placed):
            rejected[REASON_AFFINITY] += 1
        elif not anti_affinity_ok(pod, node, by_name, placed):
            rejected[REASON_ANTI_AFFINITY] += 1
        else:
            ok.append(name)
    return Feasibility(ok, dict(rejected), len(by_name))
