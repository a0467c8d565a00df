"""The floor plugin (``neuron_dra.sim.peerbench.floorplugin``, what ``hack/bench/peer
--kubelets real --ours floor`` runs in our plugin's slot): its answer for a claim, its one
CDI spec and slice, and the whole process on the fake API server behind the simulated
kubelet's registration and DRA v1 calls. The smoke on real kubelets is in
test_peer_smoke.py."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from neuron_dra.nodeplugin.kubeletapi import ClaimRef, PreparedDevice
from neuron_dra.sim import scratch
from neuron_dra.sim.fakeapi.server import FakeAPIServer
from neuron_dra.sim.kubeletclient import KubeletClient
from neuron_dra.sim.peerbench import floorplugin as fp
from neuron_dra.sim.peerbench.__main__ import build_parser, main

DRIVER = "floor.example.com"
KIND = "k8s.floor.example.com/device"


def claim(uid: str, results: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": "ns", "uid": uid},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def result(device: str, *, request: str = "dev", driver: str = DRIVER, pool: str = "n0") -> Any:
    return {"request": request, "driver": driver, "pool": pool, "device": device}


def test_answer_names_this_drivers_devices_from_this_pool() -> None:
    got = fp.answer(
        claim(
            "u1",
            [
                result("dev-3"),
                result("dev-4", request="dev/fast"),  # a subrequest: its base is answered
                result("gpu-0", driver="gpu.example.com"),  # another driver's
                result("dev-5", pool="n1"),  # another node's pool
            ],
        ),
        "u1",
        driver=DRIVER,
        pool="n0",
    )
    assert got.error == ""
    assert got.devices == (
        PreparedDevice(("dev",), "n0", "dev-3", (f"{KIND}=dev-3",)),
        PreparedDevice(("dev",), "n0", "dev-4", (f"{KIND}=dev-4",)),
    )


def test_answer_refuses_another_uid_and_a_claim_with_none_of_ours() -> None:
    stale = fp.answer(claim("u2", [result("dev-0")]), "u1", driver=DRIVER, pool="n0")
    assert stale.devices == () and "ns/c has uid u2, not u1" in stale.error
    none = fp.answer(claim("u1", [result("dev-0", pool="n1")]), "u1", driver=DRIVER, pool="n0")
    assert none.devices == () and "no devices of floor.example.com allocated on n0" in none.error
    unallocated = fp.answer({"metadata": {"uid": "u1"}}, "u1", driver=DRIVER, pool="n0")
    assert unallocated.error


def test_one_cdi_spec_and_one_slice_name_the_same_devices() -> None:
    spec = fp.cdi_spec(DRIVER, 16)
    assert spec["kind"] == KIND
    names = [d["name"] for d in spec["devices"]]
    assert names == [f"dev-{i}" for i in range(16)]
    # A CDI device with no edit is refused by the runtime: each sets one variable.
    assert spec["devices"][3]["containerEdits"] == {"env": ["FLOOR_DEVICE_3=dev-3"]}
    sl = fp.resource_slice(DRIVER, "n0", 16)
    assert sl["spec"]["pool"] == {"name": "n0", "generation": 1, "resourceSliceCount": 1}
    assert (sl["spec"]["driver"], sl["spec"]["nodeName"]) == (DRIVER, "n0")
    assert [d["name"] for d in sl["spec"]["devices"]] == names


def test_ours_floor_needs_real_kubelets(capsys: pytest.CaptureFixture[str]) -> None:
    assert build_parser().parse_args(["--kubelets", "real", "--ours", "floor"]).ours == "floor"
    assert build_parser().parse_args([]).ours == "plugin"
    with pytest.raises(SystemExit):
        main(["--ours", "floor"])
    assert "--ours floor needs --kubelets real" in capsys.readouterr().err


@pytest.fixture
def root() -> Iterator[Path]:
    # Unix socket paths must stay under 107 bytes: pytest's tmp_path can be longer.
    with scratch.temporary("floor", Path("/tmp")) as path:
        yield path


@contextlib.asynccontextmanager
async def floor_plugin(args: argparse.Namespace) -> AsyncIterator[None]:
    stop, serving = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(fp.run(args, stop, serving))
    waiter = asyncio.create_task(serving.wait())
    try:
        # Serving, or the plugin failed first (its exception is raised below).
        await asyncio.wait({task, waiter}, timeout=30, return_when="FIRST_COMPLETED")
        assert serving.is_set() or task.done(), "the floor plugin did not serve in 30 s"
        if not task.done():
            yield
    finally:
        waiter.cancel()
        stop.set()
        await asyncio.wait_for(task, 30)


def plugin_args(fake_apiserver: FakeAPIServer, root: Path, *extra: str) -> argparse.Namespace:
    """The floor plugin's arguments for a node ``n0`` of the fake API server, under ``root``."""
    fake_apiserver.write_kubeconfig(root / "kubeconfig")
    return fp.build_parser().parse_args(
        [
            "--node-name", "n0", "--kubeconfig", str(root / "kubeconfig"),
            "--cdi-root", str(root / "cdi"),
            "--kubelet-registrar-directory-path", str(root / "registry"),
            "--kubelet-plugins-directory-path", str(root / "plugins"), *extra,
        ]
    )  # fmt: skip


def allocated_claim(fake_apiserver: FakeAPIServer, *results: dict[str, str]) -> str:
    """The uid of claim default/c, allocated these ``results``."""
    made = fake_apiserver.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "default"},
            "spec": {"devices": {"requests": []}},
        }
    )
    made["status"] = {"allocation": {"devices": {"results": list(results)}}}
    return str(fake_apiserver.update_status(made)["metadata"]["uid"])


async def test_floor_plugin_registers_publishes_and_prepares(
    fake_apiserver: FakeAPIServer, root: Path
) -> None:
    args = plugin_args(fake_apiserver, root)
    uid = allocated_claim(fake_apiserver, result("dev-7"))
    ref = ClaimRef("default", uid, "c")
    async with floor_plugin(args):
        kubelet = KubeletClient(root / "registry")
        try:
            (dra,) = await kubelet.register_all()
            assert dra.service == "v1.DRAPlugin"
            (published,) = fake_apiserver.list("resource.k8s.io/v1", "ResourceSlice")
            assert published["spec"]["nodeName"] == "n0"
            spec = json.loads((root / "cdi" / "k8s.floor.example.com-device.json").read_text())
            assert spec["kind"] == KIND
            got = await dra.prepare([ref])
            assert got[uid].error == ""
            assert [d.cdi_device_ids for d in got[uid].devices] == [(f"{KIND}=dev-7",)]
            stale = await dra.prepare([ClaimRef("default", "other-uid", "c")])
            assert "not other-uid" in stale["other-uid"].error
            missing = await dra.prepare([ClaimRef("default", "u9", "gone")])
            assert "GET claim default/gone" in missing["u9"].error
            assert (await dra.unprepare([ref]))[uid].error == ""
        finally:
            await kubelet.close()
    assert not (root / "registry" / f"{DRIVER}-reg.sock").exists()


async def test_floor_files_writes_a_spec_per_claim_and_the_checkpoint(
    fake_apiserver: FakeAPIServer, root: Path
) -> None:
    # --files (--ours floor-files): the answer names the claim's own spec, which exists
    # with the checkpoint entry when Prepare answers; Unprepare takes both away.
    args = plugin_args(fake_apiserver, root, "--files")
    uid = allocated_claim(fake_apiserver, result("dev-2"), result("dev-9"))
    ref = ClaimRef("default", uid, "c")
    spec_path = root / "cdi" / f"k8s.floor.example.com-claim_{uid}.json"
    checkpoint = root / "plugins" / DRIVER / "checkpoint.json"
    async with floor_plugin(args):
        kubelet = KubeletClient(root / "registry")
        try:
            (dra,) = await kubelet.register_all()
            got = await dra.prepare([ref])
            assert got[uid].error == ""
            ids = [d.cdi_device_ids for d in got[uid].devices]
            kind = "k8s.floor.example.com/claim"
            assert ids == [(f"{kind}={uid}-dev-2",), (f"{kind}={uid}-dev-9",)]
            spec = json.loads(spec_path.read_text())
            assert (spec["kind"], spec["cdiVersion"]) == (kind, "0.5.0")
            assert [d["name"] for d in spec["devices"]] == [f"{uid}-dev-2", f"{uid}-dev-9"]
            assert json.loads(checkpoint.read_text()) == {uid: ["dev-2", "dev-9"]}
            assert (await dra.unprepare([ref]))[uid].error == ""
            assert not spec_path.exists()
            assert json.loads(checkpoint.read_text()) == {}
        finally:
            await kubelet.close()


def test_floor_files_is_a_floor_too(capsys: pytest.CaptureFixture[str]) -> None:
    assert build_parser().parse_args(["--kubelets", "real", "--ours", "floor-files"]).ours == (
        "floor-files"
    )
    with pytest.raises(SystemExit):
        main(["--ours", "floor-files"])
    assert "--ours floor-files needs --kubelets real" in capsys.readouterr().err
