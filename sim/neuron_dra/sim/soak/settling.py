"""Watching the system settle: the snapshot the checks read, the checker that runs all along,
the deleted workloads' frees, convergence after the churn and the final clean-up."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import TYPE_CHECKING

from neuron_dra.common.constants import DRIVER_NAMESPACE
from neuron_dra.common.k8s.client import (
    NEURON_ULTRASERVER_WORKLOADS,
    NEURON_ULTRASERVERS,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from neuron_dra.nodeplugin.prepare.cdi import list_cdi_specs
from neuron_dra.sim.soak.churn import delete_claim, delete_workload
from neuron_dra.sim.soak.invariants import always_violations, freed, why_claim_remains
from neuron_dra.sim.soak.options import NS, JsonDict

if TYPE_CHECKING:
    from neuron_dra.sim.soak.harness import Soak


async def snapshot(soak: Soak) -> JsonDict:
    """What the checks read: the API objects and each node's checkpoint and CDI specs."""
    assert soak.kube is not None
    # Lists of different kinds are reads at different moments. The controller writes a
    # workload's entries before its Allocated status and its Deallocating status before it
    # removes them, so the workloads are read before and after the entries: one Allocated,
    # unchanged, in both reads held its entries in between (the all-or-nothing check reads
    # it so; a concurrent read of both once saw an allocation half-written).
    workloads_api = soak.kube.resource(NEURON_ULTRASERVER_WORKLOADS)
    before = (await workloads_api.list_all(NS)).items
    lists = await asyncio.gather(
        soak.kube.resource(RESOURCE_CLAIMS).list_all(NS),
        soak.kube.resource(NEURON_ULTRASERVERS).list_all(DRIVER_NAMESPACE),
        soak.kube.resource(RESOURCE_SLICES).list_all(),
        soak.kube.resource(PODS).list_all(NS),
    )
    claims, nus, slices, pods = (x.items for x in lists)
    workloads = (await workloads_api.list_all(NS)).items
    files: dict[str, tuple[dict[str, JsonDict], set[str]]] = {}
    for node in soak.nodes:
        files[node.name] = (read_checkpoint(soak, node.name), read_cdi(soak, node.name))
    return {
        "claims": claims,
        "nus": nus,
        "workloads": workloads,
        "workloads_before": before,
        "slices": slices,
        "pods": pods,
        "files": files,
    }


def read_checkpoint(soak: Soak, node: str) -> dict[str, JsonDict]:
    try:
        doc = json.loads(soak.checkpoint(node).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        soak.violate("checkpoint-unreadable", f"{node}: {exc}")
        return {}
    return dict((doc.get("data") or {}).get("claims") or {})


def read_cdi(soak: Soak, node: str) -> set[str]:
    root = soak.cdi_root(node)
    return set(list_cdi_specs(root)) if root.exists() else set()


def check_frees(soak: Soak, snap: JsonDict, *, final: bool = False) -> None:
    """Note the deleted workloads now freed; one not freed ``free_bound`` s after the system
    is whole (or at all, when ``final``) is a violation."""
    now = time.monotonic()
    for wid, (deleted_at, name) in list(soak.pending_free.items()):
        why = freed(snap, wid, name)
        if why is None:
            soak.free_latency.append(now - deleted_at)
            del soak.pending_free[wid]
            continue
        if soak.whole_since is None:
            continue
        since = max(deleted_at, soak.t0 + soak.whole_since)
        if now - since > soak.o.free_bound or final:
            soak.violate(
                "not-freed",
                f"workload {name} ({wid}) deleted {now - deleted_at:.0f}s ago, system "
                f"whole for {now - soak.t0 - soak.whole_since:.0f}s: {why}",
            )
            del soak.pending_free[wid]


async def checker(soak: Soak) -> None:
    """The checks that hold at every instant, every 3 s; each snapshot is handed on to
    :func:`container_checker`."""
    reported: set[tuple[str, str]] = set()
    while not soak.stopping.is_set():
        await asyncio.sleep(3.0)
        try:
            snap = await snapshot(soak)
        except Exception:
            continue  # the API server may be down
        soak.checks += 1
        _report_once(soak, always_violations(snap), reported)
        check_frees(soak, snap)
        soak.latest_snapshot = snap
        soak.new_snapshot.set()


async def container_checker(soak: Soak) -> None:
    """Each new Running container looked into (real nodes; a ``kubectl exec`` each, so in a
    loop of its own: a slow look never delays the checks above), from the newest snapshot
    the checker took."""
    reported: set[tuple[str, str]] = set()
    while not soak.stopping.is_set():
        await soak.new_snapshot.wait()
        soak.new_snapshot.clear()
        assert soak.latest_snapshot is not None
        found = await soak.node_side.check_containers(soak.latest_snapshot, every=False)
        _report_once(soak, found, reported)


def _report_once(soak: Soak, found: list[tuple[str, str]], reported: set[tuple[str, str]]) -> None:
    for kind, detail in found:
        # The same instance stays visible for a few rounds: report it once.
        if (kind, detail) not in reported:
            reported.add((kind, detail))
            soak.violate(kind, detail)


async def controller_settled(soak: Soak) -> bool | str:
    """The leader's queues are empty and nothing is retried over 10 s."""
    leader = await soak.leader()
    http = soak.http
    if leader is None or http is None:
        return "no leader"

    async def sample() -> tuple[float, float]:
        async with http.get(f"http://127.0.0.1:{leader.http_port()}/metrics") as r:
            text = await r.text()
        depth = sum(
            float(v) for v in re.findall(r"^neuron_dra_workqueue_depth\{[^}]*\} (\S+)", text, re.M)
        )
        retries = sum(
            float(v)
            for v in re.findall(r"^neuron_dra_workqueue_retries_total\{[^}]*\} (\S+)", text, re.M)
        )
        return depth, retries

    d0, r0 = await sample()
    await asyncio.sleep(10)
    d1, r1 = await sample()
    if d0 or d1 or r1 != r0:
        return f"leader {leader.name}: depth {d0}/{d1}, retries +{r1 - r0:.0f} in 10s"
    return True


async def converge(soak: Soak, what: str) -> None:
    """Wait for the system whole and every settled-state check passing."""
    soak.event(f"converging ({what})")
    try:
        await soak.wait(soak.whole, f"whole ({what})", soak.o.recover_limit)
    except TimeoutError as exc:
        soak.violate("recovery", str(exc))
        return
    soak.whole_since = soak.whole_since or soak.now()
    last: list[tuple[str, str]] = []

    async def settled() -> bool | str:
        nonlocal last
        snap = await snapshot(soak)
        last = always_violations(snap) + soak.check_converged(snap)
        last += await soak.node_side.check_containers(snap, every=True)
        check_frees(soak, snap)
        if last:
            return "; ".join(f"{k}: {d}" for k, d in last[:3])
        return True

    try:
        await soak.wait(settled, f"settled ({what})", soak.o.converge_limit)
    except TimeoutError:
        for kind, detail in last:
            soak.violate(kind, f"{detail} (after {soak.o.converge_limit:.0f}s)")
    try:
        await soak.wait(lambda: controller_settled(soak), "controller settled", 120)
    except TimeoutError as exc:
        soak.violate("controller-not-converged", str(exc))


async def cleanup(soak: Soak) -> None:
    """Delete everything the churn made; every workload must then be freed."""
    assert soak.kube is not None
    for name in list(soak.workloads):
        await delete_workload(soak, sorted(soak.workloads).index(name) / len(soak.workloads))
    for name in list(soak.plain):
        await delete_claim(soak, sorted(soak.plain).index(name) / len(soak.plain))
    soak.whole_since = soak.now()

    async def all_free() -> bool | str:
        snap = await snapshot(soak)
        check_frees(soak, snap)
        if soak.pending_free:
            return f"{len(soak.pending_free)} workloads not freed"
        busy = [c["metadata"]["name"] for c in snap["claims"]]
        if busy:
            return f"claims remain: {busy[:5]}"
        return True

    try:
        await soak.wait(all_free, "everything freed", soak.o.free_bound + 30)
    except TimeoutError:
        snap = await snapshot(soak)
        check_frees(soak, snap, final=True)
        if snap["claims"]:
            left = "; ".join(why_claim_remains(snap, c) for c in snap["claims"])
            soak.violate("not-freed", f"claims left after cleanup: {left}")
