"""Client configuration and connecting: kubeconfig or in-cluster service account, and one
aiohttp session that does not consult the environment on every request.

``kubernetes_asyncio`` does what it does well here: kubeconfig / in-cluster loading (TLS, exec
plugins, token refresh) and the aiohttp session (with its 2 MiB read buffer).
"""

from __future__ import annotations

import asyncio
import os

import aiohttp
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config
from yarl import URL

from ..errors import PermanentError
from .transport import DEFAULT_TIMEOUTS, KubeClient, Timeouts


def in_cluster() -> bool:
    """True when running in a pod with a service account (the env the kubelet injects)."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and bool(
        os.environ.get("KUBERNETES_SERVICE_PORT")
    )


async def load_configuration(
    kubeconfig: str | os.PathLike[str] | None = None,
    *,
    context: str | None = None,
) -> k8s_client.Configuration:
    """A fresh ``Configuration`` (never the library's global default).

    Order: an explicit kubeconfig path; else in-cluster service account when running in a pod;
    else ``$KUBECONFIG`` / ``~/.kube/config``.
    """
    cfg = k8s_client.Configuration()
    try:
        if kubeconfig is None and in_cluster():
            # Sync, and installs a hook that re-reads the rotating service-account token.
            k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            path = os.fspath(kubeconfig) if kubeconfig is not None else None
            if path is None:
                path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
            await k8s_config.load_kube_config(
                config_file=path,
                context=context,
                client_configuration=cfg,
                persist_config=False,
            )
    except k8s_config.ConfigException as exc:
        raise PermanentError(f"cannot load Kubernetes client configuration: {exc}") from exc
    return cfg


async def connect(
    kubeconfig: str | os.PathLike[str] | None = None,
    *,
    context: str | None = None,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
) -> KubeClient:
    """A :class:`KubeClient` that owns its session. Use as ``async with await connect(...)``.

    Must be called inside the running event loop that will use it (aiohttp sessions are bound
    to their loop).
    """
    cfg = await load_configuration(kubeconfig, context=context)
    api = k8s_client.ApiClient(configuration=cfg)
    if not await asyncio.to_thread(_environment_proxy_applies, cfg):
        _without_per_request_env_lookups(api)
    return KubeClient(api, timeouts=timeouts, owned=True)


def _environment_proxy_applies(cfg: k8s_client.Configuration) -> bool:
    """Whether requests to the API server go through a proxy that aiohttp would take from
    the environment (``HTTPS_PROXY``/``NO_PROXY``, ...; may read ``~/.netrc``, so a thread)."""
    if cfg.proxy:
        return True  # configured explicitly: leave the session as the library made it
    try:
        aiohttp.helpers.get_env_proxy_for_url(URL(cfg.host or ""))
    except LookupError:
        return False
    return True


def _without_per_request_env_lookups(api: k8s_client.ApiClient) -> None:
    """Give the ``ApiClient`` a session with ``trust_env=False`` on the same connector.

    ``kubernetes_asyncio`` creates its aiohttp session with ``trust_env=True``, so aiohttp
    reads ``~/.netrc`` and the proxy variables in a worker thread on *every* request: two
    thread hops that cost a GET 1-2 ms on a busy node (issue #3). Like client-go, which reads
    the proxy environment once per process and never reads netrc, we decide once (in
    :func:`connect`): only when no proxy from the environment applies to the API server.
    """
    rest = api.rest_client
    old: aiohttp.ClientSession = rest.pool_manager
    connector = old.connector
    old.detach()  # keeps the connector (and its TLS context) open for the new session
    rest.pool_manager = aiohttp.ClientSession(
        connector=connector,
        trust_env=False,
        # As kubernetes_asyncio sets it: watch events can be large.
        read_bufsize=2**21,
    )
