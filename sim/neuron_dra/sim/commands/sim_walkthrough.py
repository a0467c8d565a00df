"""The seed walkthrough that ``neuron-dra sim`` runs on the simulated cluster.

Each step applies manifests from ``examples/specs/`` the way a user would, waits for the
cluster to act on them, prints what happened as tables (which pod got which devices and what
its containers would see) and checks the outcome against what the seeds promise. A step that
does not behave raises :class:`StepFailed` with what was expected; steps clean up after
themselves so the next one starts from an idle cluster.
"""

from __future__ import annotations

import copy
import io
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml
from neuron_dra.common import constants as c
from neuron_dra.common.k8s.errors import InvalidError, KubeError
from neuron_dra.sim.controlplane.workloads import PodSet
from neuron_dra.sim.paths import repo_root
from neuron_dra.sim.simcluster import SimCluster
from neuron_dra.sim.simcluster.topology import ULTRASERVER_TYPE, node_dns_name

JsonDict = dict[str, Any]
NS = "default"
TABLE_ACCEPT = "application/json;as=Table;v=v1;g=meta.k8s.io"
WORKLOAD_PLACEHOLDER = "<trn3pds instance type>"
G4 = "resource.aws.com/devicegroup4_id"
G8 = "resource.aws.com/devicegroup8_id"
ENV_CORES = "NEURON_RT_VISIBLE_CORES"
ENV_LNC = "NEURON_LOGICAL_NC_CONFIG"
ENV_MODE = "NEURON_RT_ULTRASERVER_MODE"
ENV_SERVER = "NEURON_RT_ULTRASERVER_SERVER_ID"
ENV_NODE = "NEURON_RT_ULTRASERVER_NODE_ID"
ENV_RANK = "NEURON_GLOBAL_TOPOID"
ENV_RANK0 = "NEURON_GLOBAL_TOPOID0_HOST"


class StepFailed(Exception):
    """A walkthrough step did not behave as the seeds say it should."""


def expect(ok: bool, message: str) -> None:
    if not ok:
        raise StepFailed(message)


# --- pure helpers ------------------------------------------------------------------------------


def render_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Columns aligned the way ``kubectl get`` prints them."""
    text = [[str(h) for h in headers], *([("" if v is None else str(v)) for v in r] for r in rows)]
    widths = [max(len(r[i]) for r in text) for i in range(len(headers))]
    return "\n".join(
        "   ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in text
    )


def core_count(ranges: str) -> int:
    """How many cores ``NEURON_RT_VISIBLE_CORES`` (``0-15`` or ``3``) names."""
    total = 0
    for part in ranges.split(","):
        lo, _, hi = part.partition("-")
        total += int(hi or lo) - int(lo) + 1
    return total


def device_order(name: str) -> tuple[int, str]:
    digits = name.removeprefix("neurondevice")
    return (int(digits), "") if digits.isdigit() else (-1, name)


def compact_devices(names: Iterable[str]) -> str:
    """``neurondevice0..3`` for a run, names otherwise."""
    ordered = sorted(names, key=device_order)
    idx = [device_order(n)[0] for n in ordered]
    if len(idx) > 1 and all(i >= 0 for i in idx) and idx == list(range(idx[0], idx[0] + len(idx))):
        return f"neurondevice{idx[0]}..{idx[-1]}"
    return ",".join(ordered)


#: NEURON_RT_ULTRASERVER_MODE is the driver's enum, not a node count (reference/neuron.md).
MODE_NAMES = {"1": "X4", "2": "X2H", "3": "X2V", "4": "X1"}


def mode_label(value: str | None) -> str:
    """``1 (X4)`` for the table: the number alone reads like a node count."""
    if value is None:
        return "-"
    return f"{value} ({MODE_NAMES[value]})" if value in MODE_NAMES else value


def workload_for_sim(doc: Mapping[str, Any], instance_type: str) -> JsonDict:
    """The seed's workload with its instance-type placeholder filled in."""
    out = copy.deepcopy(dict(doc))
    if out.get("spec", {}).get("instanceType") == WORKLOAD_PLACEHOLDER:
        out["spec"]["instanceType"] = instance_type
    return out


# --- the walkthrough ---------------------------------------------------------------------------


@dataclass
class PodView:
    name: str
    node: str
    devices: list[str]
    env: dict[str, str]
    device_nodes: list[str]


class Walkthrough:
    def __init__(self, sim: SimCluster, out: TextIO, *, specs: Path | None = None) -> None:
        self.sim = sim
        self.out = out
        self.specs = specs or repo_root() / "examples" / "specs"

    # output

    def say(self, text: str = "") -> None:
        print(text, file=self.out)

    def table(self, headers: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
        for line in render_table(headers, rows).splitlines():
            self.say("    " + line)
        self.say()

    async def server_table(self, path: str) -> None:
        """A server-side Table (the printer columns ``kubectl get`` shows)."""
        kube = self.sim.kube
        assert kube is not None
        resp = await kube.api_client.call_api(
            path,
            "GET",
            header_params={"Accept": TABLE_ACCEPT},
            _preload_content=False,
            _request_timeout=10,
        )
        table = json.loads(await resp.read())
        cols = [
            i for i, col in enumerate(table["columnDefinitions"]) if col.get("priority", 0) == 0
        ]
        headers = [table["columnDefinitions"][i]["name"].upper() for i in cols]
        self.table(headers, ([row["cells"][i] for i in cols] for row in table["rows"]))

    # reading the cluster

    def spec(self, name: str) -> list[JsonDict]:
        path = self.specs / name
        return [d for d in yaml.safe_load_all(path.read_text()) if d]

    async def apply_spec(self, name: str) -> list[Any]:
        self.say(f"  kubectl apply -f examples/specs/{name}")
        return [await self.sim.apply(doc, NS) for doc in self.spec(name)]

    def device_attr(self, node: str, device: str, attr: str) -> Any:
        for s in self.sim.slices():
            if s["spec"].get("nodeName") != node:
                continue
            for d in s["spec"]["devices"]:
                if d["name"] == device:
                    value = (d.get("attributes") or {}).get(attr) or {}
                    return next(iter(value.values()), None)
        return None

    def view(self, pod: Mapping[str, Any], container: str | None = None) -> PodView:
        node = str(pod["spec"].get("nodeName") or "")
        devices = [
            r["device"]
            for claim in self.sim.claims_of(pod).values()
            for r in claim["status"]["allocation"]["devices"]["results"]
        ]
        got = self.sim.container_devices(pod)
        name = container or pod["spec"]["containers"][0]["name"]
        inj = got.get(name)
        return PodView(
            pod["metadata"]["name"],
            node,
            sorted(devices, key=device_order),
            dict(inj.env) if inj else {},
            list(inj.device_nodes) if inj else [],
        )

    async def running(self, names: Sequence[str]) -> list[JsonDict]:
        return await self.sim.wait_until(
            lambda: self.sim.running(names), f"pods {', '.join(names)} Running"
        )

    async def running_workload(self, workload: PodSet) -> list[JsonDict]:
        """The workload's pods once all it wants are Running (pod names are the server's,
        ``<name>-<5 random characters>`` for a Deployment)."""
        return await self.sim.wait_until(
            lambda: self.sim.running_workload(workload),
            f"{workload.expected} pods of {workload.set_name} Running",
        )

    async def create_pod(self, name: str, template: str, claim: str = "neurons") -> None:
        await self.sim.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {
                    "resourceClaims": [{"name": claim, "resourceClaimTemplateName": template}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "public.ecr.aws/docker/library/alpine:latest",
                            "command": ["sleep", "infinity"],
                            "resources": {"claims": [{"name": claim}]},
                        }
                    ],
                },
            },
            NS,
        )

    async def delete_pods(self, names: Iterable[str]) -> None:
        for name in names:
            await self.sim.delete("v1", "Pod", name, NS)
        await self.idle()

    async def remove(self, workload: PodSet) -> None:
        await self.sim.remove(workload)
        await self.idle()

    async def idle(self) -> None:
        """No pods or claims left and every node's CDI directory empty (all unprepared):
        deleted pods are gone once their kubelet has unprepared their claims."""

        await self.sim.wait_until(
            lambda: self.sim.idle(NS), "pods gone, claims released and unprepared"
        )

    # --- steps ---------------------------------------------------------------------------

    async def cluster(self) -> None:
        rows = []
        for n in self.sim.nodes:
            (s,) = [x for x in self.sim.slices() if x["spec"]["nodeName"] == n.name]
            neuron = [d for d in s["spec"]["devices"] if d["name"].startswith("neurondevice")]
            first = neuron[0]["name"]
            rows.append(
                (
                    n.name,
                    n.instance_type,
                    len(neuron),
                    self.device_attr(n.name, first, "neuronDriverVersion"),
                    n.ultraserver_id or "-",
                    "-" if n.ultraserver_node_id is None else n.ultraserver_node_id,
                )
            )
        self.say(f"  {len(rows)} nodes, each running the kubelet plugin in emulation mode:")
        self.table(("NODE", "INSTANCE TYPE", "DEVICES", "DRIVER", "ULTRASERVER", "NODE ID"), rows)
        expect(len(self.sim.slices()) == len(rows), "one ResourceSlice per node")
        self.say(f"  kubectl get neuronultraservers -n {c.DRIVER_NAMESPACE}")
        await self.server_table(
            f"/apis/{c.CRD_GROUP}/{c.CRD_VERSION}/namespaces/{c.DRIVER_NAMESPACE}/{c.PLURAL_ULTRASERVER}"
        )
        want = {n.ultraserver_id for n in self.sim.nodes if n.ultraserver_id}
        got = {u["metadata"]["name"] for u in self.sim.ultraservers()}
        expect(got == want, f"NeuronUltraServers {sorted(got)}, expected {sorted(want)}")

    async def connected(self) -> None:
        await self.apply_spec("connected-4-devices.yaml")
        await self.create_pod("connected-4", "1x4-connected-neurons")
        (pod,) = await self.running(["connected-4"])
        v = self.view(pod)
        groups = {self.device_attr(v.node, d, G4) for d in v.devices}
        self.table(
            ("POD", "NODE", "DEVICES", "DEVICEGROUP4_ID", ENV_CORES, "/dev"),
            [
                (
                    v.name,
                    v.node,
                    compact_devices(v.devices),
                    ",".join(map(str, groups)),
                    v.env.get(ENV_CORES),
                    " ".join(v.device_nodes),
                )
            ],
        )
        expect(len(v.devices) == 4, f"4 devices, got {v.devices}")
        expect(len(groups) == 1, f"the 4 devices share one devicegroup4_id, got {groups}")
        expect(len(v.device_nodes) == 4, f"4 device nodes in the container, got {v.device_nodes}")
        await self.delete_pods(["connected-4"])

    async def sizes(self) -> None:
        wanted = {
            "xl": ("all-devices-xl.yaml", "xl-trn2", 16, None),
            "large": ("half-node-l.yaml", "l-trn2", 8, G8),
            "driver-2-24": ("driver-version.yaml", "driver-2.24.7.0-trn2", 8, G8),
        }
        for pod_name, (spec, template, _, _) in wanted.items():
            await self.apply_spec(spec)
            await self.create_pod(pod_name, template)
        pods = await self.running(list(wanted))
        rows = []
        for pod in pods:
            v = self.view(pod)
            _, _, count, group = wanted[v.name]
            ids = {self.device_attr(v.node, d, group) for d in v.devices} if group else set()
            version = {self.device_attr(v.node, d, "neuronDriverVersion") for d in v.devices}
            rows.append(
                (
                    v.name,
                    v.node,
                    len(v.devices),
                    compact_devices(v.devices),
                    ",".join(sorted(map(str, version))),
                    v.env.get(ENV_CORES),
                )
            )
            expect(len(v.devices) == count, f"{v.name}: {count} devices, got {len(v.devices)}")
            expect(not group or len(ids) == 1, f"{v.name}: one {group}, got {ids}")
        self.table(("POD", "NODE", "COUNT", "DEVICES", "DRIVER", ENV_CORES), rows)
        await self.delete_pods(wanted)

    async def lnc(self) -> None:
        await self.apply_spec("lnc1.yaml")
        await self.create_pod("lnc-1", "all-neurons-lnc-1")
        (pod,) = await self.running(["lnc-1"])
        v = self.view(pod)
        self.table(
            ("POD", "NODE", "DEVICES", ENV_LNC, ENV_CORES),
            [
                (
                    v.name,
                    v.node,
                    compact_devices(v.devices),
                    v.env.get(ENV_LNC),
                    v.env.get(ENV_CORES),
                )
            ],
        )
        expect(len(v.devices) == 16, f"all 16 devices, got {len(v.devices)}")
        expect(v.env.get(ENV_LNC) == "1", f"{ENV_LNC}=1, got {v.env.get(ENV_LNC)}")
        # trn2: 8 physical cores per device, LNC 1 exposes each as a logical core.
        cores = core_count(v.env.get(ENV_CORES, "0-0"))
        expect(cores == 16 * 8, f"128 logical cores with LNC 1, got {cores}")
        await self.delete_pods(["lnc-1"])

    async def ultraserver_groups(self) -> None:
        await self.apply_spec("ultraserver-4-node.yaml")
        (lws,) = await self.apply_spec("ultraserver-4-node-lws.yaml")
        pods = await self.running_workload(lws)
        rows = []
        groups: dict[str, list[PodView]] = {}
        for pod in pods:
            v = self.view(pod)
            labels = pod["metadata"]["labels"]
            node = self.sim.view.get("v1", "Node", v.node) or {}
            us = node["metadata"]["labels"].get(c.LABEL_ULTRASERVER_SERVER_ID_4)
            groups.setdefault(labels["leaderworkerset.sigs.k8s.io/group-index"], []).append(v)
            rows.append(
                (
                    v.name,
                    labels.get("role"),
                    v.node,
                    us,
                    mode_label(v.env.get(ENV_MODE)),
                    v.env.get(ENV_SERVER),
                    v.env.get(ENV_NODE),
                )
            )
        self.table(("POD", "ROLE", "NODE", "ULTRASERVER", "MODE", "SERVER ID", "NODE ID"), rows)
        servers = []
        for index, members in sorted(groups.items()):
            ids = {m.env.get(ENV_SERVER) for m in members}
            nodes = sorted(m.env.get(ENV_NODE, "") for m in members)
            expect(len(members) == 4, f"group {index}: 4 pods, got {len(members)}")
            expect(len(ids) == 1, f"group {index}: one UltraServer, got {ids}")
            expect(nodes == ["0", "1", "2", "3"], f"group {index}: node ids 0..3, got {nodes}")
            modes = {m.env.get(ENV_MODE) for m in members}
            expect(modes == {"1"}, f"group {index}: {ENV_MODE}=1 (X4), got {modes}")
            servers.append(ids.pop())
        expect(len(set(servers)) == len(servers), f"one UltraServer per group, got {servers}")
        await self.remove(lws)

    async def operator(self) -> None:
        base = f"/apis/{c.CRD_GROUP}/{c.CRD_VERSION}/namespaces/{NS}/{c.PLURAL_WORKLOAD}"
        (doc,) = self.spec("ultraserver-workload.yaml")
        workload = workload_for_sim(doc, ULTRASERVER_TYPE)
        self.say("  kubectl apply -f examples/specs/ultraserver-workload.yaml")
        if doc["spec"]["instanceType"] != workload["spec"]["instanceType"]:
            self.say(
                f"    (instanceType {WORKLOAD_PLACEHOLDER!r} set to {ULTRASERVER_TYPE}, "
                "the simulated UltraServers)"
            )
        bad = copy.deepcopy(workload)
        bad["metadata"]["name"] = "bad-topology"
        bad["spec"]["topologySize"] = 3
        try:
            await self.sim.apply(bad, NS)
        except KubeError as exc:
            expect(
                isinstance(exc, InvalidError) and "spec.topologySize" in str(exc),
                f"topologySize 3: expected 422 naming spec.topologySize, got {exc}",
            )
            self.say(f"  (a copy with topologySize: 3 is refused at admission: {exc})")
        else:
            raise StepFailed("a workload with topologySize 3 was accepted")
        await self.sim.apply(workload, NS)
        name = workload["metadata"]["name"]
        wl = await self.sim.wait_until(
            lambda: (
                (w := self.sim.workload(name))
                and w.get("status", {}).get("state") == "Allocated"
                and w
            ),
            f"workload {name} Allocated",
        )
        status = wl["status"]
        self.say(f"  kubectl get nusw {name}")
        await self.server_table(base)
        self.say(f"  kubectl get nusw {name} -o yaml   (status)")
        shown = {
            k: status.get(k)
            for k in (
                "state",
                "workloadId",
                "allocatedUltraServers",
                "totalNodesAllocated",
                "allocationTime",
            )
        }
        for line in yaml.safe_dump({"status": shown}, sort_keys=False).splitlines():
            self.say("    " + line)
        self.say()
        wid = status["workloadId"]
        expect(status.get("totalNodesAllocated") == 8, f"8 nodes allocated, got {status}")
        expect(len(status.get("allocatedUltraServers") or []) == 2, "2 UltraServers allocated")
        rct_name = workload["spec"]["resourceClaimTemplate"]["name"]
        # Watches of different kinds are not ordered with each other: the template and the
        # slices' tags may show up after the workload's status, so wait for them.
        await self.sim.wait_until(
            lambda: self.sim.view.get("resource.k8s.io/v1", "ResourceClaimTemplate", rct_name, NS),
            f"ResourceClaimTemplate {rct_name} generated",
        )
        tagged = await self.sim.wait_until(
            lambda: self.tagged_nodes(wid, at_least=8), "8 nodes tagged"
        )
        self.say(
            f"  ResourceClaimTemplate {rct_name} generated; workloadId {wid} on the devices "
            f"of {len(tagged)} nodes"
        )
        self.say(f"  kubectl get nus -n {c.DRIVER_NAMESPACE}")
        await self.server_table(
            f"/apis/{c.CRD_GROUP}/{c.CRD_VERSION}/namespaces/{c.DRIVER_NAMESPACE}/{c.PLURAL_ULTRASERVER}"
        )

        (deploy,) = await self.apply_spec("ultraserver-training-deployment.yaml")
        pods = await self.running_workload(deploy)
        rows = []
        ranks: dict[int, PodView] = {}
        for pod in pods:
            v = self.view(pod)
            node = self.sim.node(v.node)
            rank = int(v.env.get(ENV_RANK, "-1"))
            ranks[rank] = v
            rows.append(
                (
                    v.name,
                    v.node,
                    node.ultraserver_id,
                    rank,
                    v.env.get(ENV_RANK0),
                    mode_label(v.env.get(ENV_MODE)),
                    v.env.get(ENV_NODE),
                )
            )
        rows.sort(key=lambda r: int(str(r[3])))
        self.table(("POD", "NODE", "ULTRASERVER", "RANK", "RANK-0 HOST", "MODE", "NODE ID"), rows)
        expect(sorted(ranks) == list(range(8)), f"ranks 0..7, got {sorted(ranks)}")
        expect(len({v.node for v in ranks.values()}) == 8, "8 pods on 8 different nodes")
        expect(
            {v.node for v in ranks.values()} == set(tagged), "the pods run on the allocated nodes"
        )
        leaders = {v.env.get(ENV_RANK0) for v in ranks.values()}
        leader = node_dns_name(ranks[0].node)
        expect(leaders == {leader}, f"one rank-0 host ({leader}), got {leaders}")
        modes = {v.env.get(ENV_MODE) for v in ranks.values()}
        expect(modes == {"1"}, f"topologySize 4: {ENV_MODE}=1 (X4) everywhere, got {modes}")

        self.say("  kubectl delete deployment my-training-workload-deployment")
        await self.remove(deploy)
        self.say(f"  kubectl delete neuronultraserverworkload {name}")
        await self.sim.delete(f"{c.CRD_GROUP}/{c.CRD_VERSION}", c.KIND_WORKLOAD, name, NS)
        await self.sim.wait_until(lambda: self.sim.workload(name) is None, f"workload {name} gone")
        # The template goes with the workload (garbage collection: no instant on a real
        # control plane), so wait for it rather than read once.
        await self.sim.wait_until(
            lambda: self.sim.view.get("resource.k8s.io/v1", "ResourceClaimTemplate", rct_name, NS)
            is None,
            f"ResourceClaimTemplate {rct_name} deleted with the workload",
        )
        await self.sim.wait_until(lambda: not self.tagged_nodes(wid) or None, "tags cleared")
        self.say(f"  released: template {rct_name} deleted, workloadId cleared from every slice")

    def tagged_nodes(self, wid: str, *, at_least: int = 0) -> list[str]:
        """The nodes whose slice carries ``wid``; empty while fewer than ``at_least`` do
        (each plugin tags its own slice, so they show up one by one)."""
        nodes = sorted(
            s["spec"]["nodeName"]
            for s in self.sim.slices()
            if any(
                (d.get("attributes") or {}).get(c.ATTR_WORKLOAD_ID, {}).get("string") == wid
                for d in s["spec"]["devices"]
            )
        )
        return nodes if len(nodes) >= at_least else []

    async def invalid_count(self) -> None:
        from neuron_dra.sim.commands import check_claim as cc

        await self.apply_spec("invalid-trn1-7-devices.yaml")
        await self.create_pod("trn1-seven", "trn1-7-devices")
        (event,) = await self.sim.wait_until(
            lambda: self.sim.events("trn1-seven", "FailedPrepareDynamicResources")[:1],
            "FailedPrepareDynamicResources",
        )
        pod = self.sim.pod("trn1-seven") or {}
        self.table(
            ("POD", "NODE", "PHASE", "EVENT"),
            [
                (
                    "trn1-seven",
                    pod["spec"].get("nodeName"),
                    pod["status"].get("phase"),
                    f"Warning {event['reason']}",
                )
            ],
        )
        self.say("    " + event["note"])
        self.say()
        expect(
            "does not support requests for device: 7" in event["note"],
            f"the seed's message, got {event['note']!r}",
        )
        expect(pod["status"].get("phase") == "Pending", "the pod does not start")
        self.say(
            "  neuron-dra check-claim -f examples/specs/invalid-trn1-7-devices.yaml "
            "--kubeconfig <sim>   (says so before anything is scheduled)"
        )
        cluster = cc.Cluster(
            self.sim.slices(),
            {
                x["metadata"]["name"]: x
                for x in self.sim.view.list("resource.k8s.io/v1", "DeviceClass")
            },
            set(),
            source="the simulated cluster",
        )
        (doc,) = cc.claim_docs(
            self.spec("invalid-trn1-7-devices.yaml"), "invalid-trn1-7-devices.yaml"
        )
        buf = io.StringIO()
        report = cc.check(doc, cluster)
        cc.render_text(report, buf)
        for line in buf.getvalue().splitlines():
            self.say("    " + line)
        self.say()
        expect(
            not any(n.fits for n in report.nodes if n.node.startswith("trn1")),
            "check-claim refuses 7 devices on trn1.32xlarge",
        )
        await self.delete_pods(["trn1-seven"])

    async def cleanup(self) -> None:
        for kind in ("ResourceClaimTemplate",):
            for obj in self.sim.view.list("resource.k8s.io/v1", kind, NS):
                await self.sim.delete("resource.k8s.io/v1", kind, obj["metadata"]["name"], NS)
        await self.idle()
        states = {
            u["metadata"]["name"]: (u.get("status") or {}).get("state")
            for u in self.sim.ultraservers()
        }
        expect(
            all(s == "Available" for s in states.values()), f"UltraServers Available, got {states}"
        )
        expect(not self.sim.pods(NS), "no pods left")
        self.say("  no pods, claims or CDI specs left; every UltraServer Available")


@dataclass
class Step:
    title: str
    run: Callable[[], Awaitable[None]]


def steps(w: Walkthrough) -> list[Step]:
    return [
        Step("The simulated cluster", w.cluster),
        Step("Connected devices: 4 devices in one row (seeds/001 example 1)", w.connected),
        Step(
            "Whole node, half node, driver version: xl / l / 2.24.7.0 templates (seeds/001)",
            w.sizes,
        ),
        Step("Logical NeuronCore size 1 (seeds/001 example 2)", w.lnc),
        Step(
            "4-node UltraServer groups with LeaderWorkerSet (seeds/001 example 3)",
            w.ultraserver_groups,
        ),
        Step(
            "UltraServer operator: workload, template, 8 ranked pods, cleanup (seeds/000)",
            w.operator,
        ),
        Step("Invalid device count on trn1.32xlarge (seeds/003, seeds/004)", w.invalid_count),
        Step("Cleanup", w.cleanup),
    ]


async def run_walkthrough(w: Walkthrough) -> list[tuple[str, str | None, float]]:
    """Run every step; (title, failure or None, seconds) per step. A failed step does not
    stop the others: each cleans up on success only, so later steps may fail after it."""
    results: list[tuple[str, str | None, float]] = []
    for n, step in enumerate(steps(w), 1):
        w.say(f"==> {n}. {step.title}")
        started = time.monotonic()
        error: str | None = None
        try:
            await step.run()
        except (StepFailed, KubeError, OSError, TimeoutError) as exc:
            error = f"{type(exc).__name__}: {exc}" if not isinstance(exc, StepFailed) else str(exc)
            w.say(f"  FAILED: {error}")
        elapsed = time.monotonic() - started
        if error is None:
            w.say(f"  ok ({elapsed:.1f} s)")
        w.say()
        results.append((step.title, error, elapsed))
    return results
