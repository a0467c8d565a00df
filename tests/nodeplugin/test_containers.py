"""prepare/containers.py: the devices each container gets decide its claims' environment."""

from __future__ import annotations

import dataclasses
from typing import Any

from neuron_dra.nodeplugin.prepare import checkpoint as ckpt
from neuron_dra.nodeplugin.prepare import containers as c
from neuron_dra.nodeplugin.prepare.claims import ClaimPlan
from neuron_dra.nodeplugin.prepare.shares import ShareRequest


def plan(name: str, devices: dict[str, list[int]], *, lnc: int | None = None) -> ClaimPlan:
    """A claim of ``name`` holding ``devices`` (request -> indices)."""
    pairs = sorted(((r,), f"neurondevice{i}") for r, indices in devices.items() for i in indices)
    return ClaimPlan(
        claim_uid=f"uid-{name}",
        namespace="ns",
        name=name,
        devices=tuple(pairs),
        device_indices=tuple(sorted(i for v in devices.values() for i in v)),
        lnc=lnc,
        ultraserver_mode_nodes=None,
        workload_id=None,
    )


def pod(*containers: tuple[str, list[tuple[str, str | None]]], init: bool = False) -> Any:
    """Pod claim names equal the ResourceClaim names (``resourceClaimName``)."""
    names = sorted({claim for _, refs in containers for claim, _ in refs})
    specs = [
        {
            "name": cname,
            "resources": {
                "claims": [{"name": n, **({"request": r} if r else {})} for n, r in refs]
            },
        }
        for cname, refs in containers
    ]
    return {
        "metadata": {"name": "p", "uid": "pod-uid"},
        "spec": {
            "resourceClaims": [{"name": n, "resourceClaimName": n} for n in names],
            ("initContainers" if init else "containers"): specs,
        },
    }


def env_of(p: ClaimPlan, indices: tuple[int, ...]) -> dict[str, str]:
    """A stand-in for claim_env: 2 cores per device, the plan's LNC when set."""
    if indices[-1] - indices[0] + 1 != len(indices):
        raise ValueError("not consecutive")
    env = {"NEURON_RT_VISIBLE_CORES": f"{indices[0] * 2}-{indices[-1] * 2 + 1}"}
    if p.lnc is not None:
        env["NEURON_LOGICAL_NC_CONFIG"] = str(p.lnc)
    return env


def entry(p: ClaimPlan, env: dict[str, str]) -> ckpt.ClaimEntry:
    return ckpt.ClaimEntry(
        uid=p.claim_uid,
        namespace=p.namespace,
        name=p.name,
        devices=tuple(ckpt.DeviceRecord(r, "pool", d, (f"k=x-{d}",)) for r, d in p.devices),
        device_indices=p.device_indices,
        cdi_spec={"containerEdits": {"env": [f"{k}={v}" for k, v in env.items()]}},
        prepared_at="",
    )


X, Y = plan("x", {"r": [1]}), plan("y", {"r": [2]})


def test_a_container_with_two_claims_gets_both_claims_cores_from_either_spec() -> None:
    got = c.env_indices([X, Y], [], [pod(("main", [("x", None), ("y", None)]))], env_of)
    assert got == {"uid-x": (1, 2), "uid-y": (1, 2)}


def test_a_container_naming_one_request_gets_that_requests_cores() -> None:
    two = plan("two", {"r1": [1], "r2": [2]})
    got = c.env_indices([two], [], [pod(("main", [("two", "r1")]))], env_of)
    assert got == {"uid-two": (1,)}


def test_a_claim_no_container_uses_keeps_its_own_devices() -> None:
    assert c.env_indices([X], [], [pod(("main", []))], env_of) == {"uid-x": (1,)}
    assert c.env_indices([X], [], [], env_of) == {"uid-x": (1,)}


def test_containers_getting_different_sets_through_one_claim_are_refused() -> None:
    p = pod(("a", [("x", None), ("y", None)]), ("b", [("x", None)]))
    got = c.env_indices([X, Y], [], [p], env_of)
    assert isinstance(got["uid-x"], str)
    assert "container p/a: neuron1, neuron2 from ResourceClaims x, y" in got["uid-x"]
    assert "container p/b: neuron1 from ResourceClaim x" in got["uid-x"]
    assert got["uid-y"] == (1, 2)  # only container a uses y


def test_two_requests_of_one_claim_in_two_containers_are_refused() -> None:
    two = plan("two", {"r1": [1], "r2": [2]})
    got = c.env_indices([two], [], [pod(("a", [("two", "r1")]), ("b", [("two", "r2")]))], env_of)
    assert isinstance(got["uid-two"], str) and "different Neuron devices" in got["uid-two"]


def test_devices_that_are_not_one_core_range_are_refused() -> None:
    z = plan("z", {"r": [3]})
    got = c.env_indices([X, z], [], [pod(("main", [("x", None), ("z", None)]))], env_of)
    message = got["uid-x"]
    assert isinstance(message, str)
    assert "neuron1, neuron3 from ResourceClaims x, z, which are not consecutive" in message


def test_claims_whose_settings_differ_are_refused_naming_the_setting() -> None:
    x1 = plan("x", {"r": [1]}, lnc=1)
    got = c.env_indices([x1, Y], [], [pod(("main", [("x", None), ("y", None)]))], env_of)
    message = got["uid-y"]
    assert isinstance(message, str)
    assert "NEURON_LOGICAL_NC_CONFIG: x=1, y=(unset)" in message


def test_a_claim_prepared_earlier_must_already_carry_the_pairs_environment() -> None:
    p = pod(("main", [("x", None), ("y", None)]))
    own = entry(Y, {"NEURON_RT_VISIBLE_CORES": "4-5"})  # prepared for another pod, alone
    got = c.env_indices([X], [own], [p], env_of)
    assert isinstance(got["uid-x"], str) and "NEURON_RT_VISIBLE_CORES" in got["uid-x"]
    pair = entry(Y, {"NEURON_RT_VISIBLE_CORES": "2-5"})  # prepared for this very pair
    assert c.env_indices([X], [pair], [p], env_of) == {"uid-x": (1, 2)}


def test_a_core_share_gets_no_other_claim_in_its_container() -> None:
    """Its cores are some of one device's: no other claim's cores continue them in one range,
    whether the share is being prepared or was prepared earlier."""
    share = dataclasses.replace(plan("x", {"r": [1]}), share=ShareRequest(1, 1, 2, "s"))
    both = pod(("main", [("x", None), ("y", None)]))
    got = c.env_indices([share, Y], [], [both], env_of)
    assert all(isinstance(v, str) and "core share" in v for v in got.values()), got
    shared_entry = dataclasses.replace(entry(X, {}), share=ckpt.CoreShare(1, 0, 1, 2))
    got = c.env_indices([Y], [shared_entry], [both], env_of)
    assert isinstance(got["uid-y"], str) and "core share" in got["uid-y"]
    # Alone in its container, a share is fine.
    assert c.env_indices([share], [], [pod(("main", [("x", None)]))], env_of) == {"uid-x": (1,)}


def test_init_containers_and_template_claims_count() -> None:
    p = pod(("init", [("x", None), ("y", None)]), init=True)
    p["spec"]["resourceClaims"] = [
        {"name": "first", "resourceClaimTemplateName": "t"},
        {"name": "second", "resourceClaimTemplateName": "t"},
    ]
    p["spec"]["initContainers"][0]["resources"]["claims"] = [{"name": "first"}, {"name": "second"}]
    p["status"] = {
        "resourceClaimStatuses": [
            {"name": "first", "resourceClaimName": "x"},
            {"name": "second", "resourceClaimName": "y"},
        ]
    }
    assert c.env_indices([X, Y], [], [p], env_of) == {"uid-x": (1, 2), "uid-y": (1, 2)}


def test_pods_are_read_only_when_a_container_could_get_a_different_set() -> None:
    assert not c.needs_pods([X], 0)  # one claim, one request, nothing else of ours here
    assert c.needs_pods([X], 1)  # another claim prepared in the namespace
    assert c.needs_pods([X, Y], 0)  # two claims of the pod
    assert c.needs_pods([plan("two", {"r1": [1], "r2": [2]})], 0)  # a request may be named
    assert not c.needs_pods([plan("sub", {"r/a": [1], "r/b": [2]})], 0)  # one base request
