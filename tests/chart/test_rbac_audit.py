"""Audit: every request the real components send is one the chart's RBAC allows.

Four emulated trn2u.48xlarge nodes (one UltraServer) run the real ``KubeletPlugin``, the real
``ControllerManager`` runs leader-elected, and an UltraServer workload goes through
allocation (templates generated, devices tagged) and deletion (released, tags cleared,
template deleted, finalizer removed). Each component talks to the fake API server through its
own recorded client; every recorded request must be covered by that component's entries in
api_usage.py, which test_chart.py checks to be exactly the chart's RBAC. (What the scenario
does not reach, e.g. Prepare's claim GET, is covered by the table and the code scan there.)
"""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s_client
from neuron_dra.common.constants import DRIVER_NAMESPACE
from neuron_dra.common.k8s.client import KubeClient
from neuron_dra.controller.manager import ControllerManager, ManagerConfig
from neuron_dra.nodeplugin.plugin import KubeletPlugin, PluginConfig
from neuron_dra.sim.fakeapi.server import FakeAPIServer
from neuron_dra.sim.scratch import work_dir

from .api_usage import CONTROLLER, KUBELET_PLUGIN, Use

STEP = 30.0  # bound for one awaited condition on a loaded 2-core machine
NODES = [f"us-a-n{i}" for i in range(4)]
NUS_API, NUSW_API = "neuron.aws.com/v1beta1", "neuron.aws.com/v1beta1"

_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)


class Recorded:
    """An ApiClient whose requests are recorded as (group, resource, verb, namespace, name)."""

    def __init__(self, server: FakeAPIServer) -> None:
        self.api = k8s_client.ApiClient(configuration=server.client_configuration())
        self.calls: list[tuple[str, str, str, str | None, str | None]] = []
        call_api = self.api.call_api

        async def recording(path: str, method: str, *args: Any, **kwargs: Any) -> Any:
            self.calls.append(_request_of(method, path, kwargs.get("query_params") or []))
            return await call_api(path, method, *args, **kwargs)

        self.api.call_api = recording  # type: ignore[method-assign]
        self.kube = KubeClient(self.api, owned=True)


def _request_of(
    method: str, path: str, query: list[tuple[str, str]]
) -> tuple[str, str, str, str | None, str | None]:
    m = _PATH.match(path)
    assert m, f"unexpected API path {path}"
    resource = m["plural"] + (f"/{m['sub']}" if m["sub"] else "")
    name = m["name"]
    if method == "GET":
        watch = any(k == "watch" and v in ("true", "1") for k, v in query)
        verb = "get" if name else ("watch" if watch else "list")
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, "")
        if method == "DELETE":
            verb = "delete" if name else "deletecollection"
    return m["group"] or "", resource, verb, m["ns"], name


def _allowed(uses: tuple[Use, ...], call: tuple[str, str, str, str | None, str | None]) -> bool:
    group, resource, verb, ns, name = call
    for use in uses:
        if (use.group, use.resource) != (group, resource) or verb not in use.verbs:
            continue
        if use.scope == "namespace" and ns != DRIVER_NAMESPACE:
            continue  # a Role in the release namespace grants nothing elsewhere
        if use.resource_names and name not in use.resource_names:
            continue
        return True
    return False


async def _eventually(what: str, predicate: Callable[[], bool]) -> None:
    # The fake server has no "controller converged" hook; poll its in-process state, bounded.
    try:
        async with asyncio.timeout(STEP):
            while not predicate():  # noqa: ASYNC110 - state spans many objects; no event
                await asyncio.sleep(0.05)
    except TimeoutError:
        pytest.fail(f"timed out waiting for: {what}")


def _node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"node.kubernetes.io/instance-type": "trn2u.48xlarge"},
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def _tags(server: FakeAPIServer) -> set[str]:
    return {
        str(dev.get("attributes", {}).get("workloadId", {}).get("string"))
        for s in server.list("resource.k8s.io/v1", "ResourceSlice")
        for dev in s["spec"]["devices"]
        if "workloadId" in dev.get("attributes", {})
    }


async def _scenario(server: FakeAPIServer, plugins: Recorded, controller: Recorded) -> None:
    root = work_dir("audit", Path("/tmp"))
    boot_id = root / "boot_id"
    boot_id.write_text("boot-1\n")
    running: list[KubeletPlugin] = []
    manager: ControllerManager | None = None
    try:
        for i, name in enumerate(NODES):
            server.create(_node(name))
            config = PluginConfig(
                node_name=name,
                cdi_root=root / name / "cdi",
                registrar_dir=root / name / "registry",
                plugins_dir=root / name / "plugins",
                emulation_mode="trn2u.48xlarge",
                emulated_ultraserver_id="us-a",
                emulated_ultraserver_node_id=i,
                http_host="127.0.0.1",
                http_port=0,
                boot_id_path=boot_id,
                opt_root=None,
            )
            plugin = KubeletPlugin(config, plugins.kube)
            await plugin.start()
            running.append(plugin)
        manager = ControllerManager(
            controller.kube,
            ManagerConfig(
                DRIVER_NAMESPACE,
                leader_elect=True,
                identity="audit",
                http_port=0,
                http_host="127.0.0.1",
            ),
        )
        await manager.start()
        await _eventually(
            "the UltraServer is discovered",
            lambda: bool(server.list(NUS_API, "NeuronUltraServer", DRIVER_NAMESPACE)),
        )
        server.create(
            {
                "apiVersion": NUSW_API,
                "kind": "NeuronUltraServerWorkload",
                "metadata": {"name": "train", "namespace": "default"},
                "spec": {"instanceType": "trn2u.48xlarge", "topologySize": 4, "serverCount": 1},
            }
        )

        def workload() -> dict[str, Any] | None:
            return server.get(NUSW_API, "NeuronUltraServerWorkload", "train", "default")

        await _eventually(
            "the workload is allocated and its devices tagged",
            lambda: (
                (workload() or {}).get("status", {}).get("state") == "Allocated"
                and len(_tags(server)) == 1
                and bool(server.list("resource.k8s.io/v1", "ResourceClaimTemplate", "default"))
            ),
        )
        server.delete(NUSW_API, "NeuronUltraServerWorkload", "train", "default")
        await _eventually(
            "the workload is released and gone",
            lambda: (
                workload() is None
                and not _tags(server)
                and not server.list("resource.k8s.io/v1", "ResourceClaimTemplate", "default")
            ),
        )
    finally:
        if manager is not None:
            await manager.stop()
        for plugin in running:
            await plugin.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def recorded(
    fake_apiserver: FakeAPIServer,
) -> AsyncIterator[tuple[FakeAPIServer, Recorded, Recorded]]:
    plugins, controller = Recorded(fake_apiserver), Recorded(fake_apiserver)
    try:
        yield fake_apiserver, plugins, controller
    finally:
        await plugins.kube.close()
        await controller.kube.close()


async def test_components_use_only_what_the_chart_grants(
    recorded: tuple[FakeAPIServer, Recorded, Recorded],
) -> None:
    server, plugins, controller = recorded
    await _scenario(server, plugins, controller)
    for component, rec, uses in (
        ("kubelet-plugin", plugins, KUBELET_PLUGIN),
        ("controller", controller, CONTROLLER),
    ):
        denied = sorted({c for c in rec.calls if not _allowed(uses, c)}, key=str)
        assert not denied, f"{component} sent requests its RBAC does not allow: {denied}"
    # The scenario reached the writes that matter (so the check above means something).
    plugin_verbs = {(c[1], c[2]) for c in plugins.calls}
    assert {
        ("resourceslices", "create"),
        ("resourceslices", "update"),
        ("nodes", "patch"),
        ("neuronultraservers", "watch"),
    } <= plugin_verbs
    controller_verbs = {(c[1], c[2]) for c in controller.calls}
    assert {
        ("leases", "create"),
        ("neuronultraservers", "create"),
        ("neuronultraservers/status", "update"),
        ("resourceclaimtemplates", "create"),
        ("resourceclaimtemplates", "delete"),
        ("neuronultraserverworkloads", "update"),
        ("neuronultraserverworkloads/status", "update"),
    } <= controller_verbs
