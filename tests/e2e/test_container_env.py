"""What a container sees when it does not get exactly one claim's devices: two claims in one
container, one request of a two-request claim (docs/configuration.md, "Several claims or
requests in one container"). On real nodes it is read from inside the container."""

from __future__ import annotations

from typing import Any

import pytest
from neuron_dra.sim.commands.walkthrough import Walkthrough

pytestmark = pytest.mark.asyncio(loop_scope="package")

TYPE = "device.attributes['neuron.aws.com'].instanceType == '{}'"
IMAGE = "public.ecr.aws/docker/library/alpine:latest"
INF2 = "inf2.48xlarge"


def request(name: str, device_id: int, instance_type: str = "trn1.32xlarge") -> dict[str, Any]:
    """One device (2 NeuronCores on trn1 and inf2), pinned by its index. A claim of two
    such devices is an inf2.48xlarge's (a trn1.32xlarge takes no connected set of 2)."""
    cel = (
        f"{TYPE.format(instance_type)} && "
        f"device.attributes['neuron.aws.com'].deviceId == {device_id}"
    )
    return {
        "name": name,
        "exactly": {
            "deviceClassName": "neuron.aws.com",
            "selectors": [{"cel": {"expression": cel}}],
        },
    }


def template(name: str, *requests: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": list(requests)}}},
    }


def pod(name: str, claims: dict[str, str], containers: dict[str, list[dict[str, str]]]) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "resourceClaims": [
                {"name": n, "resourceClaimTemplateName": t} for n, t in claims.items()
            ],
            "containers": [
                {
                    "name": c,
                    "image": IMAGE,
                    "command": ["sleep", "infinity"],
                    "resources": {"claims": refs},
                }
                for c, refs in containers.items()
            ],
        },
    }


async def test_two_claims_in_one_container_give_the_cores_of_both(walk: Walkthrough) -> None:
    sim = walk.sim
    await sim.apply(template("dev1", request("d", 1)))
    await sim.apply(template("dev2", request("d", 2)))
    await sim.apply(
        pod("two-claims", {"a": "dev1", "b": "dev2"}, {"main": [{"name": "a"}, {"name": "b"}]})
    )
    (p,) = await walk.running(["two-claims"])
    v = await walk.view(p)
    assert v.device_nodes == ["/dev/neuron1", "/dev/neuron2"]
    # Devices 1 and 2 of a trn1.32xlarge: cores 2-3 and 4-5, whichever claim came last.
    assert v.env["NEURON_RT_VISIBLE_CORES"] == "2-5"


async def test_one_request_of_a_claim_gives_that_requests_cores(walk: Walkthrough) -> None:
    sim = walk.sim
    await sim.apply(template("pair", request("r1", 1, INF2), request("r2", 2, INF2)))
    await sim.apply(pod("one-request", {"n": "pair"}, {"main": [{"name": "n", "request": "r1"}]}))
    (p,) = await walk.running(["one-request"])
    v = await walk.view(p)
    assert v.device_nodes == ["/dev/neuron1"]
    assert v.env["NEURON_RT_VISIBLE_CORES"] == "2-3"


async def _refusal(walk: Walkthrough, name: str) -> str:
    (event,) = await walk.sim.wait_until(
        lambda: walk.sim.events(name, "FailedPrepareDynamicResources")[:1],
        f"FailedPrepareDynamicResources on {name}",
    )
    return str(event["note"])


async def test_two_containers_with_one_request_each_are_refused_with_what_to_change(
    walk: Walkthrough,
) -> None:
    sim = walk.sim
    await sim.apply(template("split", request("r1", 1, INF2), request("r2", 2, INF2)))
    containers = {"a": [{"name": "n", "request": "r1"}], "b": [{"name": "n", "request": "r2"}]}
    await sim.apply(pod("split", {"n": "split"}, containers))
    note = await _refusal(walk, "split")
    assert "reaches containers that get different Neuron devices" in note
    assert "container split/a: neuron1 from ResourceClaim" in note
    assert "give those containers the same claims and requests" in note


async def test_claims_whose_devices_are_not_one_core_range_are_refused(
    walk: Walkthrough,
) -> None:
    sim = walk.sim
    await sim.apply(template("gap1", request("d", 1)))
    await sim.apply(template("gap3", request("d", 3)))
    await sim.apply(
        pod("gap", {"a": "gap1", "b": "gap3"}, {"main": [{"name": "a"}, {"name": "b"}]})
    )
    note = await _refusal(walk, "gap")
    assert "neuron1, neuron3" in note and "not consecutive" in note
