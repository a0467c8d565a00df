"""``neuron-dra check-claim``: which nodes and devices would satisfy a ResourceClaim(Template).

The claim is allocated the way kube-scheduler's DRA plugin would (the shared structured
allocator, ``neuron_dra.sim.allocation``), one node at a time, against devices from
a live cluster (``--kubeconfig``), a file of ResourceSlices (``--slices``) or freshly emulated
nodes (``--emulate TYPE``). A node where the scheduler would find devices is then checked by
the kubelet plugin's own Prepare decision (``neuron_dra.nodeplugin.claims.plan_claim_on``: connected
device set, opaque configs, LNC, UltraServer mode, workload reservations) fed from the node's
ResourceSlice, because a claim that is allocated but cannot be prepared leaves the pod in
ContainerCreating, which is the failure this command exists to catch early.

Exit codes: 0 when every claim fits somewhere, 1 when one does not, 2 for bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TextIO

import yaml
from neuron_dra.common.constants import ATTR_INSTANCE_TYPE, DRIVER_NAME
from neuron_dra.common.deviceclasses import CLASS_EXPRESSIONS, default_classes_by_name
from neuron_dra.common.profiles import InstanceProfile
from neuron_dra.sim.allocation import (
    AllocationFailure,
    AllocationResult,
    CelError,
    DeviceKey,
    allocate,
    compile_selector,
    device_view,
)

if TYPE_CHECKING:
    from neuron_dra.nodeplugin.claims import NodeFacts

EXIT_FITS: Final = 0
EXIT_NO_FIT: Final = 1
EXIT_BAD_INPUT: Final = 2

RESOURCE_GROUP: Final = "resource.k8s.io"
CLAIM_KINDS: Final = ("ResourceClaimTemplate", "ResourceClaim")
#: Fields of a v1beta1 request that v1 moved under ``exactly``.
_EXACT_FIELDS: Final = (
    "deviceClassName",
    "selectors",
    "allocationMode",
    "count",
    "adminAccess",
    "tolerations",
    "capacity",
)
_MAX_NAMED: Final = 6
_KIND_OF_VALUE: Final[dict[type, str]] = {
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
}


class InputError(Exception):
    """Bad input (exit code 2): the message says what to fix."""


# --- reading input -------------------------------------------------------------------------------


def read_objects(path: str, what: str) -> list[dict[str, Any]]:
    """Every object in a YAML/JSON file: several documents, a list, or a ``…List``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{what} {path}: file not found") from None
    except IsADirectoryError:
        raise InputError(f"{what} {path}: is a directory, not a file") from None
    except UnicodeDecodeError:
        raise InputError(f"{what} {path}: not a text file") from None
    except OSError as exc:
        raise InputError(f"{what} {path}: cannot read: {exc.strerror or exc}") from None
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
            mark = exc.problem_mark
            detail = f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
        raise InputError(f"{what} {path}: not valid YAML: {detail}") from None
    objects: list[dict[str, Any]] = []
    for number, doc in enumerate(docs, start=1):
        if doc is None:
            continue
        if isinstance(doc, list):
            items: list[Any] = doc
        elif isinstance(doc, dict) and isinstance(doc.get("items"), list):
            items = doc["items"]  # a List (kubectl get -o yaml)
        else:
            items = [doc]
        for item in items:
            if not isinstance(item, dict):
                raise InputError(
                    f"{what} {path}: document {number} is not a Kubernetes object "
                    f"({_KIND_OF_VALUE.get(type(item), type(item).__name__)})"
                )
            objects.append(item)
    return objects


def _group(obj: Mapping[str, Any]) -> str:
    return str(obj.get("apiVersion") or "").rpartition("/")[0]


def _is(obj: Mapping[str, Any], kind: str) -> bool:
    return obj.get("kind") == kind and _group(obj) == RESOURCE_GROUP


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def to_v1_claim_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A ResourceClaim spec in v1 shape: v1beta1's flat requests moved under ``exactly``."""
    out = copy.deepcopy(dict(spec))
    for request in _list(_dict(out.get("devices")).get("requests")):
        if not isinstance(request, dict) or "exactly" in request or "firstAvailable" in request:
            continue
        exactly = {k: request.pop(k) for k in _EXACT_FIELDS if k in request}
        request["exactly"] = exactly
    return out


@dataclass(frozen=True)
class ClaimDoc:
    """One ResourceClaimTemplate or ResourceClaim of the input, in v1 shape."""

    kind: str
    api_version: str
    namespace: str
    name: str
    #: ``ResourceClaim.spec`` (v1 shape), what gets allocated.
    spec: dict[str, Any]
    #: The whole object converted to ``resource.k8s.io/v1``, for API validation.
    v1_object: dict[str, Any]
    #: Labels of the claim (a template's claim labels): Prepare matches a workload's claims
    #: to the devices reserved for it by one of them.
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"


def claim_docs(objects: Iterable[Mapping[str, Any]], path: str) -> list[ClaimDoc]:
    found: list[ClaimDoc] = []
    kinds: list[str] = []
    for obj in objects:
        kind = str(obj.get("kind") or "")
        kinds.append(kind or "(no kind)")
        if kind not in CLAIM_KINDS:
            continue
        if _group(obj) != RESOURCE_GROUP:
            raise InputError(
                f"{path}: {kind} has apiVersion {obj.get('apiVersion')!r}; expected "
                f"{RESOURCE_GROUP}/v1 (or v1beta1, v1beta2)"
            )
        meta = _dict(obj.get("metadata"))
        name = str(meta.get("name") or meta.get("generateName") or "(unnamed)")
        outer = _dict(obj.get("spec"))
        raw_spec = _dict(outer.get("spec")) if kind == "ResourceClaimTemplate" else outer
        claim_meta = _dict(outer.get("metadata")) if kind == "ResourceClaimTemplate" else meta
        labels = {str(k): str(v) for k, v in _dict(claim_meta.get("labels")).items()}
        spec = to_v1_claim_spec(raw_spec)
        v1 = copy.deepcopy(dict(obj))
        v1["apiVersion"] = f"{RESOURCE_GROUP}/v1"
        if kind == "ResourceClaimTemplate":
            v1.setdefault("spec", {})
            if isinstance(v1["spec"], dict):
                v1["spec"]["spec"] = copy.deepcopy(spec)
        else:
            v1["spec"] = copy.deepcopy(spec)
        found.append(
            ClaimDoc(
                kind=kind,
                api_version=str(obj.get("apiVersion")),
                namespace=str(meta.get("namespace") or ""),
                name=name,
                spec=spec,
                v1_object=v1,
                labels=labels,
            )
        )
    if not found:
        seen = ", ".join(sorted(set(kinds))) or "nothing"
        raise InputError(f"{path}: no ResourceClaimTemplate or ResourceClaim in it (found: {seen})")
    return found


def api_errors(doc: ClaimDoc) -> list[str]:
    """What the API server's validation would say about the (v1 form of the) object."""
    from neuron_dra.sim.fakeapi.builtin_validation import (
        apply_builtin_defaults,
        validate_builtin,
    )

    plural = "resourceclaimtemplates" if doc.kind == "ResourceClaimTemplate" else "resourceclaims"
    obj = copy.deepcopy(doc.v1_object)
    apply_builtin_defaults(RESOURCE_GROUP, plural, obj)
    return [e.full() for e in validate_builtin(RESOURCE_GROUP, plural, obj, None)]


# --- where the devices come from -----------------------------------------------------------------


@dataclass
class Cluster:
    """Devices, classes and devices in use, from one of the sources."""

    slices: list[dict[str, Any]]
    classes: dict[str, dict[str, Any]]
    allocated: set[DeviceKey] = field(default_factory=set)
    source: str = ""


def allocated_devices(claims: Iterable[Mapping[str, Any]]) -> set[DeviceKey]:
    """Devices held by allocated claims (admin-access results do not block others)."""
    out: set[DeviceKey] = set()
    for claim in claims:
        devices = _dict(_dict(_dict(claim.get("status")).get("allocation")).get("devices"))
        for result in _list(devices.get("results")):
            r = _dict(result)
            if r.get("adminAccess"):
                continue
            out.add((str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", ""))))
    return out


def _classes_of(objects: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        str(_dict(o.get("metadata")).get("name")): dict(o)
        for o in objects
        if _is(o, "DeviceClass") and _dict(o.get("metadata")).get("name")
    }


def from_slices_file(path: str) -> Cluster:
    objects = read_objects(path, "--slices")
    slices = [dict(o) for o in objects if _is(o, "ResourceSlice")]
    if not slices:
        raise InputError(f"--slices {path}: no ResourceSlice in it")
    claims = [o for o in objects if _is(o, "ResourceClaim")]
    classes = {**default_classes_by_name(), **_classes_of(objects)}
    return Cluster(slices, classes, allocated_devices(claims), source=f"slices from {path}")


def emulated_node_names(types: Sequence[str]) -> list[str]:
    """A type's name as the node name; ``<type>-<i>`` when it is emulated more than once."""
    totals = Counter(types)
    seen: Counter[str] = Counter()
    names = []
    for t in types:
        names.append(t if totals[t] == 1 else f"{t}-{seen[t]}")
        seen[t] += 1
    return names


def from_emulation(types: Sequence[str]) -> Cluster:
    """Slices of freshly emulated nodes, built by the kubelet plugin's own code.

    UltraServer-capable types get UltraServer ids: the k-th node of a type is node ``k % 4``
    of UltraServer ``k // 4`` of that type.
    """
    from neuron_dra.common.profiles import PROFILES
    from neuron_dra.nodeplugin.discovery.emulation import (
        known_types,
        scan_emulated,
        write_emulated_tree,
    )
    from neuron_dra.nodeplugin.plugin import dra_driver_version
    from neuron_dra.nodeplugin.slices import build_resource_slices

    unknown = [t for t in types if t not in known_types()]
    if unknown:
        raise InputError(
            f"--emulate {unknown[0]}: unknown instance type; known types: "
            + ", ".join(known_types())
        )
    version = dra_driver_version()
    slices: list[dict[str, Any]] = []
    index: Counter[str] = Counter()
    with tempfile.TemporaryDirectory(prefix="neuron-dra-check-claim-") as tmp:
        for n, (instance_type, node) in enumerate(
            zip(types, emulated_node_names(types), strict=True)
        ):
            k = index[instance_type]
            index[instance_type] += 1
            us_capable = PROFILES[instance_type].ultraserver_capable
            paths = write_emulated_tree(
                Path(tmp) / f"node{n}",
                instance_type,
                node_name=node,
                ultraserver_id=f"emulated-{instance_type}-{k // 4}" if us_capable else None,
                ultraserver_node_id=k % 4 if us_capable else None,
            )
            inventory = scan_emulated(paths, node_name=node)
            slices += build_resource_slices(
                inventory,
                node_name=node,
                node_uid=str(uuid.uuid5(uuid.NAMESPACE_DNS, node)),
                node_labels={},
                dra_driver_version=version,
                generation=0,
            )
    return Cluster(
        slices, default_classes_by_name(), source="emulated " + ", ".join(sorted(set(types)))
    )


async def _read_cluster(kubeconfig: str) -> Cluster:
    from neuron_dra.common.k8s.client import (
        DEVICE_CLASSES,
        RESOURCE_CLAIMS,
        RESOURCE_SLICES,
        connect,
    )

    async with await connect(kubeconfig) as kube:
        slices = (await kube.resource(RESOURCE_SLICES).list_all()).items
        classes = (await kube.resource(DEVICE_CLASSES).list_all()).items
        claims = (await kube.resource(RESOURCE_CLAIMS).list_all()).items
    return Cluster(
        [dict(s) for s in slices],
        _classes_of(
            {**c, "apiVersion": f"{RESOURCE_GROUP}/v1", "kind": "DeviceClass"} for c in classes
        ),
        allocated_devices(claims),
        source=f"cluster of {kubeconfig}",
    )


def from_cluster(kubeconfig: str) -> Cluster:
    from neuron_dra.common.k8s.errors import KubeError

    if not Path(kubeconfig).is_file():
        raise InputError(f"--kubeconfig {kubeconfig}: file not found")
    try:
        return asyncio.run(_read_cluster(kubeconfig))
    except (KubeError, OSError) as exc:
        raise InputError(f"--kubeconfig {kubeconfig}: cannot read the cluster: {exc}") from None


# --- per-node checks -----------------------------------------------------------------------------


def _attr(attrs: Mapping[str, Any], name: str) -> Any:
    """The value of one of our attributes (unqualified or qualified with the driver)."""
    typed = _dict(attrs.get(name) or attrs.get(f"{DRIVER_NAME}/{name}"))
    for kind in ("int", "bool", "string", "version"):
        if kind in typed:
            return typed[kind]
    return None


def _names(names: Sequence[str], limit: int = _MAX_NAMED) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", +{len(names) - limit}" if len(names) > limit else "")


@dataclass(frozen=True)
class NodeDevices:
    """One node's slices and our devices on it, by (driver, pool, device)."""

    name: str
    slices: list[dict[str, Any]]
    devices: dict[DeviceKey, dict[str, Any]]

    @property
    def instance_type(self) -> str | None:
        for (driver, _, _), dev in self.devices.items():
            value = _attr(_dict(dev.get("attributes")), ATTR_INSTANCE_TYPE)
            if driver == DRIVER_NAME and isinstance(value, str):
                return value
        return None


def split_by_node(slices: Sequence[Mapping[str, Any]]) -> list[NodeDevices]:
    """Per node (name order): its own slices plus the slices not bound to one node."""
    local: dict[str, list[dict[str, Any]]] = {}
    shared: list[dict[str, Any]] = []
    for s in slices:
        spec = _dict(s.get("spec"))
        node = spec.get("nodeName")
        if node:
            local.setdefault(str(node), []).append(dict(s))
            continue
        shared.append(dict(s))
        if spec.get("perDeviceNodeSelection"):
            for dev in _list(spec.get("devices")):
                if _dict(dev).get("nodeName"):
                    local.setdefault(str(dev["nodeName"]), [])
    out = []
    for name in sorted(local):
        members = local[name] + shared
        devices: dict[DeviceKey, dict[str, Any]] = {}
        for s in members:
            spec = _dict(s.get("spec"))
            driver, pool = str(spec.get("driver", "")), str(_dict(spec.get("pool")).get("name", ""))
            for dev in _list(spec.get("devices")):
                d = _dict(dev)
                devices[(driver, pool, str(d.get("name", "")))] = d
        out.append(NodeDevices(name, members, devices))
    return out


def _is_neuron_class(name: str, classes: Mapping[str, Mapping[str, Any]]) -> bool:
    if name in CLASS_EXPRESSIONS:
        return True
    selectors = _list(_dict(_dict(classes.get(name)).get("spec")).get("selectors"))
    return any(
        DRIVER_NAME in str(_dict(_dict(s).get("cel")).get("expression", "")) for s in selectors
    )


def requested_count(spec: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]]) -> int:
    """Neuron devices the claim asks for by count on one node; 0 when that is not fixed
    (``All`` or ``firstAvailable`` requests)."""
    total = 0
    for request in _list(_dict(spec.get("devices")).get("requests")):
        req = _dict(request)
        if req.get("firstAvailable"):
            if any(
                _is_neuron_class(str(_dict(s).get("deviceClassName", "")), classes)
                for s in _list(req["firstAvailable"])
            ):
                return 0
            continue
        body = _dict(req.get("exactly"))
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
    return [str(_dict(_dict(s).get("cel")).get("expression", "")) for s in _list(items)]


def selects_any(
    node: NodeDevices, spec: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]]
) -> bool:
    """Whether some Neuron request's class and selectors accept a device of ``node``: only
    then is the node's instance type worth a connected-set hint."""
    for request in _list(_dict(spec.get("devices")).get("requests")):
        body = _dict(_dict(request).get("exactly"))
        class_name = str(body.get("deviceClassName", ""))
        if not _is_neuron_class(class_name, classes):
            continue
        class_spec = _dict(_dict(classes.get(class_name)).get("spec"))
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


def published_devices(node: NodeDevices) -> dict[str, dict[str, Any]]:
    """Our devices on ``node`` as the kubelet plugin published them (device name ->
    attributes): what its Prepare checks a claim against. Attribute names qualified with the
    driver's domain (hand-written slices) are read as the plugin's unqualified ones."""
    prefix = f"{DRIVER_NAME}/"
    out: dict[str, dict[str, Any]] = {}
    for (driver, _, name), dev in node.devices.items():
        if driver != DRIVER_NAME:
            continue
        attrs = _dict(dev.get("attributes"))
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
    from neuron_dra.nodeplugin.claims import published_facts

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
    from neuron_dra.nodeplugin.claims import ClaimError, plan_claim_on

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


# --- checking one claim --------------------------------------------------------------------------


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
                devices = _names([d.device for d in outcome.devices])
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


# --- output --------------------------------------------------------------------------------------


def _config_line(entry: Mapping[str, Any]) -> str:
    opaque = _dict(entry.get("opaque"))
    params = _dict(opaque.get("parameters"))
    source = "class" if entry.get("source") == "FromClass" else "claim"
    requests = _list(entry.get("requests"))
    scope = f"requests {', '.join(map(str, requests))}" if requests else "all requests"
    driver = str(opaque.get("driver", ""))
    if driver == DRIVER_NAME and params.get("kind"):
        settings = ", ".join(
            f"{k}: {json.dumps(v)}" for k, v in params.items() if k not in ("apiVersion", "kind")
        )
        body = f"{params['kind']} {settings}".strip()
    else:
        body = f"driver {driver}: {json.dumps(params, sort_keys=True)}"
    return f"config from {source} for {scope}: {body}"


def render_text(report: ClaimReport, out: TextIO, *, show_file: bool = False) -> None:
    where = f" ({report.file})" if show_file and report.file else ""
    if report.error is not None:
        print(f"{report.doc.label}{where}: cannot be allocated: {report.error}", file=out)
        return
    fitting = [n for n in report.nodes if n.fits]
    failing = [n for n in report.nodes if not n.fits]
    total = len(report.nodes)
    if fitting:
        print(f"{report.doc.label}{where}: fits on {len(fitting)} of {total} nodes", file=out)
    else:
        print(f"{report.doc.label}{where}: does not fit on any of {total} nodes", file=out)
    chosen = report.chosen
    if chosen is not None and chosen.result is not None:
        kind = chosen.instance_type
        shown = f" ({kind})" if kind and kind != chosen.node else ""
        print(f"  node {chosen.node}{shown}:", file=out)
        by_request: dict[str, list[str]] = {}
        for d in chosen.result.devices:
            by_request.setdefault(d.request, []).append(d.device)
        for request, names in by_request.items():
            print(f"    request {request}: {', '.join(names)}", file=out)
        for entry in _list(_dict(chosen.result.allocation.get("devices")).get("config")):
            print(f"    {_config_line(_dict(entry))}", file=out)
        for warning in chosen.result.warnings:
            print(f"    warning: {warning}", file=out)
        others = [n.node for n in fitting[1:]]
        if others:
            print(f"  also fits on: {_names(others)}", file=out)
    groups: dict[tuple[str, ...], list[str]] = {}
    for n in failing:
        groups.setdefault(n.reasons, []).append(n.node)
    for reasons, names in groups.items():
        prefix = "not on " if fitting else ""
        label = f"node {names[0]}" if len(names) == 1 else f"nodes {_names(names)}"
        print(f"  {prefix}{label}: {'; '.join(reasons)}", file=out)
    for hint in report.hints:
        print(f"  {hint}", file=out)


def report_json(report: ClaimReport) -> dict[str, Any]:
    nodes = []
    for n in report.nodes:
        entry: dict[str, Any] = {"node": n.node, "instanceType": n.instance_type, "fits": n.fits}
        if n.result is not None:
            entry["devices"] = [
                {"request": d.request, "driver": d.driver, "pool": d.pool, "device": d.device}
                for d in n.result.devices
            ]
            entry["allocation"] = n.result.allocation
            if n.result.warnings:
                entry["warnings"] = list(n.result.warnings)
        if n.reasons:
            entry["reasons"] = list(n.reasons)
        nodes.append(entry)
    chosen = report.chosen
    return {
        "file": report.file,
        "kind": report.doc.kind,
        "namespace": report.doc.namespace,
        "name": report.doc.name,
        "fits": report.fits,
        "node": chosen.node if chosen is not None else None,
        "error": report.error,
        "nodes": nodes,
        "hints": report.hints,
    }


# --- the command ---------------------------------------------------------------------------------


def load_cluster(args: argparse.Namespace) -> Cluster:
    if args.kubeconfig:
        return from_cluster(args.kubeconfig)
    if args.slices:
        return from_slices_file(args.slices)
    return from_emulation(list(args.emulate))


def run_check_claim(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        docs: list[tuple[str, list[dict[str, Any]]]] = [
            (path, read_objects(path, "-f")) for path in args.files
        ]
        claims = [(path, claim_docs(objects, path)) for path, objects in docs]
        cluster = load_cluster(args)
    except InputError as exc:
        print(f"error: {exc}", file=err)
        return EXIT_BAD_INPUT
    for _, objects in docs:
        cluster.classes.update(_classes_of(objects))  # classes in the file win
    reports = [check(doc, cluster, path) for path, found in claims for doc in found]
    if args.output == "json":
        body = {
            "source": cluster.source,
            "fits": all(r.fits for r in reports),
            "claims": [report_json(r) for r in reports],
        }
        print(json.dumps(body, indent=2), file=out)
    else:
        for report in reports:
            render_text(report, out, show_file=len(args.files) > 1)
    return EXIT_FITS if all(r.fits for r in reports) else EXIT_NO_FIT
