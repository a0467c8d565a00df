"""``PluginServer``: owns both Unix sockets and their lifecycle.

Ordering matters to the kubelet:

* start: the DRA socket must accept connections before the registration socket appears,
  because the kubelet connects to the endpoint as soon as it has registered us;
* stop: the registration socket goes first, so the kubelet de-registers us before the
  DRA socket disappears under it.

With a pod UID both socket names are unique per plugin pod, so during a rolling update the
new pod starts beside the old one and neither touches the other's sockets. Without one the
names are fixed, and a live socket at our path means another instance is running: we
refuse instead of unlinking it (which would silently de-register that instance).

This module does not import the gRPC stack: ``start`` does (``wiring``), or
:func:`load_grpc_stack` beforehand, so that a plugin can publish before paying for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .model import (
    DEFAULT_BUDGET,
    DEFAULT_RESEND_INTERVAL,
    DRA_PLUGIN_TYPE,
    DRA_VERSIONS,
    HEALTH_VERSIONS,
    DriverBackend,
    HealthSource,
    PluginInfo,
    ServerStateError,
    SocketPathError,
    validate_budget,
)
from .state import RegistrationState

if TYPE_CHECKING:
    from ._proto import GrpcHealth

log = logging.getLogger(__name__)

#: ``sun_path`` is 108 bytes on Linux including the terminating NUL.
MAX_SOCKET_PATH = 107


def load_grpc_stack() -> None:
    """Import ``grpc``, protobuf and the generated code now (safe in a worker thread)."""
    from . import wiring  # noqa: F401


def socket_paths(
    driver_name: str, plugins_dir: Path, registrar_dir: Path, pod_uid: str | None
) -> tuple[Path, Path]:
    """(DRA socket, registration socket) for one plugin instance, named as the Go helper
    (``k8s.io/dynamic-resource-allocation/kubeletplugin``) names them."""
    _check_name_part("driver name", driver_name)
    if pod_uid is None:
        return plugins_dir / driver_name / "dra.sock", registrar_dir / f"{driver_name}-reg.sock"
    _check_name_part("pod UID", pod_uid)
    return (
        plugins_dir / driver_name / f"dra-{pod_uid}.sock",
        registrar_dir / f"{driver_name}-{pod_uid}-reg.sock",
    )


def _check_name_part(what: str, value: str) -> None:
    # A leading dot would make the kubelet's plugin watcher ignore the socket.
    if not value or "/" in value or value.startswith(".") or "\0" in value:
        raise ValueError(f"invalid {what} {value!r} for a socket file name")


class PluginServer:
    """The DRA gRPC server (v1 + v1beta1 + grpc.health.v1 [+ dra-health]) and the
    registration server of one plugin instance."""

    def __init__(
        self,
        *,
        driver_name: str,
        plugins_dir: Path | str,
        registrar_dir: Path | str,
        backend: DriverBackend,
        pod_uid: str | None = None,
        health_source: HealthSource | None = None,
        budget: float = DEFAULT_BUDGET,
        health_resend_interval: float = DEFAULT_RESEND_INTERVAL,
    ) -> None:
        plugins_dir, registrar_dir = Path(plugins_dir), Path(registrar_dir)
        for what, d in (("plugins_dir", plugins_dir), ("registrar_dir", registrar_dir)):
            if not d.is_absolute():
                # The endpoint we report must be a host path the kubelet can dial.
                raise ValueError(f"{what} must be absolute, got {str(d)!r}")
        self.driver_name = driver_name
        self.dra_socket, self.registration_socket = socket_paths(
            driver_name, plugins_dir, registrar_dir, pod_uid
        )
        for path in (self.dra_socket, self.registration_socket):
            if len(os.fsencode(path)) > MAX_SOCKET_PATH:
                raise SocketPathError(
                    f"socket path {path} is longer than {MAX_SOCKET_PATH} bytes, the Unix "
                    "socket limit; use shorter kubelet plugin/registrar directory paths"
                )
        self._backend = backend
        self._health_source = health_source
        self._budget = validate_budget(budget)
        self._resend_interval = health_resend_interval
        self.registration = RegistrationState()
        self._stopping = asyncio.Event()
        self._dra_server: Any = None
        self._reg_server: Any = None
        self._grpc_health: GrpcHealth | None = None
        # (st_dev, st_ino) of the sockets we created, so that stop() never unlinks a
        # socket that someone else has put at the same path since.
        self._owned: dict[Path, tuple[int, int]] = {}
        self._state = "new"

    @property
    def supported_versions(self) -> tuple[str, ...]:
        # Only advertise what we serve: the kubelet may call any service we list.
        return DRA_VERSIONS + (HEALTH_VERSIONS if self._health_source is not None else ())

    @property
    def plugin_info(self) -> PluginInfo:
        return PluginInfo(
            type=DRA_PLUGIN_TYPE,
            name=self.driver_name,
            endpoint=str(self.dra_socket),
            supported_versions=self.supported_versions,
        )

    @property
    def registered(self) -> asyncio.Event:
        """Set while the kubelet has accepted our registration (for readiness)."""
        return self.registration.registered

    @property
    def serving(self) -> bool:
        return self._state == "started"

    async def __aenter__(self) -> PluginServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._state != "new":
            raise ServerStateError(f"PluginServer.start() called in state {self._state!r}")
        self._state = "starting"
        try:
            self.dra_socket.parent.mkdir(parents=True, exist_ok=True)
            self.registration_socket.parent.mkdir(parents=True, exist_ok=True)
            # Check both paths before serving either: failing on the second one after the
            # first is already being served would flap the plugin for nothing.
            await _clear_stale_socket(self.dra_socket)
            await _clear_stale_socket(self.registration_socket)

            from . import wiring  # the gRPC stack, at the latest now (see load_grpc_stack)

            self._dra_server, self._grpc_health = wiring.dra_server(
                self._backend,
                budget=self._budget,
                health_source=self._health_source,
                stopping=self._stopping,
                resend_interval=self._resend_interval,
            )
            await self._serve(self._dra_server, self.dra_socket)
            await self._grpc_health.set_serving(wiring.serving_service_names())

            # Only now may the kubelet find us.
            self._reg_server = wiring.registration_server(self.plugin_info, self.registration)
            await self._serve(self._reg_server, self.registration_socket)
        except BaseException:
            await self._shutdown(grace=None)
            self._state = "failed"
            raise
        self._state = "started"
        log.info(
            "kubelet plugin serving",
            extra={
                "driver": self.driver_name,
                "dra_socket": str(self.dra_socket),
                "registration_socket": str(self.registration_socket),
                "versions": list(self.supported_versions),
            },
        )

    async def stop(self, grace: float | None = 5.0) -> None:
        """Idempotent. In-flight calls get ``grace`` seconds; health streams end at once."""
        if self._state in ("new", "stopped"):
            self._state = "stopped"
            return
        await self._shutdown(grace)
        self._state = "stopped"
        log.info("kubelet plugin stopped", extra={"driver": self.driver_name})

    async def _serve(self, server: Any, path: Path) -> None:
        try:
            port = server.add_insecure_port(f"unix://{path}")
        except RuntimeError as exc:
            raise SocketPathError(f"cannot listen on {path}: {exc}") from exc
        if port == 0:  # older grpc versions report a failed bind this way
            raise SocketPathError(f"cannot listen on {path}")
        await server.start()
        st = os.lstat(path)
        if not stat.S_ISSOCK(st.st_mode):
            raise SocketPathError(f"{path} is not a socket after the gRPC server started")
        self._owned[path] = (st.st_dev, st.st_ino)

    async def _shutdown(self, grace: float | None) -> None:
        self._stopping.set()
        self.registration.registered.clear()
        if self._grpc_health is not None:
            await self._grpc_health.shutdown()
        # Registration first: its socket disappearing is what de-registers us.
        if self._reg_server is not None:
            await self._reg_server.stop(grace)
            self._reg_server = None
        self._remove_own(self.registration_socket)
        if self._dra_server is not None:
            await self._dra_server.stop(grace)
            self._dra_server = None
        self._remove_own(self.dra_socket)

    def _remove_own(self, path: Path) -> None:
        """gRPC normally unlinks its sockets on stop; make sure, but only if still ours."""
        ident = self._owned.pop(path, None)
        if ident is None:
            return
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if (st.st_dev, st.st_ino) == ident:
            path.unlink(missing_ok=True)
            log.debug("removed socket left behind by gRPC", extra={"path": str(path)})


async def _clear_stale_socket(path: Path) -> None:
    """Make ``path`` free for a new socket, or explain why it cannot be.

    A socket nobody listens on is a leftover of a previous run of this instance (e.g. a
    crash) and is removed. Anything else is refused with what to do about it.
    """
    if not _is_existing_socket(path):
        return
    if await _is_listening(path):
        raise SocketPathError(
            f"{path} is in use by another running process; a second plugin instance needs "
            "its own socket names (pass the pod UID), and only the owner may remove it"
        )
    log.info("removing stale socket", extra={"path": str(path)})
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _is_existing_socket(path: Path) -> bool:
    """True for an existing socket, False if nothing is there, else ``SocketPathError``.

    Metadata calls on a local directory: not worth a thread hop.
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISSOCK(mode):
        return True
    kind = (
        "directory"
        if stat.S_ISDIR(mode)
        else ("symlink" if stat.S_ISLNK(mode) else "non-socket file")
    )
    raise SocketPathError(
        f"{path} exists and is a {kind}, not a Unix socket; refusing to replace it. "
        "Remove it if it is a leftover, or point the plugin at another directory."
    )


async def _is_listening(path: Path) -> bool:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, str(path))
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            return False
        raise SocketPathError(f"cannot check whether {path} is in use: {exc}") from exc
    finally:
        sock.close()
    return True
