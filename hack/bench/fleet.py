"""The fleet both controller benchmarks load (``controller`` on the fake API server,
``controller-scale`` on the real one): trn2u.48xlarge UltraServers of 4 Ready Nodes with the
ResourceSlices their plugins would publish, a seeded mix of workloads, and the figures'
arithmetic (percentiles, RSS, Prometheus histogram quantiles)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
from neuron_dra.common.profiles import PROFILES
from neuron_dra.nodeplugin.discovery.model import (
    NeuronDevice,
    NodeInventory,
    UltraServerInfo,
    UltraServerMode,
)
from neuron_dra.nodeplugin.publish.slices import build_resource_slices
from neuron_dra.sim.peerbench.kubeletmetrics import Histogram
from neuron_dra.sim.peerbench.kubeletmetrics import bucket_quantile as histogram_quantile

INSTANCE_TYPE = "trn2u.48xlarge"


def node_inventories() -> list[NodeInventory]:
    """One inventory per node id 0..3 (the ids vary per node, the rest is the same)."""
    profile = PROFILES[INSTANCE_TYPE]
    devices = tuple(
        NeuronDevice(
            index=i,
            dev_path=f"/dev/neuron{i}",
            core_count=profile.cores_per_device,
            device_name=profile.device_name,
            efa_pci_address=f"0000:{0x10 + i // 4:02x}:{0x1B + i % 4:02x}.0",
        )
        for i in range(profile.device_count)
    )
    return [
        NodeInventory(
            node_name="template",
            instance_type=INSTANCE_TYPE,
            driver_version="2.24.7.0",
            devices=devices,
            ultraserver=UltraServerInfo(
                modes=(UltraServerMode.X4, UltraServerMode.X2V, UltraServerMode.X1),
                server_id_2="0",
                server_id_4="0",
                node_id_2=node_id % 2,
                node_id_4=node_id,
            ),
        )
        for node_id in range(4)
    ]


def ultraserver_id(u: int) -> str:
    return f"{0xA0000000 + u:016x}"  # 16 hex chars, like the driver's election


def node_name(u: int, node_id: int) -> str:
    i = 4 * u + node_id
    return f"ip-10-{i // 62500}-{i // 250 % 250}-{i % 250}.us-west-2.compute.internal"


def fleet_nodes(n_ultraservers: int) -> list[dict[str, Any]]:
    """The Ready Nodes of ``n_ultraservers`` UltraServers of 4 nodes each."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node_name(u, node_id),
                "labels": {"node.kubernetes.io/instance-type": INSTANCE_TYPE},
            },
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
        for u in range(n_ultraservers)
        for node_id in range(4)
    ]


def fleet_slices(n_ultraservers: int, node_uid: Callable[[str], str]) -> Iterator[dict[str, Any]]:
    """Each node's ResourceSlices as its plugin publishes them, owned by its Node (whose uid
    ``node_uid(name)`` gives: both API servers garbage-collect slices of a missing owner)."""
    inventories = node_inventories()
    for u in range(n_ultraservers):
        us_id = ultraserver_id(u)
        pair = [f"{0xB0000000 + 2 * u:016x}", f"{0xB0000000 + 2 * u + 1:016x}"]
        for node_id, inv in enumerate(inventories):
            name = node_name(u, node_id)
            assert inv.ultraserver is not None
            info = dataclasses.replace(
                inv.ultraserver, server_id_4=us_id, server_id_2=pair[node_id // 2]
            )
            yield from build_resource_slices(
                dataclasses.replace(inv, node_name=name, ultraserver=info),
                node_name=name,
                node_uid=node_uid(name),
                node_labels={},
                dra_driver_version="0.1.0",
                generation=1,
            )


def workload_specs(n: int, seed: int) -> list[tuple[int, int]]:
    """(topologySize, serverCount) for each workload: a fixed, seeded mix."""
    rng = random.Random(seed)
    return [(rng.choice((1, 2, 4)), rng.randint(1, 4)) for _ in range(n)]


def workload(i: int, size: int, count: int, namespace: str = "bench") -> dict[str, Any]:
    return {
        "apiVersion": "neuron.aws.com/v1beta1",
        "kind": "NeuronUltraServerWorkload",
        "metadata": {"name": f"job-{i:05d}", "namespace": namespace},
        "spec": {
            "instanceType": INSTANCE_TYPE,
            "topologySize": size,
            "serverCount": count,
            "allocationPolicy": {"failureStrategy": "NoOp"},
        },
    }


# --- measuring -------------------------------------------------------------------------------


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def rss_kib(pid: int) -> tuple[int, int]:
    fields = dict(
        line.split(":", 1)
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if ":" in line
    )
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


Buckets = dict[str, list[tuple[float, float]]]


async def scrape(session: aiohttp.ClientSession, port: int) -> tuple[Buckets, dict[str, float]]:
    """Histogram buckets (name -> [(le, cumulative count)]) and plain samples of /metrics."""
    async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
        text = await resp.text()
    buckets: Buckets = {}
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        found = re.fullmatch(r'(\w+)_bucket\{(?:[^}]*,)?le="([^"]+)"[^}]*\} (\S+)', line)
        if found:
            buckets.setdefault(found[1], []).append((float(found[2]), float(found[3])))
            continue
        name, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            samples[name] = float(value)
    return buckets, samples


def bucket_quantile(
    before: list[tuple[float, float]], after: list[tuple[float, float]], q: float
) -> float | None:
    """``histogram_quantile`` over the increase between two scrapes (linear in a bucket,
    :func:`neuron_dra.sim.peerbench.kubeletmetrics.bucket_quantile`); None when nothing was
    observed in between."""
    delta = Histogram(tuple(sorted(after)), 0.0, 0.0).minus(Histogram(tuple(before), 0.0, 0.0))
    total = delta.buckets[-1][1] if delta.buckets else 0.0
    if total <= 0:
        return None
    return histogram_quantile(dataclasses.replace(delta, count=total), q)
