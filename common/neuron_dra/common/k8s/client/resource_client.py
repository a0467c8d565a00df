"""get/list/create/replace/patch/apply/delete/watch of one kind, in raw JSON dicts
(:class:`ResourceClient`), and the two metadata reads every cache keys objects by."""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import KubeError
from .resources import ApiResource, PatchType
from .watch import WatchStream

if TYPE_CHECKING:
    from .transport import KubeClient

JsonDict = dict[str, Any]


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
        path, query = self.list_request(
            namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            limit=limit,
            continue_token=continue_token,
            resource_version=resource_version,
        )
        result: JsonDict = await self.kube.request(
            "GET", path, query=query, request_timeout=request_timeout
        )
        return result

    def list_request(
        self,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        resource_version: str | None = None,
    ) -> tuple[str, builtins.list[tuple[str, str]]]:
        """The path and query of one LIST page (for a subclass that sends it itself)."""
        query = _selectors(label_selector, field_selector)
        if limit:
            query.append(("limit", str(limit)))
        if continue_token:
            query.append(("continue", continue_token))
        if resource_version is not None:
            query.append(("resourceVersion", resource_version))
        return self.resource.path(namespace if self.resource.namespaced else None), query

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
        path, query = self.watch_request(
            namespace,
            resource_version=resource_version,
            label_selector=label_selector,
            field_selector=field_selector,
            timeout_seconds=timeout_seconds,
            allow_bookmarks=allow_bookmarks,
        )
        return await self.kube.stream(
            path, query=query, server_timeout_seconds=float(timeout_seconds)
        )

    def watch_request(
        self,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
        allow_bookmarks: bool = True,
    ) -> tuple[str, builtins.list[tuple[str, str]]]:
        """The path and query of a watch (for a subclass that opens it itself)."""
        query = [("watch", "true")]
        query += _selectors(label_selector, field_selector)
        if resource_version:
            query.append(("resourceVersion", resource_version))
        if allow_bookmarks:
            query.append(("allowWatchBookmarks", "true"))
        query.append(("timeoutSeconds", str(int(timeout_seconds))))
        return self.resource.path(namespace if self.resource.namespaced else None), query
