"""What a DELETE does to an object: graceful deletion (pods) and finalizers, as pure decisions.

The rules kube-apiserver follows (generic registry ``Store.Delete``, ``rest.BeforeDelete``,
the pod strategy's ``CheckGracefulDelete``), restated:

- A **pod** is deleted gracefully. Its grace period is ``DeleteOptions.gracePeriodSeconds``
  when given, else ``spec.terminationGracePeriodSeconds`` (30 when unset: the API default,
  which the fake does not write into the pod); it is 0 for a pod not bound to a node (no
  ``spec.nodeName``) or already terminal (phase Succeeded or Failed); a negative period
  counts as 1. The server first writes ``metadata.deletionTimestamp`` (now + grace),
  ``metadata.deletionGracePeriodSeconds`` (the grace) and bumps ``metadata.generation``;
  then, when the grace is 0 and no finalizers remain, removes the object at once (watchers
  see MODIFIED, then DELETED). Otherwise the pod stays,
  Terminating, until its kubelet (once the containers stopped) deletes it again with grace 0.
- A pod already being deleted: a DELETE with a *shorter* grace moves the deletion timestamp
  earlier by the difference and records the new grace (grace 0 without finalizers removes it);
  with an equal or longer grace, or none, nothing changes. One whose recorded grace is 0 (or
  unset) is removed at once, or, with finalizers, stays marked.
- Any other kind has no grace period: without finalizers it is removed at once; with them it
  is marked (``deletionTimestamp`` now unless already set, ``deletionGracePeriodSeconds`` 0,
  generation bumped the first time) and stays until the finalizers are gone.

Not modelled: the orphan/foreground finalizers the server adds for ``propagationPolicy``
(the fake orphans or collects dependents itself, see ``core.ApiCore`` and ``collector``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

#: ``spec.terminationGracePeriodSeconds`` when the pod does not set it (the API default).
DEFAULT_TERMINATION_GRACE_SECONDS = 30
_TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class DeletePlan:
    """``metadata`` fields to write first (None: no write), then whether to remove the object."""

    mark: dict[str, Any] | None
    remove: bool


def rfc3339(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _clamp(seconds: int) -> int:
    """Negative grace periods count as 1 second on the delete path."""
    return 1 if seconds < 0 else seconds


def pod_grace_period(pod: Mapping[str, Any], requested: int | None) -> int:
    """The pod strategy's grace period for a first DELETE of ``pod``."""
    spec = pod.get("spec") or {}
    if requested is not None:
        period = requested
    else:
        default = spec.get("terminationGracePeriodSeconds")
        period = DEFAULT_TERMINATION_GRACE_SECONDS if default is None else int(default)
    if not spec.get("nodeName"):
        period = 0  # never scheduled: nothing runs that could need time to stop
    if (pod.get("status") or {}).get("phase") in _TERMINAL_PHASES:
        period = 0  # its containers have stopped already
    return _clamp(period)


def plan_delete(
    obj: Mapping[str, Any],
    requested: int | None,
    now: datetime,
    *,
    graceful: bool,
    held: bool,
) -> DeletePlan:
    """What a DELETE of ``obj`` does.

    ``requested`` is ``DeleteOptions.gracePeriodSeconds``; ``graceful`` whether the kind is
    deleted gracefully (pods); ``held`` whether something keeps the object after it is marked
    (finalizers; a namespace's own finalizer).
    """
    meta = obj.get("metadata") or {}
    requested = None if requested is None else _clamp(requested)
    marked_at = meta.get("deletionTimestamp")
    generation = meta.get("generation")

    if graceful and not marked_at:
        grace = pod_grace_period(obj, requested)
        mark: dict[str, Any] = {
            "deletionTimestamp": rfc3339(now + timedelta(seconds=grace)),
            "deletionGracePeriodSeconds": grace,
        }
        if generation:
            mark["generation"] = int(generation) + 1
        return DeletePlan(mark, remove=grace == 0 and not held)

    current = meta.get("deletionGracePeriodSeconds")
    if graceful and marked_at and current not in (None, 0):
        current = _clamp(int(current))
        if requested is None or requested >= current:
            return DeletePlan(None, remove=False)  # graceful deletion already under way
        shortened = parse_rfc3339(str(marked_at)) - timedelta(seconds=current - requested)
        mark = {"deletionTimestamp": rfc3339(shortened), "deletionGracePeriodSeconds": requested}
        return DeletePlan(mark, remove=requested == 0 and not held)

    # No grace period (another kind, or a pod whose grace has been cut to 0).
    if not held:
        return DeletePlan(None, remove=True)
    if marked_at and current == 0 and parse_rfc3339(str(marked_at)) <= now:
        return DeletePlan(None, remove=False)  # marked already: nothing changes
    mark = {"deletionGracePeriodSeconds": 0}
    if not marked_at or parse_rfc3339(str(marked_at)) > now:
        mark["deletionTimestamp"] = rfc3339(now)
    if not marked_at and generation:
        mark["generation"] = int(generation) + 1
    return DeletePlan(mark, remove=False)


def removed_by_update(old_meta: Mapping[str, Any], new_meta: Mapping[str, Any]) -> bool:
    """Whether an update that leaves ``new_meta`` removes the object: the last finalizer of
    an object being deleted is gone and its grace period is over (0 or unset). A pod still in
    its grace period stays until its kubelet deletes it."""
    if new_meta.get("finalizers") or not old_meta.get("deletionTimestamp"):
        return False
    return old_meta.get("deletionGracePeriodSeconds") in (None, 0)
