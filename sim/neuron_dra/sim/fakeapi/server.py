"""A fake kube-apiserver on aiohttp.

It speaks the real REST protocol over real HTTP, so the code under test uses the
real kubernetes_asyncio client (and kubectl), and it reproduces the semantics our
controllers depend on: resourceVersion concurrency, status subresources,
generation, finalizers, owner-reference garbage collection, selectors, paging,
watches with resume/bookmarks/410, CRD schemas, and injected faults.

``FakeAPIServer`` (here) owns the state and its lifecycle, and offers the in-process API
tests seed and inspect with; :mod:`.core` holds the object semantics (shared by HTTP and
in-process calls, so both take the same validation path); the HTTP side is
:mod:`.resource_handlers` (with :mod:`.lists` and :mod:`.watches`), :mod:`.discovery`
and :mod:`.control`.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import yaml
from aiohttp import web
from kubernetes_asyncio import client as k8s_client

from .. import waiting
from . import patch_verb
from .builtin_types import builtin_types
from .collector import run_owner_checks
from .control import serve_control
from .core import ApiCore
from .discovery import VERSION_INFO, openapi_document, openapi_v3_root
from .faults import FaultInjector
from .registry import Registry
from .rejections import not_found_path
from .resource_handlers import serve_resource
from .resource_types import ResourceType
from .responses import entry_raw, error_response, json_response, obj_bytes
from .selectors import combine, field_matcher, label_matcher
from .store import JSON, ApiError, Store, encode

JSONList = list[JSON]
T = TypeVar("T")
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease",
                      "neuron-dra-driver")


def _default_crd_paths() -> list[Path]:
    here = Path(__file__).resolve()
    for base in here.parents:
        d = base / "charts" / "neuron-dra-driver" / "crds"
        if d.is_dir():
            return sorted(d.glob("*.yaml"))
    return []


class FakeAPIServer:
    """The fake kube-apiserver: ``async with FakeAPIServer() as api: ... api.url ...``."""

    def __init__(
        self,
        *,
        crd_paths: Sequence[Path] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        history_size: int = 50_000,
        bookmark_interval: float = 1.0,
        clock: Callable[[], datetime] | None = None,
        watch_queue_size: int = 20_000,
        device_taints: bool = False,
    ) -> None:
        self.host = host
        self._port = port
        self.bookmark_interval = bookmark_interval
        # How long a list at a resourceVersion the store has not reached waits before the
        # 504 "Too large resource version" (the watch cache's 3 s).
        self.too_large_rv_wait = 3.0
        self.clock: Callable[[], datetime] = clock or (lambda: datetime.now(UTC))
        self.store = Store(history_size=history_size, watch_queue_size=watch_queue_size)
        self.registry = Registry(builtin_types())
        self.core = ApiCore(self.store, self.registry, self.clock, device_taints=device_taints)
        self.faults = FaultInjector(on_drop_watches=self._drop_watches,
                                    on_compact=self.store.compact)
        # (verb, resource[/subresource]) → count: lets tests assert e.g. "no relist happened".
        self.request_counts: Counter[tuple[str, str]] = Counter()
        self._runner: web.AppRunner | None = None
        for ns in DEFAULT_NAMESPACES:
            self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for path in _default_crd_paths() if crd_paths is None else crd_paths:
            self.load_manifests(Path(path))

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        # handler_cancellation: a watch whose client went away must end and unregister.
        runner = web.AppRunner(app, access_log=None, handle_signals=False,
                               shutdown_timeout=2.0, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self._port)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        self._port = sockets[0].getsockname()[1]
        self._runner = runner
        # Objects seeded in-process before the loop ran get the GC's owner check now.
        asyncio.get_running_loop().call_soon(run_owner_checks, self.core)

    async def stop(self) -> None:
        if self._runner is None:
            return
        self.store.close_watchers("shutdown")
        runner, self._runner = self._runner, None
        await runner.cleanup()

    async def __aenter__(self) -> FakeAPIServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self._port}"

    def client_configuration(self) -> k8s_client.Configuration:
        cfg = k8s_client.Configuration(host=self.url)
        return cfg

    def kubeconfig(self) -> JSON:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                      "namespace": "default"}}],
            "current-context": "fake",
            "preferences": {},
        }

    def write_kubeconfig(self, path: Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.kubeconfig(), sort_keys=False))

    async def wait_until(
        self, predicate: Callable[[], T | None], what: str, limit: float = 30.0
    ) -> T:
        """Return ``predicate()`` once it is truthy, re-evaluating it after every write the
        server commits (no polling); ``TimeoutError`` naming ``what`` after ``limit`` s.

        For conditions that only the API server's state decides (a pod Running, a status
        field set, a slice tagged)."""
        return await waiting.wait_until(predicate, what, limit, [self.store.listeners])

    def _drop_watches(self) -> int:
        return self.store.close_watchers("dropped")

    # ------------------------------------------------------------------ in-process API
    def resource_type(self, api_version: str, kind_or_plural: str) -> ResourceType:
        """Resolve a kind, plural, singular or short name within ``api_version``."""
        rt = self.registry.by_kind(api_version, kind_or_plural)
        if rt is None:
            group, _, version = api_version.rpartition("/")
            rt = self.registry.lookup(group, version, kind_or_plural) or next(
                (t for t in self.registry.types()
                 if t.group == group and t.version == version
                 and kind_or_plural in (t.singular, *t.short_names)), None)
        if rt is None:
            raise KeyError(f"no resource {kind_or_plural} in {api_version}")
        return rt

    def create(self, obj: JSON) -> JSON:
        """Create like a POST would (same validation); returns a copy of the stored object."""
        body = json.loads(encode(obj))
        rt = self.resource_type(body.get("apiVersion", ""), body.get("kind", ""))
        ns = body.get("metadata", {}).get("namespace") if rt.namespaced else None
        created, _ = self.core.create(rt, ns, body)
        return _copy(obj_bytes(self.store, rt, created))

    def seed(self, objs: Iterable[JSON]) -> int:
        """Bulk create for benchmark/test setup; same validation as ``create`` but the server
        takes ownership of the dicts (no copies in or out) and encodes each object right
        away so the first list is as fast as later ones. Returns how many were created."""
        n = 0
        for obj in objs:
            rt = self.resource_type(obj.get("apiVersion", ""), obj.get("kind", ""))
            ns = obj.get("metadata", {}).get("namespace") if rt.namespaced else None
            created, _ = self.core.create(rt, ns, obj)
            obj_bytes(self.store, rt, created)
            n += 1
        return n

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None
            ) -> JSON | None:
        rt = self.resource_type(api_version, kind)
        obj = self.store.get(rt.store_key, namespace or "" if rt.namespaced else "", name)
        return None if obj is None else _copy(obj_bytes(self.store, rt, obj))

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> JSONList:
        rt = self.resource_type(api_version, kind)
        match = combine(label_matcher(label_selector),
                        field_matcher(field_selector, rt.allowed_fields()))
        snap = self.store.page(rt.store_key, namespace if rt.namespaced else None, match)
        return [_copy(entry_raw(rt, e)) for e in snap.items]

    def update(self, obj: JSON, *, subresource: str = "") -> JSON:
        body = json.loads(encode(obj))
        rt = self.resource_type(body.get("apiVersion", ""), body.get("kind", ""))
        meta = body.get("metadata", {})
        ns = meta.get("namespace", "") if rt.namespaced else ""
        if not meta.get("resourceVersion"):
            # In-process setup writes are unconditional, even for kinds whose PUT is not.
            current = self.store.get(rt.store_key, ns, meta["name"])
            if current is not None:
                meta["resourceVersion"] = current["metadata"]["resourceVersion"]
        updated, _ = self.core.update(rt, ns, meta["name"], body, subresource=subresource)
        return _copy(obj_bytes(self.store, rt, updated))

    def update_status(self, obj: JSON) -> JSON:
        return self.update(obj, subresource="status")

    def patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        body: Any,
        namespace: str | None = None,
        *,
        content_type: str = patch_verb.MERGE,
        subresource: str = "",
    ) -> JSON:
        rt = self.resource_type(api_version, kind)
        obj, _, _ = patch_verb.patch(self.core, rt, namespace or "" if rt.namespaced else "",
                                     name, content_type, encode(body), subresource=subresource)
        return _copy(obj_bytes(self.store, rt, obj))

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None,
               *, propagation_policy: str | None = None,
               grace_period_seconds: int | None = None, uid: str | None = None) -> JSON:
        """DELETE like the HTTP verb (a bound pod is only marked, see :mod:`.deletion`);
        returns the object as deleted or marked."""
        rt = self.resource_type(api_version, kind)
        opts: JSON = {}
        if propagation_policy:
            opts["propagationPolicy"] = propagation_policy
        if grace_period_seconds is not None:
            opts["gracePeriodSeconds"] = grace_period_seconds
        if uid:
            opts["preconditions"] = {"uid": uid}
        obj, _ = self.core.delete(rt, namespace or "" if rt.namespaced else "", name, opts)
        return _copy(obj_bytes(self.store, rt, obj))

    def load_manifests(self, path: Path) -> JSONList:
        """Create every object in a (multi-document) YAML file."""
        out: JSONList = []
        with Path(path).open() as f:
            for doc in yaml.safe_load_all(f):
                if isinstance(doc, dict) and doc:
                    out.append(self.create(doc))
        return out

    # ------------------------------------------------------------------ HTTP
    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        """The one route: health, version, OpenAPI and /fake/ here, resources elsewhere."""
        path = request.path
        try:
            if path.startswith("/fake/"):
                return await serve_control(self, request)
            if path.rstrip("/") in ("/healthz", "/readyz", "/livez") or path.startswith(
                ("/healthz/", "/readyz/", "/livez/")
            ):
                return web.Response(text="ok")
            if path == "/version":
                return json_response(VERSION_INFO)
            if path.rstrip("/") == "/openapi/v3":
                return json_response(openapi_v3_root(self.registry))
            if path.startswith("/openapi/v3/"):
                doc = openapi_document(self.registry, path[len("/openapi/v3/"):])
                if doc is None:
                    raise not_found_path()
                return json_response(doc)
            return await serve_resource(self, request)
        except ApiError as exc:
            return error_response(exc)


def _copy(raw: bytes) -> JSON:
    """A private copy for in-process callers, decoded from the cached encoding."""
    out: JSON = json.loads(raw)
    return out
