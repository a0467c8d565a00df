"""Error classification for ApiException, HTTP responses, Status objects and network errors."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio.client.exceptions import ApiException
from multidict import CIMultiDict, CIMultiDictProxy
from neuron_dra.common.k8s import errors as e


def api_exc(status: int, body: dict[str, Any] | None = None, **headers: str) -> ApiException:
    exc = ApiException(status=status, reason="x")
    exc.body = json.dumps(body).encode() if body is not None else None
    exc.headers = CIMultiDictProxy(CIMultiDict(headers)) if headers else None
    return exc


def status_body(code: int, reason: str, **details: Any) -> dict[str, Any]:
    b: dict[str, Any] = {"kind": "Status", "code": code, "reason": reason, "message": "msg"}
    if details:
        b["details"] = details
    return b


@pytest.mark.parametrize(
    ("status", "reason", "cls", "retryable"),
    [
        (400, "BadRequest", e.PermanentError, False),
        (401, "Unauthorized", e.RetryableError, True),
        (403, "Forbidden", e.ForbiddenError, False),
        (404, "NotFound", e.NotFoundError, False),
        (405, "MethodNotAllowed", e.PermanentError, False),
        (409, "Conflict", e.ConflictError, True),
        (409, "AlreadyExists", e.AlreadyExistsError, False),
        (410, "Expired", e.GoneError, True),
        (415, "UnsupportedMediaType", e.PermanentError, False),
        (422, "Invalid", e.InvalidError, False),
        (429, "TooManyRequests", e.TooManyRequestsError, True),
        (500, "InternalError", e.ServerError, True),
        (503, "ServiceUnavailable", e.ServerError, True),
        (504, "Timeout", e.ServerError, True),
    ],
)
def test_classify_status(status: int, reason: str, cls: type, retryable: bool) -> None:
    err = e.classify(api_exc(status, status_body(status, reason)))
    assert err is not None and type(err) is cls
    assert err.status == status and err.reason == reason and err.message == "msg"
    assert e.is_retryable(api_exc(status, status_body(status, reason))) is retryable


def test_not_found_is_its_own_case() -> None:
    exc = api_exc(404, status_body(404, "NotFound"))
    assert e.is_not_found(exc)
    assert not e.is_retryable(exc) and not e.is_permanent(exc)


def test_conflict_helpers_distinguish_409s() -> None:
    stale = api_exc(409, status_body(409, "Conflict"))
    exists = api_exc(409, status_body(409, "AlreadyExists"))
    owners = api_exc(
        409,
        status_body(409, "Conflict", causes=[{"type": "FieldManagerConflict", "field": ".x"}]),
    )
    assert e.is_conflict(stale)
    assert not e.is_conflict(exists) and e.is_already_exists(exists)
    assert not e.is_conflict(owners)
    assert isinstance(e.classify(owners), e.FieldManagerConflictError)
    assert e.is_permanent(owners)


def test_gone() -> None:
    assert e.is_gone(api_exc(410, status_body(410, "Expired")))
    assert not e.is_gone(api_exc(404))


def test_retry_after_header_and_details() -> None:
    assert e.retry_after(api_exc(429, status_body(429, "TooManyRequests"), **{"Retry-After": "3"}))
    assert e.retry_after(api_exc(429, None, **{"Retry-After": "3"})) == 3.0
    assert e.retry_after(api_exc(429, status_body(429, "x", retryAfterSeconds=7))) == 7.0
    assert e.retry_after(api_exc(500, status_body(500, "x"))) is None
    assert e.retry_after(ValueError()) is None


def test_unparseable_body_still_classified() -> None:
    exc = ApiException(status=503, reason="Service Unavailable")
    exc.body = b"<html>bad gateway</html>"
    err = e.classify(exc)
    assert isinstance(err, e.ServerError) and err.reason == "Service Unavailable"
    assert err.body is None


def test_invalid_causes() -> None:
    causes = [{"reason": "FieldValueRequired", "message": "Required value", "field": "spec.x"}]
    err = e.classify(api_exc(422, status_body(422, "Invalid", causes=causes)))
    assert isinstance(err, e.InvalidError) and err.causes == causes


@pytest.mark.parametrize(
    "exc",
    [
        TimeoutError(),
        TimeoutError(),
        ConnectionResetError(),
        aiohttp.ServerDisconnectedError(),
        aiohttp.ClientPayloadError("truncated"),
        ApiException(status=0, reason="connection refused"),
    ],
)
def test_network_errors_are_retryable(exc: BaseException) -> None:
    err = e.classify(exc)
    assert isinstance(err, e.NetworkError) and err.retryable


def test_bugs_are_not_classified() -> None:
    assert e.classify(KeyError("x")) is None
    assert not e.is_retryable(KeyError("x")) and not e.is_permanent(KeyError("x"))


def test_typed_errors_pass_through() -> None:
    err = e.GoneError("old", status=410)
    assert e.classify(err) is err and e.is_gone(err)


def test_from_status_for_watch_error_events() -> None:
    err = e.from_status({"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"})
    assert isinstance(err, e.GoneError) and str(err) == "too old"
    assert isinstance(e.from_status({"kind": "Status", "message": "?"}), e.ServerError)


def test_apply_conflict_recognised_by_message() -> None:
    body = status_body(409, "Conflict")
    body["message"] = 'Apply failed with 1 conflict: conflict with "other": .spec.x'
    assert isinstance(e.classify(api_exc(409, body)), e.FieldManagerConflictError)
