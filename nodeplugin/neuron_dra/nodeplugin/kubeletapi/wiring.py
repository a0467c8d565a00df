"""The gRPC half of ``PluginServer``: its two ``grpc.aio`` servers with their servicers.

Kept out of ``server`` so that importing the package does not import ``grpc``, protobuf and
the generated code (0.15-0.25 s of a plugin start on our machines): the plugin publishes its
ResourceSlice before it serves the kubelet, and that import would only delay the publish.
``PluginServer.start`` imports this module; :func:`.server.load_grpc_stack` does it earlier
(from a worker thread, while the event loop keeps running).
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc.aio

from ._proto import DRA_CODECS, HEALTH_CODECS, GrpcHealth, add_registration_servicer
from .dra import DraServicer
from .health import HealthServicer
from .model import DriverBackend, HealthSource, PluginInfo
from .registration import RegistrationServicer
from .state import RegistrationState


def dra_server(
    backend: DriverBackend,
    *,
    budget: float,
    health_source: HealthSource | None,
    stopping: asyncio.Event,
    resend_interval: float,
) -> tuple[Any, GrpcHealth]:
    """The DRA server (v1 + v1beta1, grpc.health.v1, dra-health v1 + v1alpha1 if
    ``health_source``), not
    started, and its grpc.health.v1 servicer."""
    server = grpc.aio.server()
    for codec in DRA_CODECS:
        codec.add_servicer(DraServicer(codec, backend, budget=budget), server)
    grpc_health = GrpcHealth()
    grpc_health.add_to(server)
    if health_source is not None:
        # v1 and v1alpha1 on the same socket: whichever the kubelet opens gets the stream.
        for health in HEALTH_CODECS:
            health.add_servicer(
                HealthServicer(health, health_source, stopping, resend_interval=resend_interval),
                server,
            )
    return server, grpc_health


def serving_service_names() -> list[str]:
    """What grpc.health.v1 reports SERVING once the DRA server listens ("" is the server)."""
    return ["", *(codec.service_name for codec in DRA_CODECS)]


def registration_server(info: PluginInfo, state: RegistrationState) -> Any:
    """The registration server, not started."""
    server = grpc.aio.server()
    add_registration_servicer(RegistrationServicer(info, state), server)
    return server
