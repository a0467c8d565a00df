"""Differential test of device allocation: the real kube-scheduler vs our structured allocator
(``neuron_dra.sim.allocation``, what the simulated scheduler uses) vs
``neuron-dra check-claim``.

Random cases (:mod:`.cases`: 1-3 emulated Neuron nodes with the kubelet plugin's own
ResourceSlices, some devices already allocated, one random ResourceClaim) are answered by
all three; the real scheduler is right by definition. Worlds (pytest ids):

- ``fake``: no API server; our allocator against check-claim only (fast).
- ``real-<minor>``: each case also goes to the real control plane of that minor, in isolation
  (nodes ``dft-<n>-<i>`` labelled for the case and tainted against other tests' pods, its
  slices, its in-use devices as allocated ResourceClaims, its claim and a pod pinned to its
  nodes in namespace ``dft-<n>``); the verdict is the pod's: bound, or ``PodScheduled=False``
  with reason ``Unschedulable`` (no node has the devices) or ``SchedulerError`` (the claim
  cannot be allocated as written, e.g. a selector failing on a device the allocator scanned).

check-claim also predicts the kubelet plugin's Prepare-time refusals (7 devices on a trn1 are
allocated by the scheduler but not prepared): its verdict is compared at the scheduler level
(did its allocator find devices), the Prepare part is reported only.

Env: ``NEURON_DRA_DIFF_CASES`` (default 200), ``NEURON_DRA_DIFF_SEED``,
``NEURON_DRA_DIFF_BATCH`` (cases on the control plane at once, default 100). Long run:
``NEURON_DRA_DIFF_CASES=2000 .venv/bin/pytest tests/differential -k real``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import os
import re
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from neuron_dra.common.constants import DEVICE_CLASS_NEURON, DRIVER_NAME
from neuron_dra.common.deviceclasses import default_device_classes
from neuron_dra.common.k8s.cache import Store
from neuron_dra.common.k8s.client import (
    DEVICE_CLASSES,
    NAMESPACES,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    ApiResource,
    KubeClient,
    connect,
)
from neuron_dra.common.k8s.errors import AlreadyExistsError, InvalidError, NotFoundError
from neuron_dra.common.k8s.reflector import Reflector
from neuron_dra.sim.realcluster import ADMIN, RealControlPlane
from neuron_dra.sim.simcluster.realworld import real_node_object
from neuron_dra.sim.simcluster.topology import SimNode
from neuron_dra.sim.worlds import minor_of, real_control_plane, world_params

from .cases import (
    CASE_LABEL,
    ERROR,
    FITS,
    INVALID,
    UNSCHEDULABLE,
    Answer,
    Case,
    NodeSpec,
    check_claim_verdict,
    claim_object,
    generate_many,
    our_verdict,
    violations,
)

SEED = int(os.environ.get("NEURON_DRA_DIFF_SEED", "20250601"))
CASES = int(os.environ.get("NEURON_DRA_DIFF_CASES", "200"))
BATCH = max(1, int(os.environ.get("NEURON_DRA_DIFF_BATCH", "100")))
#: Seconds for one batch's pods to get their verdicts (the scheduler answers in milliseconds
#: a pod; this is for a loaded machine).
VERDICT_LIMIT = 180.0

RUN_LABEL = "neuron-dra.test/differential-run"
TAINT_KEY = "neuron-dra.test/differential"
#: The case pods tolerate our taint and the node-lifecycle taints: Node status and Leases
#: (there are no kubelets) then never change what the scheduler answers.
TOLERATIONS = [
    {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists"},
]
SERVICE_ACCOUNTS = ApiResource("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)

_A = f'device.attributes["{DRIVER_NAME}"]'


def _exactly(count: int | None = None, *selectors: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": DEVICE_CLASS_NEURON, **extra}
    if count is not None:
        body.update(allocationMode="ExactCount", count=count)
    if selectors:
        body["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return body


@dataclass(frozen=True)
class Pinned:
    """A case where two of the three answers once disagreed, with the real scheduler's
    verdict (which our allocator and check-claim must give) and what was wrong."""

    case: Case
    real: str
    why: str


def _pin(
    number: int,
    real: str,
    why: str,
    nodes: Sequence[NodeSpec | str],
    taken: dict[int, Sequence[int | str]],
    requests: list[dict[str, Any]],
    constraints: list[dict[str, Any]] | None = None,
) -> Pinned:
    name = f"dftp-{number}"
    specs = tuple(
        dataclasses.replace(n, name=f"{name}-{i}")
        if isinstance(n, NodeSpec)
        else NodeSpec(f"{name}-{i}", n)
        for i, n in enumerate(nodes)
    )
    held = tuple(
        (f"{name}-{i}", d if isinstance(d, str) else f"neurondevice{d}")
        for i, devices in taken.items()
        for d in devices
    )
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return Pinned(Case(name, specs, held, {"devices": devices}), real, why)


#: Found by this test (the ``dft-<n>`` it was); they also run on the real worlds, with the
#: random cases.
PINNED: list[Pinned] = [
    _pin(
        1, ERROR,
        "dft-67: an All request takes its devices one by one and a constraint refusing one is "
        "an error for the claim (the allocator said: no node fits)",
        [NodeSpec("", "inf2.48xlarge", driver_version="2.22.2.0"), "trn1.32xlarge"], {},
        [{"name": "a", "exactly": _exactly(None, f"{_A}.healthy", allocationMode="All")}],
        [{"matchAttribute": f"{DRIVER_NAME}/ultraserverId"}],
    ),
    _pin(
        2, UNSCHEDULABLE,
        "dft-40: request a fits nowhere, so the scheduler never evaluates request b's selector "
        "(which fails: no networkNodeLayer1); the allocator and check-claim said: error",
        ["trn1.32xlarge"], {0: [0, 3, 6, 8, 10, 11, 13]},
        [
            {"name": "a", "exactly": _exactly(8, f'"deviceId" in {_A} && {_A}.deviceId > 100')},
            {
                "name": "b",
                "exactly": _exactly(
                    4,
                    f'{_A}.resourceType == "neuron_device"',
                    f'{_A}.networkNodeLayer1 == "nn-a"',
                ),
            },
        ],
        [{"matchAttribute": "resource.aws.com/devicegroup1_id"}],
    ),
    _pin(
        3, UNSCHEDULABLE,
        "dft-190: as dftp-2, with a firstAvailable request first and two nodes",
        [NodeSpec("", "inf2.48xlarge", network_layer1="nn-b"), "inf2.48xlarge"],
        {1: [8, 9, 10, 11]},
        [
            {
                "name": "a",
                "firstAvailable": [
                    {"name": "s0", **_exactly(4, f'{_A}.instanceType == "trn3.48xlarge"')},
                    {"name": "s1", **_exactly(8)},
                ],
            },
            {"name": "b", "exactly": _exactly(4, f'{_A}.networkNodeLayer1 == "nn-a"')},
        ],
        [{"matchAttribute": f"{DRIVER_NAME}/topology4_id"}],
    ),
    _pin(
        4, ERROR,
        "seed 1, dft-97: the claim fits on the first node, but its selector fails on another "
        "node's neuronnode; the scheduler filters every node and one error fails the pod (the "
        "allocator stopped at the first node that fits)",
        ["trn2.48xlarge", NodeSpec("", "trn2u.48xlarge", ultraserver_id="5eed0000a0000002",
                                   ultraserver_node_id=1), "inf2.48xlarge"],
        {
            0: [0, 2, 5, 7, 8, 11],
            1: [0, 1, 2, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14],
            2: [0, 1, 2, 4, 5, 7, 8, 9, 10, 11],
        },
        [
            {
                "name": "a",
                "firstAvailable": [
                    {"name": "s0", **_exactly(3, f"{_A}.coreCount >= 8")},
                    {"name": "s1", **_exactly(2)},
                ],
            }
        ],
        [{"matchAttribute": "resource.aws.com/devicegroup8_id", "requests": ["a/s0"]}],
    ),
    _pin(
        5, UNSCHEDULABLE,
        "the scheduler checks whether a device is in use before its selectors: the selector "
        "failing on neuronnode (no coreCount) is not evaluated when neuronnode is taken",
        ["trn2u.48xlarge"], {0: [*range(10), "neuronnode"]},
        [{"name": "a", "exactly": _exactly(8, f"{_A}.coreCount >= 2")}],
    ),
    _pin(
        6, ERROR,
        "dftp-5 with neuronnode free: its selector fails",
        ["trn2u.48xlarge"], {0: range(10)},
        [{"name": "a", "exactly": _exactly(8, f"{_A}.coreCount >= 2")}],
    ),
    _pin(
        7, FITS,
        "dft-153: 1.34 says unschedulable (an All subrequest after the first continues with the "
        "first subrequest's count and selectors, fixed by 1.37)",
        [NodeSpec("", "trn1.32xlarge", driver_version="2.22.2.0"),
         NodeSpec("", "inf2.48xlarge", driver_version="2.22.2.0")],
        {1: [0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11]},
        [
            {
                "name": "a",
                "firstAvailable": [
                    {"name": "s0", **_exactly(4, f'{_A}.instanceType == "inf2.48xlarge"')},
                    {
                        "name": "s1",
                        **_exactly(
                            None, f"{_A}.deviceId >= 4 && {_A}.deviceId < 13", allocationMode="All"
                        ),
                    },
                ],
            }
        ],
    ),
    _pin(
        8, FITS,
        "dft-184: 1.34 allocates three devices with one topology4_id (its distinctAttribute "
        "compares pointers, fixed by 1.37)",
        ["trn2.48xlarge", NodeSpec("", "inf2.48xlarge", network_layer1="nn-b")],
        {0: [0, 6]},
        [{"name": "a", "exactly": _exactly(3)}],
        [{"distinctAttribute": f"{DRIVER_NAME}/topology4_id"}],
    ),
]  # fmt: skip


# --- the verdicts compared -----------------------------------------------------------------


def known_upstream_bug(case: Case, minor: str | None) -> str | None:
    """Why the real scheduler of ``minor`` may legitimately differ on this case: a bug of its
    own allocator, fixed upstream (our allocator follows the fixed behaviour)."""
    if minor != "1.34":
        return None
    devices = case.claim["devices"]
    if any("distinctAttribute" in c for c in devices.get("constraints") or ()):
        # distinctAttributeConstraint.matchesAttribute compares the values' pointers, so no
        # device is ever refused for a repeated value (1.37 compares the values).
        return "1.34 ignores distinctAttribute"
    for request in devices["requests"]:
        subs = request.get("firstAvailable") or []
        if any(sub.get("allocationMode") == "All" for sub in subs[1:]):
            # allocateOne recurses into the next device of an All request without its
            # subRequestIndex, i.e. with the first subrequest's count and selectors (1.37
            # passes it on).
            return "1.34 mixes an All subrequest after the first with the first one"
    return None


@dataclass
class Outcome:
    case: Case
    ours: Answer
    check_claim: Answer
    check_claim_prepare_fits: bool
    real: Answer | None = None
    #: Set when the answers may differ because of a known upstream bug of the real minor.
    known: str | None = None

    def disagreement(self) -> str | None:
        """None when the answers agree (and every allocation is valid), else a report."""
        problems = []
        answers = {"ours": self.ours, "check-claim": self.check_claim}
        if self.real is not None:
            answers = {"real": self.real, **answers}
        verdicts = {a.verdict for a in answers.values()}
        if len(verdicts) > 1:
            problems.append("verdicts differ")
        for who, answer in answers.items():
            if answer.verdict == FITS and answer.node is not None:  # (a pinned verdict has none)
                bad = violations(self.case, answer.node, answer.results)
                if bad:
                    problems.append(f"{who}'s allocation: " + "; ".join(bad))
        if not problems:
            return None
        lines = [self.case.describe(), "  " + "; ".join(problems)]
        lines += [f"  {who}: {answer}" for who, answer in answers.items()]
        return "\n".join(lines)


def local_outcome(case: Case) -> Outcome:
    cc = check_claim_verdict(case)
    return Outcome(case, our_verdict(case), cc.answer, cc.fits_with_prepare)


def pinned_cases() -> list[Case]:
    return [copy.deepcopy(p.case) for p in PINNED]


def summarize(outcomes: Sequence[Outcome], world: str, seconds: float) -> str:
    verdicts = Counter((o.real or o.ours).verdict for o in outcomes)
    timeouts = sum(1 for o in outcomes if o.real and "timed out" in o.real.detail)
    prepare = sum(
        1 for o in outcomes if o.check_claim.verdict == FITS and not o.check_claim_prepare_fits
    )
    known = Counter(o.known for o in outcomes if o.known and o.disagreement() is not None)
    shown = ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items()))
    extra = "".join(f"; {n} differ by a known upstream bug ({why})" for why, n in known.items())
    return (
        f"{world}: {len(outcomes)} cases in {seconds:.1f}s ({shown}; the real allocator "
        f"timed out on {timeouts}; check-claim adds a Prepare refusal to {prepare} of the "
        f"allocated{extra})"
    )


def assert_agree(outcomes: Sequence[Outcome], world: str, seconds: float) -> None:
    summary = summarize(outcomes, world, seconds)
    print(summary)
    reports = [r for o in outcomes if not o.known and (r := o.disagreement()) is not None]
    if reports:
        shown = "\n\n".join(reports[:15])
        more = f"\n\n... and {len(reports) - 15} more" if len(reports) > 15 else ""
        pytest.fail(f"{len(reports)} disagreement(s); {summary}\n\n{shown}{more}", pytrace=False)


# --- the tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("world", world_params())
async def test_allocator_differential(world: str) -> None:
    cases = generate_many(SEED, CASES)
    start = time.monotonic()
    minor = minor_of(world)
    if minor is None:
        outcomes = [local_outcome(c) for c in cases]
    else:
        cp = real_control_plane(minor)  # skips (fails on CI) when the minor is not built
        cases += pinned_cases()
        outcomes = [local_outcome(c) for c in cases]
        real = await ask_real_scheduler(cp, cases)
        for o in outcomes:
            o.real = real[o.case.name]
            o.known = known_upstream_bug(o.case, minor)
    assert_agree(outcomes, world, time.monotonic() - start)


@pytest.mark.parametrize("pinned", PINNED, ids=[p.case.name for p in PINNED])
def test_pinned_case(pinned: Pinned) -> None:
    """A case that once split the answers: ours and check-claim give the real verdict."""
    outcome = local_outcome(copy.deepcopy(pinned.case))
    outcome.real = Answer(pinned.real)
    report = outcome.disagreement()
    assert report is None, f"{pinned.why}\n{report}"


# --- the real scheduler -----------------------------------------------------------------------

T = TypeVar("T")


async def bounded(coros: Iterable[Awaitable[T]], limit: int = 24) -> list[T]:
    """Run ``coros`` concurrently, at most ``limit`` at a time (the API server shares two
    cores with etcd, the controller-manager, the scheduler and this test)."""
    sem = asyncio.Semaphore(limit)

    async def one(c: Awaitable[T]) -> T:
        async with sem:
            return await c

    return list(await asyncio.gather(*(one(c) for c in coros)))


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _node_selector(node: str) -> dict[str, Any]:
    return {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }


def _claim_spec(count: int) -> dict[str, Any]:
    return {
        "devices": {
            "requests": [
                {
                    "name": "taken",
                    "exactly": {
                        "deviceClassName": DEVICE_CLASS_NEURON,
                        "allocationMode": "ExactCount",
                        "count": count,
                    },
                }
            ]
        }
    }


def _pod(name: str, namespace: str, selector_value: str, run: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {RUN_LABEL: run}},
        "spec": {
            "nodeSelector": {CASE_LABEL: selector_value},
            "tolerations": TOLERATIONS,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "neuron", "resourceClaimName": "claim"}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "neuron"}]},
                }
            ],
        },
    }


_DRA_REJECTIONS = r"(\d+) (?:cannot allocate all claims|timed out trying to allocate devices)"


def pod_verdict(pod: dict[str, Any], case: Case | None) -> Answer | None:
    """The scheduler's verdict on a pod, once it has one."""
    node = (pod.get("spec") or {}).get("nodeName")
    if node:
        return Answer(FITS, node=str(node))
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") != "PodScheduled" or cond.get("status") != "False":
            continue
        message = str(cond.get("message") or "")
        if cond.get("reason") == "Unschedulable":
            # Every node of the case must have been turned down by the DRA plugin: anything
            # else (a taint, a missing Node) would be a fault of this test, not an answer.
            # Its allocator giving up after its time limit is its answer too.
            by_dra = sum(int(n) for n in re.findall(_DRA_REJECTIONS, message))
            if case is not None and by_dra != len(case.nodes):
                return Answer(f"{UNSCHEDULABLE} (not by DRA on every node)", message)
            return Answer(UNSCHEDULABLE, message)
        if cond.get("reason") == "SchedulerError" and '"DynamicResources" filter' in message:
            return Answer(ERROR, message)
        # Other scheduler errors (a conflict while binding, say) are retried: keep waiting.
    return None


class Watched:
    """A label- or field-selected watch-fed store, to wait on without polling."""

    def __init__(self, kube: KubeClient, res: ApiResource, **selectors: str) -> None:
        self.reflector = Reflector(
            kube.resource(res), Store(), name=f"dft-{res.plural}", **selectors
        )

    async def __aenter__(self) -> Watched:
        self.reflector.start()
        await self.reflector.wait_synced()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.reflector.stop()

    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self.reflector.store.get_by_name(name, namespace)

    async def wait(self, predicate: Callable[[], bool], what: str, limit: float) -> None:
        try:
            async with asyncio.timeout(limit):
                await self.reflector.wait_until(predicate)
        except TimeoutError:
            raise AssertionError(f"timed out after {limit:g}s waiting for {what}") from None


async def ask_real_scheduler(cp: RealControlPlane, cases: Sequence[Case]) -> dict[str, Answer]:
    run = uuid.uuid4().hex[:8]
    answers: dict[str, Answer] = {}
    phases: dict[str, float] = {}
    async with await connect(cp.kubeconfig(ADMIN)) as kube:
        for cls in default_device_classes():
            with contextlib.suppress(AlreadyExistsError):
                await kube.resource(DEVICE_CLASSES).create(cls)
        async with (
            Watched(kube, PODS, label_selector=f"{RUN_LABEL}={run}") as pods,
            Watched(kube, SERVICE_ACCOUNTS, field_selector="metadata.name=default") as sas,
        ):
            for number, start in enumerate(range(0, len(cases), BATCH)):
                batch = _Batch(kube, cases[start : start + BATCH], number, run, pods, sas, phases)
                try:
                    answers.update(await batch.run())
                finally:
                    await batch.cleanup()
    print("real scheduler phases: " + ", ".join(f"{k} {v:.1f}s" for k, v in phases.items()))
    return answers


class _Batch:
    """Cases on the control plane at once. Everything a pod's scheduling depends on is
    written before any case pod exists, and a barrier pod proves the scheduler has seen it
    all: its node, slice and claim are written last, and each informer delivers in order."""

    def __init__(
        self,
        kube: KubeClient,
        cases: Sequence[Case],
        number: int,
        run: str,
        pods: Watched,
        sas: Watched,
        phases: dict[str, float],
    ) -> None:
        self.kube = kube
        self.cases = list(cases)
        self.run_id = run
        self.pods = pods
        self.sas = sas
        self.barrier = f"dft-barrier-{run}-{number}"
        self.node_uids: dict[str, str] = {}
        self.namespaces: list[str] = []
        self.pod_keys: list[tuple[str, str]] = []
        self.invalid: dict[str, Answer] = {}
        #: Seconds spent per phase (shown in the summary).
        self.phases = phases
        self._last = time.monotonic()

    # -- objects ------------------------------------------------------------------------------

    async def _namespace(self, name: str) -> None:
        await self.kube.resource(NAMESPACES).create(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "labels": {RUN_LABEL: self.run_id}},
            }
        )
        self.namespaces.append(name)

    async def _node(self, name: str, instance_type: str, case_value: str, index: int) -> None:
        body = real_node_object(SimNode(name, instance_type), index)
        body["metadata"]["labels"].update({CASE_LABEL: case_value, RUN_LABEL: self.run_id})
        body["spec"] = {"taints": [{"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}]}
        api = self.kube.resource(NODES)
        created = await api.create(body)
        self.node_uids[name] = str(created["metadata"]["uid"])
        await api.merge_patch(name, {"status": body["status"]}, subresource="status")

    async def _slice(self, obj: dict[str, Any]) -> None:
        obj = copy.deepcopy(obj)
        node = obj["spec"]["nodeName"]
        for ref in obj["metadata"].get("ownerReferences") or []:
            ref["uid"] = self.node_uids[node]  # else the garbage collector removes it
        obj["metadata"].setdefault("labels", {})[RUN_LABEL] = self.run_id
        await self.kube.resource(RESOURCE_SLICES).create(obj)

    async def _taken(self, case: Case, node: str, devices: list[str]) -> None:
        api = self.kube.resource(RESOURCE_CLAIMS)
        name = f"taken-{node}"
        await api.create(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": case.name},
                "spec": _claim_spec(len(devices)),
            }
        )
        allocation = {
            "devices": {
                "results": [
                    {"request": "taken", "driver": DRIVER_NAME, "pool": node, "device": d}
                    for d in devices
                ]
            },
            "nodeSelector": _node_selector(node),
        }
        await api.merge_patch(
            name, {"status": {"allocation": allocation}}, case.name, subresource="status"
        )

    async def _claim(self, case: Case) -> None:
        try:
            await self.kube.resource(RESOURCE_CLAIMS).create(claim_object(case))
        except InvalidError as err:
            self.invalid[case.name] = Answer(INVALID, str(err))

    async def _create_pod(self, namespace: str, selector_value: str) -> None:
        await self.kube.resource(PODS).create(_pod("pod", namespace, selector_value, self.run_id))
        self.pod_keys.append((namespace, "pod"))

    # -- the steps ----------------------------------------------------------------------------

    def _lap(self, phase: str) -> None:
        now = time.monotonic()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self._last
        self._last = now

    async def run(self) -> dict[str, Answer]:
        self._last = time.monotonic()
        await bounded(self._namespace(n) for n in [*(c.name for c in self.cases), self.barrier])
        await bounded(
            self._node(n.name, n.instance_type, c.name, i)
            for c in self.cases
            for i, n in enumerate(c.nodes)
        )
        await bounded(self._slice(s) for c in self.cases for s in c.slices)
        await bounded(
            self._taken(c, node, devices)
            for c in self.cases
            for node, devices in c.taken_by_node().items()
        )
        await bounded(self._claim(c) for c in self.cases)
        self._lap("objects")
        await self._barrier()
        self._lap("barrier")
        pending = [c for c in self.cases if c.name not in self.invalid]
        await bounded(self._create_pod(c.name, c.name) for c in pending)

        answers: dict[str, Answer] = dict(self.invalid)

        def settled() -> bool:
            for c in pending:
                if c.name not in answers:
                    pod = self.pods.get("pod", c.name)
                    got = pod_verdict(pod, c) if pod is not None else None
                    if got is not None:
                        answers[c.name] = got
            return len(answers) == len(self.cases)

        try:
            await self.pods.wait(
                settled, f"the scheduler's verdicts on {len(pending)} pods", VERDICT_LIMIT
            )
        except AssertionError as err:
            stuck = [c.name for c in pending if c.name not in answers]
            states = [
                f"{ns}: {json.dumps((self.pods.get('pod', ns) or {}).get('status'))}"
                for ns in stuck[:5]
            ]
            raise AssertionError(
                f"{err}; {len(stuck)} without one, e.g.\n" + "\n".join(states)
            ) from None
        self._lap("verdicts")
        for name, answer in list(answers.items()):
            if answer.verdict == FITS:
                claim = await self.kube.resource(RESOURCE_CLAIMS).get("claim", name)
                allocation = (claim.get("status") or {}).get("allocation") or {}
                results = tuple(allocation.get("devices", {}).get("results") or ())
                answers[name] = Answer(FITS, node=answer.node, results=results)
        return answers

    async def _barrier(self) -> None:
        b = self.barrier
        await self._node(b, "barrier", b, 0)
        await self._slice(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {
                    "name": f"{b}-{DRIVER_NAME}",
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "Node",
                            "name": b,
                            "uid": "",
                            "controller": True,
                        }
                    ],
                },
                "spec": {
                    "driver": DRIVER_NAME,
                    "nodeName": b,
                    "pool": {"name": b, "generation": 0, "resourceSliceCount": 1},
                    "devices": [{"name": "barrier0"}],
                },
            }
        )
        await self.kube.resource(RESOURCE_CLAIMS).create(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "claim", "namespace": b},
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "one", "exactly": {"deviceClassName": DEVICE_CLASS_NEURON}}
                        ]
                    }
                },
            }
        )
        await self.sas.wait(
            lambda: all(self.sas.get("default", ns) is not None for ns in self.namespaces),
            f"the default ServiceAccount of {len(self.namespaces)} namespaces",
            120.0,
        )
        await self._create_pod(b, b)

        def bound() -> bool:
            pod = self.pods.get("pod", b)
            return bool(pod and (pod.get("spec") or {}).get("nodeName"))

        await self.pods.wait(bound, "the barrier pod to be bound", 120.0)

    async def cleanup(self) -> None:
        """Pods go at once (no kubelet would confirm a graceful delete), then the nodes (their
        slices follow by owner reference) and the namespaces (claims and all)."""
        pods = self.kube.resource(PODS)
        await bounded(
            _gone(pods.delete(name, ns, grace_period_seconds=0)) for ns, name in self.pod_keys
        )
        nodes = self.kube.resource(NODES)
        await bounded(_gone(nodes.delete(name)) for name in self.node_uids)
        namespaces = self.kube.resource(NAMESPACES)
        await bounded(_gone(namespaces.delete(name)) for name in self.namespaces)
        self._lap("cleanup")


async def _gone(call: Awaitable[Any]) -> None:
    with contextlib.suppress(NotFoundError):
        await call
