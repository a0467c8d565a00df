"""What every walkthrough step uses: printing, applying the seeds' manifests, reading the
cluster (a pod's devices and environment, device attributes, tagged slices), creating and
deleting pods, and waiting for the cluster to be idle again."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml
from neuron_dra.common import constants as c
from neuron_dra.sim.commands.walkthrough.tables import device_order, render_table
from neuron_dra.sim.controlplane.podsets import PodSet
from neuron_dra.sim.paths import repo_root
from neuron_dra.sim.simcluster import SimCluster
from neuron_dra.sim.simcluster.cluster import PODS_LIMIT

JsonDict = dict[str, Any]
NS = "default"
TABLE_ACCEPT = "application/json;as=Table;v=v1;g=meta.k8s.io"
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


@dataclass
class PodView:
    name: str
    node: str
    devices: list[str]
    env: dict[str, str]
    device_nodes: list[str]
    #: The device metadata files mounted into the container: path -> content.
    files: dict[str, str]


class WalkthroughTools:
    """The cluster the steps act on and the output they print to."""

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
        return await self.sim.apply_file(self.specs / name, NS)

    def device_attr(self, node: str, device: str, attr: str) -> Any:
        for s in self.sim.slices():
            if s["spec"].get("nodeName") != node:
                continue
            for d in s["spec"]["devices"]:
                if d["name"] == device:
                    value = (d.get("attributes") or {}).get(attr) or {}
                    return next(iter(value.values()), None)
        return None

    async def view(self, pod: Mapping[str, Any], container: str | None = None) -> PodView:
        node = str(pod["spec"].get("nodeName") or "")
        devices = [
            r["device"]
            for claim in self.sim.claims_of(pod).values()
            for r in claim["status"]["allocation"]["devices"]["results"]
        ]
        got = await self.sim.container_devices(pod)
        name = container or pod["spec"]["containers"][0]["name"]
        inj = got.get(name)
        return PodView(
            pod["metadata"]["name"],
            node,
            sorted(devices, key=device_order),
            dict(inj.env) if inj else {},
            list(inj.device_nodes) if inj else [],
            dict(inj.files) if inj else {},
        )

    async def running(self, names: Sequence[str]) -> list[JsonDict]:
        return await self.sim.wait_until(
            lambda: self.sim.running(names), f"pods {', '.join(names)} Running", PODS_LIMIT
        )

    async def running_workload(self, workload: PodSet) -> list[JsonDict]:
        """The workload's pods once all it wants are Running (pod names are the server's,
        ``<name>-<5 random characters>`` for a Deployment)."""
        return await self.sim.wait_until(
            lambda: self.sim.running_workload(workload),
            f"{workload.expected} pods of {workload.set_name} Running",
            PODS_LIMIT,
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
