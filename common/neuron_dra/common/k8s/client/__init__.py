"""A raw-dict Kubernetes client on top of ``kubernetes_asyncio``'s transport.

Why not the generated API classes:

- Caches hold thousands of ResourceSlices; deserializing them into generated models is several
  times slower than ``json.loads`` (1.25 s against 0.22 s for 1,000 slices). Every call here uses
  ``call_api(..., _preload_content=False)`` and returns plain JSON dicts.
- One code path serves every kind (core, ``resource.k8s.io/v1``, ``coordination.k8s.io/v1``, our
  CRDs), described by an :class:`ApiResource`.
- ``kubernetes_asyncio`` has no default timeout; every request here gets one from
  :class:`Timeouts` unless the caller passes its own.
- Patches always say which content type they are: the generated ``CustomObjectsApi`` silently
  sends JSON-patch for dict bodies, which the real API server rejects.

We still use ``kubernetes_asyncio`` for what it does well: kubeconfig / in-cluster loading
(TLS, exec plugins, token refresh) and the aiohttp session (with its 2 MiB read buffer).

The modules: :mod:`.resources` (kinds and patch types), :mod:`.config` (configuration and
:func:`connect`), :mod:`.transport` (timeouts and one request, :class:`KubeClient`),
:mod:`.watch` (reading a watch stream), :mod:`.resource_client` (the verbs of one kind). This
``__init__`` is the client's API: import from ``neuron_dra.common.k8s.client``.
"""

from .config import connect, in_cluster, load_configuration
from .resource_client import ListResult, ResourceClient
from .resources import (
    CONFIG_MAPS,
    CUSTOM_RESOURCE_DEFINITIONS,
    DEVICE_CLASSES,
    EVENTS,
    LEASES,
    NAMESPACES,
    NEURON_ULTRASERVER_WORKLOADS,
    NEURON_ULTRASERVERS,
    NODES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    ApiResource,
    PatchType,
    object_key,
    resource_version,
)
from .transport import (
    DEFAULT_TIMEOUTS,
    JSON,
    PROTOBUF,
    KubeClient,
    QueryParams,
    RawResponse,
    StatusDecoder,
    Timeouts,
    decode_json,
    go_json,
    media_type,
)
from .watch import MAX_LINE_BYTES, FrameDecoder, FramedWatchStream, WatchEvent, WatchStream

__all__ = [
    "CONFIG_MAPS",
    "CUSTOM_RESOURCE_DEFINITIONS",
    "DEFAULT_TIMEOUTS",
    "DEVICE_CLASSES",
    "EVENTS",
    "JSON",
    "LEASES",
    "MAX_LINE_BYTES",
    "NAMESPACES",
    "NEURON_ULTRASERVERS",
    "NEURON_ULTRASERVER_WORKLOADS",
    "NODES",
    "PODS",
    "PROTOBUF",
    "RESOURCE_CLAIMS",
    "RESOURCE_CLAIM_TEMPLATES",
    "RESOURCE_SLICES",
    "ApiResource",
    "FrameDecoder",
    "FramedWatchStream",
    "KubeClient",
    "ListResult",
    "PatchType",
    "QueryParams",
    "RawResponse",
    "ResourceClient",
    "StatusDecoder",
    "Timeouts",
    "WatchEvent",
    "WatchStream",
    "connect",
    "decode_json",
    "go_json",
    "in_cluster",
    "load_configuration",
    "media_type",
    "object_key",
    "resource_version",
]
