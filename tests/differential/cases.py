"""Random allocation cases for the allocator differential test, and the two answers we compute.

A :class:`Case` is an inventory (1-3 emulated nodes whose ResourceSlices come from the kubelet
plugin's own discovery and slice builder), the devices already in use there (held by
allocated ResourceClaims) and one ResourceClaim spec. Everything is drawn from a
``random.Random`` seeded per case (:func:`generate`), so case ``n`` of a seed is the same on
every run and on every world.

:func:`our_verdict` is the simulated scheduler's answer (``testing.allocation.allocate``),
:func:`check_claim_verdict` the one of ``neuron-dra check-claim`` (its ``check`` function);
both are compared with the real kube-scheduler's by the test. A verdict is one of
:data:`FITS`, :data:`UNSCHEDULABLE` (no node has the devices: the pod stays Pending with
``PodScheduled=False/Unschedulable``) and :data:`ERROR` (the claim cannot be allocated as
written, e.g. a selector that fails on a device the allocator looked at: kube-scheduler
aborts the attempt, ``PodScheduled=False/SchedulerError``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import random
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from neuron_dra.common.constants import (
    ATTR_NUMA_NODE,
    ATTR_PCIE_ROOT,
    DEVICE_CLASS_NEURON,
    DRIVER_NAME,
    LABEL_NETWORK_NODE_LAYER1,
    device_group_attribute,
)
from neuron_dra.common.deviceclasses import default_classes_by_name
from neuron_dra.sim import scratch
from neuron_dra.sim.allocation import (
    AllocationFailure,
    DeviceKey,
    allocate,
    compile_selector,
    device_view,
)
from neuron_dra.sim.commands.check_claim.allocation import ClaimReport, check
from neuron_dra.sim.commands.check_claim.inputs import claim_docs
from neuron_dra.sim.commands.check_claim.sources import Cluster

FITS: Final = "fits"
UNSCHEDULABLE: Final = "unschedulable"
ERROR: Final = "error"
#: The API server refuses the claim (never generated on purpose; a generator bug if seen).
INVALID: Final = "invalid"

INSTANCE_TYPES: Final = ("trn1.32xlarge", "trn2.48xlarge", "trn2u.48xlarge", "inf2.48xlarge")
#: Types whose emulated tree can pair every Neuron device with an EFA device (AWS group ids).
EFA_TYPES: Final = frozenset({"trn2.48xlarge", "trn2u.48xlarge"})
DRIVER_VERSIONS: Final = ("2.24.7.0", "2.22.2.0")
ULTRASERVER_IDS: Final = ("5eed0000a0000001", "5eed0000a0000002")
#: Label put on every node of a case and selected by its pod.
CASE_LABEL: Final = "neuron-dra.test/differential-case"

_A: Final = f'device.attributes["{DRIVER_NAME}"]'
_CAP: Final = f'device.capacity["{DRIVER_NAME}"]'


# --- the inventory ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeSpec:
    name: str
    instance_type: str
    driver_version: str = DRIVER_VERSIONS[0]
    efa: bool = False
    ultraserver_id: str | None = None
    ultraserver_node_id: int | None = None
    network_layer1: str | None = None

    def describe(self) -> str:
        extra = [f"driver {self.driver_version}"]
        if self.efa:
            extra.append("EFA")
        if self.ultraserver_id:
            extra.append(f"US {self.ultraserver_id[-4:]}/{self.ultraserver_node_id}")
        if self.network_layer1:
            extra.append(f"nn1 {self.network_layer1}")
        return f"{self.name} {self.instance_type} ({', '.join(extra)})"


def _scratch_dir() -> Path | None:
    """Emulated trees are ~460 small files a node: on tmpfs they take a tenth of the time."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else None


@functools.cache
def _inventory(
    instance_type: str,
    driver_version: str,
    efa: bool,
    ultraserver_id: str | None,
    ultraserver_node_id: int | None,
) -> Any:
    """The plugin's discovery over an emulated tree (cached: only the node name differs
    between nodes of one shape, and the slice builder takes it from the inventory)."""
    from neuron_dra.nodeplugin.discovery.emulation import scan_emulated, write_emulated_tree

    with scratch.temporary("dft", _scratch_dir()) as tmp:
        paths = write_emulated_tree(
            tmp / "node",
            instance_type,
            node_name="template",
            ultraserver_id=ultraserver_id,
            ultraserver_node_id=ultraserver_node_id,
            driver_version=driver_version,
            efa=efa,
        )
        return scan_emulated(paths, node_name="template")


def node_slices(node: NodeSpec, node_uid: str | None = None) -> list[dict[str, Any]]:
    """The node's ResourceSlices as its kubelet plugin publishes them (pool = node name)."""
    from neuron_dra.nodeplugin.plugin import dra_driver_version
    from neuron_dra.nodeplugin.publish.slices import build_resource_slices

    inventory = dataclasses.replace(
        _inventory(
            node.instance_type,
            node.driver_version,
            node.efa,
            node.ultraserver_id,
            node.ultraserver_node_id,
        ),
        node_name=node.name,
    )
    labels = {LABEL_NETWORK_NODE_LAYER1: node.network_layer1} if node.network_layer1 else {}
    return build_resource_slices(
        inventory,
        node_name=node.name,
        node_uid=node_uid or str(uuid.uuid5(uuid.NAMESPACE_DNS, node.name)),
        node_labels=labels,
        dra_driver_version=dra_driver_version(),
        generation=0,
    )


# --- a case ----------------------------------------------------------------------------------


@dataclass
class Case:
    """One differential case; ``taken`` are (node, device name) pairs already allocated."""

    name: str  # "dft-<n>": prefix of its node names, and its namespace
    nodes: tuple[NodeSpec, ...]
    taken: tuple[tuple[str, str], ...]
    claim: dict[str, Any]  # ResourceClaim.spec, v1
    _slices: list[dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def slices(self) -> list[dict[str, Any]]:
        if self._slices is None:
            self._slices = [s for n in self.nodes for s in node_slices(n)]
        return self._slices

    @property
    def allocated(self) -> set[DeviceKey]:
        return {(DRIVER_NAME, node, dev) for node, dev in self.taken}

    def taken_by_node(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for node, dev in self.taken:
            out.setdefault(node, []).append(dev)
        return out

    def describe(self) -> str:
        lines = [f"case {self.name}:"]
        taken = self.taken_by_node()
        for n in self.nodes:
            held = taken.get(n.name, [])
            shown = ", ".join(d.removeprefix("neurondevice") for d in held) or "-"
            lines.append(f"  node {n.describe()}; taken: {shown}")
        lines.append("  claim: " + json.dumps(self.claim, sort_keys=True))
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """What a pinned regression case stores (see ``PINNED`` in the test)."""
        return {
            "name": self.name,
            "nodes": [dataclasses.asdict(n) for n in self.nodes],
            "taken": [list(t) for t in self.taken],
            "claim": self.claim,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Case:
        return cls(
            name=str(data["name"]),
            nodes=tuple(NodeSpec(**n) for n in data["nodes"]),
            taken=tuple((str(a), str(b)) for a, b in data["taken"]),
            claim=copy.deepcopy(dict(data["claim"])),
        )


# --- generation ------------------------------------------------------------------------------


def _device_names(node: NodeSpec) -> list[str]:
    from neuron_dra.common.profiles import PROFILES

    names = [f"neurondevice{i}" for i in range(PROFILES[node.instance_type].device_count)]
    if PROFILES[node.instance_type].ultraserver_capable:
        names.append("neuronnode")
    return names


def _gen_nodes(rng: random.Random, prefix: str) -> tuple[NodeSpec, ...]:
    nodes = []
    us_id = rng.choice(ULTRASERVER_IDS)
    us_node = rng.randrange(4)
    for i in range(rng.choice((1, 1, 2, 2, 3))):
        t = rng.choice(INSTANCE_TYPES)
        us = t == "trn2u.48xlarge"
        nodes.append(
            NodeSpec(
                name=f"{prefix}-{i}",
                instance_type=t,
                driver_version=rng.choices(DRIVER_VERSIONS, weights=(3, 1))[0],
                efa=t in EFA_TYPES and rng.random() < 0.3,
                ultraserver_id=us_id if us else None,
                ultraserver_node_id=(us_node + i) % 4 if us else None,
                network_layer1=rng.choice(("nn-a", "nn-b")) if rng.random() < 0.15 else None,
            )
        )
    return tuple(nodes)


def _gen_taken(rng: random.Random, nodes: Sequence[NodeSpec]) -> tuple[tuple[str, str], ...]:
    taken: list[tuple[str, str]] = []
    for node in nodes:
        names = _device_names(node)
        devices = [n for n in names if n != "neuronnode"]
        roll = rng.random()
        if roll < 0.35:
            chosen: list[str] = []
        elif roll < 0.75:
            chosen = rng.sample(devices, rng.randint(1, len(devices) - 1))
        elif roll < 0.95:
            size = rng.choice((2, 4, 4, 8))
            start = rng.randrange(0, len(devices), size) if size < len(devices) else 0
            chosen = devices[start : start + size]
            if rng.random() < 0.5:  # plus a stray one elsewhere: fragmentation
                chosen = sorted({*chosen, rng.choice(devices)}, key=names.index)
        else:
            chosen = list(devices)
        if "neuronnode" in names and rng.random() < 0.15:
            chosen.append("neuronnode")
        taken += [(node.name, d) for d in sorted(chosen, key=names.index)]
    return tuple(taken)


def _selector(rng: random.Random, nodes: Sequence[NodeSpec]) -> str:
    types = [n.instance_type for n in nodes]
    kind = rng.choices(
        (
            "type", "driver", "range", "range-unguarded", "resource-type", "memory",
            "semver", "none", "us-node", "healthy", "cores-unguarded", "nn-unguarded",
        ),
        weights=(6, 3, 5, 1, 2, 2, 1, 2, 1, 1, 1, 1),
    )[0]  # fmt: skip
    if kind == "type":
        t = rng.choice(types) if rng.random() < 0.8 else rng.choice(INSTANCE_TYPES)
        return f'{_A}.instanceType == "{t}"'
    if kind == "driver":
        return f'{_A}.neuronDriverVersion == "{rng.choice(DRIVER_VERSIONS)}"'
    if kind in ("range", "range-unguarded"):
        a = rng.randrange(0, 12)
        b = rng.randrange(a + 1, 17)
        expr = f"{_A}.deviceId >= {a} && {_A}.deviceId < {b}"
        return expr if kind == "range-unguarded" else f'"deviceId" in {_A} && {expr}'
    if kind == "resource-type":
        value = rng.choice(("neuron_device", "neuron_device", "neuron_node"))
        return f'{_A}.resourceType == "{value}"'
    if kind == "memory":
        q = rng.choice(("32Gi", "64Gi", "96Gi", "100Gi"))
        return f'{_CAP}.memory.compareTo(quantity("{q}")) >= 0'
    if kind == "semver":
        op = rng.choice(("isGreaterThan", "isLessThan"))
        return f'{_A}.draDriverVersion.{op}(semver("0.0.1"))'
    if kind == "none":
        return rng.choice(
            (
                f'{_A}.instanceType == "trn3.48xlarge"',
                f'"deviceId" in {_A} && {_A}.deviceId > 100',
            )
        )
    if kind == "us-node":
        return f'"ultraserverNodeId" in {_A} && {_A}.ultraserverNodeId == {rng.randrange(4)}'
    if kind == "healthy":
        return f"{_A}.healthy"
    if kind == "cores-unguarded":
        return f"{_A}.coreCount >= {rng.choice((2, 8))}"
    return f'{_A}.networkNodeLayer1 == "{rng.choice(("nn-a", "nn-b"))}"'


def _exactly(rng: random.Random, nodes: Sequence[NodeSpec], *, all_ok: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": DEVICE_CLASS_NEURON}
    if all_ok and rng.random() < 0.1:
        body["allocationMode"] = "All"
    else:
        body["allocationMode"] = "ExactCount"
        body["count"] = rng.choice((1, 1, 2, 2, 3, 4, 4, 4, 5, 6, 7, 8, 8, 8, 12, 16, 17))
    n_sel = rng.choices((0, 1, 2), weights=(4, 4, 1))[0]
    if body["allocationMode"] == "All" and n_sel == 0 and rng.random() < 0.7:
        n_sel = 1  # All over a whole node is rarely what anyone asks for
    if n_sel:
        body["selectors"] = [{"cel": {"expression": _selector(rng, nodes)}} for _ in range(n_sel)]
    return body


_CONSTRAINT_ATTRIBUTES: Final = (
    device_group_attribute(4),
    device_group_attribute(4),
    device_group_attribute(8),
    device_group_attribute(8),
    device_group_attribute(16),
    device_group_attribute(2),
    device_group_attribute(3),
    device_group_attribute(6),
    device_group_attribute(1),
    f"{DRIVER_NAME}/instanceType",
    f"{DRIVER_NAME}/topology4_id",
    f"{DRIVER_NAME}/ultraserverId",
    ATTR_PCIE_ROOT,
    ATTR_NUMA_NODE,
)


def _gen_claim(rng: random.Random, nodes: Sequence[NodeSpec]) -> dict[str, Any]:
    requests: list[dict[str, Any]] = []
    names = ["a", "b"][: rng.choices((1, 2), weights=(4, 1))[0]]
    subrequests: dict[str, list[str]] = {}
    for name in names:
        if rng.random() < 0.2:
            subs = []
            for k in range(rng.choice((2, 2, 3))):
                sub = {"name": f"s{k}", **_exactly(rng, nodes, all_ok=True)}
                subs.append(sub)
            subrequests[name] = [s["name"] for s in subs]
            requests.append({"name": name, "firstAvailable": subs})
        else:
            requests.append({"name": name, "exactly": _exactly(rng, nodes, all_ok=True)})
    devices: dict[str, Any] = {"requests": requests}
    roll = rng.random()
    if roll < 0.55:
        constraint: dict[str, Any]
        if roll < 0.05:
            constraint = {"distinctAttribute": f"{DRIVER_NAME}/topology4_id"}
        else:
            constraint = {"matchAttribute": rng.choice(_CONSTRAINT_ATTRIBUTES)}
        if len(names) > 1 and rng.random() < 0.3:
            constraint["requests"] = [rng.choice(names)]
        elif subrequests and rng.random() < 0.3:
            parent = rng.choice(sorted(subrequests))
            constraint["requests"] = [f"{parent}/{rng.choice(subrequests[parent])}"]
        devices["constraints"] = [constraint]
    return {"devices": devices}


#: kube-scheduler's allocator tries every ordered choice of devices before it gives up on a
#: node (10 s at most, then "timed out trying to allocate devices", and the pod waits for all
#: of its nodes): claims that fit on some node and would cost it more than this many
#: (estimated) steps there are drawn again, so that a run measures answers, not timeouts.
MAX_REAL_SEARCH: Final = 20_000


def expensive_nodes(case: Case) -> list[str]:
    """The nodes where kube-scheduler's search would be long because the claim does not
    fit there (by our allocator) and :func:`real_search_cost` is over the limit."""
    out = []
    for node, cost in real_search_cost(case).items():
        if cost > MAX_REAL_SEARCH:
            got = allocate(
                case.claim,
                classes=classes(),
                slices=case.slices,
                allocated=case.allocated,
                node_name=node,
            )
            if isinstance(got, AllocationFailure):
                out.append(node)
    return out


def real_search_cost(case: Case) -> dict[str, float]:
    """Per node, a rough count of the partial allocations kube-scheduler's backtracking
    explores when nothing fits there: per request, the ordered choices of its count among
    the free matching devices (within one group after the first device, under a
    ``matchAttribute``), multiplied over the requests."""
    from neuron_dra.sim.allocation.model import (
        ClaimError,
        Matcher,
        gather_nodes,
        parse_claim,
    )

    try:
        claim = parse_claim(case.claim, classes())
    except ClaimError:
        return {}
    _, nodes = gather_nodes(case.slices)
    matcher = Matcher()
    costs = {}
    for node in nodes:
        cost = 1.0
        for request in claim.requests:
            options = 0.0
            for alt in request.alternatives:
                matched = matcher.matches(node, alt).devices
                free = [d for d in matched if d.key not in case.allocated]
                if alt.all_mode:
                    options += 1
                    continue
                groups = [c for c in claim.constraints if c.applies(alt) and not c.distinct]
                later = len(free)
                for c in groups:
                    sizes = Counter(d.attribute(c.attribute) for d in free)
                    later = min(later, max(sizes.values(), default=1))
                n, k = len(free), alt.count
                options += _ordered(n, 1) * _ordered(max(later - 1, 0), min(k, later) - 1)
            cost *= max(options, 1.0)
        costs[node.name] = cost
    return costs


def _ordered(n: int, k: int) -> float:
    out = 1.0
    for i in range(max(min(k, n), 0)):
        out *= n - i
    return out


def generate(seed: int, number: int, *, prefix: str = "dft") -> Case:
    """Case ``number`` of ``seed`` (independent of the other cases: one Random each)."""
    rng = random.Random(f"{seed}/{number}")
    name = f"{prefix}-{number}"
    nodes = _gen_nodes(rng, name)
    case = Case(name=name, nodes=nodes, taken=_gen_taken(rng, nodes), claim={})
    for _ in range(20):
        case.claim = _gen_claim(rng, nodes)
        if not expensive_nodes(case):
            break
    return case


def generate_many(seed: int, count: int, *, prefix: str = "dft") -> list[Case]:
    return [generate(seed, n, prefix=prefix) for n in range(count)]


# --- our two answers -------------------------------------------------------------------------


def classes() -> dict[str, dict[str, Any]]:
    return default_classes_by_name()


@dataclass(frozen=True)
class Answer:
    verdict: str
    detail: str = ""
    node: str | None = None
    #: ``status.allocation.devices.results`` when the claim fits.
    results: tuple[Mapping[str, Any], ...] = ()

    def __str__(self) -> str:
        where = f" on {self.node}" if self.node else ""
        devices = ", ".join(str(r.get("device")) for r in self.results)
        shown = f" [{devices}]" if devices else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.verdict}{where}{shown}{detail}"


def our_verdict(case: Case) -> Answer:
    """The simulated scheduler's allocator over all of the case's nodes."""
    got = allocate(case.claim, classes=classes(), slices=case.slices, allocated=case.allocated)
    if isinstance(got, AllocationFailure):
        return Answer(ERROR if got.error else UNSCHEDULABLE, got.message)
    results = tuple(got.allocation["devices"]["results"])
    return Answer(FITS, node=got.node_name, results=results)


def claim_object(case: Case) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "claim", "namespace": case.name},
        "spec": copy.deepcopy(case.claim),
    }


@dataclass(frozen=True)
class CheckClaimAnswer:
    """check-claim's scheduler-level verdict, plus whether its whole verdict (which adds the
    kubelet plugin's Prepare checks, e.g. 7 devices on a trn1 are not a connected set) says
    the claim fits."""

    answer: Answer
    fits_with_prepare: bool
    report: ClaimReport


def check_claim_verdict(case: Case) -> CheckClaimAnswer:
    (doc,) = claim_docs([claim_object(case)], case.name)
    cluster = Cluster(copy.deepcopy(case.slices), classes(), case.allocated, source=case.name)
    report = check(doc, cluster)
    if report.error is not None:
        verdict = INVALID if report.error.startswith("the API server would reject") else ERROR
        answer = Answer(verdict, report.error)
    else:
        allocated = [n for n in report.nodes if n.result is not None]
        if allocated:
            first = allocated[0]
            assert first.result is not None
            answer = Answer(
                FITS,
                node=first.node,
                results=tuple(first.result.allocation["devices"]["results"]),
            )
        else:
            answer = Answer(
                UNSCHEDULABLE, "; ".join(f"{n.node}: {'; '.join(n.reasons)}" for n in report.nodes)
            )
    return CheckClaimAnswer(answer, report.fits, report)


# --- checking an allocation ------------------------------------------------------------------


def _alternatives(claim: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Result request name (``req`` or ``req/sub``) -> its ``exactly``-shaped body."""
    out: dict[str, Mapping[str, Any]] = {}
    for request in claim["devices"]["requests"]:
        if request.get("firstAvailable"):
            for sub in request["firstAvailable"]:
                out[f"{request['name']}/{sub['name']}"] = sub
        else:
            out[request["name"]] = request["exactly"]
    return out


def violations(case: Case, node: str | None, results: Iterable[Mapping[str, Any]]) -> list[str]:
    """What is wrong with an allocation of the case's claim (empty: nothing): devices on
    other nodes, in use, unknown, failing their selectors (per our CEL), wrong counts,
    broken constraints."""
    results = list(results)
    devices = {
        (s["spec"]["pool"]["name"], d["name"]): d for s in case.slices for d in s["spec"]["devices"]
    }
    alts = _alternatives(case.claim)
    class_exprs = [
        sel["cel"]["expression"] for sel in classes()[DEVICE_CLASS_NEURON]["spec"]["selectors"]
    ]
    problems: list[str] = []
    pools = {str(r.get("pool")) for r in results}
    if node is not None and pools - {node}:
        problems.append(f"devices of pools {sorted(pools - {node})} on node {node}")
    if len(pools) > 1:
        problems.append(f"devices of several nodes: {sorted(pools)}")
    seen: Counter[tuple[str, str]] = Counter()
    per_request: Counter[str] = Counter()
    chosen_alt: dict[str, str] = {}
    for r in results:
        key = (str(r.get("pool")), str(r.get("device")))
        seen[key] += 1
        request = str(r.get("request"))
        per_request[request] += 1
        parent = request.split("/", 1)[0]
        if chosen_alt.setdefault(parent, request) != request:
            problems.append(f"request {parent} got devices of two subrequests")
        if r.get("driver") != DRIVER_NAME:
            problems.append(f"{key}: driver {r.get('driver')}")
        if key in {(n, d) for n, d in case.taken}:
            problems.append(f"{key[0]}/{key[1]} is already allocated")
        device = devices.get(key)
        body = alts.get(request)
        if device is None or body is None:
            problems.append(f"{key[0]}/{key[1]} for request {request}: unknown")
            continue
        exprs = class_exprs + [s["cel"]["expression"] for s in body.get("selectors") or []]
        view = device_view(DRIVER_NAME, device)
        for expr in exprs:
            if view.check(compile_selector(expr)) is not True:
                problems.append(f"{key[0]}/{key[1]} does not satisfy {expr!r} (our CEL)")
    problems += [f"{k[0]}/{k[1]} allocated {c} times" for k, c in seen.items() if c > 1]
    for request, count in per_request.items():
        body = alts.get(request) or {}
        if body.get("allocationMode", "ExactCount") == "ExactCount" and count != body.get(
            "count", 1
        ):
            problems.append(f"request {request}: {count} devices, asked {body.get('count', 1)}")
    for request in case.claim["devices"]["requests"]:
        if request["name"] not in chosen_alt:
            problems.append(f"request {request['name']}: no devices")
    for constraint in case.claim["devices"].get("constraints") or []:
        attr = constraint.get("matchAttribute") or constraint.get("distinctAttribute")
        scope = constraint.get("requests")
        values = []
        for r in results:
            request = str(r.get("request"))
            if scope and request not in scope and request.split("/", 1)[0] not in scope:
                continue
            device = devices.get((str(r.get("pool")), str(r.get("device")))) or {}
            values.append(_attribute(device, str(attr)))
        if None in values:
            problems.append(f"{attr}: missing on a constrained device")
        elif constraint.get("matchAttribute") and len(set(values)) > 1:
            problems.append(f"matchAttribute {attr}: values {sorted(map(str, set(values)))}")
        elif constraint.get("distinctAttribute") and len(set(values)) < len(values):
            problems.append(f"distinctAttribute {attr}: repeated values {values}")
    return problems


def _attribute(device: Mapping[str, Any], qualified: str) -> Any:
    attrs = device.get("attributes") or {}
    domain, _, name = qualified.partition("/")
    raw = attrs.get(qualified) or (attrs.get(name) if domain == DRIVER_NAME else None)
    if not raw:
        return None
    return next(iter(raw.items()))
