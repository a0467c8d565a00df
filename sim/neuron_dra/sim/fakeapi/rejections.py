"""The ApiErrors the verbs answer with, worded and shaped as kube-apiserver's are (clients
and tests match on reason, code and message)."""

from __future__ import annotations

from .errors import FieldError, invalid_status, status
from .resource_types import ResourceType
from .store import ApiError


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(status(404, "NotFound", f'{rt.qualified} "{name}" not found',
                           name=name, group=rt.group, kind=rt.plural))


def not_found_path() -> ApiError:
    """A URL that names no resource the server serves."""
    return ApiError(status(404, "NotFound", "the server could not find the requested "
                           "resource"))


def conflict(rt: ResourceType, name: str, detail: str | None = None) -> ApiError:
    msg = detail or ("the object has been modified; please apply your changes to the "
                     "latest version and try again")
    return ApiError(status(409, "Conflict",
                           f'Operation cannot be fulfilled on {rt.qualified} "{name}": {msg}',
                           name=name, group=rt.group, kind=rt.plural))


def precondition_failed(rt: ResourceType, name: str, detail: str) -> ApiError:
    """rest.BeforeDelete's 409: it names the kind (``Pod``, ``ResourceClaim.resource.k8s.io``)
    where other conflicts name the resource."""
    kind = f"{rt.kind}.{rt.group}" if rt.group else rt.kind
    return ApiError(status(409, "Conflict",
                           f'Operation cannot be fulfilled on {kind} "{name}": {detail}',
                           name=name, group=rt.group, kind=rt.kind))


def bad_request(message: str) -> ApiError:
    return ApiError(status(400, "BadRequest", message))


def invalid(rt: ResourceType, name: str, errors: list[FieldError]) -> ApiError:
    return ApiError(invalid_status(rt.kind, rt.group, name, errors))


def method_not_allowed() -> ApiError:
    return ApiError(status(405, "MethodNotAllowed", "the server does not allow this method "
                           "on the requested resource"))
