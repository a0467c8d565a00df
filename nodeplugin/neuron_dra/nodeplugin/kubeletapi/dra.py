"""``DRAPlugin`` servicer (v1 and v1beta1): kubelet calls -> ``DriverBackend``.

Rules (the kubelet's DRA manager): the kubelet discards a whole response with a
non-OK status and fails the pod with an error that names no claim, so a non-OK status is
kept for requests we cannot even interpret. Everything that goes wrong for a claim becomes
that claim's ``error`` (which the kubelet puts into the pod's events), and every claim of
the request gets an entry keyed by its UID, with no extra keys.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import grpc

from ._proto import DraCodec, Message
from .model import (
    DEFAULT_BUDGET,
    ClaimRef,
    DriverBackend,
    PrepareResult,
    UnprepareResult,
    validate_budget,
)

log = logging.getLogger(__name__)

#: A call that took longer than this is logged at INFO even when every claim succeeded.
SLOW_CALL_SECONDS = 1.0

R = TypeVar("R", PrepareResult, UnprepareResult)


class InvalidRequest(ValueError):
    """The request is malformed as a whole (answered with INVALID_ARGUMENT)."""


def unique_claims(claims: Sequence[ClaimRef]) -> list[ClaimRef]:
    """The request's claims without repeats; raises ``InvalidRequest`` for bad entries.

    The three fields are required by the API. A UID listed twice with the same
    namespace/name is harmless (one map entry answers both), but with different ones the
    single answer would be wrong for one of them.
    """
    seen: dict[str, ClaimRef] = {}
    for i, claim in enumerate(claims):
        missing = [f for f in ("namespace", "uid", "name") if not getattr(claim, f)]
        if missing:
            raise InvalidRequest(f"claims[{i}]: {', '.join(missing)} must not be empty")
        other = seen.setdefault(claim.uid, claim)
        if other != claim:
            raise InvalidRequest(
                f"claim UID {claim.uid} is listed as both {other.key} and {claim.key}"
            )
    return list(seen.values())


class _BudgetExpired(Exception):
    pass


def _timeout_message(budget: str, verb: str, claim: ClaimRef) -> str:
    return f"timed out after {budget}s {verb} claim {claim.key}; the kubelet will retry"


def _failure_message(verb: str, reason: str, claim: ClaimRef) -> str:
    return f"{verb} claim {claim.key} failed: {reason}"


def _describe(claims: Sequence[ClaimRef]) -> list[str]:
    return [f"{c.key}:{c.uid}" for c in claims]


class DraServicer:
    """One instance per API version; all versions share the backend."""

    def __init__(
        self,
        codec: DraCodec,
        backend: DriverBackend,
        *,
        budget: float = DEFAULT_BUDGET,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._codec = codec
        self._backend = backend
        self._budget = validate_budget(budget)
        self._clock = clock

    # Method names are fixed by the generated handler table.

    async def NodePrepareResources(self, request: Message, context: Any) -> Message:
        claims = await self._claims_or_abort(request, context, "NodePrepareResources")
        results = await self._call(
            "NodePrepareResources", "preparing", claims, self._backend.prepare, PrepareResult
        )
        return self._codec.prepare_response(results)

    async def NodeUnprepareResources(self, request: Message, context: Any) -> Message:
        claims = await self._claims_or_abort(request, context, "NodeUnprepareResources")
        results = await self._call(
            "NodeUnprepareResources",
            "unpreparing",
            claims,
            self._backend.unprepare,
            UnprepareResult,
        )
        return self._codec.unprepare_response(results)

    async def _claims_or_abort(self, request: Message, context: Any, method: str) -> list[ClaimRef]:
        try:
            return unique_claims(self._codec.claims(request))
        except InvalidRequest as exc:
            log.warning(
                "%s: rejecting malformed request: %s",
                method,
                exc,
                extra={"api": self._codec.version},
            )
            # abort() raises, ending the RPC with this status.
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise AssertionError("unreachable: context.abort returned") from exc

    async def _call(
        self,
        method: str,
        verb: str,
        claims: list[ClaimRef],
        backend_call: Callable[[Sequence[ClaimRef]], Awaitable[Mapping[str, R]]],
        result_type: type[R],
    ) -> dict[str, R]:
        # Per call, only at debug level when all goes well: the backend logs each claim it
        # prepares, and on a busy node formatting and writing two more lines per call is a
        # measurable part of a ~5 ms Prepare (issue #3).
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: %d claim(s)", method, len(claims), extra=self._extra(claims))
        if not claims:
            return {}
        start = self._clock()
        got: Mapping[str, R] = {}
        # Set when the batch as a whole failed: the error text for each claim.
        batch_error: Callable[[ClaimRef], str] | None = None
        try:
            got = await self._within_budget(backend_call, claims)
        except _BudgetExpired:
            log.error(
                "%s: no answer within the %gs budget",
                method,
                self._budget,
                extra=self._extra(claims),
            )
            batch_error = functools.partial(_timeout_message, f"{self._budget:g}", verb)
        except Exception as exc:
            log.exception(
                "%s: backend failed for the whole batch", method, extra=self._extra(claims)
            )
            batch_error = functools.partial(_failure_message, verb, str(exc) or repr(exc))

        results = self._complete(method, verb, claims, got, batch_error, result_type)
        failed = {uid: r.error for uid, r in results.items() if r.error}
        took = self._clock() - start
        level = logging.INFO if failed or took > SLOW_CALL_SECONDS else logging.DEBUG
        if log.isEnabledFor(level):
            extra = self._extra(claims)
            if failed:
                extra["errors"] = failed
            log.log(level, "%s: done in %.3fs, %d failed", method, took, len(failed), extra=extra)
        return results

    def _extra(self, claims: Sequence[ClaimRef]) -> dict[str, object]:
        return {"api": self._codec.version, "claims": _describe(claims)}

    async def _within_budget(
        self,
        backend_call: Callable[[Sequence[ClaimRef]], Awaitable[Mapping[str, R]]],
        claims: list[ClaimRef],
    ) -> Mapping[str, R]:
        # On expiry the backend is cancelled, like a Go context deadline: letting it run
        # on would race with the kubelet's retry of the same claims.
        try:
            async with asyncio.timeout(self._budget) as deadline:
                return await backend_call(claims)
        except TimeoutError as exc:
            if deadline.expired():
                raise _BudgetExpired from exc
            raise  # the backend's own TimeoutError: an ordinary batch failure

    def _complete(
        self,
        method: str,
        verb: str,
        claims: list[ClaimRef],
        got: Mapping[str, R],
        batch_error: Callable[[ClaimRef], str] | None,
        result_type: type[R],
    ) -> dict[str, R]:
        """One result per requested claim, in request order, and nothing else."""
        wanted = {c.uid for c in claims}
        unknown = sorted(set(got) - wanted)
        if unknown:
            # The kubelet rejects the whole response for a UID it did not ask about.
            log.warning("%s: dropping results for claims not in the request: %s", method, unknown)
        out: dict[str, R] = {}
        for claim in claims:
            result = got.get(claim.uid)
            if batch_error is not None:
                result = result_type(error=batch_error(claim))
            elif result is None:
                log.error(
                    "%s: backend returned no result for claim %s (%s)", method, claim.key, claim.uid
                )
                result = result_type(
                    error=f"internal error: the driver returned no result {verb} claim "
                    f"{claim.key}; the kubelet will retry"
                )
            out[claim.uid] = result
        return out
