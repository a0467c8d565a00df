"""CEL rules of CRD schemas (``x-kubernetes-validations``) for the fake API server: compiling a
rule when the CRD is loaded and evaluating it to the real server's error text.

A bad rule fails at load (``SchemaError``), as ``kubectl apply`` of the CRD would. Transition
rules (rules that use ``oldSelf``) are told apart by compiling without ``oldSelf`` first.

Supported rule fields: ``rule``, ``message``, ``fieldPath``. ``messageExpression``, ``reason``
and ``optionalOldSelf`` are refused at load (our CRDs do not use them; the real tier judges
CRDs that do). ``self`` is DYN, so ``self.noSuchField`` compiles and fails at runtime instead
of at CRD creation; the Kubernetes CEL libraries (``quantity()``, ``isSorted()``, ``url()``...)
are absent (only cel-go's ``strings``, ``optional`` and ``cel.bind``); CEL cost limits are not
enforced.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings

__all__ = ["Rule", "SchemaError", "compile_rule", "evaluate_rule", "parse_field_path"]

_UNSUPPORTED_RULE_FIELDS = ("messageExpression", "reason", "optionalOldSelf")


class SchemaError(ValueError):
    """The schema (or one of its CEL rules) is unusable; raised when a CRD is loaded."""


@functools.cache
def _env(transition: bool) -> Any:
    dyn = cel.Type.DYN
    variables: dict[str, Any] = {"self": dyn, "oldSelf": dyn} if transition else {"self": dyn}
    extensions = [ext_strings.ExtStrings(), ext_optional.ExtOptional(), ext_bindings.ExtBindings()]
    return cel.NewEnv(variables=variables, extensions=extensions)


@functools.lru_cache(maxsize=4096)
def _compile_cached(expr: str, transition: bool) -> Any:
    """Compile once per (expression, environment); CRDs are reloaded by every test server."""
    return _env(transition).compile(expr)


def _cel_error_text(err: BaseException) -> str:
    """cel-cpp status text without the ``INVALID_ARGUMENT:`` wrapper."""
    text = re.sub(r"^[A-Z_]+: ", "", str(err).strip())
    return re.sub(r"\s*\[[A-Z_]+\]$", "", text)


def _return_type(program: Any) -> str:
    try:
        return str(program.return_type().name())
    except Exception:  # pragma: no cover - defensive: older bindings
        return "DYN"


@dataclass(frozen=True)
class Rule:
    rule: str
    message: str
    program: Any
    transition: bool  # uses oldSelf: runs only on update, where an old value correlates
    field_path: str

    def default_message(self) -> str:
        return self.message or f"failed rule: {self.rule.strip()}"

    def error_string(self) -> str:
        return self.message or self.rule.strip()


# The checker names the whole dotted reference it could not resolve: 'oldSelf' or 'oldSelf.x'.
_USES_OLD_SELF = re.compile(r"undeclared reference to 'oldSelf[.']")


def compile_rule(raw: Any, where: str, correlatable: bool) -> Rule:
    if not isinstance(raw, dict):
        raise SchemaError(f"{where}: must be an object")
    for name in _UNSUPPORTED_RULE_FIELDS:
        if name in raw:
            raise SchemaError(f"{where}.{name}: not supported by the fake API server")
    rule = raw.get("rule")
    if not isinstance(rule, str) or not rule.strip():
        raise SchemaError(f"{where}.rule: Required value")
    transition = False
    try:
        program = _compile_cached(rule, False)
    except RuntimeError as err:
        if not _USES_OLD_SELF.search(str(err)):
            raise SchemaError(
                f"{where}.rule: Invalid value: {rule!r}: compilation failed: {_cel_error_text(err)}"
            ) from None
        transition = True
        try:
            program = _compile_cached(rule, True)
        except RuntimeError as err2:
            raise SchemaError(
                f"{where}.rule: Invalid value: {rule!r}: compilation failed: "
                f"{_cel_error_text(err2)}"
            ) from None
    if transition and not correlatable:
        raise SchemaError(
            f"{where}.rule: Forbidden: oldSelf cannot be used on the uncorrelatable portion of "
            "the schema (inside items of a list that is not x-kubernetes-list-type=map)"
        )
    if _return_type(program) not in ("BOOL", "DYN"):
        raise SchemaError(f"{where}.rule: Invalid value: {rule!r}: must evaluate to a bool")
    message = raw.get("message") or ""
    if not isinstance(message, str):
        raise SchemaError(f"{where}.message: must be a string")
    message = message.strip()
    if "\n" in message:
        raise SchemaError(f"{where}.message: Invalid value: message must not contain line breaks")
    return Rule(
        rule=rule,
        message=message,
        program=program,
        transition=transition,
        field_path=str(raw.get("fieldPath") or ""),
    )


_FIELD_PATH_TOKEN = re.compile(r"\.([A-Za-z_$][A-Za-z0-9_$-]*)|\['((?:[^'\\]|\\.)*)'\]")


def parse_field_path(text: str) -> list[str]:
    """``.spec.a['b.c']`` -> ["spec", "a", "b.c"]; raises ValueError on anything else."""
    names: list[str] = []
    pos = 0
    while pos < len(text):
        m = _FIELD_PATH_TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"invalid field path at {text[pos:]!r}")
        names.append(m.group(1) if m.group(1) is not None else m.group(2).replace("\\'", "'"))
        pos = m.end()
    if not names:
        raise ValueError("field path must not be empty")
    return names


def _eval_error_text(raw: Any) -> str:
    """Runtime error values, phrased like cel-go where the cause is common."""
    text = str(raw)
    missing = re.match(r'NOT_FOUND: Key not found in map : "?(.*?)"?$', text)
    if missing:
        return f"no such key: {missing.group(1)}"
    return re.sub(r"^[A-Z_]+: ", "", text)


def evaluate_rule(rule: Rule, data: dict[str, Any]) -> tuple[str, bool] | None:
    """None if the rule holds, else the detail of the real server's ``Invalid value`` error and
    whether the rule evaluated to false (then the error goes to its ``fieldPath``), as opposed
    to not evaluating at all (then it stays at the rule's node)."""
    try:
        result = rule.program.eval(data=data)
        kind = result.type().name()
        raw = result.value()
    except Exception as exc:  # the binding raises for values it cannot convert
        kind, raw = "ERROR", str(exc)
    if kind == "ERROR":
        text = _eval_error_text(raw)
        if text.startswith("No matching overloads") or "no matching overload" in text:
            return (
                f"'{text}': call arguments did not match a supported operator, function or "
                f"macro signature for rule: {rule.error_string()}"
            ), False
        return f"{text} evaluating rule: {rule.error_string()}", False
    if raw is True:
        return None
    if kind != "BOOL":
        return f"rule did not evaluate to a bool: {rule.error_string()}", False
    return rule.default_message(), True
