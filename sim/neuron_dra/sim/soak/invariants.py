"""The promises the soak checks, as pure functions of a snapshot (the API objects and each
node's checkpoint and CDI specs): what holds at every instant, and what holds once settled."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from neuron_dra.common.constants import ATTR_WORKLOAD_ID, DRIVER_NAME, LABEL_WORKLOAD_ID
from neuron_dra.common.ultraserver import node_reservations
from neuron_dra.sim.simcluster.containers import ContainerDevices
from neuron_dra.sim.soak.options import JsonDict

#: The environment that says which cores and which rank a container has.
ENV_VISIBLE_CORES = "NEURON_RT_VISIBLE_CORES"
ENV_GLOBAL_TOPOID = "NEURON_GLOBAL_TOPOID"


def slice_tags(slices: Iterable[JsonDict]) -> set[tuple[str, str]]:
    """(node, workloadId) for every device of our driver tagged with a workloadId."""
    out: set[tuple[str, str]] = set()
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != DRIVER_NAME:
            continue
        node = str(spec.get("nodeName") or "")
        for device in spec.get("devices") or []:
            for key, value in (device.get("attributes") or {}).items():
                if key.split("/")[-1] == ATTR_WORKLOAD_ID and isinstance(value, dict):
                    out.add((node, str(value.get("string"))))
    return out


def allocation_entries(nus_objects: Iterable[JsonDict]) -> list[tuple[str, JsonDict]]:
    return [
        (str(n["metadata"]["name"]), e)
        for n in nus_objects
        for e in (n.get("status") or {}).get("allocations") or []
    ]


def allocated_devices(claim: JsonDict) -> list[tuple[str, str]]:
    alloc = (claim.get("status") or {}).get("allocation") or {}
    return [
        (str(r.get("pool")), str(r.get("device")))
        for r in (alloc.get("devices") or {}).get("results") or []
        if r.get("driver") == DRIVER_NAME
    ]


def always_violations(snap: JsonDict) -> list[tuple[str, str]]:
    """What must hold at every instant, faults or not."""
    out: list[tuple[str, str]] = []
    claims: list[JsonDict] = snap["claims"]
    allocated = {c["metadata"]["uid"]: c for c in claims if allocated_devices(c)}
    # 1. No device allocated to, or prepared for, two live (allocated) claims.
    holders: dict[tuple[str, str], set[str]] = {}
    for uid, c in allocated.items():
        for dev in allocated_devices(c):
            holders.setdefault(dev, set()).add(uid)
    for node, (checkpoint, _) in snap["files"].items():
        for uid, entry in checkpoint.items():
            if uid not in allocated:
                continue
            for d in entry.get("devices") or []:
                holders.setdefault((node, str(d.get("deviceName"))), set()).add(uid)
    for dev, uids in holders.items():
        if len(uids) > 1:
            names = sorted(allocated[u]["metadata"]["name"] for u in uids)
            out.append(("double-use", f"device {dev} held by live claims {names}"))
    # 2. No node in two allocation entries; 3. all-or-nothing for Allocated workloads.
    entries = allocation_entries(snap["nus"])
    seen: dict[str, str] = {}
    for nus, e in entries:
        for node in e.get("allocatedNodes") or []:
            ref = f"{e.get('workloadRef')}#{e.get('ultraserverIndex')}"
            if node in seen and seen[node] != ref:
                out.append(("node-booked-twice", f"{node}: {seen[node]} and {ref} ({nus})"))
            seen[node] = ref
    live = {
        str(w["status"].get("workloadId")): w
        for w in snap["workloads"]
        if (w.get("status") or {}).get("workloadId") and not w["metadata"].get("deletionTimestamp")
    }
    # Allocated and unchanged from before the entries were read to after (settling.py).
    before: list[JsonDict] = snap["workloads_before" if "workloads_before" in snap else "workloads"]
    steady = {(w["metadata"].get("uid"), w["metadata"].get("resourceVersion")) for w in before}
    for wid, w in live.items():
        if (w.get("status") or {}).get("state") != "Allocated":
            continue
        if (w["metadata"].get("uid"), w["metadata"].get("resourceVersion")) not in steady:
            continue
        mine = [e for _, e in entries if e.get("workloadId") == wid]
        spec = w["spec"]
        sizes = sorted(len(e.get("allocatedNodes") or []) for e in mine)
        if len(mine) != int(spec["serverCount"]) or any(
            s != int(spec["topologySize"]) for s in sizes
        ):
            out.append(
                (
                    "not-all-or-nothing",
                    f"{w['metadata']['name']} Allocated with units of sizes {sizes}, "
                    f"wants {spec['serverCount']}x{spec['topologySize']}",
                )
            )
    # 4. A live workload's claims only on its reserved nodes.
    reserved: dict[str, set[str]] = {}
    for _, e in entries:
        reserved.setdefault(str(e.get("workloadId")), set()).update(e.get("allocatedNodes") or [])
    for c in claims:
        cwid = str((c["metadata"].get("labels") or {}).get(LABEL_WORKLOAD_ID) or "")
        if not cwid or cwid not in live:
            continue
        outside = {p for p, _ in allocated_devices(c)} - reserved.get(cwid, set())
        if outside:
            out.append(
                (
                    "outside-reservation",
                    f"claim {c['metadata']['name']} of {cwid} on {sorted(outside)}",
                )
            )
    return out


def freed(snap: JsonDict, wid: str, name: str) -> str | None:
    """Why the deleted workload ``wid`` is not free yet (None once it is)."""
    if any(
        (w.get("status") or {}).get("workloadId") == wid or w["metadata"]["name"] == name
        for w in snap["workloads"]
    ):
        return "workload object still there"
    if any(e.get("workloadId") == wid for _, e in allocation_entries(snap["nus"])):
        return "allocation entries remain"
    if any(t == wid for _, t in slice_tags(snap["slices"])):
        return "slices still tagged"
    left = [
        c
        for c in snap["claims"]
        if (c["metadata"].get("labels") or {}).get(LABEL_WORKLOAD_ID) == wid
    ]
    if left:
        return "claims remain: " + "; ".join(why_claim_remains(snap, c) for c in left)
    return None


def why_claim_remains(snap: JsonDict, claim: JsonDict) -> str:
    """What holds ``claim`` in the API: whether it is being deleted, its finalizers, its
    allocation's nodes, and each consumer in ``reservedFor`` with its pod's phase, node and
    deletion (a pod gone from the API is named so), and the nodes whose checkpoint still
    holds it prepared. What a claim left after cleanup is reported with."""
    meta, status = claim["metadata"], claim.get("status") or {}
    nodes = sorted({pool for pool, _device in allocated_devices(claim)})
    pods = {p["metadata"]["uid"]: p for p in snap["pods"]}
    consumers = []
    for ref in status.get("reservedFor") or []:
        pod = pods.get(ref.get("uid"))
        if pod is None:
            consumers.append(f"{ref.get('name')} (gone)")
            continue
        deleting = " deleting" if pod["metadata"].get("deletionTimestamp") else ""
        consumers.append(
            f"{ref.get('name')} ({(pod.get('status') or {}).get('phase')} on "
            f"{pod['spec'].get('nodeName') or 'no node'}{deleting})"
        )
    prepared = sorted(
        node for node, (checkpoint, _cdi) in snap["files"].items() if meta["uid"] in checkpoint
    )
    return (
        f"{meta['name']}: {'deleting' if meta.get('deletionTimestamp') else 'not deleted'}, "
        f"finalizers {meta.get('finalizers') or []}, allocated on {nodes or '-'}, "
        f"reserved for {consumers or '-'}, prepared on {prepared or '-'}, "
        f"resourceVersion {meta.get('resourceVersion')}"
    )


def converged_violations(
    snap: JsonDict, kubelet_prepared: Mapping[str, set[str]]
) -> list[tuple[str, str]]:
    """What must hold once the system has settled (``kubelet_prepared``: the claims each
    node's kubelet holds prepared)."""
    out: list[tuple[str, str]] = []
    claims = {c["metadata"]["uid"]: c for c in snap["claims"]}
    running = {
        p["metadata"]["uid"]: p
        for p in snap["pods"]
        if (p.get("status") or {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    }
    for node, (checkpoint, cdi) in snap["files"].items():
        ck = set(checkpoint)
        kubelet = kubelet_prepared[node]
        expected = {
            uid
            for uid, c in claims.items()
            if any(p == node for p, _ in allocated_devices(c))
            and any(
                r.get("uid") in running for r in (c.get("status") or {}).get("reservedFor") or []
            )
        }
        if ck != cdi:
            detail = f"checkpoint-only {sorted(ck - cdi)}, cdi-only {sorted(cdi - ck)}"
            out.append(("checkpoint-cdi", f"{node}: {detail}"))
        # A real kubelet records a claim before its Prepare succeeds: one it holds for a pod
        # that is not running (its Prepare refused, say) is not an orphan; one the plugin
        # holds and the kubelet does not is (nobody will unprepare it).
        kubelet_only = (kubelet - ck) & expected
        if ck - kubelet or kubelet_only:
            detail = f"checkpoint-only {sorted(ck - kubelet)}, kubelet-only {sorted(kubelet_only)}"
            out.append(("checkpoint-kubelet", f"{node}: {detail}"))
        if expected - ck:
            out.append(("missing-prepare", f"{node}: {sorted(expected - ck)}"))
        if ck - set(claims):
            out.append(("orphan-prepare", f"{node}: {sorted(ck - set(claims))}"))
    # An Allocated workload's pods run (once settled): its units are whole nodes it holds,
    # so nothing may keep its claims from being prepared.
    allocated = {
        str(w["metadata"]["name"])
        for w in snap["workloads"]
        if (w.get("status") or {}).get("state") == "Allocated"
        and not w["metadata"].get("deletionTimestamp")
    }
    for p in snap["pods"]:
        owner = (p["metadata"].get("labels") or {}).get("workload")
        phase = (p.get("status") or {}).get("phase")
        if owner in allocated and phase != "Running" and not p["metadata"].get("deletionTimestamp"):
            out.append(
                ("workload-pod-not-running", f"pod {p['metadata']['name']} of {owner}: {phase}")
            )
    live = {
        str(w["status"]["workloadId"])
        for w in snap["workloads"]
        if (w.get("status") or {}).get("workloadId")
    }
    want = {
        (str(n), str(e.get("workloadId")))
        for _, e in allocation_entries(snap["nus"])
        if e.get("phase") != "Releasing" and e.get("workloadId") in live
        for n in e.get("allocatedNodes") or []
    }
    tags = slice_tags(snap["slices"])
    if tags != want:
        out.append(
            (
                "workload-tags",
                f"slice-only {sorted(tags - want)}, nus-only {sorted(want - tags)}",
            )
        )
    return out


@dataclass(frozen=True)
class ContainerExpectation:
    """What a Running container must have, from its claims' allocations and the
    NeuronUltraServers' entries alone (not from anything the plugin wrote)."""

    device_nodes: tuple[str, ...]
    visible_cores: str
    #: ``NEURON_GLOBAL_TOPOID``; None: the variable must be absent (not a workload's claim).
    rank: str | None


def pod_claim_names(pod: JsonDict) -> list[str] | None:
    """The ResourceClaim names ``pod`` uses (a template's generated name from the pod's
    status); None while one is not known yet."""
    generated = {
        str(s.get("name")): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    out = []
    for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = ref.get("resourceClaimName") or generated.get(str(ref.get("name")))
        if not name:
            return None
        out.append(str(name))
    return out


def expected_container(
    pod: JsonDict,
    claims: Mapping[str, JsonDict],
    nus_objects: Iterable[JsonDict],
    cores_per_device: int,
) -> ContainerExpectation | None:
    """What the container of ``pod`` (one container using all its claims) must have, or
    None when that cannot be said (a claim gone or not allocated: the pod is going away).
    ``claims`` by name in the pod's namespace; ``cores_per_device``: logical cores."""
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    names = pod_claim_names(pod)
    if not node or names is None or any(n not in claims for n in names):
        return None
    indices: list[int] = []
    wids = set()
    for name in names:
        claim = claims[name]
        devices = allocated_devices(claim)
        if not devices:
            return None
        indices += [int(re.sub(r"\D", "", d)) for pool, d in devices if pool == node]
        wid = (claim["metadata"].get("labels") or {}).get(LABEL_WORKLOAD_ID)
        if wid:
            wids.add(str(wid))
    rank = None
    if wids:
        mine = [r for r in node_reservations(nus_objects, node) if r.workload_id in wids]
        if len(mine) != 1:
            return None  # the workload's entry is going (or never was: another check's case)
        rank = str(mine[0].rank)
    first, last = min(indices) * cores_per_device, (max(indices) + 1) * cores_per_device - 1
    return ContainerExpectation(
        device_nodes=tuple(f"/dev/neuron{i}" for i in sorted(indices)),
        visible_cores=str(first) if first == last else f"{first}-{last}",
        rank=rank,
    )


def container_differences(want: ContainerExpectation, seen: ContainerDevices) -> list[str]:
    """How what a container has differs from what its claims give (empty: exactly that)."""
    out = []
    if tuple(seen.device_nodes) != want.device_nodes:
        out.append(f"device nodes {seen.device_nodes}, claims give {list(want.device_nodes)}")
    cores = seen.env.get(ENV_VISIBLE_CORES)
    if cores != want.visible_cores:
        out.append(f"{ENV_VISIBLE_CORES}={cores}, claims give {want.visible_cores}")
    rank = seen.env.get(ENV_GLOBAL_TOPOID)
    if rank != want.rank:
        out.append(f"{ENV_GLOBAL_TOPOID}={rank}, claims give {want.rank}")
    return out
