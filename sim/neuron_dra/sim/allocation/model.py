"""The allocator's view of slices, classes and a claim spec (internal to this package).

Parsing turns API dicts into small immutable records once; ``NodeDevices.matches`` evaluates
the selectors of one request alternative over one node's devices, lazily and cached.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from neuron_dra.sim.allocation.cel import (
    CelError,
    CompiledSelector,
    DeviceView,
    compile_selector,
    device_view,
)

DeviceKey = tuple[str, str, str]
"""(driver, pool, device name), the identity of a device in ``allocated``."""

#: Taint effects that keep a device from being allocated unless tolerated.
_BLOCKING_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})

MAX_SHOWN_EXPRESSION: Final = 100


class ClaimError(Exception):
    """The claim cannot be allocated anywhere as written (kube-scheduler aborts it)."""


def short_expression(expression: str) -> str:
    text = " ".join(expression.split())
    if len(text) > MAX_SHOWN_EXPRESSION:
        text = text[: MAX_SHOWN_EXPRESSION - 3] + "..."
    return text


# --- devices -------------------------------------------------------------------------------------


def _typed_value(value: Any) -> tuple[str, Any] | None:
    if not isinstance(value, Mapping):
        return None
    for kind in ("int", "bool", "string", "version"):
        if kind in value:
            return (kind, value[kind])
    return None


@dataclass(eq=False)
class Device:
    key: DeviceKey
    index: int
    spec: Mapping[str, Any]
    pool_incomplete: bool
    attributes: dict[str, tuple[str, Any]] = field(default_factory=dict)
    _view: DeviceView | None = None

    @property
    def driver(self) -> str:
        return self.key[0]

    @property
    def pool(self) -> str:
        return self.key[1]

    @property
    def name(self) -> str:
        return self.key[2]

    @property
    def view(self) -> DeviceView:
        if self._view is None:
            self._view = device_view(self.driver, self.spec)
        return self._view

    def attribute(self, qualified: str) -> tuple[str, Any] | None:
        """Typed value of a fully qualified attribute (unqualified names are the driver's)."""
        return self.attributes.get(qualified)

    def untolerated_taints(self, tolerations: Sequence[Mapping[str, Any]]) -> list[str]:
        out = []
        for taint in self.spec.get("taints") or []:
            if taint.get("effect") not in _BLOCKING_EFFECTS:
                continue
            if not any(_tolerates(t, taint) for t in tolerations):
                out.append(str(taint.get("key", "")))
        return out


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    effect = toleration.get("effect")
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key")
    if toleration.get("operator", "Equal") == "Exists":
        return not key or key == taint.get("key")
    return key == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def _qualified_attributes(driver: str, device: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
    out: dict[str, tuple[str, Any]] = {}
    for name, value in (device.get("attributes") or {}).items():
        typed = _typed_value(value)
        if typed is not None:
            out[name if "/" in name else f"{driver}/{name}"] = typed
    return out


@dataclass
class NodeDevices:
    """Every device usable on one node, in the allocator's scan order."""

    name: str
    devices: list[Device]
    incomplete_pools: list[str]


def gather_nodes(slices: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[NodeDevices]]:
    """(node names, per-node devices) from the newest generation of every pool.

    Node-local slices (``spec.nodeName``, or per-device ``nodeName``) belong to their node;
    ``allNodes`` slices and devices are usable on every node. Slices that only carry a node
    selector are ignored (the allocator does not know Node labels). Pools are scanned in
    (driver, pool) order, their slices by name, devices in listed order; a device name seen
    twice in a pool counts once.
    """
    pools: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for s in slices:
        spec = s.get("spec") or {}
        pool = spec.get("pool") or {}
        pools[(str(spec.get("driver", "")), str(pool.get("name", "")))].append(s)

    local: dict[str, list[Device]] = defaultdict(list)
    everywhere: list[Device] = []
    incomplete: dict[str, list[str]] = defaultdict(list)
    incomplete_everywhere: list[str] = []
    index = 0
    for (driver, pool_name), members in sorted(pools.items()):
        newest = max(_generation(s) for s in members)
        current = sorted(
            (s for s in members if _generation(s) == newest),
            key=lambda s: str((s.get("metadata") or {}).get("name", "")),
        )
        expected = (current[0].get("spec") or {}).get("pool", {}).get("resourceSliceCount", 1)
        is_incomplete = isinstance(expected, int) and len(current) < expected
        seen: set[str] = set()
        for s in current:
            spec = s.get("spec") or {}
            slice_node = spec.get("nodeName")
            per_device = bool(spec.get("perDeviceNodeSelection"))
            if is_incomplete:
                if slice_node:
                    incomplete[str(slice_node)].append(pool_name)
                elif spec.get("allNodes"):
                    incomplete_everywhere.append(pool_name)
            for raw in spec.get("devices") or []:
                name = str(raw.get("name", ""))
                if not name or name in seen:
                    continue
                seen.add(name)
                device = Device(
                    key=(driver, pool_name, name),
                    index=index,
                    spec=raw,
                    pool_incomplete=is_incomplete,
                    attributes=_qualified_attributes(driver, raw),
                )
                index += 1
                node = raw.get("nodeName") if per_device else slice_node
                if node:
                    local[str(node)].append(device)
                elif (per_device and raw.get("allNodes")) or (
                    not per_device and spec.get("allNodes")
                ):
                    everywhere.append(device)
    names = sorted(local)
    nodes = [
        NodeDevices(
            name=n,
            devices=sorted([*local[n], *everywhere], key=lambda d: d.index),
            incomplete_pools=sorted({*incomplete[n], *incomplete_everywhere}),
        )
        for n in names
    ]
    return names, nodes


def _generation(s: Mapping[str, Any]) -> int:
    value = ((s.get("spec") or {}).get("pool") or {}).get("generation", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


# --- the claim -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Alternative:
    """One way to satisfy a request: the request itself, or one ``firstAvailable`` entry."""

    name: str  # as it appears in results: ``req`` or ``req/sub``
    parent: str
    class_name: str
    class_selectors: tuple[CompiledSelector, ...]
    selectors: tuple[CompiledSelector, ...]
    all_mode: bool
    count: int
    tolerations: tuple[Mapping[str, Any], ...]
    #: ``adminAccess`` (an ``exactly`` request only): devices in use are candidates too, and
    #: the devices given are not in use for other claims.
    admin_access: bool = False


@dataclass(frozen=True)
class Request:
    name: str
    alternatives: tuple[Alternative, ...]


@dataclass(frozen=True)
class Constraint:
    attribute: str
    requests: frozenset[str] | None  # None: every request
    distinct: bool = False

    def applies(self, alt: Alternative) -> bool:
        return self.requests is None or alt.parent in self.requests or alt.name in self.requests

    def describe(self) -> str:
        return f"{'distinctAttribute' if self.distinct else 'matchAttribute'} {self.attribute}"


@dataclass(frozen=True)
class Claim:
    requests: tuple[Request, ...]
    constraints: tuple[Constraint, ...]
    config: tuple[Mapping[str, Any], ...]


def _selectors(items: Any, where: str) -> tuple[CompiledSelector, ...]:
    out = []
    for i, sel in enumerate(items or []):
        expression = ((sel or {}).get("cel") or {}).get("expression")
        if not isinstance(expression, str) or not expression.strip():
            raise ClaimError(f"{where}selector #{i}: no CEL expression")
        try:
            out.append(compile_selector(expression))
        except CelError as err:
            raise ClaimError(f"{where}selector #{i}: {err}") from None
    return tuple(out)


def _alternative(
    body: Mapping[str, Any],
    *,
    name: str,
    parent: str,
    classes: Mapping[str, Mapping[str, Any]],
) -> Alternative:
    class_name = body.get("deviceClassName")
    if not class_name:
        raise ClaimError(f"request {name}: deviceClassName is required")
    device_class = classes.get(class_name)
    if device_class is None:
        raise ClaimError(f"request {name}: device class {class_name} not found")
    mode = body.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise ClaimError(f"request {name}: unknown allocationMode {mode!r}")
    count = body.get("count")
    if mode == "All":
        count = 0
    elif count is None:
        count = 1
    if (
        not isinstance(count, int)
        or isinstance(count, bool)
        or (mode == "ExactCount" and count < 1)
    ):
        raise ClaimError(f"request {name}: count must be a positive integer, got {count!r}")
    class_spec = device_class.get("spec") or {}
    return Alternative(
        name=name,
        parent=parent,
        class_name=str(class_name),
        class_selectors=_selectors(
            class_spec.get("selectors"), f"request {name}: class {class_name} "
        ),
        selectors=_selectors(body.get("selectors"), f"request {name}: "),
        all_mode=mode == "All",
        count=count,
        tolerations=tuple(body.get("tolerations") or ()),
        admin_access=body.get("adminAccess") is True,
    )


def parse_claim(spec: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]]) -> Claim:
    """The v1 claim spec (``exactly``/``firstAvailable``); the flat v1beta1 request is accepted
    too, since the templates users keep in their repositories still use it. ClaimError if the
    claim cannot be allocated as written (unknown class, selector that does not compile)."""
    if "devices" not in spec and isinstance(spec.get("spec"), Mapping):
        spec = spec["spec"]  # a whole ResourceClaim
    devices = spec.get("devices") or {}
    requests = []
    names: set[str] = set()
    for raw in devices.get("requests") or []:
        name = str(raw.get("name") or "")
        if not name:
            raise ClaimError("a request has no name")
        if name in names:
            raise ClaimError(f"request {name}: duplicate name")
        names.add(name)
        subs = raw.get("firstAvailable")
        if subs:
            alts = tuple(
                _alternative(
                    sub, name=f"{name}/{sub.get('name', '')}", parent=name, classes=classes
                )
                for sub in subs
            )
        else:
            body = raw.get("exactly") if raw.get("exactly") is not None else raw
            alts = (_alternative(body, name=name, parent=name, classes=classes),)
        requests.append(Request(name, alts))
    if not requests:
        raise ClaimError("the claim has no device requests")
    constraints = []
    for raw in devices.get("constraints") or []:
        listed = raw.get("requests")
        for ref in listed or ():
            if str(ref).split("/", 1)[0] not in names:
                raise ClaimError(f"constraint names unknown request {ref}")
        for field_name, distinct in (("matchAttribute", False), ("distinctAttribute", True)):
            attr = raw.get(field_name)
            if attr:
                if "/" not in attr:
                    raise ClaimError(f"{field_name} {attr} must be a fully qualified name")
                constraints.append(
                    Constraint(str(attr), frozenset(listed) if listed else None, distinct)
                )
    return Claim(tuple(requests), tuple(constraints), tuple(devices.get("config") or ()))


# --- matching ------------------------------------------------------------------------------------


@dataclass
class Match:
    """Devices of a node an alternative's selectors accept, plus those whose evaluation failed."""

    devices: list[Device]
    errors: list[tuple[Device, str]]


class Matcher:
    """Which devices of a node each alternative selects (per allocation call)."""

    def __init__(self) -> None:
        self._matches: dict[tuple[str, str], Match] = {}

    @staticmethod
    def _eval(device: Device, selector: CompiledSelector) -> bool | str:
        return device.view.check(selector)

    def device_error(self, alt: Alternative, device: Device) -> tuple[bool, str | None]:
        """(selected, error): class selectors first, then the request's, short-circuiting."""
        for where, selectors in (
            (f"class {alt.class_name} ", alt.class_selectors),
            ("", alt.selectors),
        ):
            for i, sel in enumerate(selectors):
                result = self._eval(device, sel)
                if isinstance(result, str):
                    return False, (
                        f"request {alt.name}: {where}selector #{i} on device "
                        f"{device.pool}/{device.name}: {result}"
                    )
                if not result:
                    return False, None
        return True, None

    def matches(self, node: NodeDevices, alt: Alternative) -> Match:
        key = (node.name, alt.name)
        found = self._matches.get(key)
        if found is None:
            found = Match([], [])
            for device in node.devices:
                selected, error = self.device_error(alt, device)
                if error is not None:
                    found.errors.append((device, error))
                elif selected:
                    found.devices.append(device)
            self._matches[key] = found
        return found

    def selected(self, device: Device, selectors: Sequence[CompiledSelector]) -> bool:
        """All ``selectors`` true for ``device`` (an evaluation error counts as false)."""
        return all(self._eval(device, sel) is True for sel in selectors)

    def survivors(
        self, devices: Sequence[Device], selectors: Sequence[CompiledSelector]
    ) -> list[int]:
        """How many of ``devices`` pass selectors[0], selectors[0..1], ... (errors fail)."""
        counts = []
        remaining = list(devices)
        for sel in selectors:
            remaining = [d for d in remaining if self._eval(d, sel) is True]
            counts.append(len(remaining))
        return counts
