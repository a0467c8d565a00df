"""``neuron-dra sim``: the embedded default.

Foundation release: the simulated cluster is the fake API server with the
Neuron CRDs. The walkthrough applies the seed's NeuronUltraServerWorkload
(``examples/specs/ultraserver-workload.yaml``) through the real Kubernetes
client and shows what the API server does with it: defaults, printer columns,
admission of an invalid spec, optimistic concurrency, deletion. Every step
checks its outcome; the command exits non-zero if any step does not behave.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import signal
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException
from neuron_dra.common import constants as c
from neuron_dra.common.paths import repo_root
from neuron_dra.common.testing.fakeapi.server import FakeAPIServer

TIMEOUT = 10.0
NAMESPACE = "default"
TABLE_ACCEPT = "application/json;as=Table;v=v1;g=meta.k8s.io"


class StepFailed(Exception):
    """A walkthrough step did not behave as documented."""


def _example(name: str) -> dict[str, Any]:
    path = repo_root() / "examples" / "specs" / name
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict):
        raise StepFailed(f"{path} does not hold one object")
    return doc


async def _table(api: k8s.ApiClient, path: str) -> str:
    """Render a server-side Table the way ``kubectl get`` prints it."""
    resp = await api.call_api(
        path,
        "GET",
        header_params={"Accept": TABLE_ACCEPT},
        _preload_content=False,
        _request_timeout=TIMEOUT,
    )
    table = json.loads(await resp.read())
    headers = [
        col["name"].upper() for col in table["columnDefinitions"] if col.get("priority", 0) == 0
    ]
    keep = [i for i, col in enumerate(table["columnDefinitions"]) if col.get("priority", 0) == 0]
    rows = [
        ["" if row["cells"][i] is None else str(row["cells"][i]) for i in keep]
        for row in table["rows"]
    ]
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    lines = ["   ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["   ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


async def _walkthrough(api: k8s.ApiClient) -> None:
    # The client's stubs omit the private kwargs (_content_type) it accepts at run time.
    objects: Any = k8s.CustomObjectsApi(api)
    group, version, plural = c.CRD_GROUP, c.CRD_VERSION, c.PLURAL_WORKLOAD
    base = f"/apis/{group}/{version}/namespaces/{NAMESPACE}/{plural}"
    workload = _example("ultraserver-workload.yaml")
    name = workload["metadata"]["name"]

    created = await objects.create_namespaced_custom_object(
        group, version, NAMESPACE, plural, workload, _request_timeout=TIMEOUT
    )
    strategy = created["spec"].get("allocationPolicy", {}).get("failureStrategy")
    print(
        f"  created {c.KIND_WORKLOAD} {NAMESPACE}/{name} (uid {created['metadata']['uid']}, "
        f"resourceVersion {created['metadata']['resourceVersion']}, failureStrategy {strategy})"
    )
    print("\n" + "\n".join("    " + line for line in (await _table(api, base)).splitlines()) + "\n")

    bad = copy.deepcopy(workload)
    bad["metadata"]["name"] = "bad-topology"
    bad["spec"]["topologySize"] = 3
    try:
        await objects.create_namespaced_custom_object(
            group, version, NAMESPACE, plural, bad, _request_timeout=TIMEOUT
        )
    except ApiException as exc:
        message = json.loads(exc.body or "{}").get("message", "")
        if exc.status != 422 or "spec.topologySize" not in message:
            raise StepFailed(
                "topologySize 3: expected 422 naming spec.topologySize, "
                f"got {exc.status}: {message}"
            ) from exc
        print(f"  topologySize: 3 rejected at admission (422): {message}")
    else:
        raise StepFailed("a workload with topologySize 3 was accepted")

    stale = copy.deepcopy(created)
    fresh = await objects.patch_namespaced_custom_object(
        group,
        version,
        NAMESPACE,
        plural,
        name,
        {"metadata": {"labels": {"team": "ml"}}},
        _content_type="application/merge-patch+json",
        _request_timeout=TIMEOUT,
    )
    stale["metadata"].setdefault("labels", {})["team"] = "other"
    try:
        await objects.replace_namespaced_custom_object(
            group, version, NAMESPACE, plural, name, stale, _request_timeout=TIMEOUT
        )
    except ApiException as exc:
        if exc.status != 409:
            raise StepFailed(f"stale update: expected 409 Conflict, got {exc.status}") from exc
        print(
            f"  update from resourceVersion {stale['metadata']['resourceVersion']} after a change "
            f"(now {fresh['metadata']['resourceVersion']}) refused with 409 Conflict"
        )
    else:
        raise StepFailed("an update with a stale resourceVersion was accepted")

    await objects.delete_namespaced_custom_object(
        group, version, NAMESPACE, plural, name, _request_timeout=TIMEOUT
    )
    try:
        await objects.get_namespaced_custom_object(
            group, version, NAMESPACE, plural, name, _request_timeout=TIMEOUT
        )
    except ApiException as exc:
        if exc.status != 404:
            raise
        print(f"  deleted {NAMESPACE}/{name}")
    else:
        raise StepFailed("the workload is still there after delete")


async def _step(title: str, fn: Callable[[], Awaitable[None]]) -> bool:
    print(f"==> {title}")
    try:
        await fn()
    except (StepFailed, ApiException, OSError) as exc:
        print(f"  FAILED: {exc}")
        return False
    return True


async def run_sim(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="neuron-dra-sim-"))
    kubeconfig = workdir / "kubeconfig"
    async with FakeAPIServer(port=args.port) as server:
        server.write_kubeconfig(kubeconfig)
        print(f"fake kube-apiserver with the Neuron CRDs at {server.url}")
        async with k8s.ApiClient(server.client_configuration()) as api:
            ok = await _step(
                "UltraServer workload example (examples/specs/ultraserver-workload.yaml)",
                lambda: _walkthrough(api),
            )
        print("\nall steps passed" if ok else "\nsome steps FAILED")
        print(
            "The full simulated cluster (emulated nodes, kubelet plugin, controller) "
            "arrives with the later releases; see README.md."
        )
        if args.keep_running:
            print(
                f"\nkubeconfig: {kubeconfig}\n  try: kubectl --kubeconfig {kubeconfig} get nusw -A"
                "\nCtrl-C to stop."
            )
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
    return 0 if ok else 1
