"""Compilation of DRA device selectors (``cel.expression``) for the fake API server's
validation, as kube-apiserver 1.34 compiles them.

The Kubernetes quantity and semver CEL libraries are declared for compilation only: evaluating
selectors is the simulated scheduler's business (the ``allocation`` package next door, which
this package may not import). ``device`` is DYN, so only syntax, unknown functions, literal
type errors and unknown top-level ``device`` fields are caught (not e.g.
``device.attributes["x"].y > "a"``); the other Kubernetes CEL libraries (lists, regex extras,
ip/cidr/url, format) are absent and CEL cost limits are not enforced.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings

__all__ = ["compile_device_selector"]

_DEVICE_FIELDS = ("driver", "attributes", "capacity", "allowMultipleAllocations")
_STRING_LITERAL = re.compile(r"""(?:[rRbB]{0,2})("(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')""")
_DEVICE_FIELD_REF = re.compile(r"(?<![\w.])device\s*\.\s*([A-Za-z_]\w*)")


def _selector_functions() -> list[Any]:
    """Declarations (no implementations) of the Kubernetes quantity and semver CEL libraries.

    Selectors such as ``device.capacity[d].memory.compareTo(quantity("8Gi")) >= 0`` must
    compile here as they do on the real server; evaluating them is the simulated scheduler's
    business.
    """
    semver_t = cel.Type.AbstractType("kubernetes.Semver")
    quantity_t = cel.Type.AbstractType("kubernetes.Quantity")
    s, b, i, d = cel.Type.STRING, cel.Type.BOOL, cel.Type.INT, cel.Type.DOUBLE

    def fn(name: str, *overloads: tuple[str, Any, list[Any], bool]) -> Any:
        return cel.FunctionDecl(
            name,
            [
                cel.Overload(oid, ret, params, is_member=member)
                for oid, ret, params, member in overloads
            ],
        )

    q, v = quantity_t, semver_t
    return [
        fn("quantity", ("string_to_quantity", q, [s], False)),
        fn("isQuantity", ("is_quantity_string", b, [s], False)),
        fn(
            "semver",
            ("string_to_semver", v, [s], False),
            ("string_bool_to_semver", v, [s, b], False),
        ),
        fn(
            "isSemver",
            ("is_semver_string", b, [s], False),
            ("is_semver_string_bool", b, [s, b], False),
        ),
        fn("isInteger", ("quantity_is_integer", b, [q], True)),
        fn("asInteger", ("quantity_as_integer", i, [q], True)),
        fn("asApproximateFloat", ("quantity_as_float", d, [q], True)),
        fn("sign", ("quantity_sign", i, [q], True)),
        fn("add", ("quantity_add", q, [q, q], True), ("quantity_add_int", q, [q, i], True)),
        fn("sub", ("quantity_sub", q, [q, q], True), ("quantity_sub_int", q, [q, i], True)),
        fn("isLessThan", ("quantity_less", b, [q, q], True), ("semver_less", b, [v, v], True)),
        fn(
            "isGreaterThan",
            ("quantity_greater", b, [q, q], True),
            ("semver_greater", b, [v, v], True),
        ),
        fn("compareTo", ("quantity_compare", i, [q, q], True), ("semver_compare", i, [v, v], True)),
        fn("major", ("semver_major", i, [v], True)),
        fn("minor", ("semver_minor", i, [v], True)),
        fn("patch", ("semver_patch", i, [v], True)),
    ]


@functools.cache
def _selector_env() -> Any:
    return cel.NewEnv(
        variables={"device": cel.Type.DYN},
        functions=_selector_functions(),
        extensions=[
            ext_strings.ExtStrings(),
            ext_optional.ExtOptional(),
            ext_bindings.ExtBindings(),
        ],
    )


def _clean_cel_error(err: BaseException) -> str:
    text = re.sub(r"^[A-Z_]+: ", "", str(err).strip())
    return re.sub(r"\s*\[[A-Z_]+\]$", "", text)


@functools.lru_cache(maxsize=2048)
def compile_device_selector(expression: str) -> tuple[Any | None, str | None]:
    """(program, None) or (None, message) for a DRA ``cel.expression``; cached per text."""
    # ``device`` is DYN here, so catch the typed environment's "undefined field" by hand.
    unquoted = _STRING_LITERAL.sub('""', expression)
    for match in _DEVICE_FIELD_REF.finditer(unquoted):
        if match.group(1) not in _DEVICE_FIELDS:
            return None, f"compilation failed: ERROR: <input>: undefined field '{match.group(1)}'"
    try:
        program = _selector_env().compile(expression)
    except RuntimeError as err:
        return None, f"compilation failed: {_clean_cel_error(err)}"
    if program.return_type().name() not in ("BOOL", "DYN"):
        return None, "must evaluate to bool"
    return program, None
