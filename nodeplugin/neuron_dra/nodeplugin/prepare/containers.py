"""Which Neuron devices each container gets, so that its runtime environment says so (pure).

The environment (``NEURON_RT_VISIBLE_CORES``, LNC, UltraServer ids, ranks) travels in each
claim's CDI spec, and a container runtime applies the specs of every CDI device the kubelet
hands a container, the last value of a variable winning. The kubelet hands a container the
devices of each claim it names in ``resources.claims`` (only a request's devices when the
entry names a ``request``). So a claim's one environment is right only if it describes the
whole set of Neuron devices of every container that gets any of the claim's devices:

- a container naming two claims (devices 1 and 2) must see ``NEURON_RT_VISIBLE_CORES`` for
  both devices, whichever claim's spec the runtime applies last: each claim's spec carries
  the environment of the pair;
- a container naming one request of a two-request claim must see that request's cores only;
- two containers that get different device sets through one claim cannot both be right, nor
  can a set whose cores are not one contiguous range, nor claims whose settings (LNC,
  UltraServer mode, ranks) differ, nor a core share beside another claim (its cores are
  some of one device's): those are refused at Prepare with what to change.

:func:`env_scopes` answers, for each claim being prepared, the device set its environment
must describe (its :class:`EnvScope`) or why none can be right (a :class:`ScopeConflict`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from neuron_dra.common.constants import NODE_DEVICE_NAME, device_index
from neuron_dra.nodeplugin.prepare import checkpoint as ckpt
from neuron_dra.nodeplugin.prepare.claims import ClaimPlan

JsonDict = dict[str, Any]


def consumer_pods(claim: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The pods a claim is reserved for, as (name, uid)."""
    return tuple(
        (str(r.get("name")), str(r.get("uid")))
        for r in (claim.get("status") or {}).get("reservedFor") or []
        if r.get("resource") == "pods" and not r.get("apiGroup")
    )


@dataclass(frozen=True)
class NeuronClaim:
    """A Neuron claim of this node as far as containers are concerned."""

    uid: str
    name: str
    #: (base request names, Neuron device indices) per allocated device.
    devices: tuple[tuple[tuple[str, ...], tuple[int, ...]], ...]

    def indices(self, request: str | None) -> frozenset[int]:
        """The device indices a container gets naming this claim (and ``request``)."""
        return frozenset(
            i
            for requests, indices in self.devices
            if request is None or request in requests
            for i in indices
        )


@dataclass(frozen=True)
class EnvScope:
    """What one claim's environment must describe: the Neuron devices of the containers that
    use it, and the claims those devices come from."""

    indices: frozenset[int]
    claims: frozenset[str]  # uids
    containers: tuple[str, ...]  # "pod/container"


@dataclass(frozen=True)
class ScopeConflict:
    """No one environment of the claim can be right; the message says what to change."""

    message: str


def resource_claim_names(pod: Mapping[str, Any]) -> dict[str, str]:
    """Pod claim name (``spec.resourceClaims[].name``) -> the ResourceClaim's name."""
    out: dict[str, str] = {}
    for pc in (pod.get("spec") or {}).get("resourceClaims") or []:
        if pc.get("resourceClaimName"):
            out[str(pc["name"])] = str(pc["resourceClaimName"])
    for st in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if st.get("resourceClaimName"):
            out[str(st["name"])] = str(st["resourceClaimName"])
    return out


def container_sets(
    pod: Mapping[str, Any], claims: Mapping[str, NeuronClaim]
) -> dict[str, dict[str, frozenset[int]]]:
    """Container -> {claim uid: device indices it gets from that claim}, for the containers
    that get Neuron devices; ``claims`` are this node's Neuron claims by ResourceClaim name."""
    names = resource_claim_names(pod)
    spec = pod.get("spec") or {}
    out: dict[str, dict[str, frozenset[int]]] = {}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        got: dict[str, frozenset[int]] = {}
        for ref in (container.get("resources") or {}).get("claims") or []:
            claim = claims.get(names.get(str(ref.get("name")), ""))
            if claim is None:
                continue  # another driver's claim, or not allocated here
            got[claim.uid] = got.get(claim.uid, frozenset()) | claim.indices(ref.get("request"))
        if any(got.values()):
            out[str(container.get("name"))] = got
    return out


def env_scopes(
    pods: Sequence[Mapping[str, Any]],
    claims: Mapping[str, NeuronClaim],
    preparing: Iterable[str],
) -> dict[str, EnvScope | ScopeConflict]:
    """For each claim uid in ``preparing`` that some container of ``pods`` uses: the device
    set its environment must describe, or why no environment can be right. Claims no
    container uses are left out (their own devices are the scope)."""
    by_uid = {c.uid: c for c in claims.values()}
    users: dict[str, list[tuple[str, frozenset[int], frozenset[str]]]] = {}
    for pod in pods:
        pod_name = str((pod.get("metadata") or {}).get("name"))
        for container, got in container_sets(pod, claims).items():
            indices = frozenset().union(*got.values())
            for uid in got:
                users.setdefault(uid, []).append(
                    (f"{pod_name}/{container}", indices, frozenset(got))
                )
    out: dict[str, EnvScope | ScopeConflict] = {}
    for uid in preparing:
        seen = users.get(uid)
        if not seen:
            continue
        claim = by_uid[uid]
        sets = {(indices, used) for _, indices, used in seen}
        if len(sets) > 1:
            described = "; ".join(
                f"container {who}: {_devices(indices)} from {_claims(used, by_uid)}"
                for who, indices, used in seen
            )
            out[uid] = ScopeConflict(
                f"ResourceClaim {claim.name} reaches containers that get different Neuron "
                f"devices ({described}), but a claim's CDI spec carries one "
                "NEURON_RT_VISIBLE_CORES: give those containers the same claims and "
                "requests, or each container claims of its own"
            )
            continue
        ((indices, used),) = sets
        out[uid] = EnvScope(indices, used, tuple(who for who, _, _ in seen))
    return out


def contiguity_problem(scope: EnvScope, by_uid: Mapping[str, NeuronClaim]) -> str | None:
    """Why the scope's devices cannot be one core range (the only form the runtime takes)."""
    ordered = sorted(scope.indices)
    if ordered[-1] - ordered[0] + 1 == len(ordered):
        return None
    return (
        f"container {', '.join(scope.containers)} gets {_devices(scope.indices)} from "
        f"{_claims(scope.claims, by_uid)}, which are not consecutive: "
        "NEURON_RT_VISIBLE_CORES must be one contiguous range of cores. Ask for connected "
        "devices in one claim (a matchAttribute constraint), or give the claims to "
        "different containers"
    )


def share_not_alone(scope: EnvScope, by_uid: Mapping[str, NeuronClaim]) -> str:
    """Why a container cannot have a core share beside other Neuron claims: the share's cores
    are some of one device's, which no other claim's cores continue in one range."""
    return (
        f"container {', '.join(scope.containers)} gets Neuron devices from "
        f"{_claims(scope.claims, by_uid)}, one of which holds some cores of a shared device: "
        "a container with a core share gets no other Neuron claim (NEURON_RT_VISIBLE_CORES "
        "is one range). Ask for the cores in one claim, or give the claims to different "
        "containers"
    )


def env_difference(
    scope: EnvScope, envs: Mapping[str, Mapping[str, str]], by_uid: Mapping[str, NeuronClaim]
) -> str | None:
    """Why the scope's claims cannot share one environment: ``envs`` is each claim's
    environment for the scope's devices (computed, or as recorded for a claim prepared
    earlier); they must be equal, since the runtime keeps whichever comes last."""
    distinct = {tuple(sorted(e.items())) for e in envs.values()}
    if len(distinct) <= 1:
        return None
    keys = sorted({k for e in envs.values() for k in e})
    differ = [k for k in keys if len({e.get(k) for e in envs.values()}) > 1]
    detail = "; ".join(
        f"{k}: " + ", ".join(f"{by_uid[u].name}={envs[u].get(k, '(unset)')}" for u in sorted(envs))
        for k in differ
    )
    return (
        f"container {', '.join(scope.containers)} gets Neuron devices from "
        f"{_claims(scope.claims, by_uid)}, whose runtime settings differ ({detail}); the "
        "Neuron runtime takes one value per container: make the claims' settings (NeuronConfig "
        "logicalNeuronCore, UltraServerConfig) agree, or give the claims to different containers"
    )


def _devices(indices: Iterable[int]) -> str:
    return ", ".join(f"neuron{i}" for i in sorted(indices))


def _claims(uids: Iterable[str], by_uid: Mapping[str, NeuronClaim]) -> str:
    names = sorted(by_uid[u].name for u in uids if u in by_uid)
    return ("ResourceClaims " if len(names) > 1 else "ResourceClaim ") + ", ".join(names)


# --- from what Prepare has: plans of the batch, checkpoint entries, pods ---------------------


def _indices_of(device: str, all_indices: Sequence[int]) -> tuple[int, ...]:
    if device == NODE_DEVICE_NAME:
        return tuple(all_indices)
    index = device_index(device)
    return (index,) if index is not None else ()


def neuron_claims(
    plans: Iterable[ClaimPlan], entries: Iterable[ckpt.ClaimEntry]
) -> dict[str, NeuronClaim]:
    """This node's Neuron claims in one namespace, by name: those being prepared (``plans``)
    and those prepared already (checkpoint ``entries``)."""
    out: dict[str, NeuronClaim] = {}
    for e in entries:
        devices = tuple(
            (d.request_names, _indices_of(d.device_name, e.device_indices)) for d in e.devices
        )
        out[e.name] = NeuronClaim(e.uid, e.name, devices)
    for p in plans:
        devices = tuple(
            (tuple(dict.fromkeys(r.split("/", 1)[0] for r in requests)),
             _indices_of(device, p.device_indices))
            for requests, device in p.devices
        )  # fmt: skip
        out[p.name] = NeuronClaim(p.claim_uid, p.name, devices)
    return out


def recorded_env(entry: ckpt.ClaimEntry) -> dict[str, str]:
    """The environment a prepared claim's CDI spec carries."""
    env = (entry.cdi_spec.get("containerEdits") or {}).get("env") or []
    return dict(str(e).partition("=")[::2] for e in env)


def needs_pods(plans: Sequence[ClaimPlan], entries_in_namespace: int) -> bool:
    """Whether a container could get more or fewer Neuron devices than a claim of the batch
    holds. Not when the pod has one Neuron claim here (one in the batch, none prepared in its
    namespace: a pod names claims of its own namespace only) with one request: every
    container naming it gets all of it. Then the pods need not be read."""
    if len(plans) != 1 or entries_in_namespace:
        return True
    (plan,) = plans
    return len({r.split("/", 1)[0] for requests, _ in plan.devices for r in requests}) > 1


EnvOf = Callable[[ClaimPlan, tuple[int, ...]], Mapping[str, str]]


def env_indices(
    plans: Sequence[ClaimPlan],
    entries: Sequence[ckpt.ClaimEntry],
    pods: Sequence[Mapping[str, Any]],
    env_of: EnvOf,
) -> dict[str, tuple[int, ...] | str]:
    """For each claim of the batch (``plans``, one namespace): the device indices its
    environment describes, or why it must be refused (the message to the user).

    ``entries`` are the claims prepared in the namespace, ``pods`` the claims' consumers,
    ``env_of(plan, indices)`` the environment a plan would carry for those devices (it may
    raise ``ValueError`` for devices no environment fits)."""
    claims = neuron_claims(plans, entries)
    by_uid = {c.uid: c for c in claims.values()}
    scopes = env_scopes(pods, claims, [p.claim_uid for p in plans])
    planned = {p.claim_uid: p for p in plans}
    recorded = {e.uid: recorded_env(e) for e in entries}
    shares = {p.claim_uid for p in plans if p.share} | {e.uid for e in entries if e.share}
    out: dict[str, tuple[int, ...] | str] = {}
    for plan in plans:
        scope = scopes.get(plan.claim_uid)
        if scope is None:
            out[plan.claim_uid] = plan.device_indices
            continue
        if isinstance(scope, ScopeConflict):
            out[plan.claim_uid] = scope.message
            continue
        if len(scope.claims) > 1 and scope.claims & shares:
            out[plan.claim_uid] = share_not_alone(scope, by_uid)
            continue
        problem = contiguity_problem(scope, by_uid)
        if problem is None:
            indices = tuple(sorted(scope.indices))
            envs: dict[str, Mapping[str, str]] = {}
            try:
                for uid in scope.claims:
                    if uid in planned:
                        envs[uid] = env_of(planned[uid], indices)
                    elif uid in recorded:
                        envs[uid] = recorded[uid]
            except ValueError as exc:
                problem = f"container {', '.join(scope.containers)}: {exc}"
            else:
                problem = env_difference(scope, envs, by_uid)
        out[plan.claim_uid] = indices if problem is None else problem
    return out
