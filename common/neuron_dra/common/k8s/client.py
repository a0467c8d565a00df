"""A raw-dict Kubernetes client on top of ``kubernetes_asyncio``'s transport.

Why not the generated API classes:

- Caches hold thousands of ResourceSlices; deserializing them into generated models is several
  times slower than ``json.loads`` (reference/python-eco.md §2). Every call here uses
  ``call_api(..., _preload_content=False)`` and returns plain JSON dicts.
- One code path serves every kind (core, ``resource.k8s.io/v1``, ``coordination.k8s.io/v1``, our
  CRDs), described by an :class:`ApiResource`.
- ``kubernetes_asyncio`` has no default timeout; every request here gets one from
  :class:`Timeouts` unless the caller passes its own.
- Patches always say which content type they are: the generated ``CustomObjectsApi`` silently
  sends JSON-patch for dict bodies, which the real API server rejects.

We still use ``kubernetes_asyncio`` for what it does well: kubeconfig / in-cluster loading
(TLS, exec plugins, token refresh) and the aiohttp session (with its 2 MiB read buffer).
"""

from __future__ import annotations

import asyncio
import builtins
import json
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple, Self
from urllib.parse import quote

import aiohttp
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config
from neuron_dra.common import constants
from yarl import URL

from .errors import KubeError, NetworkError, PermanentError, classify, from_response, from_status

JsonDict = dict[str, Any]

#: Largest watch-event line we accept. A ResourceSlice with 128 devices is ~60 KB; objects are
#: bounded by etcd's 1.5 MiB request limit, so 16 MiB leaves room without being unbounded.
MAX_LINE_BYTES = 16 * 1024 * 1024


# --- resources ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApiResource:
    """Where a kind lives in the REST API. ``group`` is ``""`` for the core group."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def _prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def path(
        self,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> str:
        """The URL path. ``namespace=None`` on a namespaced kind means all namespaces (lists)."""
        if not self.namespaced and namespace:
            raise ValueError(f"{self.kind} is cluster-scoped; got namespace {namespace!r}")
        if self.namespaced and name is not None and not namespace:
            raise ValueError(f"{self.kind} is namespaced; a namespace is required for {name!r}")
        parts = [self._prefix()]
        if namespace:
            parts.append(f"namespaces/{quote(namespace, safe='')}")
        parts.append(self.plural)
        if name is not None:
            if not name:
                raise ValueError("empty object name")
            parts.append(quote(name, safe=""))
            if subresource:
                parts.append(subresource)
        elif subresource:
            raise ValueError("a subresource needs an object name")
        return "/".join(parts)

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


NAMESPACES = ApiResource("", "v1", "namespaces", "Namespace", namespaced=False)
NODES = ApiResource("", "v1", "nodes", "Node", namespaced=False)
PODS = ApiResource("", "v1", "pods", "Pod", namespaced=True)
CONFIG_MAPS = ApiResource("", "v1", "configmaps", "ConfigMap", namespaced=True)
EVENTS = ApiResource("events.k8s.io", "v1", "events", "Event", namespaced=True)
LEASES = ApiResource("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
RESOURCE_SLICES = ApiResource(
    "resource.k8s.io", "v1", "resourceslices", "ResourceSlice", namespaced=False
)
RESOURCE_CLAIMS = ApiResource(
    "resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", namespaced=True
)
RESOURCE_CLAIM_TEMPLATES = ApiResource(
    "resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", namespaced=True
)
DEVICE_CLASSES = ApiResource("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False)
CUSTOM_RESOURCE_DEFINITIONS = ApiResource(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False
)
NEURON_ULTRASERVERS = ApiResource(
    constants.CRD_GROUP,
    constants.CRD_VERSION,
    constants.PLURAL_ULTRASERVER,
    constants.KIND_ULTRASERVER,
    namespaced=True,
)
NEURON_ULTRASERVER_WORKLOADS = ApiResource(
    constants.CRD_GROUP,
    constants.CRD_VERSION,
    constants.PLURAL_WORKLOAD,
    constants.KIND_WORKLOAD,
    namespaced=True,
)


class PatchType(StrEnum):
    """PATCH content types. There is deliberately no default: pick one."""

    #: RFC 7386. Works for every kind, including CRDs. Lists are replaced wholesale.
    MERGE = "application/merge-patch+json"
    #: Built-in kinds only; the API server rejects it for custom resources.
    STRATEGIC = "application/strategic-merge-patch+json"
    #: RFC 6902 operations list.
    JSON = "application/json-patch+json"
    #: Server-side apply; needs a field manager.
    APPLY = "application/apply-patch+yaml"


# --- timeouts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timeouts:
    """Client-side timeouts. aiohttp's default is *no* timeout at all, so we always set one.

    ``request`` bounds a whole unary call including reading the body. Watches have no total
    bound (they are long-lived by design); instead the socket read timeout is the server-side
    ``timeoutSeconds`` plus ``watch_margin``, so a server that never closes the stream as
    promised is still noticed.
    """

    connect: float = 5.0
    request: float = 30.0
    watch_margin: float = 30.0

    def __post_init__(self) -> None:
        if min(self.connect, self.request, self.watch_margin) <= 0:
            raise ValueError("timeouts must be positive")

    def unary(self, override: float | None = None) -> aiohttp.ClientTimeout:
        total = self.request if override is None else override
        return aiohttp.ClientTimeout(
            total=total, connect=self.connect, sock_connect=self.connect, sock_read=total
        )

    def watch(self, server_timeout_seconds: float) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(
            total=None,
            connect=self.connect,
            sock_connect=self.connect,
            sock_read=server_timeout_seconds + self.watch_margin,
        )


DEFAULT_TIMEOUTS = Timeouts()


# --- configuration --------------------------------------------------------------------------


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


# --- transport ------------------------------------------------------------------------------


class WatchEvent(NamedTuple):
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    object: JsonDict


class WatchStream:
    """Newline-delimited watch events from one HTTP response.

    Iterating yields :class:`WatchEvent`; an in-stream ``ERROR`` event is raised as its typed
    error (a :class:`~.errors.GoneError` for 410 Expired), and the end of the stream ends the
    iteration. Always close it (``async with``) so the connection is not leaked.
    """

    def __init__(self, response: aiohttp.ClientResponse, max_line_bytes: int) -> None:
        self._response = response
        self._max_line = max_line_bytes
        self._closed = False

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Drop the connection. Safe to call from another task to abort a blocked read."""
        if not self._closed:
            self._closed = True
            # close(), not release(): release() would try to reuse a half-read connection.
            self._response.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self

    async def __anext__(self) -> WatchEvent:
        while True:
            if self._closed:
                raise StopAsyncIteration
            try:
                line = await self._response.content.readuntil(b"\n", max_size=self._max_line)
            except aiohttp.ClientConnectionError as exc:
                if self._closed:
                    raise StopAsyncIteration from None
                raise NetworkError(f"watch stream broken: {exc}", reason="StreamError") from exc
            except (aiohttp.ClientPayloadError, TimeoutError) as exc:
                raise classify(exc) or NetworkError(str(exc)) from exc
            except ValueError as exc:  # LineTooLong
                raise NetworkError(f"watch event too large: {exc}", reason="LineTooLong") from exc
            if not line:
                self.close()
                raise StopAsyncIteration
            line = line.strip()
            if not line:
                continue
            try:
                event = json.loads(line)
                ev_type = str(event["type"])
                obj = event["object"]
            except (ValueError, KeyError, TypeError) as exc:
                raise NetworkError(
                    f"malformed watch event: {line[:200]!r}", reason="MalformedEvent"
                ) from exc
            if not isinstance(obj, dict):
                raise NetworkError(f"malformed watch event object: {line[:200]!r}")
            if ev_type == "ERROR":
                raise from_status(obj)
            return WatchEvent(ev_type, obj)


QueryParams = Sequence[tuple[str, str]]


@dataclass
class KubeClient:
    """Raw JSON requests through a ``kubernetes_asyncio`` ``ApiClient``.

    ``owned=True`` means closing this closes the ``ApiClient`` (and its aiohttp session).
    """

    api_client: k8s_client.ApiClient
    timeouts: Timeouts = DEFAULT_TIMEOUTS
    owned: bool = False
    max_line_bytes: int = MAX_LINE_BYTES
    _resources: dict[ApiResource, ResourceClient] = field(default_factory=dict, repr=False)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self.owned:
            await self.api_client.close()

    def resource(self, res: ApiResource) -> ResourceClient:
        """The raw-dict client for one kind (cached, cheap to call repeatedly)."""
        rc = self._resources.get(res)
        if rc is None:
            rc = self._resources[res] = ResourceClient(self, res)
        return rc

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: QueryParams | None,
        body: Any,
        content_type: str | None,
        client_timeout: aiohttp.ClientTimeout,
    ) -> aiohttp.ClientResponse:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        try:
            resp: aiohttp.ClientResponse = await self.api_client.call_api(
                path,
                method,
                query_params=list(query or []),
                header_params=headers,
                body=body,
                # Adds the bearer token (and runs the in-cluster token refresh hook) when set.
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=client_timeout,
            )
        except Exception as exc:
            err = classify(exc)
            if err is None:
                raise
            raise err from exc
        if resp.status >= 300:
            try:
                raw = await resp.read()
            except (aiohttp.ClientError, TimeoutError):
                raw = b""
            finally:
                resp.release()
            raise from_response(resp.status, raw, resp.headers, default_reason=resp.reason or "")
        return resp

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: QueryParams | None = None,
        body: Any = None,
        content_type: str | None = None,
        request_timeout: float | None = None,
    ) -> Any:
        """One unary call; returns the decoded JSON body (None for an empty body)."""
        resp = await self._send(
            method,
            path,
            query=query,
            body=body,
            content_type=content_type,
            client_timeout=self.timeouts.unary(request_timeout),
        )
        try:
            raw = await resp.read()
        except Exception as exc:
            err = classify(exc)
            if err is None:
                raise
            raise err from exc
        finally:
            resp.release()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise NetworkError(f"{method} {path}: response is not JSON: {raw[:200]!r}") from exc

    async def stream(
        self, path: str, *, query: QueryParams, server_timeout_seconds: float
    ) -> WatchStream:
        """Open a streaming GET (a watch). The caller closes the returned stream."""
        resp = await self._send(
            "GET",
            path,
            query=query,
            body=None,
            content_type=None,
            client_timeout=self.timeouts.watch(server_timeout_seconds),
        )
        return WatchStream(resp, self.max_line_bytes)


# --- per-resource helpers -------------------------------------------------------------------


class ListResult(NamedTuple):
    items: builtins.list[JsonDict]
    resource_version: str


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise ValueError("object has no metadata")
    return meta


def _selectors(label_selector: str | None, field_selector: str | None) -> list[tuple[str, str]]:
    q: list[tuple[str, str]] = []
    if label_selector:
        q.append(("labelSelector", label_selector))
    if field_selector:
        q.append(("fieldSelector", field_selector))
    return q


class ResourceClient:
    """get/list/create/replace/patch/apply/delete/watch for one :class:`ApiResource`.

    Everything takes and returns raw JSON dicts. Errors are the typed errors of
    :mod:`.errors`. ``request_timeout`` (seconds) overrides the default per-call timeout.
    """

    def __init__(self, kube: KubeClient, resource: ApiResource) -> None:
        self.kube = kube
        self.resource = resource

    def __repr__(self) -> str:
        return f"ResourceClient({self.resource})"

    def _ns(self, namespace: str | None, obj: Mapping[str, Any] | None = None) -> str | None:
        if not self.resource.namespaced:
            return None
        if namespace:
            return namespace
        if obj is not None:
            ns = _meta(obj).get("namespace")
            if ns:
                return str(ns)
        raise ValueError(f"{self.resource.kind} is namespaced; no namespace given")

    async def get(
        self,
        name: str,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        request_timeout: float | None = None,
    ) -> JsonDict:
        path = self.resource.path(self._ns(namespace), name, subresource)
        result: JsonDict = await self.kube.request("GET", path, request_timeout=request_timeout)
        return result

    async def list(
        self,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        resource_version: str | None = None,
        request_timeout: float | None = None,
    ) -> JsonDict:
        """One page: the raw ``…List`` object (``items``, ``metadata.continue``, ``…Version``).

        ``namespace=None`` lists across all namespaces.
        """
        query = _selectors(label_selector, field_selector)
        if limit:
            query.append(("limit", str(limit)))
        if continue_token:
            query.append(("continue", continue_token))
        if resource_version is not None:
            query.append(("resourceVersion", resource_version))
        path = self.resource.path(namespace if self.resource.namespaced else None)
        result: JsonDict = await self.kube.request(
            "GET", path, query=query, request_timeout=request_timeout
        )
        return result

    async def list_all(
        self,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int | None = 500,
        request_timeout: float | None = None,
    ) -> ListResult:
        """All items, paging with ``limit``/``continue``; returns the snapshot's resourceVersion.

        If a continue token expires mid-way (410), the pages already read belong to a snapshot
        we can no longer finish, so we start again with one unpaged list, which is always
        consistent (this is what client-go's pager does too).
        """
        items: builtins.list[JsonDict] = []
        token: str | None = None
        limit = page_size
        while True:
            try:
                page = await self.list(
                    namespace,
                    label_selector=label_selector,
                    field_selector=field_selector,
                    limit=limit,
                    continue_token=token,
                    request_timeout=request_timeout,
                )
            except KubeError as exc:
                if exc.status == 410 and token:
                    items, token, limit = [], None, None
                    continue
                raise
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            token = meta.get("continue") or None
            if not token:
                return ListResult(items, str(meta.get("resourceVersion") or ""))

    async def create(
        self,
        obj: JsonDict,
        namespace: str | None = None,
        *,
        field_manager: str | None = None,
        request_timeout: float | None = None,
    ) -> JsonDict:
        query = [("fieldManager", field_manager)] if field_manager else []
        path = self.resource.path(self._ns(namespace, obj))
        result: JsonDict = await self.kube.request(
            "POST",
            path,
            query=query,
            body=obj,
            content_type="application/json",
            request_timeout=request_timeout,
        )
        return result

    async def replace(
        self,
        obj: JsonDict,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
        request_timeout: float | None = None,
    ) -> JsonDict:
        """PUT. Include ``metadata.resourceVersion`` to make it conditional (409 if stale)."""
        meta = _meta(obj)
        path = self.resource.path(self._ns(None, obj), str(meta.get("name") or ""), subresource)
        query = [("fieldManager", field_manager)] if field_manager else []
        result: JsonDict = await self.kube.request(
            "PUT",
            path,
            query=query,
            body=obj,
            content_type="application/json",
            request_timeout=request_timeout,
        )
        return result

    async def patch(
        self,
        name: str,
        body: JsonDict | builtins.list[JsonDict],
        *,
        patch_type: PatchType,
        namespace: str | None = None,
        subresource: str | None = None,
        field_manager: str | None = None,
        force: bool | None = None,
        request_timeout: float | None = None,
    ) -> JsonDict:
        patch_type = PatchType(patch_type)
        if patch_type is PatchType.JSON and not isinstance(body, list):
            raise TypeError("a JSON patch is a list of operations")
        if patch_type is not PatchType.JSON and not isinstance(body, dict):
            raise TypeError(f"a {patch_type.name} patch body is an object")
        if patch_type is PatchType.APPLY and not field_manager:
            raise ValueError("server-side apply needs a field manager")
        if force is not None and patch_type is not PatchType.APPLY:
            raise ValueError("force only applies to server-side apply")
        query: builtins.list[tuple[str, str]] = []
        if field_manager:
            query.append(("fieldManager", field_manager))
        if force:
            query.append(("force", "true"))
        path = self.resource.path(self._ns(namespace), name, subresource)
        result: JsonDict = await self.kube.request(
            "PATCH",
            path,
            query=query,
            body=body,
            content_type=patch_type.value,
            request_timeout=request_timeout,
        )
        return result

    async def merge_patch(
        self,
        name: str,
        body: JsonDict,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        request_timeout: float | None = None,
    ) -> JsonDict:
        return await self.patch(
            name,
            body,
            patch_type=PatchType.MERGE,
            namespace=namespace,
            subresource=subresource,
            request_timeout=request_timeout,
        )

    async def apply(
        self,
        obj: JsonDict,
        *,
        field_manager: str,
        force: bool = False,
        subresource: str | None = None,
        request_timeout: float | None = None,
    ) -> JsonDict:
        """Server-side apply of ``obj`` (which must carry apiVersion, kind and metadata.name)."""
        body = dict(obj)
        body.setdefault("apiVersion", self.resource.api_version)
        body.setdefault("kind", self.resource.kind)
        meta = _meta(body)
        return await self.patch(
            str(meta.get("name") or ""),
            body,
            patch_type=PatchType.APPLY,
            namespace=self._ns(None, body),
            subresource=subresource,
            field_manager=field_manager,
            force=force,
            request_timeout=request_timeout,
        )

    async def delete(
        self,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation_policy: str | None = None,
        grace_period_seconds: int | None = None,
        request_timeout: float | None = None,
    ) -> JsonDict | None:
        """DELETE with optional preconditions. Returns the server's answer: a ``Status``, or the
        object itself when finalizers keep it around (with ``deletionTimestamp`` set)."""
        options: JsonDict = {"kind": "DeleteOptions", "apiVersion": "v1"}
        preconditions: JsonDict = {}
        if uid:
            preconditions["uid"] = uid
        if resource_version:
            preconditions["resourceVersion"] = resource_version
        if preconditions:
            options["preconditions"] = preconditions
        if propagation_policy:
            options["propagationPolicy"] = propagation_policy
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        path = self.resource.path(self._ns(namespace), name)
        result: JsonDict | None = await self.kube.request(
            "DELETE",
            path,
            body=options,
            content_type="application/json",
            request_timeout=request_timeout,
        )
        return result

    async def watch(
        self,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
        allow_bookmarks: bool = True,
    ) -> WatchStream:
        """Open a watch. ``timeout_seconds`` asks the server to end the stream; the client read
        timeout is derived from it. Close the returned stream when done."""
        query = [("watch", "true")]
        query += _selectors(label_selector, field_selector)
        if resource_version:
            query.append(("resourceVersion", resource_version))
        if allow_bookmarks:
            query.append(("allowWatchBookmarks", "true"))
        query.append(("timeoutSeconds", str(int(timeout_seconds))))
        path = self.resource.path(namespace if self.resource.namespaced else None)
        return await self.kube.stream(
            path, query=query, server_timeout_seconds=float(timeout_seconds)
        )


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` (or ``name`` for cluster-scoped objects), as client-go keys them."""
    meta = _meta(obj)
    ns = meta.get("namespace")
    name = str(meta.get("name") or "")
    return f"{ns}/{name}" if ns else name


def resource_version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")
