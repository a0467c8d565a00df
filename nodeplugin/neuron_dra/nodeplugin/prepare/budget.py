"""What one Prepare call may spend, and how a claim fails within it.

The kubelet gives each NodePrepareResources / NodeUnprepareResources call 45 s and then gives
up. Inside that budget every claim gets an answer of its own:
:class:`PrepareFailure` says why one claim is not prepared now and whether the kubelet's retry
can help (``permanent``: the claim or the node must change first). :func:`read_claim` (and the
consumer pods' reads, :func:`read_object`) are a Prepare's API reads, retried with backoff
only as long as an answer still fits the budget, so a claim whose read keeps failing gets a
clear error instead of a cancellation.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

from neuron_dra.common.k8s.client import ResourceClient
from neuron_dra.common.k8s.clock import Clock
from neuron_dra.common.k8s.errors import KubeError, NotFoundError
from neuron_dra.nodeplugin.kubeletapi import ClaimRef
from neuron_dra.nodeplugin.prepare.nodelock import NodeLockTimeout

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrepareLimits:
    """Bounds for one Prepare call. The kubelet gives up after 45 s and the gRPC layer cancels
    us at its own budget (``kubeletapi.DEFAULT_BUDGET``, 40 s); stopping API retries at 30 s
    means a claim whose read keeps failing gets its own clear error instead of a cancellation."""

    #: Seconds all claims of one call may spend reading their ResourceClaims, retries included.
    budget: float = 30.0
    #: Tries per claim read (1 = no retry).
    attempts: int = 6
    backoff_base: float = 0.2
    backoff_cap: float = 5.0
    #: Per-request timeout (never longer than what is left of the budget).
    request_timeout: float = 10.0
    #: Seconds (real time) a Prepare or Unprepare waits for the node lock each time it needs
    #: it; then its claims get retryable errors. The other instance holds it only for local
    #: file work. A Prepare can wait once within ``budget`` and once after it, so keep
    #: ``budget + lock_timeout`` below the gRPC layer's budget (40 s).
    lock_timeout: float = 5.0
    #: The wait for the node lock of the recovery at plugin start (nobody is waiting on the
    #: plugin yet; a lock still busy after this long means something is stuck).
    start_lock_timeout: float = 60.0

    def __post_init__(self) -> None:
        if self.budget <= 0 or self.attempts < 1 or self.backoff_base <= 0:
            raise ValueError("need budget > 0, attempts >= 1 and backoff_base > 0")
        if self.lock_timeout <= 0 or self.start_lock_timeout <= 0:
            raise ValueError("need lock_timeout > 0 and start_lock_timeout > 0")


class PrepareFailure(Exception):
    """One claim cannot be prepared now. ``reason`` is a small fixed set (a metric label);
    ``permanent``: retrying the same request cannot help, the claim or node must change."""

    def __init__(self, message: str, *, reason: str, permanent: bool, event: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.permanent = permanent
        #: Worth a Warning Event on the claim (the user can act on it).
        self.event = event


def state_failure(exc: NodeLockTimeout | OSError, verb: str) -> PrepareFailure:
    """The node's state (lock, checkpoint) cannot be consulted now: retryable."""
    if isinstance(exc, NodeLockTimeout):
        return PrepareFailure(f"cannot {verb} now: {exc}", reason="NodeLockBusy", permanent=False)
    return PrepareFailure(
        f"cannot {verb} now: the plugin's checkpoint or lock file is not accessible: {exc}",
        reason="StateUnavailable",
        permanent=False,
    )


async def read_claim(
    api: ResourceClient,
    ref: ClaimRef,
    *,
    deadline: float,
    limits: PrepareLimits,
    clock: Clock,
    rng: random.Random,
) -> dict[str, Any]:
    """GET the claim, retrying retryable errors within the attempts and the budget."""
    claim = await read_object(
        api, "ResourceClaim", ref.name, ref.namespace,
        deadline=deadline, limits=limits, clock=clock, rng=rng, missing_ok=False,
    )  # fmt: skip
    assert claim is not None
    return claim


async def read_object(
    api: ResourceClient,
    kind: str,
    name: str,
    namespace: str,
    *,
    deadline: float,
    limits: PrepareLimits,
    clock: Clock,
    rng: random.Random,
    missing_ok: bool,
) -> dict[str, Any] | None:
    """GET one object, retrying retryable errors within the attempts and the budget; a
    missing object is None with ``missing_ok``, else a permanent failure."""
    key = f"{namespace}/{name}"
    last: KubeError | None = None
    for attempt in range(limits.attempts):
        remaining = deadline - clock.now()
        if remaining <= 0:
            break
        try:
            obj: dict[str, Any] = await api.get(
                name,
                namespace,
                request_timeout=max(0.1, min(limits.request_timeout, remaining)),
            )
        except NotFoundError:
            if missing_ok:
                return None
            raise PrepareFailure(
                f"{kind} {key} not found", reason="NotFound", permanent=True
            ) from None
        except KubeError as exc:
            if not exc.retryable:
                raise PrepareFailure(
                    f"cannot read {kind} {key}: {exc.message}",
                    reason="APIError",
                    permanent=True,
                ) from exc
            last = exc
            if attempt + 1 >= limits.attempts:
                break
            delay = min(limits.backoff_cap, limits.backoff_base * 2**attempt)
            delay *= 1.0 + 0.2 * rng.random()  # jitter: claims of a batch spread out
            if exc.retry_after is not None:
                delay = max(delay, exc.retry_after)
            if delay >= deadline - clock.now():
                break  # sleeping past the budget would only make the answer late
            log.debug("reading %s %s failed (%s); retrying in %.2fs", kind, key, exc, delay)
            await clock.sleep(delay)
            continue
        return obj
    raise PrepareFailure(
        f"cannot read {kind} {key} within the prepare budget "
        f"({limits.budget:g}s, {limits.attempts} attempts): "
        f"{last.message if last else 'budget exhausted'}",
        reason="APIUnavailable",
        permanent=False,
    )
