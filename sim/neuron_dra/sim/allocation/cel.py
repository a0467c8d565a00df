"""DRA device selectors evaluated as kube-scheduler evaluates them (Kubernetes' DRA CEL library).

The single variable is ``device`` with ``driver``, ``attributes`` (domain -> name -> value),
``capacity`` (domain -> name -> quantity) and ``allowMultipleAllocations``. Unqualified
attribute and capacity names live under the driver's domain. ``version`` attributes are semver
values and capacities are quantities, with the Kubernetes CEL library functions on them
(``semver()``, ``isSemver()``, ``.major()``, ``.compareTo()``, ``quantity()``, ``.asInteger()``,
``.add()``, ...).

How the two Kubernetes types are represented: cel-expr-python passes only CEL values across its
boundary, so semver and quantity values are small protobuf messages from a private descriptor
pool (``kubernetes.Semver``, ``kubernetes.Quantity``). The runtime dispatches member functions on
the value *kind* (every message is a "struct"), so each function has one implementation that
checks the Python message type itself; the type checker still sees one typed overload per type,
so ``quantity("1").isLessThan(semver("1.0.0"))`` is a compile error as in Kubernetes. Equal values
compare equal with ``==``: a quantity is stored as its exact reduced fraction (``1Gi ==
1024Mi``), a semver without its build metadata (which does not take part in precedence).

Semantics mirrored from the scheduler: an evaluation error (e.g. a missing attribute) is an
error for the whole claim, a non-bool result is an error, and an unknown domain in
``device.attributes[...]``/``device.capacity[...]`` is an empty map. The last is approximated:
each string literal of the expression that is not a domain of the device is added as an empty
domain (so ``"other.example.com" in device.attributes`` is true for a literal domain, where the
real map-with-default answers the same way for lookups but need not for ``in``).

Not mirrored: CEL cost limits (``CELSelectorExpressionMaxCost``), and the list-valued
attribute types of later API versions.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from neuron_dra.common.quantity import is_quantity, parse_quantity

__all__ = [
    "CelError",
    "CompiledSelector",
    "DeviceView",
    "compile_selector",
    "device_view",
    "make_quantity",
    "make_semver",
    "parse_semver",
    "quantity_value",
]

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1

# --- the two opaque Kubernetes types as protobuf messages --------------------------------------

_PACKAGE: Final = "kubernetes"
SEMVER_TYPE: Final = f"{_PACKAGE}.Semver"
QUANTITY_TYPE: Final = f"{_PACKAGE}.Quantity"


def _build_pool() -> tuple[Any, Any, Any]:
    fdp = descriptor_pb2.FileDescriptorProto(
        name="neuron_dra_sim_cel_types.proto", package=_PACKAGE, syntax="proto3"
    )
    int64_t = descriptor_pb2.FieldDescriptorProto.TYPE_INT64
    string_t = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
    optional = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    for name, fields in (
        ("Semver", (("major", int64_t), ("minor", int64_t), ("patch", int64_t), ("pre", string_t))),
        # Exact value as a reduced fraction; strings because quantities outgrow int64 (1Ei*8).
        ("Quantity", (("numerator", string_t), ("denominator", string_t))),
    ):
        msg = fdp.message_type.add(name=name)
        for number, (field, ftype) in enumerate(fields, 1):
            msg.field.add(name=field, number=number, type=ftype, label=optional)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    semver_cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(SEMVER_TYPE))
    quantity_cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(QUANTITY_TYPE))
    return pool, semver_cls, quantity_cls


_POOL, _SemverMsg, _QuantityMsg = _build_pool()


class CelError(Exception):
    """A selector that does not compile, fails at runtime or does not yield a bool."""


# --- semver ------------------------------------------------------------------------------------

_NUM = r"(0|[1-9]\d*)"
_PRE_ID = r"(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
_SEMVER_RE = re.compile(
    rf"{_NUM}\.{_NUM}\.{_NUM}(?:-({_PRE_ID}(?:\.{_PRE_ID})*))?(?:\+[0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*)?"
)
_LOOSE_RE = re.compile(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?((?:[-+].*)?)")


@dataclass(frozen=True)
class _Version:
    major: int
    minor: int
    patch: int
    pre: tuple[str, ...]


def parse_semver(text: str, *, normalize: bool = False) -> _Version:
    """Strict semver 2.0.0 (what ``version`` attributes hold); ValueError otherwise.

    ``normalize`` is the Kubernetes library's lenient form: an optional leading ``v``, missing
    minor/patch read as 0 and leading zeros dropped (``v1.02`` -> ``1.2.0``).
    """
    if normalize:
        loose = _LOOSE_RE.fullmatch(text)
        if loose is not None:
            major, minor, patch, rest = loose.groups()
            text = f"{int(major)}.{int(minor or 0)}.{int(patch or 0)}{rest}"
    match = _SEMVER_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"invalid semver: {text}")
    major, minor, patch, pre = match.groups()
    values = (int(major), int(minor), int(patch))
    if max(values) > _INT64_MAX:
        raise ValueError(f"invalid semver: {text}")
    return _Version(*values, tuple(pre.split(".")) if pre else ())


def make_semver(text: str, *, normalize: bool = False) -> Any:
    v = parse_semver(text, normalize=normalize)
    return _SemverMsg(major=v.major, minor=v.minor, patch=v.patch, pre=".".join(v.pre))


def _pre_key(pre: str) -> tuple[Any, ...]:
    """Precedence key of a prerelease: none sorts after any; numeric ids below alphanumeric."""
    if not pre:
        return (1,)
    ids = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))
    return (0, ids)


def _semver_cmp(a: Any, b: Any) -> int:
    ka = (a.major, a.minor, a.patch, _pre_key(a.pre))
    kb = (b.major, b.minor, b.patch, _pre_key(b.pre))
    return (ka > kb) - (ka < kb)


# --- quantity ----------------------------------------------------------------------------------


def make_quantity(value: Fraction | int) -> Any:
    value = Fraction(value)
    return _QuantityMsg(numerator=str(value.numerator), denominator=str(value.denominator))


def quantity_value(msg: Any) -> Fraction:
    return Fraction(int(msg.numerator), int(msg.denominator))


def _quantity(text: str) -> Any:
    try:
        return make_quantity(parse_quantity(text))
    except ValueError as err:
        raise ValueError(f"invalid quantity {text!r}: {err}") from None


def _cmp(a: Fraction, b: Fraction) -> int:
    return (a > b) - (a < b)


# --- member functions shared by both types: one runtime implementation each -------------------


def _is_semver(v: Any) -> bool:
    return isinstance(v, _SemverMsg)


def _is_quantity(v: Any) -> bool:
    return isinstance(v, _QuantityMsg)


def _type_name(v: Any) -> str:
    if _is_semver(v):
        return SEMVER_TYPE
    if _is_quantity(v):
        return QUANTITY_TYPE
    return type(v).__name__


def _no_overload(name: str, *args: Any) -> ValueError:
    return ValueError(f"no such overload: {name}({', '.join(_type_name(a) for a in args)})")


def _compare(name: str) -> Callable[[Any, Any], int]:
    def impl(a: Any, b: Any) -> int:
        if _is_semver(a) and _is_semver(b):
            return _semver_cmp(a, b)
        if _is_quantity(a) and _is_quantity(b):
            return _cmp(quantity_value(a), quantity_value(b))
        raise _no_overload(name, a, b)

    return impl


_compare_to = _compare("compareTo")
_less = _compare("isLessThan")
_greater = _compare("isGreaterThan")


def _semver_part(name: str) -> Callable[[Any], int]:
    def impl(v: Any) -> int:
        if not _is_semver(v):
            raise _no_overload(name, v)
        return int(getattr(v, name))

    return impl


def _q(name: str, v: Any) -> Fraction:
    if not _is_quantity(v):
        raise _no_overload(name, v)
    return quantity_value(v)


def _as_integer(v: Any) -> int:
    value = _q("asInteger", v)
    if value.denominator != 1 or not _INT64_MIN <= value.numerator <= _INT64_MAX:
        raise ValueError("cannot convert value to integer")
    return value.numerator


def _is_integer(v: Any) -> bool:
    value = _q("isInteger", v)
    return value.denominator == 1 and _INT64_MIN <= value.numerator <= _INT64_MAX


def _sign(v: Any) -> int:
    value = _q("sign", v)
    return (value > 0) - (value < 0)


def _arith(name: str, op: Callable[[Fraction, Fraction], Fraction]) -> Callable[[Any, Any], Any]:
    def impl(a: Any, b: Any) -> Any:
        left = _q(name, a)
        if _is_quantity(b):
            return make_quantity(op(left, quantity_value(b)))
        if isinstance(b, int) and not isinstance(b, bool):
            return make_quantity(op(left, Fraction(b)))
        raise _no_overload(name, a, b)

    return impl


def _functions() -> list[Any]:
    T = cel.Type
    s, b, i, d = T.STRING, T.BOOL, T.INT, T.DOUBLE
    v, q = T(SEMVER_TYPE), T(QUANTITY_TYPE)

    def member(name: str, impl: Callable[..., Any], *typed: tuple[str, Any, list[Any]]) -> Any:
        # The first overload carries the implementation (registered once per kind); the rest
        # exist for the type checker only.
        (oid, ret, params), *checker_only = typed
        overloads = [cel.Overload(oid, ret, params, is_member=True, impl=impl)]
        overloads += [cel.Overload(o, r, p, is_member=True) for o, r, p in checker_only]
        return cel.FunctionDecl(name, overloads)

    return [
        cel.FunctionDecl(
            "semver",
            [
                cel.Overload("string_to_semver", v, [s], impl=make_semver),
                cel.Overload(
                    "string_bool_to_semver",
                    v,
                    [s, b],
                    impl=lambda text, norm: make_semver(text, normalize=norm),
                ),
            ],
        ),
        cel.FunctionDecl(
            "isSemver",
            [
                cel.Overload("is_semver_string", b, [s], impl=_is_semver_text),
                cel.Overload(
                    "is_semver_string_bool",
                    b,
                    [s, b],
                    impl=lambda text, norm: _is_semver_text(text, norm),
                ),
            ],
        ),
        cel.FunctionDecl("quantity", [cel.Overload("string_to_quantity", q, [s], impl=_quantity)]),
        cel.FunctionDecl(
            "isQuantity", [cel.Overload("is_quantity_string", b, [s], impl=is_quantity)]
        ),
        member("major", _semver_part("major"), ("semver_major", i, [v])),
        member("minor", _semver_part("minor"), ("semver_minor", i, [v])),
        member("patch", _semver_part("patch"), ("semver_patch", i, [v])),
        member(
            "compareTo",
            _compare_to,
            ("semver_compare", i, [v, v]),
            ("quantity_compare", i, [q, q]),
        ),
        member(
            "isLessThan",
            lambda x, y: _less(x, y) < 0,
            ("semver_less", b, [v, v]),
            ("quantity_less", b, [q, q]),
        ),
        member(
            "isGreaterThan",
            lambda x, y: _greater(x, y) > 0,
            ("semver_greater", b, [v, v]),
            ("quantity_greater", b, [q, q]),
        ),
        member("isInteger", _is_integer, ("quantity_is_integer", b, [q])),
        member("asInteger", _as_integer, ("quantity_as_integer", i, [q])),
        member(
            "asApproximateFloat",
            lambda x: float(_q("asApproximateFloat", x)),
            ("quantity_as_float", d, [q]),
        ),
        member("sign", _sign, ("quantity_sign", i, [q])),
        # Two runtime kinds (struct, int): both overloads carry the implementation.
        cel.FunctionDecl(
            "add",
            [
                cel.Overload("quantity_add", q, [q, q], is_member=True, impl=_ADD),
                cel.Overload("quantity_add_int", q, [q, i], is_member=True, impl=_ADD),
            ],
        ),
        cel.FunctionDecl(
            "sub",
            [
                cel.Overload("quantity_sub", q, [q, q], is_member=True, impl=_SUB),
                cel.Overload("quantity_sub_int", q, [q, i], is_member=True, impl=_SUB),
            ],
        ),
    ]


def _is_semver_text(text: str, normalize: bool = False) -> bool:
    try:
        parse_semver(text, normalize=normalize)
    except ValueError:
        return False
    return True


_ADD = _arith("add", lambda x, y: x + y)
_SUB = _arith("sub", lambda x, y: x - y)


@functools.cache
def _env() -> Any:
    return cel.NewEnv(
        descriptor_pool=_POOL,
        variables={"device": cel.Type.DYN},
        functions=_functions(),
        extensions=[
            ext_strings.ExtStrings(),
            ext_optional.ExtOptional(),
            ext_bindings.ExtBindings(),
        ],
    )


# --- compile and evaluate ----------------------------------------------------------------------

_STRING_LITERAL = re.compile(r""""((?:[^"\\\n]|\\.)*)"|'((?:[^'\\\n]|\\.)*)'""")
_STATUS_PREFIX = re.compile(r"^[A-Z_]+: ")
_STATUS_SUFFIX = re.compile(r"\s*\[[A-Z_]+\]$")
_MISSING_KEY = re.compile(r'Key not found in map\s*:\s*"?([^"]*)"?')


def _clean(text: str) -> str:
    """The first line of a cel-cpp status message without its status code decoration."""
    text = text.strip().splitlines()[0] if text.strip() else ""
    while _STATUS_PREFIX.match(text):
        text = _STATUS_PREFIX.sub("", text, count=1)
    text = _STATUS_SUFFIX.sub("", text)
    missing = _MISSING_KEY.search(text)
    if missing:
        return f"no such key: {missing.group(1)}"
    return text


@dataclass(frozen=True, eq=False)
class CompiledSelector:
    expression: str
    program: Any
    literals: frozenset[str]

    def evaluate(self, device: DeviceView) -> bool:
        """True/False, or CelError with the runtime error (``no such key: x``)."""
        result = self.program.eval(device.activation(self.literals))
        kind = result.type()
        if kind == cel.Type.ERROR:
            raise CelError(f"CEL runtime error: {_clean(str(result.value()))}")
        if kind != cel.Type.BOOL:
            raise CelError(f"CEL result of type {kind.name().lower()} is not a bool")
        return bool(result.value())


@functools.lru_cache(maxsize=4096)
def _compile_cached(expression: str) -> CompiledSelector | str:
    try:
        program = _env().compile(expression)
    except RuntimeError as err:
        return f"compilation failed: {_clean(str(err))}"
    ret = program.return_type()
    if ret != cel.Type.BOOL and ret != cel.Type.DYN:
        return f"must evaluate to bool, not {ret.name().lower()}"
    literals = frozenset(a or b for a, b in _STRING_LITERAL.findall(expression) if a or b)
    return CompiledSelector(expression, program, literals)


def compile_selector(expression: str) -> CompiledSelector:
    """Compile once per distinct expression text (cached); CelError if it does not compile."""
    result = _compile_cached(expression)
    if isinstance(result, str):
        raise CelError(result)
    return result


# --- the ``device`` variable -------------------------------------------------------------------


def _split(name: str, driver: str) -> tuple[str, str]:
    domain, sep, ident = name.rpartition("/")
    return (domain, ident) if sep else (driver, name)


def _attribute_value(value: Mapping[str, Any]) -> Any:
    if "int" in value:
        return int(value["int"])
    if "bool" in value:
        return bool(value["bool"])
    if "string" in value:
        return str(value["string"])
    if "version" in value:
        try:
            return make_semver(str(value["version"]))
        except ValueError:
            # The API server rejects these; keep the text rather than failing every selector.
            return str(value["version"])
    return None


class DeviceView:
    """One device as the CEL ``device`` variable; built once, reused for every selector."""

    def __init__(self, driver: str, device: Mapping[str, Any]) -> None:
        attributes: dict[str, dict[str, Any]] = {driver: {}}
        for name, value in (device.get("attributes") or {}).items():
            converted = _attribute_value(value or {})
            if converted is not None:
                domain, ident = _split(name, driver)
                attributes.setdefault(domain, {})[ident] = converted
        capacity: dict[str, dict[str, Any]] = {driver: {}}
        for name, cap in (device.get("capacity") or {}).items():
            raw = cap.get("value") if isinstance(cap, Mapping) else cap
            try:
                q = make_quantity(parse_quantity(str(raw)))
            except ValueError:
                continue
            domain, ident = _split(name, driver)
            capacity.setdefault(domain, {})[ident] = q
        self.driver = driver
        self.attributes = attributes
        self.capacity = capacity
        self.allow_multiple = bool(device.get("allowMultipleAllocations") or False)
        self._activations: dict[frozenset[str], Any] = {}
        self._results: dict[str, bool | str] = {}

    def check(self, selector: CompiledSelector) -> bool | str:
        """``selector.evaluate`` with the error as a string; cached per expression."""
        result = self._results.get(selector.expression)
        if result is None:
            try:
                result = selector.evaluate(self)
            except CelError as err:
                result = str(err)
            self._results[selector.expression] = result
        return result

    def activation(self, literals: frozenset[str]) -> Any:
        extra = frozenset(x for x in literals if x not in self.attributes or x not in self.capacity)
        act = self._activations.get(extra)
        if act is None:
            attributes: dict[str, Any] = {**{x: {} for x in extra}, **self.attributes}
            capacity: dict[str, Any] = {**{x: {} for x in extra}, **self.capacity}
            act = _env().Activation(
                {
                    "device": {
                        "driver": self.driver,
                        "attributes": attributes,
                        "capacity": capacity,
                        "allowMultipleAllocations": self.allow_multiple,
                    }
                }
            )
            self._activations[extra] = act
        return act


def device_view(driver: str, device: Mapping[str, Any]) -> DeviceView:
    """The view of a device, shared by every device with the same driver and content.

    Views (and the selector results they remember) depend only on that content, so repeated
    allocations over unchanged slices, as in the simulated scheduler, reuse them.
    """
    return _cached_view(driver, json.dumps(device, sort_keys=True, default=str))


@functools.lru_cache(maxsize=16384)
def _cached_view(driver: str, device_json: str) -> DeviceView:
    return DeviceView(driver, json.loads(device_json))


def evaluate_all(selectors: Iterable[CompiledSelector], device: DeviceView) -> bool:
    """All selectors true (short-circuit, in order); CelError from the first failing one."""
    return all(sel.evaluate(device) for sel in selectors)
