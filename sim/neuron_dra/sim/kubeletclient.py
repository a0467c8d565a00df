"""A small kubelet-side client of DRA plugins, for the simulated kubelet and tests.

It follows what a 1.34/1.35 kubelet does (its plugin watcher and DRA handler): find sockets
in the registration directory, ``GetInfo`` (1 s), validate, pick the DRA service, dial the
endpoint, ``NotifyRegistrationStatus`` (5 s); then Prepare/Unprepare with a 45 s deadline.
It uses our generated stubs (via ``kubeletapi._proto``); wire compatibility with the real
kubelet is tested separately with an independent encoder.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc
import grpc.aio
from neuron_dra.nodeplugin.kubeletapi import _proto
from neuron_dra.nodeplugin.kubeletapi.model import (
    DRA_PLUGIN_TYPE,
    KUBELET_CALL_TIMEOUT,
    ClaimRef,
    DeviceHealthReport,
    PluginCallError,
    PluginInfo,
    PrepareResult,
    RegistrationRejected,
    UnprepareResult,
)
from neuron_dra.sim.cancellation import being_cancelled

log = logging.getLogger(__name__)

#: The DRA services a 1.34/1.35 kubelet can use, by registration string.
KUBELET_DRA_CODECS: Final = {codec.registration_name: codec for codec in _proto.DRA_CODECS}
GET_INFO_TIMEOUT: Final = 1.0
NOTIFY_TIMEOUT: Final = 5.0


def pick_service(supported_versions: Sequence[str]) -> str:
    """The service a 1.34+ kubelet uses: the first in the *plugin's* order it supports.

    (Not the kubelet's own preference: a plugin listing v1beta1 first gets v1beta1.)
    """
    if not supported_versions:
        raise RegistrationRejected("the plugin lists no supported versions")
    for version in supported_versions:
        if version in KUBELET_DRA_CODECS:
            return version
    raise RegistrationRejected(
        f"none of the services supported by the plugin {list(supported_versions)} are "
        f"supported by the kubelet {list(KUBELET_DRA_CODECS)}"
    )


def discover(registrar_dir: Path) -> list[Path]:
    """Unix sockets under ``registrar_dir`` (recursively), skipping dot-names, sorted."""
    found: list[Path] = []
    for root, dirs, files in os.walk(registrar_dir):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if name.startswith("."):
                continue
            path = Path(root, name)
            try:
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    found.append(path)
            except FileNotFoundError:
                continue  # removed while we looked
    return sorted(found)


def _closed_under(method: str) -> PluginCallError:
    """A call whose channel was closed while it was in flight: grpc.aio then cancels the
    awaiting task's await (``CancelledError`` without the task being cancelled).
    Re-registration closes the channel of the plugin's previous instance; a kubelet sees
    that call fail, not its own loop stop."""
    return PluginCallError(method, "CANCELLED", "the plugin's connection closed during the call")


def _rpc_error(method: str, exc: Any) -> PluginCallError:
    return PluginCallError(method, exc.code().name, exc.details() or "")


@dataclass
class DraPlugin:
    """One registered plugin instance, connected to its DRA endpoint."""

    registration_socket: Path
    info: PluginInfo
    #: The registration string in use, e.g. ``"v1.DRAPlugin"``.
    service: str
    call_timeout: float
    _channel: Any = field(repr=False)

    @property
    def endpoint(self) -> str:
        return self.info.endpoint

    def _stub(self) -> _proto.DraStub:
        return KUBELET_DRA_CODECS[self.service].stub(self._channel)

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        try:
            return await self._stub().prepare(claims, self.call_timeout)
        except grpc.aio.AioRpcError as exc:
            raise _rpc_error("NodePrepareResources", exc) from exc
        except asyncio.CancelledError:
            if being_cancelled():
                raise
            raise _closed_under("NodePrepareResources") from None

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, UnprepareResult]:
        try:
            return await self._stub().unprepare(claims, self.call_timeout)
        except grpc.aio.AioRpcError as exc:
            raise _rpc_error("NodeUnprepareResources", exc) from exc
        except asyncio.CancelledError:
            if being_cancelled():
                raise
            raise _closed_under("NodeUnprepareResources") from None

    def health_stream(self) -> AsyncGenerator[list[DeviceHealthReport], None]:
        """Complete device-health lists as the plugin sends them, over the newest dra-health
        version it advertises (as a 1.37 kubelet picks: v1, else v1alpha1)."""
        advertised = set(self.info.supported_versions)
        codec = next(
            (c for c in _proto.HEALTH_CODECS if c.registration_name in advertised),
            _proto.HEALTH_V1ALPHA1,  # a 1.36 kubelet opens it whatever is advertised
        )
        return codec.stub(self._channel).watch()

    async def close(self) -> None:
        await self._channel.close()


class KubeletClient:
    """Registers plugins found in a registration directory and calls them."""

    def __init__(
        self,
        registrar_dir: Path | str,
        *,
        call_timeout: float = KUBELET_CALL_TIMEOUT,
        get_info_timeout: float = GET_INFO_TIMEOUT,
        notify_timeout: float = NOTIFY_TIMEOUT,
    ) -> None:
        self.registrar_dir = Path(registrar_dir)
        self._call_timeout = call_timeout
        self._get_info_timeout = get_info_timeout
        self._notify_timeout = notify_timeout
        #: Registered instances per driver name, oldest first.
        self.plugins: dict[str, list[DraPlugin]] = {}

    def discover(self) -> list[Path]:
        return discover(self.registrar_dir)

    async def register_all(self) -> list[DraPlugin]:
        """Register every socket not registered yet; rejections are logged and skipped."""
        known = {p.registration_socket for ps in self.plugins.values() for p in ps}
        out: list[DraPlugin] = []
        for path in self.discover():
            if path in known:
                continue
            try:
                out.append(await self.register(path))
            except RegistrationRejected as exc:
                log.warning("plugin at %s rejected: %s", path, exc)
        return out

    async def register(self, registration_socket: Path) -> DraPlugin:
        """The kubelet's handshake; raises ``RegistrationRejected`` (after telling the
        plugin) or ``PluginCallError`` if a registration call fails."""
        async with grpc.aio.insecure_channel(f"unix://{registration_socket}") as channel:
            reg = _proto.RegistrationStub(channel)
            try:
                info = await reg.get_info(self._get_info_timeout)
            except grpc.aio.AioRpcError as exc:
                raise _rpc_error("GetInfo", exc) from exc
            try:
                info, service = self._validate(registration_socket, info)
            except RegistrationRejected as exc:
                await self._notify(reg, False, str(exc))
                raise
            # Like the kubelet, connect to the endpoint before confirming registration.
            channel = grpc.aio.insecure_channel(f"unix://{info.endpoint}")
            plugin = DraPlugin(registration_socket, info, service, self._call_timeout, channel)
            try:
                await self._notify(reg, True, "")
            except BaseException:
                await plugin.close()
                raise
        self.plugins.setdefault(info.name, []).append(plugin)
        log.info(
            "registered DRA plugin %s at %s using %s", info.name, plugin.endpoint, plugin.service
        )
        return plugin

    def _validate(self, registration_socket: Path, info: PluginInfo) -> tuple[PluginInfo, str]:
        """(info with the effective endpoint, chosen service) or ``RegistrationRejected``."""
        if info.type != DRA_PLUGIN_TYPE:
            raise RegistrationRejected(f"unknown plugin type {info.type!r}")
        if not info.name:
            raise RegistrationRejected("the plugin reports an empty driver name")
        # An empty endpoint means "same socket as registration".
        endpoint = info.endpoint or str(registration_socket)
        info = PluginInfo(info.type, info.name, endpoint, info.supported_versions)
        service = pick_service(info.supported_versions)
        if any(p.endpoint == endpoint for p in self.plugins.get(info.name, [])):
            raise RegistrationRejected(
                f"endpoint {endpoint} of driver {info.name} is already registered"
            )
        return info, service

    async def _notify(self, reg: _proto.RegistrationStub, ok: bool, error: str) -> None:
        try:
            await reg.notify(ok, error, self._notify_timeout)
        except grpc.aio.AioRpcError as exc:
            raise _rpc_error("NotifyRegistrationStatus", exc) from exc

    def plugin(self, driver_name: str) -> DraPlugin:
        """The most recently registered instance (the kubelet prefers connected ones,
        which needs connection tracking we do not simulate)."""
        instances = self.plugins.get(driver_name)
        if not instances:
            raise KeyError(f"DRA driver {driver_name} is not registered")
        return instances[-1]

    async def deregister(self, plugin: DraPlugin) -> None:
        self.plugins.get(plugin.info.name, []).remove(plugin)
        await plugin.close()

    async def close(self) -> None:
        for instances in self.plugins.values():
            for plugin in instances:
                await plugin.close()
        self.plugins.clear()
