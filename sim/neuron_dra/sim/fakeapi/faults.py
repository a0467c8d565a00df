"""Fault injection for the fake API server.

Controllers have to survive conflicts, throttling, server errors, dropped watches
and compacted history; these knobs make each of those happen on demand, either
in-process (``server.faults.fail_next(...)``) or over HTTP under ``/fake/...``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from .errors import status

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass
class RequestInfo:
    """What a request is, in the apiserver's own terms (verb, resource, ...)."""

    verb: str  # get list watch create update patch delete deletecollection (or "" for non-API)
    method: str
    path: str
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str | None = None
    name: str | None = None
    content_type: str = ""
    body_bytes: bytes = b""
    _body: Any = field(default=None, repr=False)
    _parsed: bool = field(default=False, repr=False)

    @property
    def body(self) -> Any:
        """The decoded request body (JSON or YAML), None when absent or undecodable."""
        if not self._parsed:
            self._parsed = True
            if self.body_bytes:
                try:
                    self._body = json.loads(self.body_bytes)
                except ValueError:
                    try:
                        self._body = yaml.safe_load(self.body_bytes)
                    except yaml.YAMLError:
                        self._body = None
        return self._body

    @property
    def is_write(self) -> bool:
        return self.verb in WRITE_VERBS


Predicate = Callable[[RequestInfo], bool]


@dataclass
class FailRule:
    remaining: int
    code: int
    verb: str | None = None
    resource: str | None = None
    predicate: Predicate | None = None
    message: str | None = None
    # Commit the write, then answer with the error: the "response lost" crash case where a
    # controller must not assume its write failed.
    after_commit: bool = False

    def matches(self, req: RequestInfo) -> bool:
        if not req.verb:
            return False
        if self.verb is not None and req.verb != self.verb:
            return False
        if self.resource is not None:
            full = f"{req.resource}/{req.subresource}" if req.subresource else req.resource
            if self.resource not in (req.resource, full):
                return False
        return self.predicate is None or bool(self.predicate(req))


def fault_status(code: int, req: RequestInfo, message: str | None) -> tuple[dict[str, Any],
                                                                              dict[str, str]]:
    """The Status body and headers the real server sends for ``code``."""
    what = f"{req.resource}.{req.group}" if req.group else req.resource
    name = req.name or ""
    if code == 409:
        msg = message or (
            f'Operation cannot be fulfilled on {what} "{name}": the object has been modified; '
            "please apply your changes to the latest version and try again"
        )
        return status(409, "Conflict", msg, name=name or None, group=req.group or None,
                      kind=req.resource or None), {}
    if code == 429:
        msg = message or "the server has received too many requests and has asked us to try " \
                         "again later"
        return status(429, "TooManyRequests", msg, retry_after_seconds=1), {"Retry-After": "1"}
    if code == 500:
        return status(500, "InternalError",
                      f"Internal error occurred: {message or 'injected fault'}"), {}
    if code == 503:
        return status(503, "ServiceUnavailable", message or "the server is currently unable "
                      "to handle the request"), {"Retry-After": "1"}
    if code == 504:
        return status(504, "Timeout", message or "the server was unable to return a response "
                      "in the time allotted"), {}
    if code == 404:
        return status(404, "NotFound", message or f'{what} "{name}" not found'), {}
    if code == 403:
        return status(403, "Forbidden", message or "forbidden"), {}
    return status(code, "Unknown", message or f"injected fault {code}"), {}


class FaultInjector:
    """Programmable failures; the server consults it for every API request."""

    def __init__(
        self,
        *,
        on_drop_watches: Callable[[], int] | None = None,
        on_compact: Callable[[], int] | None = None,
    ) -> None:
        self._rules: list[FailRule] = []
        self._latency: dict[str | None, float] = {}
        self._on_drop = on_drop_watches
        self._on_compact = on_compact
        self.injected = 0  # how many requests were failed on purpose
        # (verb, path, seconds) of every request held back by injected latency, so a test
        # can check which requests the latency hit without timing the machine.
        self.delayed: list[tuple[str, str, float]] = []

    def fail_next(
        self,
        n: int = 1,
        code: int = 500,
        *,
        verb: str | None = None,
        resource: str | None = None,
        predicate: Predicate | None = None,
        message: str | None = None,
        after_commit: bool = False,
    ) -> FailRule:
        """Fail the next ``n`` requests matching verb/resource/predicate with ``code``.

        ``resource`` is a plural (``leases``) or plural/subresource (``pods/status``).
        """
        rule = FailRule(n, code, verb, resource, predicate, message, after_commit)
        self._rules.append(rule)
        return rule

    def fail_next_write(
        self,
        predicate: Predicate | None = None,
        code: int = 500,
        *,
        n: int = 1,
        resource: str | None = None,
        after_commit: bool = False,
        message: str | None = None,
    ) -> FailRule:
        """Fail the next write (create/update/patch/delete) for which ``predicate`` holds."""

        def is_matching_write(req: RequestInfo) -> bool:
            return req.is_write and (predicate is None or bool(predicate(req)))

        return self.fail_next(n, code, resource=resource, predicate=is_matching_write,
                              message=message, after_commit=after_commit)

    def set_latency(self, seconds: float, *, verb: str | None = None) -> None:
        """Delay every request (or only ``verb``) by ``seconds``; 0 removes the delay."""
        if seconds <= 0:
            self._latency.pop(verb, None)
        else:
            self._latency[verb] = seconds

    def drop_watches(self) -> int:
        """Close every open watch stream (clients see a clean end of stream)."""
        return self._on_drop() if self._on_drop else 0

    def compact(self) -> int:
        """Forget the event history; returns the version history now starts after."""
        return self._on_compact() if self._on_compact else 0

    def clear(self) -> None:
        self._rules.clear()
        self._latency.clear()

    @property
    def pending_rules(self) -> int:
        return sum(r.remaining for r in self._rules)

    # -- used by the server
    def latency_for(self, req: RequestInfo) -> float:
        """How long to hold ``req`` back; the server calls this once per request and sleeps
        that long, so a positive answer is recorded in ``delayed``."""
        delay = max(self._latency.get(req.verb, 0.0), self._latency.get(None, 0.0))
        if delay > 0:
            self.delayed.append((req.verb, req.path, delay))
        return delay

    def take(self, req: RequestInfo) -> FailRule | None:
        """The first rule matching ``req``, consuming one of its remaining failures."""
        for rule in self._rules:
            if rule.remaining > 0 and rule.matches(req):
                rule.remaining -= 1
                if rule.remaining <= 0:
                    self._rules.remove(rule)
                self.injected += 1
                return rule
        return None
