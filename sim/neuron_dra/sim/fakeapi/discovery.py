"""The documents clients read before anything else: /version, discovery (/api, /apis,
group and resource lists) and the /openapi/v3 index and per-group-version documents,
all made from the registry (kubectl refuses to work without them)."""

from __future__ import annotations

import hashlib
import json

from .registry import Registry
from .store import JSON

VERSION_INFO = {
    "major": "1",
    "minor": "34",
    "emulationMajor": "1",
    "emulationMinor": "34",
    "gitVersion": "v1.34.2",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-11-11T00:00:00Z",
    "goVersion": "go1.24.9",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def discovery_document(registry: Registry, segs: list[str], server_address: str
                       ) -> JSON | None:
    """The answer to GET /api, /apis, /apis/GROUP, /api/VERSION or /apis/GROUP/VERSION
    (``segs`` are the path's segments); None for a group or version not served."""
    if segs == ["api"]:
        return core_versions(server_address)
    if segs == ["apis"]:
        return group_list(registry)
    if segs[0] == "apis" and len(segs) == 2:
        return group(registry, segs[1])
    group_name, version = ("", segs[1]) if segs[0] == "api" else (segs[1], segs[2])
    return resource_list(registry, group_name, version)


def openapi_document(registry: Registry, gv: str) -> JSON | None:
    """GET /openapi/v3/<gv> (``api/v1``, ``apis/GROUP/VERSION``); None when not served."""
    segs = gv.strip("/").split("/")
    if len(segs) == 2 and segs[0] == "api":
        return openapi_v3_gv(registry, "", segs[1])
    if len(segs) == 3 and segs[0] == "apis":
        return openapi_v3_gv(registry, segs[1], segs[2])
    return None


def core_versions(server_address: str) -> JSON:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def _group_doc(name: str, group_versions: list[str]) -> JSON:
    versions = [{"groupVersion": f"{name}/{v}", "version": v} for v in group_versions]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": name,
        "versions": versions,
        "preferredVersion": versions[0],
    }


def group_list(registry: Registry) -> JSON:
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group_doc(name, versions) for name, versions in registry.groups() if name],
    }


def group(registry: Registry, name: str) -> JSON | None:
    versions = registry.group_versions(name)
    return _group_doc(name, versions) if versions and name else None


def resource_list(registry: Registry, group: str, version: str) -> JSON | None:
    if not registry.group_known(group, version):
        return None
    resources: list[JSON] = []
    for rt in registry.served(group, version):
        entry: JSON = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": list(rt.verbs),
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        resources.append(entry)
        if "status" in rt.subresources:
            resources.append(
                {
                    "name": f"{rt.plural}/status",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        if "binding" in rt.subresources:
            resources.append(
                {
                    "name": f"{rt.plural}/binding",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "kind": "Binding",
                    "verbs": ["create"],
                }
            )
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
            "resources": resources}


# -- OpenAPI v3 (just enough for kubectl)
def openapi_v3_root(registry: Registry) -> JSON:
    """The /openapi/v3 index. kubectl reads it to learn that the server validates fields
    itself (``fieldValidation``); without it kubectl refuses to apply with validation on."""
    paths: JSON = {}
    for name, versions in registry.groups():
        for v in versions:
            gv = f"api/{v}" if not name else f"apis/{name}/{v}"
            doc = openapi_v3_gv(registry, name, v)
            digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
            paths[gv] = {"serverRelativeURL": f"/openapi/v3/{gv}?hash={digest[:32].upper()}"}
    return {"paths": paths}


def openapi_v3_gv(registry: Registry, group: str, version: str) -> JSON | None:
    """A per-group-version OpenAPI document: PATCH operations (with their query
    parameters and media types) per kind, and the CRD schemas as components."""
    if not registry.group_known(group, version):
        return None
    prefix = f"/api/{version}" if not group else f"/apis/{group}/{version}"
    params = [
        {"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
        for n in ("dryRun", "fieldManager", "fieldValidation", "force")
    ]
    paths: JSON = {}
    schemas: JSON = {}
    for rt in registry.served(group, version):
        g, v = rt.group, rt.version
        gvk = {"group": g, "version": v, "kind": rt.kind}
        ref_name = ".".join(reversed(g.split("."))) + f".{v}.{rt.kind}" if g else (
            f"io.k8s.api.core.{v}.{rt.kind}")
        schema: JSON = {"type": "object", "x-kubernetes-group-version-kind": [gvk]}
        if rt.crd is not None and rt.raw_schema is not None:
            schema = {**rt.raw_schema, "x-kubernetes-group-version-kind": [gvk]}
        schemas[ref_name] = schema
        body = {"schema": {"type": "object"}}
        ns = "/namespaces/{namespace}" if rt.namespaced else ""
        paths[f"{prefix}{ns}/{rt.plural}/{{name}}"] = {
            "patch": {
                "operationId": f"patch{rt.kind}",
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": gvk,
                "parameters": params,
                # No strategic-merge entry: kubectl then computes strategic patches for
                # built-ins from its compiled-in types, which is what we approximate.
                "requestBody": {"content": {
                    "application/json-patch+json": body,
                    "application/merge-patch+json": body,
                    "application/apply-patch+yaml": body,
                }},
                "responses": {"200": {"description": "OK", "content": {
                    "application/json": {
                        "schema": {"$ref": f"#/components/schemas/{ref_name}"}}}}},
            }
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.34.2"},
        "paths": paths,
        "components": {"schemas": schemas},
    }
