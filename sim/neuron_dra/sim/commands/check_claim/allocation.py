"""The allocation check: one claim allocated node by node as kube-scheduler's DRA plugin
would, each allocation then put to the prepare check, with a hint when a count can never
be a connected set."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from neuron_dra.common.constants import DRIVER_NAME
from neuron_dra.common.deviceclasses import CLASS_EXPRESSIONS
from neuron_dra.common.profiles import InstanceProfile
from neuron_dra.sim.allocation import (
    AllocationFailure,
    AllocationResult,
    CelError,
    allocate,
    compile_selector,
    device_view,
)
from neuron_dra.sim.commands.check_claim.inputs import (
    RESOURCE_GROUP,
    ClaimDoc,
    api_errors,
    as_dict,
    as_list,
)
from neuron_dra.sim.commands.check_claim.nodes import NodeDevices, names_list, split_by_node
from neuron_dra.sim.commands.check_claim.prepare import node_facts, prepare_problems
from neuron_dra.sim.commands.check_claim.sources import Cluster


def _is_neuron_class(name: str, classes: Mapping[str, Mapping[str, Any]]) -> bool:
    if name in CLASS_EXPRESSIONS:
        return True
    selectors = as_list(as_dict(as_dict(classes.get(name)).get("spec")).get("selectors"))
    return any(
        DRIVER_NAME in str(as_dict(as_dict(s).get("cel")).get("expression", "")) for s in selectors
    )


def requested_count(spec: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]]) -> int:
    """Neuron devices the claim asks for by count on one node; 0 when that is not fixed
    (``All`` or ``firstAvailable`` requests)."""
    total = 0
    for request in as_list(as_dict(spec.get("devices")).get("requests")):
        req = as_dict(request)
        if req.get("firstAvailable"):
            if any(
                _is_neuron_class(str(as_dict(s).get("deviceClassName", "")), classes)
                for s in as_list(req["firstAvailable"])
            ):
                return 0
            continue
        body = as_dict(req.get("exactly"))
        if not _is_neuron_class(str(body.get("deviceClassName", "")), classes):
            continue
        if (body.get("allocationMode") or "ExactCount") != "ExactCount":
            return 0
        count = body.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool):
            return 0
        total += count
    return total


def _expressions(items: Any) -> list[str]:
    return [str(as_dict(as_dict(s).get("cel")).get("expression", "")) for s in as_list(items)]


def selects_any(
    node: NodeDevices, spec: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]]
) -> bool:
    """Whether some Neuron request's class and selectors accept a device of ``node``: only
    then is the node's instance type worth a connected-set hint."""
    for request in as_list(as_dict(spec.get("devices")).get("requests")):
        body = as_dict(as_dict(request).get("exactly"))
        class_name = str(body.get("deviceClassName", ""))
        if not _is_neuron_class(class_name, classes):
            continue
        class_spec = as_dict(as_dict(classes.get(class_name)).get("spec"))
        try:
            selectors = [
                compile_selector(e)
                for e in _expressions(class_spec.get("selectors"))
                + _expressions(body.get("selectors"))
            ]
        except CelError:
            continue
        for (driver, _, _), dev in node.devices.items():
            view = device_view(driver, dev)
            if all(view.check(sel) is True for sel in selectors):
                return True
    return False


def count_hint(count: int, profile: InstanceProfile | None) -> str | None:
    """``trn1.32xlarge: 7 devices are not a connected set (valid: 1, 4, 8, 16)``, or None.

    ``profile``: the node's, as Prepare sees it (``node_facts``). Its ``valid_set_sizes`` are
    the counts Prepare's connected-set check accepts: any other count gets the seed's
    "does not support requests for device" refusal whichever devices are picked.
    """
    if profile is None or count < 1 or count in profile.valid_set_sizes:
        return None
    valid = ", ".join(str(s) for s in profile.valid_set_sizes)
    return f"{profile.name}: {count} devices are not a connected set (valid: {valid})"


@dataclass
class NodeOutcome:
    node: str
    instance_type: str | None
    result: AllocationResult | None = None
    reasons: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return self.result is not None and not self.reasons


@dataclass
class ClaimReport:
    file: str
    doc: ClaimDoc
    #: Set when the claim cannot be allocated anywhere as written.
    error: str | None = None
    nodes: list[NodeOutcome] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.error is None and any(n.fits for n in self.nodes)

    @property
    def chosen(self) -> NodeOutcome | None:
        """The node the (simulated) scheduler would pick: the first that fits."""
        return next((n for n in self.nodes if n.fits), None)


def check(doc: ClaimDoc, cluster: Cluster, file: str = "") -> ClaimReport:
    report = ClaimReport(file, doc)
    invalid = api_errors(doc)
    if invalid:
        note = "" if doc.api_version.endswith("/v1") else f" (checked as {RESOURCE_GROUP}/v1)"
        report.error = f"the API server would reject it{note}: " + "; ".join(invalid)
        return report
    nodes = split_by_node(cluster.slices)
    if not nodes:
        outcome = allocate(
            doc.spec, classes=cluster.classes, slices=cluster.slices, allocated=cluster.allocated
        )
        failed = isinstance(outcome, AllocationFailure)
        report.error = str(outcome) if failed else "no node has devices"
        return report
    count = requested_count(doc.spec, cluster.classes)
    for node in nodes:
        outcome = allocate(
            doc.spec,
            classes=cluster.classes,
            slices=node.slices,
            allocated=cluster.allocated,
            node_name=node.name,
        )
        if isinstance(outcome, AllocationFailure) and outcome.error:
            report.error = outcome.message
            report.nodes = []
            report.hints = []
            return report
        n = NodeOutcome(node.name, node.instance_type)
        if isinstance(outcome, AllocationFailure):
            n.reasons = outcome.nodes[0].reasons if outcome.nodes else (outcome.message,)
        else:
            n.result = outcome
            problems = prepare_problems(outcome, node, doc.labels)
            if problems:
                devices = names_list([d.device for d in outcome.devices])
                n.reasons = (
                    f"the scheduler would allocate {devices}, but the kubelet plugin would "
                    "refuse to prepare them: " + "; ".join(problems),
                )
        if not n.fits and selects_any(node, doc.spec, cluster.classes):
            facts = node_facts(node)
            hint = count_hint(count, facts.profile if facts is not None else None)
            if hint and hint not in report.hints:
                report.hints.append(hint)
        report.nodes.append(n)
    return report
