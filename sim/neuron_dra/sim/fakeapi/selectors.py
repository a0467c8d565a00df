"""Label and field selectors with kube-apiserver's syntax and restrictions.

Label selectors: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x,y)``, ``a``,
``!a``, ``a>1``/``a<1``, comma-separated and ANDed. Field selectors: ``f=v``, ``f==v``,
``f!=v`` where ``f`` must be one of the labels the real server supports for the kind;
anything else is rejected the way the real server rejects it, because code that
works only against a lenient fake breaks on a real cluster.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from neuron_dra.common import names

Matcher = Callable[[dict[str, Any]], bool]


class SelectorError(ValueError):
    """An unparsable or unsupported selector (the server answers 400 BadRequest)."""


_QUALIFIED = re.compile("^" + names.QUALIFIED_NAME_FMT + "$")
_PREFIX = re.compile("^" + names.DNS1123_SUBDOMAIN_FMT + "$")
_VALUE = re.compile("^" + names.LABEL_VALUE_FMT + "$")


def _check_key(key: str) -> None:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _PREFIX.match(prefix)):
        raise SelectorError(f"unable to parse requirement: invalid label key {key!r}")
    if not name or len(name) > 63 or not _QUALIFIED.match(name):
        raise SelectorError(
            f"unable to parse requirement: invalid label key {key!r}: name part must consist "
            "of alphanumeric characters, '-', '_' or '.', and must start and end with an "
            "alphanumeric character"
        )


def _check_value(value: str) -> None:
    if len(value) > 63 or not _VALUE.match(value):
        raise SelectorError(
            f"unable to parse requirement: invalid label value: {value!r}: a valid label must "
            "be an empty string or consist of alphanumeric characters, '-', '_' or '.', and "
            "must start and end with an alphanumeric character"
        )


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", ">", "<"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        op = self.op
        if op == "exists":
            return self.key in labels
        if op == "!":
            return self.key not in labels
        if op in ("=", "in"):
            return self.key in labels and labels[self.key] in self.values
        if op in ("!=", "notin"):
            # Like the real server: a missing label satisfies != and notin.
            return self.key not in labels or labels[self.key] not in self.values
        try:
            have = int(labels[self.key])
        except (KeyError, ValueError):
            return False
        want = int(self.values[0])
        return have > want if op == ">" else have < want


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside ``( ... )``."""
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError("unable to parse requirement: unbalanced ')'")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise SelectorError("unable to parse requirement: missing ')'")
    parts.append("".join(cur))
    return parts


_SET_RE = re.compile(r"^\s*(\S+)\s+(in|notin)\s*\((.*)\)\s*$")
_CMP_RE = re.compile(r"^\s*([^!=<>\s]+)\s*(==|=|!=|>|<)\s*(.*?)\s*$")


def parse_label_selector(text: str | None) -> list[Requirement]:
    """Parse a label selector string; empty/None selects everything."""
    if not text or not text.strip():
        return []
    reqs: list[Requirement] = []
    for raw in _split_top(text):
        part = raw.strip()
        if not part:
            raise SelectorError(f"unable to parse requirement: empty requirement in {text!r}")
        m = _SET_RE.match(part)
        if m:
            key, op, inner = m.group(1), m.group(2), m.group(3)
            _check_key(key)
            values = tuple(v.strip() for v in inner.split(",")) if inner.strip() else ()
            if not values:
                raise SelectorError(
                    f"unable to parse requirement: for '{op}' operators, values set can't be empty"
                )
            for v in values:
                _check_value(v)
            reqs.append(Requirement(key, op, values))
            continue
        if part.startswith("!"):
            key = part[1:].strip()
            _check_key(key)
            reqs.append(Requirement(key, "!"))
            continue
        m = _CMP_RE.match(part)
        if m:
            key, op, value = m.group(1), m.group(2), m.group(3)
            _check_key(key)
            if op in (">", "<"):
                try:
                    int(value)
                except ValueError:
                    raise SelectorError(
                        f"unable to parse requirement: for 'Gt', 'Lt' operators, the value "
                        f"must be an integer, got {value!r}"
                    ) from None
            else:
                _check_value(value)
            reqs.append(Requirement(key, "=" if op == "==" else op, (value,)))
            continue
        if re.match(r"^[^\s=!<>(),]+$", part):
            _check_key(part)
            reqs.append(Requirement(part, "exists"))
            continue
        raise SelectorError(f"unable to parse requirement: couldn't parse {part!r}")
    return reqs


def label_matcher(text: str | None) -> Matcher | None:
    """A predicate over whole objects, or None when the selector selects everything."""
    reqs = parse_label_selector(text)
    if not reqs:
        return None

    def match(obj: dict[str, Any]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(r.matches(labels) for r in reqs)

    return match


def _unescape(s: str) -> str:
    return re.sub(r"\\(.)", r"\1", s)


def _split_unescaped(s: str, sep: str) -> list[str]:
    out: list[str] = []
    cur: list[str] = []
    it = iter(s)
    for ch in it:
        if ch == "\\":
            cur.append(ch)
            cur.append(next(it, ""))
        elif ch == sep:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


def field_value(obj: dict[str, Any], label: str) -> str:
    """The string value of a dotted field (``""`` when absent, like the real server)."""
    cur: Any = obj
    for part in label.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
        if cur is None:
            return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    if isinstance(cur, list):
        # status.podIPs: the real server matches on the first IP.
        first = cur[0] if cur else {}
        return str(first.get("ip", "")) if isinstance(first, dict) else str(first)
    return str(cur)


def parse_field_selector(text: str | None, allowed: Iterable[str]) -> list[tuple[str, str, str]]:
    """Parse into (field, op, value) triples; unknown fields raise SelectorError."""
    if not text or not text.strip():
        return []
    allowed_set = frozenset(allowed)
    out: list[tuple[str, str, str]] = []
    for raw in _split_unescaped(text, ","):
        part = raw.strip()
        if not part:
            continue
        for op in ("!=", "==", "="):
            idx = _find_unescaped(part, op)
            if idx >= 0:
                field, value = part[:idx].strip(), _unescape(part[idx + len(op) :].strip())
                break
        else:
            raise SelectorError(f"invalid selector: '{part}'; can't understand '{part}'")
        if field not in allowed_set:
            raise SelectorError(f"field label not supported: {field}")
        out.append((field, "!=" if op == "!=" else "=", value))
    return out


def _find_unescaped(s: str, token: str) -> int:
    i = 0
    while i < len(s):
        if s[i] == "\\":
            i += 2
            continue
        if s.startswith(token, i):
            return i
        i += 1
    return -1


def field_matcher(text: str | None, allowed: Iterable[str]) -> Matcher | None:
    terms = parse_field_selector(text, allowed)
    if not terms:
        return None

    def match(obj: dict[str, Any]) -> bool:
        for field, op, value in terms:
            have = field_value(obj, field)
            if (have == value) != (op == "="):
                return False
        return True

    return match


def combine(*matchers: Matcher | None) -> Matcher | None:
    active = [m for m in matchers if m is not None]
    if not active:
        return None
    if len(active) == 1:
        return active[0]
    return lambda obj: all(m(obj) for m in active)
