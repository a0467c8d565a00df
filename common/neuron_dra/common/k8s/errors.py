"""Typed errors for Kubernetes API calls.

Callers decide what to do by type, not by HTTP status:

- :class:`RetryableError` — try again later (conflicts, throttling, server trouble, network).
  :class:`ConflictError` (stale resourceVersion: re-read and retry) and :class:`GoneError`
  (expired resourceVersion: relist) are the two that need more than a backoff.
- :class:`PermanentError` — retrying the same request cannot succeed; a user or operator must
  change something (invalid object, missing RBAC). Its message should say what.
- :class:`NotFoundError` and :class:`AlreadyExistsError` are their own cases: for many callers
  they are normal outcomes (object already deleted, object already created), not failures.

``classify`` turns a ``kubernetes_asyncio`` ``ApiException``, an aiohttp/network error or a
timeout into one of these; our raw-dict client raises them directly.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException


class KubeError(Exception):
    """An error from (or on the way to) the API server.

    ``status`` is the HTTP status (0 when there was no response), ``reason`` the
    ``Status.reason`` (``Conflict``, ``AlreadyExists``, ``Expired``...), ``body`` the decoded
    ``Status`` object when the server sent one.
    """

    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        reason: str = "",
        body: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason
        self.body = body
        self.retry_after = retry_after

    @property
    def causes(self) -> list[dict[str, Any]]:
        """``Status.details.causes`` (per-field reasons on 422, field-manager conflicts on 409)."""
        if not self.body:
            return []
        details = self.body.get("details") or {}
        causes = details.get("causes") or []
        return [c for c in causes if isinstance(c, dict)]


class RetryableError(KubeError):
    retryable = True


class PermanentError(KubeError):
    retryable = False


class NotFoundError(KubeError):
    """404: the object (or its namespace, or the resource type) does not exist."""


class AlreadyExistsError(KubeError):
    """409 with reason ``AlreadyExists``: a create found the name taken. Not retryable as is."""


class ConflictError(RetryableError):
    """409 ``Conflict``: the write was based on a stale resourceVersion; re-read and retry."""


class GoneError(RetryableError):
    """410: the resourceVersion (or continue token) is too old; the caller must relist."""


class TooManyRequestsError(RetryableError):
    """429: throttled (API priority and fairness); honour ``retry_after``."""


class ServerError(RetryableError):
    """5xx: the server or something behind it failed; retry with backoff."""


class NetworkError(RetryableError):
    """No usable response: connection refused/reset, timeout, truncated body."""


class InvalidError(PermanentError):
    """422: the object fails validation; ``causes`` names the fields."""


class ForbiddenError(PermanentError):
    """403: RBAC (or an admission policy) forbids the request."""


class FieldManagerConflictError(PermanentError):
    """409 from server-side apply: another field manager owns fields we set.

    Retrying the same apply gives the same answer; resolve ownership or apply with force.
    """


def _decode_body(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, (bytes, bytearray)):
        raw = raw.decode("utf-8", "replace")
    if isinstance(raw, str) and raw:
        try:
            parsed = json.loads(raw)
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None
    return None


def _retry_after_header(headers: Any) -> float | None:
    if not headers:
        return None
    try:
        value = headers.get("Retry-After")
    except AttributeError:
        return None
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        # The HTTP-date form is never sent by kube-apiserver; ignore it rather than guess.
        return None


def from_response(
    status: int, body: Any, headers: Any = None, *, default_reason: str = ""
) -> KubeError:
    """Build the typed error for an HTTP error response (``body`` raw bytes/str or a dict)."""
    decoded = _decode_body(body)
    reason = default_reason
    message = ""
    retry_after = _retry_after_header(headers)
    if decoded is not None:
        reason = str(decoded.get("reason") or reason)
        message = str(decoded.get("message") or "")
        details = decoded.get("details") or {}
        if retry_after is None and isinstance(details, dict) and "retryAfterSeconds" in details:
            try:
                retry_after = float(details["retryAfterSeconds"])
            except (TypeError, ValueError):
                retry_after = None
    if not message:
        message = f"HTTP {status} {reason}".strip()
    kwargs: dict[str, Any] = {
        "status": status,
        "reason": reason,
        "body": decoded,
        "retry_after": retry_after,
    }
    if status == 404:
        return NotFoundError(message, **kwargs)
    if status == 409:
        if reason == "AlreadyExists":
            return AlreadyExistsError(message, **kwargs)
        err = ConflictError(message, **kwargs)
        # Server-side apply ownership conflicts carry FieldManagerConflict causes; the message
        # prefix is the kube-apiserver's wording, a fallback for servers that omit the causes.
        if any(c.get("type") == "FieldManagerConflict" for c in err.causes) or message.startswith(
            "Apply failed with"
        ):
            return FieldManagerConflictError(message, **kwargs)
        return err
    if status == 410:
        return GoneError(message, **kwargs)
    if status == 429:
        return TooManyRequestsError(message, **kwargs)
    if status == 422:
        return InvalidError(message, **kwargs)
    if status == 403:
        return ForbiddenError(message, **kwargs)
    if status == 401:
        # Bound service-account tokens rotate; the in-cluster config re-reads the token file on
        # each request, so a 401 right after rotation heals itself on retry.
        return RetryableError(message, **kwargs)
    if status == 408 or status >= 500:
        return ServerError(message, **kwargs)
    return PermanentError(message, **kwargs)


def from_status(obj: dict[str, Any]) -> KubeError:
    """Typed error for a ``Status`` object, e.g. the object of a watch ``ERROR`` event."""
    try:
        code = int(obj.get("code") or 500)
    except (TypeError, ValueError):
        code = 500
    return from_response(code, obj)


def classify(exc: BaseException) -> KubeError | None:
    """The typed error for ``exc``, or None if it is not an API/network error (a bug)."""
    if isinstance(exc, KubeError):
        return exc
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        if status == 0:
            return NetworkError(str(exc.reason or "no response"), reason=str(exc.reason or ""))
        return from_response(status, exc.body, exc.headers, default_reason=str(exc.reason or ""))
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return NetworkError(f"request timed out: {exc}", reason="Timeout")
    if isinstance(exc, aiohttp.ClientResponseError):
        return from_response(exc.status, None, exc.headers, default_reason=exc.message)
    if isinstance(exc, (aiohttp.ClientError, ConnectionError)):
        # ClientConnectorError, ServerDisconnectedError, ClientPayloadError (truncated body)...
        return NetworkError(f"{type(exc).__name__}: {exc}", reason=type(exc).__name__)
    return None


def is_retryable(exc: BaseException) -> bool:
    err = classify(exc)
    return err is not None and err.retryable


def is_permanent(exc: BaseException) -> bool:
    err = classify(exc)
    return isinstance(err, PermanentError)


def is_conflict(exc: BaseException) -> bool:
    """409 caused by a stale resourceVersion (not ``AlreadyExists``, not SSA field ownership)."""
    err = classify(exc)
    return type(err) is ConflictError


def is_already_exists(exc: BaseException) -> bool:
    return isinstance(classify(exc), AlreadyExistsError)


def is_not_found(exc: BaseException) -> bool:
    return isinstance(classify(exc), NotFoundError)


def is_gone(exc: BaseException) -> bool:
    return isinstance(classify(exc), GoneError)


def retry_after(exc: BaseException) -> float | None:
    """Seconds the server asked us to wait (``Retry-After`` or ``details.retryAfterSeconds``)."""
    err = classify(exc)
    return None if err is None else err.retry_after
