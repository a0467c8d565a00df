"""The prepare check: would the kubelet plugin's own Prepare decision accept an
allocation on a node, judged from the node's ResourceSlice."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from neuron_dra.common.constants import DRIVER_NAME
from neuron_dra.sim.allocation import AllocationResult
from neuron_dra.sim.commands.check_claim.inputs import as_dict
from neuron_dra.sim.commands.check_claim.nodes import NodeDevices

if TYPE_CHECKING:
    from neuron_dra.nodeplugin.prepare.claims import NodeFacts


def published_devices(node: NodeDevices) -> dict[str, dict[str, Any]]:
    """Our devices on ``node`` as the kubelet plugin published them (device name ->
    attributes): what its Prepare checks a claim against. Attribute names qualified with the
    driver's domain (hand-written slices) are read as the plugin's unqualified ones."""
    prefix = f"{DRIVER_NAME}/"
    out: dict[str, dict[str, Any]] = {}
    for (driver, _, name), dev in node.devices.items():
        if driver != DRIVER_NAME:
            continue
        attrs = as_dict(dev.get("attributes"))
        unqualified = {k: v for k, v in attrs.items() if not k.startswith(prefix)}
        for k, v in attrs.items():
            if k.startswith(prefix):
                unqualified.setdefault(k.removeprefix(prefix), v)
        out[name] = unqualified
    return out


def node_facts(node: NodeDevices) -> NodeFacts | None:
    """What Prepare would know about ``node``, from its slices; None for an instance type
    this version has no profile for (the plugin describes those from sysfs, which a slice
    does not show, so nothing reliable can be predicted there)."""
    # The kubelet plugin's module, imported here: only this command needs it from ``common``
    # (the wheel ships every package).
    from neuron_dra.nodeplugin.prepare.claims import published_facts

    try:
        return published_facts(published_devices(node))
    except LookupError:
        return None


#: Name of the claim handed to Prepare's checks; its messages start with ``claim <key>: ``,
#: which the report drops (it already names the template or claim).
_CLAIM_NAMESPACE: Final = "check-claim"
_CLAIM_NAME: Final = "claim"


def prepare_problems(
    result: AllocationResult, node: NodeDevices, labels: Mapping[str, str] | None = None
) -> list[str]:
    """Why the kubelet plugin would refuse to prepare this allocation (empty: it would not).

    This is the plugin's own decision (``plan_claim_on``, what its Prepare calls) fed with
    the node's ResourceSlice instead of its discovered inventory, so the message is Prepare's
    (minus the claim name). The one check it skips is whether a node's UltraServer election
    is done (retryable, and the 2-node ids are not in the slice). ``labels``: the claim's.
    """
    from neuron_dra.nodeplugin.prepare.claims import ClaimError, plan_claim_on

    if not any(d.driver == DRIVER_NAME for d in result.devices):
        return []  # the kubelet does not ask our plugin to prepare other drivers' devices
    facts = node_facts(node)
    if facts is None:
        return []
    claim = {
        "metadata": {
            "uid": _CLAIM_NAMESPACE,  # any non-empty uid: Prepare only requires one
            "namespace": _CLAIM_NAMESPACE,
            "name": _CLAIM_NAME,
            "labels": dict(labels or {}),
        },
        "status": {"allocation": result.allocation},
    }
    try:
        plan_claim_on(
            claim, node_name=node.name, facts=lambda: facts, published=published_devices(node)
        )
    except ClaimError as exc:
        return [exc.message.removeprefix(f"claim {_CLAIM_NAMESPACE}/{_CLAIM_NAME}: ")]
    return []
