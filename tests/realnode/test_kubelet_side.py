"""What only a real kubelet does to the plugin, and what the plugin must survive of it: the
kubelet restarting with prepared claims, the plugin dying while the kubelet prepares, two
plugin instances of an upgrade, a node rebooting, a claim shared by two pods, and device
health in the pod's status. Every pod is a real container; the plugin's state is read from
its files inside the node (checkpoint, CDI specs)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from typing import Any

import pytest
from neuron_dra.nodeplugin.discovery.emulation import EmulatedPaths, mark_unhealthy
from neuron_dra.nodeplugin.prepare.cdi import list_cdi_specs
from neuron_dra.sim.realnode.node import KUBELET, RealNode
from neuron_dra.sim.simcluster import SimCluster
from neuron_dra.sim.simcluster.cluster import RECOVERY_LIMIT
from neuron_dra.sim.simcluster.realnodes import RealNodes

pytestmark = pytest.mark.asyncio(loop_scope="package")

NS = "default"
DATA_DIR = "/var/lib/kubelet/plugins/neuron.aws.com"
IMAGE = "public.ecr.aws/docker/library/alpine:latest"


# --- helpers ---------------------------------------------------------------------------------


def nodes(sim: SimCluster) -> RealNodes:
    assert sim.real_nodes is not None
    return sim.real_nodes


def node(sim: SimCluster, name: str) -> RealNode:
    return nodes(sim).node(name)


def checkpoint(sim: SimCluster, name: str) -> dict[str, Any]:
    """The plugin's checkpoint on node ``name`` (``data``: bootId, claims by uid)."""
    path = node(sim, name).layout.host_path(f"{DATA_DIR}/checkpoint.json")
    try:
        data: dict[str, Any] = json.loads(path.read_text())["data"]
    except FileNotFoundError:
        return {"bootId": "", "claims": {}}
    return data


def prepared(sim: SimCluster, name: str) -> set[str] | None:
    """Claim uids prepared on ``name`` (checkpoint entries whose CDI specs are there, and no
    other spec), or None while the two disagree (a Prepare or Unprepare between its spec
    and its checkpoint write)."""
    in_checkpoint = set(checkpoint(sim, name)["claims"])
    return in_checkpoint if list_cdi_specs(sim.cdi_root(name)) == in_checkpoint else None


async def settled(sim: SimCluster, name: str, want: set[str], what: str) -> None:
    """Until exactly ``want`` is prepared on ``name`` (files: polled)."""
    await sim.wait_until(lambda: prepared(sim, name) == want, what, poll=0.2)


def template(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "d", "exactly": {"deviceClassName": "neuron.aws.com"}}]
                }
            }
        },
    }


def pod(name: str, on: str, *, template_name: str | None = None, claim: str | None = None) -> Any:
    source = (
        {"resourceClaimTemplateName": template_name}
        if template_name
        else {"resourceClaimName": claim}
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": on},
            "resourceClaims": [{"name": "n", **source}],
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "command": ["sleep", "infinity"],
                    "resources": {"claims": [{"name": "n"}]},
                }
            ],
        },
    }


def claim_uid(sim: SimCluster, pod_name: str) -> str:
    p = sim.pod(pod_name)
    assert p is not None
    (claim,) = sim.claims_of(p).values()
    return str(claim["metadata"]["uid"])


def container_id(sim: SimCluster, pod_name: str) -> str:
    p = sim.pod(pod_name) or {}
    (status,) = (p.get("status") or {}).get("containerStatuses") or [{}]
    return str(status.get("containerID"))


async def gone(sim: SimCluster, *names: str) -> None:
    await sim.wait_until(lambda: all(sim.pod(n) is None for n in names), f"{names} gone")


# --- the kubelet restarts ----------------------------------------------------------------------


async def test_kubelet_restart_keeps_running_claims_and_unprepares_the_deleted_pods(
    sim: SimCluster,
) -> None:
    await sim.apply(template("one"))
    for name in ("keep", "drop"):
        await sim.apply(pod(name, "kn-0", template_name="one"))
    await sim.wait_until(lambda: sim.running(["keep", "drop"]), "both pods Running")
    keep, drop = claim_uid(sim, "keep"), claim_uid(sim, "drop")
    before = checkpoint(sim, "kn-0")["claims"][keep]["preparedAt"], container_id(sim, "keep")
    await settled(sim, "kn-0", {keep, drop}, "both claims prepared")

    kn0 = node(sim, "kn-0")
    kn0.kill(KUBELET)  # -9: nothing of it runs meanwhile
    await sim.delete("v1", "Pod", "drop", NS)  # Terminating: no kubelet to finish it
    kn0.restart(KUBELET)

    await gone(sim, "drop")
    await settled(sim, "kn-0", {keep}, "only keep's claim prepared")
    # Not prepared again, not restarted: the same entry and the same container.
    after = checkpoint(sim, "kn-0")["claims"][keep]["preparedAt"], container_id(sim, "keep")
    assert after == before
    assert sim.running(["keep"])


# --- the plugin dies while the kubelet prepares ------------------------------------------------


async def test_plugin_killed_while_the_kubelet_prepares_then_the_pod_runs(
    sim: SimCluster,
) -> None:
    plugin = nodes(sim).plugins["kn-1"]
    assert plugin.proc is not None
    os.kill(plugin.proc.pid, signal.SIGSTOP)  # frozen: the kubelet's call hangs on it
    try:
        await sim.apply(template("one"))
        await sim.apply(pod("mid", "kn-1", template_name="one"))
        log = node(sim, "kn-1").components[KUBELET].log
        # 1.34/1.35 put the pod in the message's keys, 1.36+ in the logger's context.
        marker = re.compile(r'"Processing resource".*default/mid')
        await sim.wait_until(
            lambda: marker.search(log.read_text(errors="replace")),
            "the kubelet preparing mid",
            poll=0.2,
        )
    finally:
        nodes(sim).stop_plugin("kn-1", kill=True)  # SIGKILL wakes nothing: it just dies
    nodes(sim).start_plugin("kn-1")
    # The kubelet retries the failed Prepare with its back-off: a recovery, not one status.
    await sim.wait_until(
        lambda: sim.running(["mid"]), "mid Running after the plugin's restart", RECOVERY_LIMIT
    )
    await settled(sim, "kn-1", {claim_uid(sim, "mid")}, "mid's claim prepared, once")


# --- two plugin instances (a rolling update) ---------------------------------------------------


async def test_two_plugin_instances_during_an_upgrade_fail_no_prepare(sim: SimCluster) -> None:
    await sim.apply(template("one"))
    rn = nodes(sim)
    # The new DaemonSet pod beside the old, ready (registered) before the old one goes, as a
    # rolling update with maxSurge waits for.
    await rn.wait_ready(rn.start_plugin("kn-0", pod_uid="kn-0-next"))
    for i in range(3):
        await sim.apply(pod(f"during-{i}", "kn-0", template_name="one"))
    rn.stop_plugin("kn-0")  # the old pod goes (SIGTERM)
    for i in range(3, 5):
        await sim.apply(pod(f"during-{i}", "kn-0", template_name="one"))
    names = [f"during-{i}" for i in range(5)]
    await sim.wait_until(lambda: sim.running(names), "every pod of the upgrade Running")
    failed = [e["note"] for n in names for e in sim.events(n, "FailedPrepareDynamicResources")]
    assert not failed
    await settled(sim, "kn-0", {claim_uid(sim, n) for n in names}, "every claim prepared")
    # The next instance serves on: put the usual one back for the next tests.
    await rn.wait_ready(rn.start_plugin("kn-0"))
    rn.stop_plugin("kn-0", pod_uid="kn-0-next")


# --- the node reboots --------------------------------------------------------------------------


async def test_node_reboot_new_boot_id_and_the_pod_is_prepared_again(sim: SimCluster) -> None:
    await sim.apply(template("one"))
    await sim.apply(pod("survivor", "kn-1", template_name="one"))
    await sim.wait_until(lambda: sim.running(["survivor"]), "survivor Running")
    uid, first = claim_uid(sim, "survivor"), container_id(sim, "survivor")
    old_boot = checkpoint(sim, "kn-1")["bootId"]

    kn1 = node(sim, "kn-1")
    kn1.reboot()  # every process dies, /run is wiped, a new boot id; the disk stays
    nodes(sim).start_plugin("kn-1")  # the DaemonSet's pod comes back
    assert kn1.boot_id != old_boot

    def restarted() -> bool:
        p = sim.pod("survivor") or {}
        statuses = (p.get("status") or {}).get("containerStatuses") or []
        return bool(
            statuses and statuses[0].get("ready") and container_id(sim, "survivor") != first
        )

    await sim.wait_until(
        restarted, "survivor's container started again after the reboot", RECOVERY_LIMIT
    )
    data = checkpoint(sim, "kn-1")
    assert data["bootId"] == kn1.boot_id and set(data["claims"]) == {uid}
    await settled(sim, "kn-1", {uid}, "survivor's claim prepared on the new boot")


# --- a claim two pods share --------------------------------------------------------------------


async def test_a_claim_shared_by_two_pods_is_prepared_once_and_kept_for_the_last(
    sim: SimCluster,
) -> None:
    await sim.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "shared"},
            "spec": template("x")["spec"]["spec"],
        }
    )
    for name in ("share-a", "share-b"):
        await sim.apply(pod(name, "kn-0", claim="shared"))
    running = await sim.wait_until(lambda: sim.running(["share-a", "share-b"]), "both Running")
    uid = str((sim.claim("shared") or {})["metadata"]["uid"])
    views = [await sim.container_devices(p) for p in running]
    assert views[0]["main"].device_nodes == views[1]["main"].device_nodes != []
    await settled(sim, "kn-0", {uid}, "the shared claim prepared once")

    await sim.delete("v1", "Pod", "share-a", NS)
    await gone(sim, "share-a")
    assert prepared(sim, "kn-0") == {uid}  # share-b still uses it
    await sim.delete("v1", "Pod", "share-b", NS)
    await gone(sim, "share-b")
    await settled(sim, "kn-0", set(), "the shared claim unprepared")


# --- device health -----------------------------------------------------------------------------


def resource_health(sim: SimCluster, pod_name: str) -> dict[str, str]:
    """resourceID -> health, from the pod's ``allocatedResourcesStatus``. The kubelet names a
    device by its first CDI device id (``k8s.neuron.aws.com/claim=<claim uid>-<device>``)."""
    return {k: health for k, (health, _) in resource_statuses(sim, pod_name).items()}


def resource_statuses(sim: SimCluster, pod_name: str) -> dict[str, tuple[str, str]]:
    """resourceID -> (health, message) from the pod's ``allocatedResourcesStatus``."""
    p = sim.pod(pod_name) or {}
    out: dict[str, tuple[str, str]] = {}
    for status in (p.get("status") or {}).get("containerStatuses") or []:
        for entry in status.get("allocatedResourcesStatus") or []:
            for res in entry.get("resources") or []:
                out[str(res.get("resourceID"))] = (
                    str(res.get("health")),
                    str(res.get("message") or ""),
                )
    return out


def slice_healthy(sim: SimCluster, node_name: str, device: str) -> bool | None:
    """The device's ``healthy`` attribute in its node's ResourceSlice."""
    for sl in sim.slices():
        if sl["spec"].get("nodeName") != node_name:
            continue
        for d in sl["spec"].get("devices") or []:
            if d["name"] == device:
                value = (d.get("attributes") or {}).get("healthy") or {}
                return value.get("bool")  # type: ignore[no-any-return]
    return None


async def test_an_unhealthy_device_shows_where_the_kubelet_can_show_it(
    sim: SimCluster, kubelet: str
) -> None:
    """From 1.36 (ResourceHealthStatus on by default) the kubelet reads our health stream
    (v1alpha1; a 1.37 kubelet takes v1, which we advertise beside it) and puts the device's
    health in the pod's status, with the driver's reason as its message; before, it opens no
    stream, the pod status says nothing, and the ResourceSlice's ``healthy`` attribute is
    where it shows."""
    streams = tuple(int(p) for p in kubelet.split(".")) >= (1, 36)
    await sim.apply(template("one"))
    await sim.apply(pod("watched", "kn-1", template_name="one"))
    (running,) = await sim.wait_until(lambda: sim.running(["watched"]), "watched Running")
    (claim,) = sim.claims_of(running).values()
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    device = str(result["device"])
    resource_id = f"k8s.neuron.aws.com/claim={claim['metadata']['uid']}-{device}"
    if streams:
        await sim.wait_until(
            lambda: resource_health(sim, "watched").get(resource_id) == "Healthy",
            "Healthy reported",
        )
    root = node(sim, "kn-1").layout.host_path(f"{DATA_DIR}/emulated/kn-1")
    paths = EmulatedPaths(root / "sys", root / "dev", root / "opt")
    index = int(device.removeprefix("neurondevice"))
    mark_unhealthy(paths, index, ["hbm"])
    try:
        await sim.wait_until(
            lambda: slice_healthy(sim, "kn-1", device) is False, "healthy=false in the slice"
        )
        if streams:
            await sim.wait_until(
                lambda: resource_health(sim, "watched").get(resource_id) == "Unhealthy",
                "Unhealthy in the pod's allocatedResourcesStatus",
            )
            _, message = resource_statuses(sim, "watched")[resource_id]
            assert message == "unhealthy component: hbm", message
        else:
            assert resource_health(sim, "watched") == {}
            assert sim.running(["watched"]), "the pod runs on, nothing broken"
    finally:
        with contextlib.suppress(OSError):
            mark_unhealthy(paths, index, [])
        await sim.wait_until(
            lambda: slice_healthy(sim, "kn-1", device) is True, "healthy again in the slice"
        )
