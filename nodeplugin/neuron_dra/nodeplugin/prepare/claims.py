"""From an allocated ResourceClaim to what this node must prepare (pure).

The scheduler has already picked devices; what it cannot know is checked here, before anything
is written for the container:

* the opaque configs addressed to us decode strictly and fit this node (LNC only where the
  instance type has it, UltraServerConfig only on UltraServer nodes with that size);
* the devices form a connected set the Neuron runtime can use (a contiguous core range);
* no device is reserved for a different UltraServer workload.

What is checked about the node comes in as ``NodeFacts``: the plugin takes them from discovery
(``node.PrepareNode.facts``), ``neuron-dra check-claim`` from the node's published ResourceSlice
(``published_facts``). Both then run the same ``plan_claim_on``, so what check-claim predicts
is what Prepare says.

Every rejection is a ClaimError whose message names the claim and says what to change: the
kubelet shows it in the pod's events while the pod sits in ContainerCreating.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from neuron_dra.common.constants import (
    ATTR_INSTANCE_TYPE,
    ATTR_ULTRASERVER_MODES,
    ATTR_WORKLOAD_ID,
    DRIVER_NAME,
    LABEL_WORKLOAD_ID,
    NODE_DEVICE_NAME,
    device_index,
    device_name,
    parse_ultraserver_modes,
)
from neuron_dra.common.profiles import (
    PROFILES,
    InstanceProfile,
    UnknownInstanceType,
    connected_set_error,
    is_connected_set,
)
from neuron_dra.nodeplugin.prepare import extendedresource
from neuron_dra.nodeplugin.prepare.shares import ShareError, ShareRequest, read_shares

if TYPE_CHECKING:
    from neuron_dra.common.models.configs import NeuronConfig, OpaqueConfig, UltraServerConfig
    from neuron_dra.nodeplugin.prepare.node import PrepareNode

SOURCE_CLASS: Final = "FromClass"
SOURCE_CLAIM: Final = "FromClaim"


def load_config_models() -> None:
    """Import the opaque-config models now (pydantic; the plugin calls it before serving).

    They are imported where claims are decoded rather than with this module: pydantic and the
    models cost ~0.3 s of start-up, and nothing before the first ResourceSlice publish needs
    them (this module is imported for its types by the slice side too).
    """
    import neuron_dra.common.models.configs  # noqa: F401


class ClaimError(Exception):
    """A claim this node cannot prepare.

    ``permanent``: retrying the same claim cannot succeed; the user must change the claim (or
    its template/class). Otherwise the condition may clear by itself (e.g. the UltraServer
    election is still running) and the kubelet's retry may succeed.
    """

    def __init__(self, message: str, *, permanent: bool = True) -> None:
        super().__init__(message)
        self.message = message
        self.permanent = permanent


@dataclass(frozen=True)
class ClaimPlan:
    """What to prepare for one claim on this node."""

    claim_uid: str
    namespace: str
    name: str
    #: (request names, device name) per allocated device of our driver, sorted by device. The
    #: request names are as allocated (``req`` or ``req/sub``): the kubelet matches them
    #: against containers' ``resources.claims[].request``.
    devices: tuple[tuple[tuple[str, ...], str], ...]
    #: Every Neuron device index the container gets (all of them for ``neuronnode``), sorted.
    device_indices: tuple[int, ...]
    #: logicalNeuronCore from a NeuronConfig; None = the node's default.
    lnc: int | None
    #: ultraserverMode (a node count) from an UltraServerConfig; None when not configured.
    ultraserver_mode_nodes: int | None
    #: The UltraServer workload the devices are reserved for (and the claim belongs to).
    workload_id: str | None
    #: Allocated with ``adminAccess`` (a monitoring pod's claim): the devices stay in use by
    #: the claims that hold them; this claim gets their device nodes and no runtime env.
    admin_access: bool = False
    #: (device name, shareID) of the results that have one: the kubelet's answer names them.
    share_ids: tuple[tuple[str, str], ...] = ()
    #: The cores it holds of one device it shares with other claims (core sharing).
    share: ShareRequest | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def held_indices(self) -> tuple[int, ...]:
        """The device indices the claim holds exclusively: none for admin access."""
        return () if self.admin_access else self.device_indices

    @property
    def device_names(self) -> tuple[str, ...]:
        return tuple(name for _, name in self.devices)

    @property
    def uses_node_device(self) -> bool:
        return NODE_DEVICE_NAME in self.device_names


@dataclass(frozen=True)
class NodeFacts:
    """What ``plan_claim_on`` checks a claim against, besides the node's published devices."""

    profile: InstanceProfile
    #: Indices of the node's Neuron devices (all of them are what ``neuronnode`` stands for).
    device_indices: frozenset[int]
    #: UltraServer sizes (in nodes) the node can take part in; () if none.
    ultraserver_node_counts: tuple[int, ...]
    #: Sizes above 1 for which the node has its UltraServer server and node ids (the election
    #: is done); None when not known, as from a ResourceSlice, which does not carry the 2-node
    #: ids: the (retryable) readiness check is then skipped.
    ultraserver_elected: frozenset[int] | None


def published_facts(published: Mapping[str, Mapping[str, Any]]) -> NodeFacts:
    """The node as its ResourceSlice describes it (``published``: device name -> attributes,
    as the plugin publishes them): what ``check-claim`` has instead of an inventory.

    Raises UnknownInstanceType (a LookupError) when no device names an instance type this
    version has a profile for: the plugin describes such a type from sysfs links and chip
    names that the slice does not carry, so its checks cannot be reproduced from here.
    """
    types = {
        t
        for attrs in published.values()
        if isinstance(t := _dict(_dict(attrs).get(ATTR_INSTANCE_TYPE)).get("string"), str)
    }
    if len(types) != 1:
        found = ", ".join(sorted(types)) or "none"
        raise UnknownInstanceType(f"not one instance type published by the devices ({found})")
    (instance_type,) = types
    profile = PROFILES.get(instance_type)
    if profile is None:
        raise UnknownInstanceType(f"no profile for instance type {instance_type!r}")
    # ``ultraserverModes`` is what the plugin publishes for ``ultraserver_node_counts`` (node
    # counts joined by "_"), on every device of an UltraServer-capable node.
    modes = next(
        (
            str(m)
            for attrs in published.values()
            if (m := _dict(_dict(attrs).get(ATTR_ULTRASERVER_MODES)).get("string"))
        ),
        "",
    )
    return NodeFacts(
        profile=profile,
        device_indices=frozenset(i for name in published if (i := device_index(name)) is not None),
        ultraserver_node_counts=parse_ultraserver_modes(modes),
        ultraserver_elected=None,
    )


@dataclass(frozen=True)
class _Config:
    index: int
    source: str
    requests: frozenset[str]
    config: OpaqueConfig

    def applies_to(self, request: str) -> bool:
        # A config naming "req" covers every subrequest "req/sub"; one naming "req/sub" only
        # that subrequest. No requests = the whole claim.
        return not self.requests or request in self.requests or _base(request) in self.requests

    @property
    def precedence(self) -> tuple[int, int, int]:
        # Claim beats class (the claim author chose it for this claim); within a source a
        # config naming requests beats one for the whole claim; among equals the later wins.
        # Source must come first: the allocator lists a class config with the names of the
        # requests that used the class, so "names requests" alone would let class defaults
        # override what the claim says.
        return (int(self.source != SOURCE_CLASS), int(bool(self.requests)), self.index)


def _base(request: str) -> str:
    return request.split("/", 1)[0]


def _dict(value: Any) -> Mapping[str, Any]:
    # Any mapping: the publisher hands out read-only views (MappingProxyType) of what it
    # published, and a dict-only check would make every device look untagged.
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _decode_configs(raw: Sequence[Any], *, driver_name: str, claim: str) -> list[_Config]:
    """Decode every config addressed to us, even ones applying to no allocated request: a
    mistake in them is still the user's to fix, better reported now than on the next pod."""
    from neuron_dra.common.models.configs import ConfigError, decode_opaque_config

    out: list[_Config] = []
    for i, entry in enumerate(raw):
        entry = _dict(entry)
        opaque = _dict(entry.get("opaque"))
        if opaque.get("driver") != driver_name:
            continue
        source = str(entry.get("source", SOURCE_CLAIM))
        where = "class" if source == SOURCE_CLASS else "claim"
        try:
            config = decode_opaque_config(opaque.get("parameters"))
        except ConfigError as exc:
            raise ClaimError(
                f"claim {claim}: invalid {where} config #{i} for driver {driver_name}: {exc}"
            ) from None
        requests = frozenset(str(r) for r in _list(entry.get("requests")))
        out.append(_Config(i, source, requests, config))
    return out


def _winner(
    configs: Sequence[_Config], request: str, kind: type[NeuronConfig] | type[UltraServerConfig]
) -> _Config | None:
    matching = [c for c in configs if isinstance(c.config, kind) and c.applies_to(request)]
    return max(matching, key=lambda c: c.precedence, default=None)


def _single_value(
    chosen: Mapping[str, tuple[int, _Config]], *, what: str, claim: str
) -> int | None:
    """One value for the claim: the container has one environment, so per-request values
    must agree (requests without a config follow the configured ones)."""
    values = {v for v, _ in chosen.values()}
    if len(values) > 1:
        detail = ", ".join(f"{v} for request {r}" for r, (v, _) in sorted(chosen.items()))
        raise ClaimError(
            f"claim {claim}: conflicting {what} values ({detail}); all devices of a claim "
            f"share one container environment, so use one {what} value"
        )
    return next(iter(values), None)


def plan_claim(
    claim: Mapping[str, Any],
    *,
    node: PrepareNode,
    published: Mapping[str, Mapping[str, Any]],
    node_name: str | None = None,
    driver_name: str = DRIVER_NAME,
) -> ClaimPlan:
    """Validate an allocated ResourceClaim (v1 dict) against this node and plan its devices.

    ``published``: this node's devices as in its ResourceSlice (device name -> attributes).
    ``node_name`` defaults to ``node``'s; it is the pool our results must come from.
    ``status.allocation.devices.config`` already holds class and claim configs in order.
    """
    return plan_claim_on(
        claim,
        node_name=node_name or node.name,
        facts=node.facts,
        published=published,
        driver_name=driver_name,
    )


def plan_claim_on(
    claim: Mapping[str, Any],
    *,
    node_name: str,
    facts: Callable[[], NodeFacts],
    published: Mapping[str, Mapping[str, Any]],
    driver_name: str = DRIVER_NAME,
) -> ClaimPlan:
    """``plan_claim`` against facts from any source (see ``NodeFacts``).

    ``facts`` is called only once the claim has results of ours from this node, so a node
    that cannot be described fails claims the same way whatever the source; a LookupError
    from it is a retryable ClaimError.
    """
    node = node_name
    meta = _dict(claim.get("metadata"))
    uid, namespace, name = (str(meta.get(k) or "") for k in ("uid", "namespace", "name"))
    key = f"{namespace}/{name}"
    if not uid:
        raise ClaimError(f"claim {key}: metadata.uid missing")
    allocation = _dict(_dict(_dict(claim.get("status")).get("allocation")).get("devices"))
    if not allocation:
        # The kubelet only prepares allocated claims, so our copy is older than its: retry.
        raise ClaimError(f"claim {key}: not allocated yet", permanent=False)

    by_device: dict[str, list[str]] = {}
    admin = set()
    results = [_dict(r) for r in _list(allocation.get("results"))]
    ours = [r for r in results if r.get("driver") == driver_name]  # not another driver's
    for result in ours:
        admin.add(bool(result.get("adminAccess")))
        pool, device, request = (str(result.get(k) or "") for k in ("pool", "device", "request"))
        if pool != node:
            raise ClaimError(
                f"claim {key}: device {device} was allocated from pool {pool}, but this is "
                f"node {node}; the claim cannot be prepared here"
            )
        by_device.setdefault(device, [])
        if request not in by_device[device]:
            by_device[device].append(request)
    if not by_device:
        raise ClaimError(f"claim {key}: no devices of driver {driver_name} allocated")
    if admin == {True, False}:
        raise ClaimError(
            f"claim {key}: some of its Neuron devices are allocated with adminAccess and "
            "some without; a claim either watches devices (adminAccess, e.g. for "
            "neuron-monitor) or uses them: put the two kinds of request in separate claims"
        )

    try:
        node_facts = facts()
    except LookupError as exc:
        raise ClaimError(f"claim {key}: {exc}", permanent=False) from None
    profile = node_facts.profile

    indices = _device_indices(key, node, by_device, node_facts.device_indices, published)
    admin_access = admin == {True}
    if admin_access:
        # Watching devices, not using them: any set, whoever holds them (a workload's
        # reserved devices too), no runtime configuration (KEP-5018 admin access).
        lnc = mode = workload_id = None
    else:
        try:
            _check_connected(key, profile, by_device, indices)
        except ClaimError as exc:
            raise _for_extended_resource(exc, meta) from None
        lnc, mode = _runtime_settings(
            key, _list(allocation.get("config")), by_device, node_facts, node, driver_name
        )
        workload_id = _check_workload(key, meta, by_device, indices, published)
    try:
        share_ids, share = read_shares(
            ours, published, profile=profile, lnc=lnc, admin=admin_access
        )
    except ShareError as exc:
        raise ClaimError(f"claim {key}: {exc}") from None
    return ClaimPlan(
        claim_uid=uid,
        namespace=namespace,
        name=name,
        devices=_planned_devices(by_device),
        device_indices=indices,
        lnc=lnc,
        ultraserver_mode_nodes=mode,
        workload_id=workload_id,
        admin_access=admin_access,
        share_ids=share_ids,
        share=share,
    )


def _runtime_settings(
    key: str,
    config: list[Any],
    by_device: Mapping[str, Sequence[str]],
    node_facts: NodeFacts,
    node: str,
    driver_name: str,
) -> tuple[int | None, int | None]:
    """The claim's logicalNeuronCore and ultraserverMode from its opaque configs, checked
    against the node (None: not configured)."""
    from neuron_dra.common.models.configs import NeuronConfig, UltraServerConfig

    profile = node_facts.profile
    configs = _decode_configs(config, driver_name=driver_name, claim=key)
    requests = sorted({r for rs in by_device.values() for r in rs})
    lnc_by_request: dict[str, tuple[int, _Config]] = {}
    mode_by_request: dict[str, tuple[int, _Config]] = {}
    for request in requests:
        nc = _winner(configs, request, NeuronConfig)
        if nc is not None:
            assert isinstance(nc.config, NeuronConfig)
            lnc_by_request[request] = (nc.config.logical_neuron_core, nc)
        us = _winner(configs, request, UltraServerConfig)
        if us is not None:
            assert isinstance(us.config, UltraServerConfig)
            mode_by_request[request] = (us.config.ultraserver_mode, us)
    lnc = _single_value(lnc_by_request, what="logicalNeuronCore", claim=key)
    mode = _single_value(mode_by_request, what="ultraserverMode", claim=key)
    if lnc is not None and lnc not in profile.allowed_lnc:
        allowed = ", ".join(str(v) for v in sorted(profile.allowed_lnc))
        raise ClaimError(
            f"claim {key}: logicalNeuronCore {lnc} is not supported on {profile.name} "
            f"(supported: {allowed}); remove the NeuronConfig or request a Trn2/Trn3 instance"
        )
    if mode is not None:
        _check_ultraserver(key, node, mode, node_facts)
    return lnc, mode


def _planned_devices(
    by_device: Mapping[str, Sequence[str]],
) -> tuple[tuple[tuple[str, ...], str], ...]:
    return tuple((tuple(by_device[d]), d) for d in sorted(by_device, key=_device_sort_key))


def _device_sort_key(name: str) -> tuple[int, int, str]:
    index = device_index(name)
    return (0, index, name) if index is not None else (1, 0, name)


def _device_indices(
    key: str,
    node: str,
    by_device: Mapping[str, Sequence[str]],
    present: frozenset[int],
    published: Mapping[str, Mapping[str, Any]],
) -> tuple[int, ...]:
    indices: set[int] = set()
    for device in by_device:
        if device not in published:
            raise ClaimError(
                f"claim {key}: device {device} is not published by node {node}; "
                "delete the claim so that it is allocated again"
            )
        if device == NODE_DEVICE_NAME:
            indices |= present
            continue
        index = device_index(device)
        if index is None or index not in present:
            raise ClaimError(
                f"claim {key}: device {device} is not present on node {node}; "
                "delete the claim so that it is allocated again"
            )
        indices.add(index)
    if NODE_DEVICE_NAME in by_device and len(by_device) > 1:
        others = ", ".join(sorted(d for d in by_device if d != NODE_DEVICE_NAME))
        raise ClaimError(
            f"claim {key}: {NODE_DEVICE_NAME} (the whole node) and {others} overlap; "
            f"request either {NODE_DEVICE_NAME} or individual devices"
        )
    return tuple(sorted(indices))


def _for_extended_resource(exc: ClaimError, meta: Mapping[str, Any]) -> ClaimError:
    """``exc`` with what a pod asking ``aws.amazon.com/neuron: N`` can do, for the claim the
    scheduler made for it (:mod:`.extendedresource`)."""
    if not extendedresource.made_for_extended_resource(meta):
        return exc
    advice = extendedresource.EXTENDED_RESOURCE_ADVICE
    return ClaimError(f"{exc.message} {advice}", permanent=exc.permanent)


def _check_connected(
    key: str,
    profile: InstanceProfile,
    by_device: Mapping[str, Sequence[str]],
    indices: tuple[int, ...],
) -> None:
    if NODE_DEVICE_NAME in by_device:
        # The whole node: always a valid set; a missing device shows up as a gap below.
        pass
    else:
        try:
            connected = is_connected_set(profile, indices)
        except ValueError as exc:
            raise ClaimError(f"claim {key}: {exc}") from None
        if not connected and len(indices) not in profile.valid_set_sizes:
            # The scheduler extension's words, which users already know and search for.
            raise ClaimError(connected_set_error(profile, len(indices)))
        if not connected:
            # A supported count in the wrong shape (e.g. four devices that are not a row):
            # "does not support requests for 4" would be false, so say what is wrong.
            shown = ", ".join(str(i) for i in indices)
            raise ClaimError(
                f"Instance type {profile.name} does not support the device set {shown}: it "
                f"is not one connected group. Constrain the request with matchAttribute: "
                f"resource.aws.com/devicegroup{len(indices)}_id."
            )
    # The runtime takes NEURON_RT_VISIBLE_CORES only as one increasing contiguous range. A
    # connected set that wraps around a ring (inf2 devices 11 and 0) or an arbitrary subset on
    # an all-to-all type would need two ranges, which the runtime refuses at start-up: reject
    # now with advice instead.
    if indices and indices[-1] - indices[0] + 1 != len(indices):
        shown = ", ".join(str(i) for i in indices)
        raise ClaimError(
            f"claim {key}: devices {shown} on {profile.name} are not consecutive, so the Neuron "
            "runtime cannot be given one contiguous NEURON_RT_VISIBLE_CORES range; add a "
            "matchAttribute constraint on resource.aws.com/devicegroup<N>_id to the request"
        )


def _check_ultraserver(key: str, node: str, mode: int, facts: NodeFacts) -> None:
    profile, counts = facts.profile, facts.ultraserver_node_counts
    if not counts:
        raise ClaimError(
            f"claim {key}: UltraServerConfig needs an UltraServer node, but node {node} "
            f"({profile.name}) is not part of an UltraServer; remove the UltraServerConfig or "
            "select neuron_node devices of an UltraServer instance type"
        )
    if mode not in counts:
        supported = ", ".join(str(c) for c in counts)
        raise ClaimError(
            f"claim {key}: ultraserverMode {mode} is not supported by node {node} "
            f"(supported node counts: {supported})"
        )
    elected = facts.ultraserver_elected
    if mode > 1 and elected is not None and mode not in elected:
        # The driver's election is running or has not been done: it usually completes.
        raise ClaimError(
            f"claim {key}: node {node} has no {mode}-node UltraServer id yet (election "
            "not complete)",
            permanent=False,
        )


def _check_workload(
    key: str,
    meta: Mapping[str, Any],
    by_device: Mapping[str, Sequence[str]],
    indices: Sequence[int],
    published: Mapping[str, Mapping[str, Any]],
) -> str | None:
    """The workload the claim's devices are reserved for, after checking it is the claim's.

    ``neuronnode`` overlaps every device, so their reservations count too.
    """
    claim_workload = _dict(meta.get("labels")).get(LABEL_WORKLOAD_ID)
    checked = set(by_device)
    if NODE_DEVICE_NAME in by_device:
        checked |= {device_name(i) for i in indices}
    reserved: str | None = None
    for device in sorted(checked, key=_device_sort_key):
        tag = _dict(_dict(published.get(device)).get(ATTR_WORKLOAD_ID)).get("string")
        if tag is None:
            continue
        if tag != claim_workload:
            belongs = f"workload {claim_workload}" if claim_workload else "no workload"
            raise ClaimError(
                f"claim {key}: device {device} is reserved for workload {tag}, but the claim "
                f"belongs to {belongs} (label {LABEL_WORKLOAD_ID}); only that workload's "
                "claims may use it"
            )
        reserved = tag
    if claim_workload and reserved is None:
        # The scheduler saw the tag, this node's slice no longer (or not yet) carries it: the
        # workload is being moved (RestartAll) or released. Preparing now would start a
        # container without its rank; the kubelet retries, and the controller moves the claim
        # if the node does not come back to the workload.
        raise ClaimError(
            f"claim {key}: it belongs to workload {claim_workload} (label {LABEL_WORKLOAD_ID}), "
            "but its devices are not reserved for that workload on this node at the moment",
            permanent=False,
        )
    return reserved
