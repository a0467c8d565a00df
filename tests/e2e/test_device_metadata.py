"""The device metadata file (KEP-5304) as a container sees it: at the standard path, in
Kubernetes' format, with the devices' attributes and the same cores and LNC as the container's
environment (docs/configuration.md, "Device metadata file"). No Kubernetes feature takes
part, so the same holds on every minor: on real nodes (1.34 and 1.37) the file is read from
inside the container; on the fake world, from the host file the claim's CDI spec mounts. The
UltraServer rank in the file is checked with the seed 000 workload
(test_seed_000_operator.py), an admin-access claim's file in test_admin_access.py."""

from __future__ import annotations

from typing import Any

import pytest
from neuron_dra.nodeplugin.prepare import metadata
from neuron_dra.sim.commands.walkthrough import Walkthrough
from neuron_dra.sim.simcluster import SimCluster

from .test_container_env import INF2, pod, request, template

pytestmark = pytest.mark.asyncio(loop_scope="package")

BASE = "/var/run/kubernetes.io/dra-device-attributes"
V1BETA1 = "metadata.resource.k8s.io/v1beta1"
V1ALPHA1 = "metadata.resource.k8s.io/v1alpha1"


def read(files: dict[str, str], path: str) -> dict[str, Any]:
    """The object a reader uses (the first: the newest version), after checking the stream."""
    assert path in files, sorted(files)
    objects = metadata.decode(files[path])
    assert [o["apiVersion"] for o in objects] == [V1BETA1, V1ALPHA1]
    assert objects[0]["kind"] == objects[1]["kind"] == "DeviceMetadata"
    first = {k: v for k, v in objects[0].items() if k != "apiVersion"}
    assert first == {k: v for k, v in objects[1].items() if k != "apiVersion"}
    return objects[0]


def slice_attributes(sim: SimCluster, node: str, device: str) -> dict[str, Any]:
    """The device's attributes as its node's ResourceSlice publishes them."""
    for s in sim.slices():
        if s["spec"].get("nodeName") == node:
            for d in s["spec"]["devices"]:
                if d["name"] == device:
                    return dict(d.get("attributes") or {})
    return {}


def attributes(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Device name -> attribute name -> value (``{"int": 3}`` -> 3)."""
    (req,) = doc["requests"]
    return {
        d["name"]: {k: next(iter(v.values())) for k, v in d["attributes"].items()}
        for d in req["devices"]
    }


async def test_a_container_reads_each_requests_file_of_its_template_claim(
    walk: Walkthrough,
) -> None:
    sim = walk.sim
    await sim.apply(template("pair-meta", request("r1", 1, INF2), request("r2", 2, INF2)))
    await sim.apply(pod("reads-metadata", {"accel": "pair-meta"}, {"main": [{"name": "accel"}]}))
    (p,) = await walk.running(["reads-metadata"])
    v = await walk.view(p)
    claim = sim.claims_of(p)["accel"]
    # Two requests, two files, under the pod's name for the claim (its own is generated).
    under = f"{BASE}/resourceclaimtemplates/accel"
    assert sorted(v.files) == [
        f"{under}/r1/neuron.aws.com-metadata.json",
        f"{under}/r2/neuron.aws.com-metadata.json",
    ]
    cores = []
    for req, device_id in (("r1", 1), ("r2", 2)):
        doc = read(v.files, f"{under}/{req}/neuron.aws.com-metadata.json")
        assert doc["metadata"]["name"] == claim["metadata"]["name"]
        assert doc["metadata"]["namespace"] == "default"
        assert doc["metadata"]["uid"] == claim["metadata"]["uid"]
        assert doc["podClaimName"] == "accel"
        assert doc["requests"][0]["name"] == req
        (device,) = doc["requests"][0]["devices"]
        assert (device["driver"], device["pool"]) == ("neuron.aws.com", v.node)
        name = f"neurondevice{device_id}"
        attrs = attributes(doc)[name]
        # The slice's attributes, qualified...
        assert attrs["neuron.aws.com/deviceId"] == device_id
        assert attrs["neuron.aws.com/instanceType"] == INF2
        assert attrs == {
            **{
                k if "/" in k else f"neuron.aws.com/{k}": next(iter(val.values()))
                for k, val in slice_attributes(sim, v.node, name).items()
                if k not in ("healthy", "logicalCoreCount")
            },
            # ...and what the container was prepared with.
            "neuron.aws.com/logicalCoreCount": 2,
            "neuron.aws.com/logicalNeuronCore": 1,
            "neuron.aws.com/visibleCores": f"{2 * device_id}-{2 * device_id + 1}",
        }
        cores.append(attrs["neuron.aws.com/visibleCores"])
    # The file's cores are the environment's, device by device.
    assert cores == ["2-3", "4-5"]
    assert v.env["NEURON_RT_VISIBLE_CORES"] == "2-5"


async def test_a_claim_the_pod_names_is_under_its_own_name(walk: Walkthrough) -> None:
    sim = walk.sim
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "named-claim"},
        "spec": {"devices": {"requests": [request("one", 5)]}},
    }
    spec = pod("names-claim", {}, {"main": [{"name": "mine"}]})
    spec["spec"]["resourceClaims"] = [{"name": "mine", "resourceClaimName": "named-claim"}]
    await sim.apply(claim)
    try:
        await sim.apply(spec)
        (p,) = await walk.running(["names-claim"])
        v = await walk.view(p)
        path = f"{BASE}/resourceclaims/named-claim/one/neuron.aws.com-metadata.json"
        assert list(v.files) == [path]
        doc = read(v.files, path)
        assert doc["metadata"]["name"] == "named-claim"
        assert "podClaimName" not in doc
        attrs = attributes(doc)["neurondevice5"]
        assert attrs["neuron.aws.com/visibleCores"] == v.env["NEURON_RT_VISIBLE_CORES"] == "10-11"
    finally:
        await sim.delete("v1", "Pod", "names-claim", "default")
        await sim.delete("resource.k8s.io/v1", "ResourceClaim", "named-claim", "default")
