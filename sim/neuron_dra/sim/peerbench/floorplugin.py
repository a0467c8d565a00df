"""The floor plugin: the least any Python DRA kubelet plugin does per Prepare, as a measuring
instrument (``hack/bench/peer --kubelets real --ours floor``), not product code.

What every DRA driver must do and nothing else: at start, write one CDI spec for all its
devices and publish one ResourceSlice; then serve the kubelet's registration service and
DRA v1 over ``grpc.aio`` on Unix sockets. Per claim a Prepare GETs the ResourceClaim with our
plugin's API client (``KubeClient``: the same aiohttp session and TLS, kept alive), checks
its uid and answers the CDI ids of the devices of this driver allocated from this node's
pool. No checkpoint, no per-claim CDI spec, no status write, no metrics, no per-call log:
whatever the real kubelet times beyond this is the price of Python, grpcio and the GET.
Unprepare answers success. The gRPC and the claim GET are our plugin's own
(:mod:`neuron_dra.nodeplugin.kubeletapi`'s generated protos and translation, its client).

With ``--files`` (``--ours floor-files``) it also does the file work every correct driver
does before it answers, as the Go peer does: a CDI spec per claim (written atomically and
fsynced, as ours is) whose ids the answer names, and a checkpoint of the prepared claims
(atomic, not fsynced, as ours is) in the plugin's directory, both inline on the event loop
(the cheapest way); Unprepare removes the spec and saves the checkpoint. Still no node lock,
metadata file, status write, metrics or log line.

    python -m neuron_dra.sim.peerbench.floorplugin --node-name N --kubeconfig K \\
        --cdi-root D --kubelet-registrar-directory-path R --kubelet-plugins-directory-path P
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc.aio
from neuron_dra.common.k8s.client import (
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    ResourceClient,
    connect,
)
from neuron_dra.common.k8s.errors import AlreadyExistsError
from neuron_dra.nodeplugin.kubeletapi import _proto
from neuron_dra.nodeplugin.kubeletapi.model import (
    DRA_PLUGIN_TYPE,
    V1_SERVICE,
    PluginInfo,
    PreparedDevice,
    PrepareResult,
    UnprepareResult,
)
from neuron_dra.nodeplugin.kubeletapi.server import socket_paths
from neuron_dra.nodeplugin.prepare.atomicfile import replace_file
from neuron_dra.nodeplugin.prepare.cdi import spec_file_name

FLOOR_DRIVER = "floor.example.com"
#: As many devices as the peer's ``--num-devices`` and a trn2.48xlarge's Neuron devices.
DEFAULT_DEVICES = 16


def cdi_kind(driver: str) -> str:
    return f"k8s.{driver}/device"


def device_names(count: int) -> list[str]:
    return [f"dev-{i}" for i in range(count)]


def cdi_spec(driver: str, count: int) -> dict[str, Any]:
    """One spec naming every device. A CDI device must carry some edit (the runtime rejects
    an empty one), so each sets one variable, as the peer's do; no device nodes: the floor
    hands nothing real to the container."""
    return {
        "cdiVersion": "0.3.0",
        "kind": cdi_kind(driver),
        "devices": [
            {"name": name, "containerEdits": {"env": [f"FLOOR_DEVICE_{i}={name}"]}}
            for i, name in enumerate(device_names(count))
        ],
    }


def resource_slice(driver: str, node: str, count: int) -> dict[str, Any]:
    """The node's one slice: its pool is the node's name, its devices bare names (no
    attributes: nothing selects them beyond the driver). No owner reference to the Node,
    which would cost a GET at start: the benchmark's cluster goes away with the run."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": name} for name in device_names(count)],
        },
    }


def claim_kind(driver: str) -> str:
    """The kind of the per-claim specs of ``--files``."""
    return f"k8s.{driver}/claim"


def answer(
    claim: Mapping[str, Any], uid: str, *, driver: str, pool: str, per_claim: bool = False
) -> PrepareResult:
    """The kubelet's answer for one claim as read: its devices of ``driver`` from ``pool``
    with their CDI ids (``per_claim``: those of the claim's own spec), or an error for a
    claim recreated under the same name (another uid) or with none of ours."""
    meta = claim.get("metadata") or {}
    key = f"{meta.get('namespace')}/{meta.get('name')}"
    if meta.get("uid") != uid:
        return PrepareResult(error=f"claim {key} has uid {meta.get('uid')}, not {uid}")
    allocation = (claim.get("status") or {}).get("allocation") or {}
    kind, prefix = (claim_kind(driver), f"{uid}-") if per_claim else (cdi_kind(driver), "")
    devices = tuple(
        PreparedDevice(
            request_names=(str(r["request"]).split("/", 1)[0],),  # a subrequest's base
            pool_name=pool,
            device_name=str(r["device"]),
            cdi_device_ids=(f"{kind}={prefix}{r['device']}",),
        )
        for r in (allocation.get("devices") or {}).get("results") or []
        if r.get("driver") == driver and r.get("pool") == pool
    )
    if not devices:
        return PrepareResult(error=f"claim {key}: no devices of {driver} allocated on {pool}")
    return PrepareResult(devices=devices)


class FloorFiles:
    """``--files``: a claim's own CDI spec and the checkpoint of the prepared claims."""

    def __init__(self, driver: str, cdi_root: Path, checkpoint: Path) -> None:
        self._kind = claim_kind(driver)
        self._cdi_root, self._checkpoint = cdi_root, checkpoint
        self._prepared: dict[str, list[str]] = {}

    def spec_path(self, uid: str) -> Path:
        return self._cdi_root / spec_file_name(uid, cdi_kind=self._kind)  # named as ours

    def prepare(self, uid: str, devices: Sequence[str]) -> None:
        spec = {
            # 0.5.0: a device name may start with a digit (the uid) from that version on.
            "cdiVersion": "0.5.0",
            "kind": self._kind,
            "devices": [
                {"name": f"{uid}-{d}", "containerEdits": {"env": [f"FLOOR_DEVICE={d}"]}}
                for d in devices
            ],
        }
        raw = json.dumps(spec, separators=(",", ":")).encode()
        replace_file(self.spec_path(uid), raw, mode=0o644)  # durable, as ours
        self._prepared[uid] = list(devices)
        self._save()

    def unprepare(self, uid: str) -> None:
        self.spec_path(uid).unlink(missing_ok=True)
        if self._prepared.pop(uid, None) is not None:
            self._save()

    def _save(self) -> None:
        replace_file(self._checkpoint, json.dumps(self._prepared).encode(), durable=False)


class FloorDra:
    """DRA v1: Prepare GETs each claim (concurrently, as our plugin does) and answers;
    with ``files``, after writing the claim's files."""

    def __init__(
        self, claims: ResourceClient, *, driver: str, pool: str, files: FloorFiles | None = None
    ) -> None:
        self._claims, self._driver, self._pool, self._files = claims, driver, pool, files

    async def _one(self, namespace: str, name: str, uid: str) -> PrepareResult:
        try:
            claim = await self._claims.get(name, namespace)
        except Exception as exc:  # the kubelet shows a claim's error and retries
            return PrepareResult(error=f"GET claim {namespace}/{name}: {exc}")
        got = answer(
            claim, uid, driver=self._driver, pool=self._pool, per_claim=self._files is not None
        )
        if self._files is not None and not got.error:
            try:
                self._files.prepare(uid, [d.device_name for d in got.devices])
            except OSError as exc:
                return PrepareResult(error=f"claim {namespace}/{name}: {exc}")
        return got

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        refs = _proto.DRA_V1.claims(request)
        got = await asyncio.gather(*(self._one(r.namespace, r.name, r.uid) for r in refs))
        return _proto.DRA_V1.prepare_response(
            {r.uid: result for r, result in zip(refs, got, strict=True)}
        )

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        refs = _proto.DRA_V1.claims(request)
        out = {}
        for r in refs:
            try:
                if self._files is not None:
                    self._files.unprepare(r.uid)
                out[r.uid] = UnprepareResult()
            except OSError as exc:
                out[r.uid] = UnprepareResult(error=f"claim {r.namespace}/{r.name}: {exc}")
        return _proto.DRA_V1.unprepare_response(out)


class FloorRegistration:
    """pluginregistration v1: a precomputed GetInfo, and the kubelet's verdict printed."""

    def __init__(self, info: PluginInfo) -> None:
        self._info = _proto.plugin_info_message(info)

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return self._info

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        registered, error = _proto.registration_status(request)
        print(f"floor plugin: registered={registered} {error}".rstrip(), flush=True)
        return _proto.registration_status_response()


def write_files(args: argparse.Namespace) -> tuple[Path, Path]:
    """The CDI spec written, the sockets' directories made and any socket left by an earlier
    run of the instrument removed; (DRA socket, registration socket), named as our plugin's."""
    spec = json.dumps(cdi_spec(args.driver_name, args.num_devices)).encode()
    vendor, _, cls = cdi_kind(args.driver_name).partition("/")
    # Atomic (a runtime watching the directory never reads half a file); once, so no fsync.
    replace_file(Path(args.cdi_root) / f"{vendor}-{cls}.json", spec, mode=0o644, durable=False)
    sockets = socket_paths(
        args.driver_name, Path(args.kubelet_plugins_directory_path),
        Path(args.kubelet_registrar_directory_path), None,
    )  # fmt: skip
    for path in sockets:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
    return sockets


async def _serve(server: Any, path: Path) -> None:
    server.add_insecure_port(f"unix://{path}")
    await server.start()


async def run(
    args: argparse.Namespace, stop: asyncio.Event, serving: asyncio.Event | None = None
) -> None:
    """Publish, serve until ``stop`` is set (``serving`` is set once the kubelet can find
    the plugin), stop serving."""
    driver, node = args.driver_name, args.node_name
    dra_sock, reg_sock = write_files(args)
    async with await connect(args.kubeconfig) as kube:
        with contextlib.suppress(AlreadyExistsError):  # the same slice, from an earlier run
            await kube.resource(RESOURCE_SLICES).create(
                resource_slice(driver, node, args.num_devices)
            )
        dra = grpc.aio.server()
        files = (
            FloorFiles(driver, Path(args.cdi_root), dra_sock.parent / "checkpoint.json")
            if args.files
            else None
        )
        dra_servicer = FloorDra(
            kube.resource(RESOURCE_CLAIMS), driver=driver, pool=node, files=files
        )
        _proto.DRA_V1.add_servicer(dra_servicer, dra)
        await _serve(dra, dra_sock)  # before the registration socket: the kubelet dials it
        reg = grpc.aio.server()
        info = PluginInfo(DRA_PLUGIN_TYPE, driver, str(dra_sock), (V1_SERVICE,))
        _proto.add_registration_servicer(FloorRegistration(info), reg)
        await _serve(reg, reg_sock)
        print(f"floor plugin: serving {driver} on {dra_sock}", flush=True)
        if serving is not None:
            serving.set()
        try:
            await stop.wait()
        finally:
            await reg.stop(None)  # first: its socket going de-registers the plugin
            await dra.stop(None)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m neuron_dra.sim.peerbench.floorplugin",
        description="The least a Python DRA plugin does per Prepare: a measuring instrument.",
    )
    p.add_argument("--node-name", required=True)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--cdi-root", required=True)
    p.add_argument("--kubelet-registrar-directory-path", required=True)
    p.add_argument("--kubelet-plugins-directory-path", required=True)
    p.add_argument("--driver-name", default=FLOOR_DRIVER)
    p.add_argument("--num-devices", type=int, default=DEFAULT_DEVICES)
    p.add_argument(
        "--files",
        action="store_true",
        help="also write a CDI spec per claim and a checkpoint before answering",
    )
    return p


async def _main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await run(args, stop)


def main(argv: Sequence[str] | None = None) -> int:
    asyncio.run(_main(build_parser().parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
