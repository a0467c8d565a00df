"""Safe write patterns: RV-guarded read-modify-write, merge patch, server-side apply, finalizers.

The project's rule (docs/architecture.md): every write is resourceVersion-guarded or
server-side apply, and retried on 409. Blind PUTs (without an RV) or merge patches of lists
(``metadata.finalizers``) would silently overwrite a concurrent writer's change, so list edits
go through :func:`update_with_retry`.
"""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import Callable
from typing import Any

from .client import ResourceClient
from .clock import Clock, SystemClock
from .errors import ConflictError, NotFoundError

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]
Mutate = Callable[[JsonDict], JsonDict | None]

DEFAULT_ATTEMPTS = 5
#: Pause between conflict retries: short, jittered, growing (like client-go's DefaultRetry).
RETRY_BASE = 0.01
RETRY_FACTOR = 2.0


async def _pause(attempt: int, clock: Clock, rng: random.Random) -> None:
    await clock.sleep(RETRY_BASE * RETRY_FACTOR**attempt * (1.0 + 0.1 * rng.random()))


async def update_with_retry(
    api: ResourceClient,
    name: str,
    namespace: str | None,
    mutate: Mutate,
    *,
    status: bool = False,
    attempts: int = DEFAULT_ATTEMPTS,
    clock: Clock | None = None,
    rng: random.Random | None = None,
    current: JsonDict | None = None,
) -> JsonDict:
    """GET, ``mutate`` a deep copy, PUT it back guarded by the read resourceVersion.

    ``mutate`` edits the copy in place or returns a replacement; returning ``None`` means "no
    change needed" and nothing is written (the current object is returned). On 409 the object is
    read again and ``mutate`` re-applied, up to ``attempts`` times; then the last
    :class:`ConflictError` is raised. ``status=True`` writes the ``/status`` subresource.
    :class:`NotFoundError` propagates: the caller decides whether a vanished object matters.

    ``current``: the object as a cache last saw it, tried before the first GET (a round trip
    less when the cache is fresh, as it usually is). A stale one costs a 409, and "no change
    needed" is only ever concluded from a fresh read; either way the loop above follows,
    from a GET and without a pause (the cache lagged: nobody raced us).
    """
    if attempts < 1:
        raise ValueError("attempts must be >= 1")
    clock = clock or SystemClock()
    rng = rng or random.Random()
    if current is not None:
        desired = _guarded(current, mutate)
        if desired is not None:
            try:
                return await api.replace(desired, subresource="status" if status else None)
            except ConflictError:
                log.debug("cached %s %s/%s was stale", api.resource.kind, namespace, name)
    last: ConflictError | None = None
    for attempt in range(attempts):
        fresh = await api.get(name, namespace)
        desired = _guarded(fresh, mutate)
        if desired is None:
            return fresh
        try:
            return await api.replace(desired, subresource="status" if status else None)
        except ConflictError as exc:
            last = exc
            log.debug(
                "conflict updating %s %s/%s (attempt %d)",
                api.resource.kind,
                namespace,
                name,
                attempt + 1,
            )
            if attempt + 1 < attempts:
                await _pause(attempt, clock, rng)
    assert last is not None
    raise last


def _guarded(current: JsonDict, mutate: Mutate) -> JsonDict | None:
    """``mutate`` of a deep copy of ``current``, guarded by ``current``'s resourceVersion
    (whatever mutate did to metadata); None when no change is needed."""
    desired = mutate(copy.deepcopy(current))
    if desired is None:
        return None
    desired.setdefault("metadata", {})["resourceVersion"] = current["metadata"]["resourceVersion"]
    return desired


async def merge_patch(
    api: ResourceClient,
    name: str,
    patch: JsonDict,
    namespace: str | None = None,
    *,
    status: bool = False,
    resource_version: str | None = None,
) -> JsonDict:
    """RFC 7386 merge patch (the content type that works for CRDs and built-ins alike).

    Pass ``resource_version`` to make it conditional (409 if the object moved on); use that, or
    :func:`update_with_retry`, whenever the patch replaces a list others may edit.
    """
    body = copy.deepcopy(patch)
    if resource_version is not None:
        body.setdefault("metadata", {})["resourceVersion"] = resource_version
    return await api.merge_patch(name, body, namespace, subresource="status" if status else None)


async def apply(
    api: ResourceClient,
    obj: JsonDict,
    *,
    field_manager: str,
    force: bool = False,
    status: bool = False,
    attempts: int = DEFAULT_ATTEMPTS,
    clock: Clock | None = None,
    rng: random.Random | None = None,
) -> JsonDict:
    """Server-side apply ``obj`` as ``field_manager``.

    A plain 409 ``Conflict`` (``obj`` carried a stale ``metadata.resourceVersion``, or the
    server lost a race) is retried. A field-ownership conflict
    (:class:`~.errors.FieldManagerConflictError`) is not: the same apply would fail the same
    way, so it propagates for the caller to resolve (or apply with ``force=True``).
    """
    clock = clock or SystemClock()
    rng = rng or random.Random()
    tries = 1 if force else max(1, attempts)
    last: ConflictError | None = None
    for attempt in range(tries):
        try:
            return await api.apply(
                obj,
                field_manager=field_manager,
                force=force,
                subresource="status" if status else None,
            )
        except ConflictError as exc:
            if type(exc) is not ConflictError:
                raise
            last = exc
            if attempt + 1 < tries:
                await _pause(attempt, clock, rng)
    assert last is not None
    raise last


async def ensure_finalizer(
    api: ResourceClient,
    name: str,
    namespace: str | None,
    finalizer: str,
    *,
    clock: Clock | None = None,
    current: JsonDict | None = None,
) -> JsonDict:
    """Add ``finalizer`` unless present (RV-guarded, so concurrent finalizer edits survive);
    ``current`` as for :func:`update_with_retry`.

    Does nothing for an object already being deleted: the API server refuses new finalizers
    then, and a controller must not block a deletion it did not already own.
    """

    def add(obj: JsonDict) -> JsonDict | None:
        meta = obj.setdefault("metadata", {})
        finalizers: list[str] = meta.get("finalizers") or []
        if finalizer in finalizers or meta.get("deletionTimestamp"):
            return None
        meta["finalizers"] = [*finalizers, finalizer]
        return obj

    return await update_with_retry(api, name, namespace, add, clock=clock, current=current)


async def remove_finalizer(
    api: ResourceClient,
    name: str,
    namespace: str | None,
    finalizer: str,
    *,
    clock: Clock | None = None,
) -> JsonDict | None:
    """Remove ``finalizer`` if present. Returns the updated object, or None if the object is
    gone (including when removing the last finalizer let the deletion complete)."""

    def drop(obj: JsonDict) -> JsonDict | None:
        meta = obj.setdefault("metadata", {})
        finalizers: list[str] = meta.get("finalizers") or []
        if finalizer not in finalizers:
            return None
        meta["finalizers"] = [f for f in finalizers if f != finalizer]
        return obj

    try:
        return await update_with_retry(api, name, namespace, drop, clock=clock)
    except NotFoundError:
        return None


def has_finalizer(obj: JsonDict, finalizer: str) -> bool:
    return finalizer in ((obj.get("metadata") or {}).get("finalizers") or [])
