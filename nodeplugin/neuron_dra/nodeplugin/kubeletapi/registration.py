"""``pluginregistration.Registration`` servicer.

The kubelet dials the registration socket when it appears, asks ``GetInfo`` (1 s timeout),
connects to the endpoint we name, and reports the outcome with
``NotifyRegistrationStatus``. It may call ``GetInfo`` again later as a liveness check, so
the answer is precomputed and the handler never waits on anything.
"""

from __future__ import annotations

import logging
from typing import Any

from ._proto import (
    Message,
    plugin_info_message,
    registration_status,
    registration_status_response,
)
from .model import PluginInfo
from .state import RegistrationState

log = logging.getLogger(__name__)


class RegistrationServicer:
    def __init__(self, info: PluginInfo, state: RegistrationState) -> None:
        self._message = plugin_info_message(info)
        self._info = info
        self._state = state

    # Method names are fixed by the generated handler table.

    async def GetInfo(self, request: Message, context: Any) -> Message:
        self._state.info_requests += 1
        log.debug("GetInfo", extra={"driver": self._info.name, "endpoint": self._info.endpoint})
        return self._message

    async def NotifyRegistrationStatus(self, request: Message, context: Any) -> Message:
        registered, error = registration_status(request)
        self._state.record(registered, error)
        if registered:
            log.info(
                "registered with the kubelet",
                extra={"driver": self._info.name, "endpoint": self._info.endpoint},
            )
        else:
            log.error(
                "the kubelet rejected the plugin: %s",
                self._state.last_error,
                extra={
                    "driver": self._info.name,
                    "endpoint": self._info.endpoint,
                    "versions": list(self._info.supported_versions),
                },
            )
        # Always OK: the notification itself was received fine, and an error status would
        # only make the kubelet log a second, less useful error.
        return registration_status_response()
