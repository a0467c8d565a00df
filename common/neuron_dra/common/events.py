"""Kubernetes Events (events.k8s.io/v1) from the kubelet plugin, best effort.

Events are how a user learns why a claim did not prepare (next to the kubelet's own
``FailedPrepareDynamicResources`` on the pod) and how an operator learns that the plugin reset
its checkpoint. They are never worth failing or delaying real work for, so :meth:`record`
logs and swallows every API error and bounds each write with a short timeout.

The kubelet retries a failing Prepare with backoff for as long as the pod exists; without
de-duplication each retry would add an identical Event. Identical events (same object, type,
reason and note) within ``dedup_window`` seconds are therefore written once.
"""

from __future__ import annotations

import collections
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final

from neuron_dra.common.k8s.client import EVENTS, KubeClient
from neuron_dra.common.k8s.clock import Clock, SystemClock

log = logging.getLogger(__name__)

REPORTING_CONTROLLER: Final = "neuron.aws.com/kubelet-plugin"
#: events.k8s.io/v1 validation limits.
MAX_NOTE_BYTES: Final = 1024
MAX_FIELD_CHARS: Final = 128
_MAX_NAME: Final = 253
#: Cluster-scoped objects (Nodes) get their Events in "default", as the kubelet's do.
CLUSTER_EVENT_NAMESPACE: Final = "default"


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


@dataclass(frozen=True)
class ObjectRef:
    """What an Event is about (its ``regarding``)."""

    api_version: str
    kind: str
    name: str
    namespace: str | None = None
    uid: str | None = None

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> ObjectRef:
        meta = obj.get("metadata") or {}
        return cls(
            api_version=str(obj.get("apiVersion") or ""),
            kind=str(obj.get("kind") or ""),
            name=str(meta.get("name") or ""),
            namespace=meta.get("namespace") or None,
            uid=meta.get("uid") or None,
        )

    @classmethod
    def node(cls, name: str, uid: str | None = None) -> ObjectRef:
        return cls("v1", "Node", name, None, uid)

    @classmethod
    def resource_claim(cls, namespace: str, name: str, uid: str | None) -> ObjectRef:
        return cls("resource.k8s.io/v1", "ResourceClaim", name, namespace, uid)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            out["namespace"] = self.namespace
        if self.uid:
            out["uid"] = self.uid
        return out


# --- pure ----------------------------------------------------------------------------------


def truncate_utf8(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` UTF-8 bytes, never inside a character."""
    raw = text.encode()
    if len(raw) <= max_bytes:
        return text
    ellipsis = "..."
    cut = raw[: max_bytes - len(ellipsis)].decode("utf-8", "ignore")
    return cut + ellipsis


def micro_time(ts: datetime) -> str:
    """A ``MicroTime``: RFC 3339 with exactly six fractional digits, UTC."""
    if ts.tzinfo is not None:
        ts = ts.astimezone(UTC)
    # A naive time is taken to be UTC already (our clocks only hand out aware ones).
    return ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_name(regarding: ObjectRef, suffix: str) -> str:
    # "<object>.<hex>" like client-go's recorder, so `kubectl get events` groups visually;
    # the object part is cut so the whole name stays a valid DNS subdomain.
    base = regarding.name[: _MAX_NAME - len(suffix) - 1].rstrip(".-") or "object"
    return f"{base}.{suffix}"


def build_event(
    regarding: ObjectRef,
    *,
    type_: EventType,
    reason: str,
    note: str,
    action: str,
    reporting_instance: str,
    now: datetime,
    suffix: str,
    reporting_controller: str = REPORTING_CONTROLLER,
) -> dict[str, Any]:
    """The events.k8s.io/v1 Event object (pure)."""
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {
            "name": event_name(regarding, suffix),
            "namespace": regarding.namespace or CLUSTER_EVENT_NAMESPACE,
        },
        "regarding": regarding.to_json(),
        "reason": reason[:MAX_FIELD_CHARS],
        "note": truncate_utf8(note, MAX_NOTE_BYTES),
        "type": str(type_),
        "action": action[:MAX_FIELD_CHARS],
        "reportingController": reporting_controller[:MAX_FIELD_CHARS],
        "reportingInstance": reporting_instance[:MAX_FIELD_CHARS],
        "eventTime": micro_time(now),
    }


# --- recorder ------------------------------------------------------------------------------

_DedupKey = tuple[str, str, str, str, str, str, str]


class EventRecorder:
    """Writes Events as ``reporting_instance`` (the node name); never raises on API errors."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        reporting_instance: str,
        clock: Clock | None = None,
        dedup_window: float = 300.0,
        max_remembered: int = 1024,
        request_timeout: float = 5.0,
        reporting_controller: str = REPORTING_CONTROLLER,
    ) -> None:
        self._kube = kube
        self._instance = reporting_instance
        self._clock: Clock = clock or SystemClock()
        self._window = dedup_window
        self._max = max_remembered
        self._timeout = request_timeout
        self._controller = reporting_controller
        # key -> monotonic time of the last write; oldest first, so pruning is cheap.
        self._recent: collections.OrderedDict[_DedupKey, float] = collections.OrderedDict()

    def _is_duplicate(self, key: _DedupKey, now: float) -> bool:
        last = self._recent.get(key)
        return last is not None and now - last < self._window

    def _remember(self, key: _DedupKey, now: float) -> None:
        self._recent[key] = now
        self._recent.move_to_end(key)
        while len(self._recent) > self._max:
            self._recent.popitem(last=False)

    async def record(
        self,
        regarding: ObjectRef,
        *,
        type_: EventType,
        reason: str,
        note: str,
        action: str,
    ) -> bool:
        """Write one Event; False when skipped as a duplicate or when the write failed."""
        key: _DedupKey = (
            regarding.kind,
            regarding.namespace or "",
            regarding.name,
            regarding.uid or "",
            str(type_),
            reason,
            note,
        )
        now = self._clock.now()
        if self._is_duplicate(key, now):
            log.debug(
                "skipping duplicate event %s on %s %s", reason, regarding.kind, regarding.name
            )
            return False
        event = build_event(
            regarding,
            type_=type_,
            reason=reason,
            note=note,
            action=action,
            reporting_instance=self._instance,
            now=self._clock.wall(),
            suffix=uuid.uuid4().hex[:16],
            reporting_controller=self._controller,
        )
        try:
            await self._kube.resource(EVENTS).create(event, request_timeout=self._timeout)
        except Exception as exc:  # best effort: an Event is never worth failing the caller
            log.warning(
                "cannot record %s event %s on %s %s: %s",
                type_,
                reason,
                regarding.kind,
                regarding.name,
                exc,
            )
            return False
        # Remembered only once written, so an event lost to an API outage is tried again.
        self._remember(key, now)
        return True
