"""A fake kube-apiserver on aiohttp.

It speaks the real REST protocol over real HTTP, so the code under test uses the
real kubernetes_asyncio client (and kubectl), and it reproduces the semantics our
controllers depend on: resourceVersion concurrency, status subresources,
generation, finalizers, owner-reference garbage collection, selectors, paging,
watches with resume/bookmarks/410, CRD schemas, and injected faults.

``ApiCore`` holds the semantics (shared by HTTP and in-process seeding, so both take
the same validation path); ``FakeAPIServer`` maps HTTP onto it.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import uuid
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
from . import patch as patchlib
from .builtin_validation import apply_builtin_defaults, validate_builtin, validate_object_meta
from .deletion import plan_delete, removed_by_update
from .errors import FieldError, invalid_status, status
from .faults import FaultInjector, RequestInfo, fault_status
from .registry import (
    AGE,
    PrinterColumn,
    Registry,
    ResourceType,
    builtin_types,
    cell_value,
    prune_builtin,
)
from .schema import CRDSchema, SchemaError, validate_crd_manifest
from .selectors import SelectorError, combine, field_matcher, label_matcher
from .store import JSON, ApiError, Entry, Event, Expired, Store, Watcher, encode

# Names the real server validates differently from the DNS-subdomain default.
_NAME_RULES = {"namespaces": "dns-label", "events": "path-segment"}
# Built-ins whose server-side defaulting writes into nested objects.
_DEFAULTED = frozenset({("resource.k8s.io", "resourceclaims"),
                        ("resource.k8s.io", "resourceclaimtemplates")})
StrList = list[str]
JSONList = list[JSON]
T = TypeVar("T")
BytesList = list[bytes]
CRD_KEY = ("apiextensions.k8s.io", "customresourcedefinitions")
NS_KEY = ("", "namespaces")
POD_KEY = ("", "pods")
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease",
                      "neuron-dra-driver")
FORBIDDEN = "FieldValueForbidden"
INVALID = "FieldValueInvalid"

MERGE = "application/merge-patch+json"
JSONPATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"


def _rfc3339(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_bool(value: str | None) -> bool:
    """Go's strconv.ParseBool: kubernetes_asyncio sends Python's ``True``."""
    return value is not None and value.strip() in ("1", "t", "T", "true", "TRUE", "True")


def _default_crd_paths() -> list[Path]:
    here = Path(__file__).resolve()
    for base in here.parents:
        d = base / "charts" / "neuron-dra-driver" / "crds"
        if d.is_dir():
            return sorted(d.glob("*.yaml"))
    return []


def _generated_suffix() -> str:
    # The real server's generateName suffix: 5 chars from a consonant/digit alphabet.
    return "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))


class ApiCore:
    """Kubernetes object semantics over a Store (no HTTP here)."""

    def __init__(self, store: Store, registry: Registry, clock: Callable[[], datetime]) -> None:
        self.store = store
        self.registry = registry
        self.clock = clock
        # Dependents written with ownerReferences, waiting for the GC's owner check.
        self.pending_owner_checks: list[tuple[tuple[str, str], str, str]] = []

    # ------------------------------------------------------------------ helpers
    def now(self) -> str:
        return _rfc3339(self.clock())

    @staticmethod
    def not_found(rt: ResourceType, name: str) -> ApiError:
        return ApiError(status(404, "NotFound", f'{rt.qualified} "{name}" not found',
                               name=name, group=rt.group, kind=rt.plural))

    @staticmethod
    def conflict(rt: ResourceType, name: str, detail: str | None = None) -> ApiError:
        msg = detail or ("the object has been modified; please apply your changes to the "
                         "latest version and try again")
        return ApiError(status(409, "Conflict",
                               f'Operation cannot be fulfilled on {rt.qualified} "{name}": {msg}',
                               name=name, group=rt.group, kind=rt.plural))

    @staticmethod
    def bad_request(message: str) -> ApiError:
        return ApiError(status(400, "BadRequest", message))

    @staticmethod
    def invalid(rt: ResourceType, name: str, errors: list[FieldError]) -> ApiError:
        return ApiError(invalid_status(rt.kind, rt.group, name, errors))

    def rt_for_key(self, key: tuple[str, str]) -> ResourceType | None:
        vs = self.registry.versions_of(*key)
        return vs[0] if vs else None

    def as_version(self, rt: ResourceType, obj: JSON) -> JSON:
        """Objects of multi-version CRDs are stored once; reads relabel the version."""
        if obj.get("apiVersion") == rt.api_version:
            return obj
        return {**obj, "apiVersion": rt.api_version}

    def get(self, rt: ResourceType, ns: str, name: str) -> JSON:
        obj = self.store.get(rt.store_key, ns, name)
        if obj is None:
            raise self.not_found(rt, name)
        return self.as_version(rt, obj)

    def _check_type(self, rt: ResourceType, body: Any) -> JSON:
        if not isinstance(body, dict):
            raise self.bad_request("the request body must be a JSON object")
        av, kind = body.get("apiVersion"), body.get("kind")
        if av and av != rt.api_version and not self._other_version(rt, av):
            raise self.bad_request(
                f"the API version in the data ({av}) does not match the expected API version "
                f"({rt.api_version})"
            )
        if kind and kind != rt.kind:
            raise self.bad_request(
                f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})"
            )
        body["apiVersion"] = rt.api_version
        body["kind"] = rt.kind
        meta = body.get("metadata")
        if meta is None:
            body["metadata"] = {}
        elif not isinstance(meta, dict):
            raise self.bad_request("metadata must be an object")
        return body

    def _other_version(self, rt: ResourceType, api_version: str) -> bool:
        return any(v.api_version == api_version for v in self.registry.versions_of(*rt.store_key))

    def _namespace_usable(self, rt: ResourceType, ns: str, name: str) -> None:
        if not rt.namespaced:
            return
        nso = self.store.get(NS_KEY, "", ns)
        if nso is None:
            raise ApiError(status(404, "NotFound", f'namespaces "{ns}" not found',
                                  name=ns, kind="namespaces"))
        if nso["metadata"].get("deletionTimestamp"):
            raise ApiError(status(
                403, "Forbidden",
                f'{rt.plural} "{name}" is forbidden: unable to create new content '
                f"in namespace {ns} because it is being terminated",
                name=name, kind=rt.plural,
            ))

    def _prepare_custom(self, rt: ResourceType, obj: JSON, strict: str) -> list[str]:
        """Prune unknown fields and apply defaults (CRD structural schema semantics).

        Returns warnings; unknown fields are an error under fieldValidation=Strict.
        """
        schema: CRDSchema | None = rt.schema
        if schema is None:
            return self._prepare_builtin(rt, obj, strict)
        unknown = schema.prune(obj)
        schema.apply_defaults(obj)
        return self._unknown_fields(rt, unknown, strict)

    def _prepare_builtin(self, rt: ResourceType, obj: JSON, strict: str) -> list[str]:
        """Drop fields a built-in kind does not have, like decoding into its Go type.

        Stored objects never hold unknown fields, so pruning in place cannot touch values a
        request body shares with the stored object."""
        if not rt.model:
            return []
        return self._unknown_fields(rt, prune_builtin(rt.model, obj), strict)

    def _unknown_fields(self, rt: ResourceType, unknown: list[str], strict: str) -> list[str]:
        """fieldValidation: Strict rejects unknown fields (400); Warn, the default since
        1.27, drops them with a warning per field; Ignore drops them silently."""
        msgs = [f'unknown field "{p}"' for p in unknown]
        if msgs and strict == "Strict":
            raise self.bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
                f"strict decoding error: {', '.join(msgs)}"
            )
        return msgs if strict in ("", "Warn") else []

    def _validate(self, rt: ResourceType, obj: JSON, old: JSON | None) -> None:
        name = obj["metadata"].get("name", "")
        errs = validate_object_meta(obj, namespaced=rt.namespaced,
                                    name_validator=_NAME_RULES.get(rt.plural, "dns-subdomain"))
        if rt.schema is not None:
            errs += rt.schema.validate(obj, old)
        elif rt.crd is None:
            errs += validate_builtin(rt.group, rt.plural, obj, old)
        if rt.store_key == CRD_KEY:
            errs += self._crd_errors(obj)
        if errs:
            raise self.invalid(rt, name, errs)

    @staticmethod
    def _spec_part(obj: JSON) -> Any:
        if "spec" in obj:
            return obj["spec"]
        return {k: v for k, v in obj.items()
                if k not in ("metadata", "status", "apiVersion", "kind")}

    # ------------------------------------------------------------------ create
    def create(
        self,
        rt: ResourceType,
        ns: str | None,
        body: Any,
        *,
        dry_run: bool = False,
        field_validation: str = "",
    ) -> tuple[JSON, list[str]]:
        """Create ``body`` (a fresh dict this call may modify); returns (object, warnings)."""
        obj = self._check_type(rt, body)
        meta = obj["metadata"]
        if rt.namespaced:
            body_ns = meta.get("namespace")
            if ns is None:
                ns = body_ns or "default"
            if body_ns and body_ns != ns:
                raise self.bad_request("the namespace of the provided object does not match "
                                       "the namespace sent on the request")
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
            ns = ""
        if meta.get("resourceVersion"):
            raise self.bad_request("resourceVersion should not be set on objects to be created")
        name = meta.get("name")
        generate = not name and meta.get("generateName")
        if generate:
            name = self._generate_name(rt, ns, str(meta["generateName"]))
            meta["name"] = name
        self._namespace_usable(rt, ns, str(name or ""))
        if not name:
            raise self.invalid(rt, "", [FieldError("metadata.name", "FieldValueRequired",
                                                   "name or generateName is required")])
        for k in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(k, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = self.now()
        meta["generation"] = 1
        if rt.has_status or rt.status_on_create != "keep":
            init = rt.status_on_create
            if callable(init):
                obj["status"] = init()
            elif init == "drop":
                obj.pop("status", None)
        if rt.plural == "namespaces" and not rt.group:
            obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        warnings = self._prepare_custom(rt, obj, field_validation)
        if rt.crd is None:
            apply_builtin_defaults(rt.group, rt.plural, obj)
        self._validate(rt, obj, None)
        if self.store.get(rt.store_key, ns, str(name)) is not None:
            raise ApiError(status(409, "AlreadyExists", f'{rt.qualified} "{name}" already exists',
                                  name=str(name), group=rt.group, kind=rt.plural))
        if rt.store_key == CRD_KEY:
            self._crd_status(obj)
        if dry_run:
            return obj, warnings
        ev = self.store.put(rt.store_key, obj)
        if rt.store_key == CRD_KEY:
            self._register_crd(ev.obj)
        if meta.get("ownerReferences"):
            self.check_owners_later(rt, ev.obj)
        return ev.obj, warnings

    def _generate_name(self, rt: ResourceType, ns: str, prefix: str) -> str:
        for _ in range(16):
            name = prefix + _generated_suffix()
            if self.store.get(rt.store_key, ns, name) is None:
                return name
        raise ApiError(status(409, "AlreadyExists",
                              f'{rt.qualified} "{prefix}" already exists: could not generate a '
                              "unique name", kind=rt.plural))

    # ------------------------------------------------------------------ update
    def update(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        body: Any,
        *,
        subresource: str = "",
        dry_run: bool = False,
        field_validation: str = "",
    ) -> tuple[JSON, list[str]]:
        """Replace an object (PUT semantics); ``body`` is a fresh top-level dict."""
        old = self.store.get(rt.store_key, ns, name)
        if old is None:
            if rt.create_on_update and not subresource and isinstance(body, dict):
                # AllowCreateOnUpdate (leases, events): a PUT of a missing object creates it.
                bmeta = body.get("metadata")
                if isinstance(bmeta, dict):
                    if bmeta.get("name") not in (None, "", name):
                        raise self.bad_request(f"the name of the object ({bmeta['name']}) does "
                                               f"not match the name on the URL ({name})")
                    bmeta["name"] = name
                    bmeta.pop("resourceVersion", None)
                return self.create(rt, ns if rt.namespaced else None, body, dry_run=dry_run,
                                   field_validation=field_validation)
            raise self.not_found(rt, name)
        new = self._check_type(rt, body)
        builtin_warnings = self._prepare_builtin(rt, new, field_validation)
        meta = dict(new["metadata"])
        new["metadata"] = meta
        if meta.get("name") not in (None, "", name):
            raise self.bad_request(f"the name of the object ({meta['name']}) does not match the "
                                   f"name on the URL ({name})")
        if rt.namespaced and meta.get("namespace") not in (None, "", ns):
            raise self.bad_request("the namespace of the provided object does not match the "
                                   "namespace sent on the request")
        old_meta = old["metadata"]
        rv = meta.get("resourceVersion")
        if not rv and not rt.unconditional_update:
            # genericregistry.Store.Update: the Invalid names the resource, not the kind.
            raise ApiError(invalid_status(rt.plural, rt.group, name, [FieldError(
                "metadata.resourceVersion", INVALID, "must be specified for an update", 0,
                True)]))
        if rv and str(rv) != old_meta["resourceVersion"]:
            raise self.conflict(rt, name)
        if meta.get("uid") and meta["uid"] != old_meta.get("uid"):
            raise self.conflict(rt, name, f"Precondition failed: UID in precondition: "
                                          f"{meta['uid']}, UID in object meta: {old_meta['uid']}")
        if subresource == "status":
            # Writes to /status change only .status.
            result = dict(old)
            result["metadata"] = dict(old_meta)
            if "status" in new:
                result["status"] = new["status"]
            else:
                result.pop("status", None)
            new = result
            meta = new["metadata"]
        else:
            if rt.has_status:
                if "status" in old:
                    new["status"] = old["status"]
                else:
                    new.pop("status", None)
            meta["name"] = name
            if rt.namespaced:
                meta["namespace"] = ns
            else:
                meta.pop("namespace", None)
            for k in ("uid", "creationTimestamp", "generation", "deletionTimestamp",
                      "deletionGracePeriodSeconds"):
                if k in old_meta:
                    meta[k] = old_meta[k]
                else:
                    meta.pop(k, None)
            if "managedFields" not in meta and "managedFields" in old_meta:
                meta["managedFields"] = old_meta["managedFields"]
        meta["resourceVersion"] = old_meta["resourceVersion"]
        warnings: list[str] = builtin_warnings
        if rt.schema is not None:
            new = copy.deepcopy(new)  # pruning/defaulting mutate nested values
            warnings = self._prepare_custom(rt, new, field_validation)
            meta = new["metadata"]
        elif rt.store_key in _DEFAULTED:
            new = copy.deepcopy(new)  # defaulting writes into nested values shared with old
            apply_builtin_defaults(rt.group, rt.plural, new)
            meta = new["metadata"]
        if old_meta.get("deletionTimestamp"):
            added = [f for f in meta.get("finalizers") or []
                     if f not in (old_meta.get("finalizers") or [])]
            if added:
                go_list = "[]string{" + ", ".join(json.dumps(f) for f in added) + "}"
                raise self.invalid(rt, name, [FieldError(
                    "metadata.finalizers", FORBIDDEN,
                    f"no new finalizers can be added if the object is being deleted, found new "
                    f"finalizers {go_list}")])
        if rt.crd is not None:
            # customResourceStrategy.PrepareForUpdate: any change outside metadata bumps it
            # (a status change too, when there is no status subresource).
            changed = any(new.get(k) != old.get(k) for k in new.keys() | old.keys()
                          if k != "metadata")
        else:
            changed = self._spec_part(new) != self._spec_part(old)
        if changed and subresource != "status":
            meta["generation"] = int(old_meta.get("generation", 1)) + 1
        self._validate(rt, new, old)
        if rt.store_key == CRD_KEY:
            self._crd_status(new)
        if _same(new, old):
            return self.as_version(rt, old), warnings  # no-op writes don't bump the version
        if dry_run:
            return new, warnings
        if removed_by_update(old_meta, meta):
            ev = self.store.remove(rt.store_key, ns, name)
            assert ev is not None
            self.after_removal(ev, None)
            # Like genericregistry's deleteWithoutFinalizers: the watch's DELETED event carries
            # the last stored state, but the PUT/PATCH answers with the object as updated.
            return self.as_version(rt, new), warnings
        ev = self.store.put(rt.store_key, new)
        if rt.store_key == CRD_KEY:
            self._register_crd(ev.obj)
        if meta.get("ownerReferences") and meta.get("ownerReferences") != old_meta.get(
                "ownerReferences"):
            self.check_owners_later(rt, ev.obj)
        return self.as_version(rt, ev.obj), warnings

    # ------------------------------------------------------------------ patch
    def patch(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        content_type: str,
        raw: bytes,
        *,
        subresource: str = "",
        field_manager: str | None = None,
        force: bool = False,
        dry_run: bool = False,
        field_validation: str = "",
    ) -> tuple[JSON, bool, list[str]]:
        """Returns (object, created, warnings); only apply can create."""
        ctype = content_type.split(";")[0].strip().lower()
        current = self.store.get(rt.store_key, ns, name)
        if ctype == APPLY:
            return self._apply(rt, ns, name, raw, current, subresource=subresource,
                               field_manager=field_manager, force=force, dry_run=dry_run,
                               field_validation=field_validation)
        if ctype not in (MERGE, JSONPATCH, STRATEGIC):
            raise ApiError(status(415, "UnsupportedMediaType",
                                  f"the body of the request was in an unknown format - accepted "
                                  f"media types include: {JSONPATCH}, {MERGE}, {APPLY}"
                                  + ("" if rt.crd else f", {STRATEGIC}")))
        if ctype == STRATEGIC and rt.crd is not None:
            raise ApiError(status(415, "UnsupportedMediaType",
                                  f"the body of the request was in an unknown format - accepted "
                                  f"media types include: {JSONPATCH}, {MERGE}, {APPLY}"))
        if current is None:
            raise self.not_found(rt, name)
        try:
            body = json.loads(raw or b"null")
        except ValueError as exc:
            raise self.bad_request(f"error decoding patch: {exc}") from None
        current = self.as_version(rt, current)
        try:
            if ctype == MERGE:
                if not isinstance(body, dict):
                    raise self.bad_request("merge patch must be a JSON object")
                new = patchlib.merge_patch(current, body)
            elif ctype == JSONPATCH:
                new = patchlib.json_patch(current, body)
            else:
                if not isinstance(body, dict):
                    raise self.bad_request("strategic merge patch must be a JSON object")
                new = patchlib.strategic_merge_patch(current, body)
        except patchlib.PatchError as exc:
            code = exc.code
            raise ApiError(status(code, "BadRequest" if code == 400 else "Invalid"
                                  if code == 422 else "Conflict", str(exc))) from None
        if not isinstance(new, dict):
            raise self.bad_request("patch produced a non-object document")
        # A resourceVersion left in the patched object is a precondition: it must be current.
        pmeta = new.get("metadata")
        meta: JSON = pmeta if isinstance(pmeta, dict) else {}
        if str(meta.get("resourceVersion", "")) != current["metadata"]["resourceVersion"]:
            raise self.conflict(rt, name)
        obj, warnings = self.update(rt, ns, name, new, subresource=subresource, dry_run=dry_run,
                                    field_validation=field_validation)
        return obj, False, warnings

    def _apply(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        raw: bytes,
        current: JSON | None,
        *,
        subresource: str,
        field_manager: str | None,
        force: bool,
        dry_run: bool,
        field_validation: str,
    ) -> tuple[JSON, bool, list[str]]:
        if not field_manager:
            raise self.bad_request("PATCH requests with apply content type require fieldManager "
                                   "to be set")
        try:
            applied = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise self.bad_request(f"error decoding YAML: {exc}") from None
        if not isinstance(applied, dict):
            raise self.bad_request("apply configuration must be an object")
        if not applied.get("apiVersion") or not applied.get("kind"):
            raise self.bad_request("apiVersion and kind must be set in an apply configuration")
        self._check_type(rt, applied)
        ameta = applied.setdefault("metadata", {})
        if ameta.get("name") not in (None, name):
            raise self.bad_request(f"the name of the object ({ameta['name']}) does not match the "
                                   f"name on the URL ({name})")
        ameta["name"] = name
        if rt.namespaced:
            ameta["namespace"] = ns
        want_rv = ameta.pop("resourceVersion", None)
        try:
            merged = patchlib.server_side_apply(
                current, applied, manager=field_manager, force=force, now=self.now(),
                api_version=rt.api_version)
        except patchlib.ApplyConflict as exc:
            # errors.NewApplyConflict: the details carry only the causes (no name/kind).
            raise ApiError(status(409, "Conflict", str(exc), causes=exc.causes())) from None
        if current is None:
            if subresource:
                raise self.not_found(rt, name)
            merged["metadata"].pop("resourceVersion", None)
            obj, warnings = self.create(rt, ns if rt.namespaced else None, merged,
                                        dry_run=dry_run, field_validation=field_validation)
            return obj, True, warnings
        if want_rv and str(want_rv) != current["metadata"]["resourceVersion"]:
            raise self.conflict(rt, name)
        merged["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        obj, warnings = self.update(rt, ns, name, merged, subresource=subresource,
                                    dry_run=dry_run, field_validation=field_validation)
        return obj, False, warnings

    # ------------------------------------------------------------------ delete
    def delete(
        self, rt: ResourceType, ns: str, name: str, options: JSON | None = None,
        *, dry_run: bool = False,
    ) -> tuple[JSON, bool]:
        """Returns (object, deleted_now). Pods are deleted gracefully and objects with
        finalizers are only marked (``deletionTimestamp``): see :mod:`.deletion`."""
        opts = options or {}
        cur = self.store.get(rt.store_key, ns, name)
        if cur is None:
            raise self.not_found(rt, name)
        meta = cur["metadata"]
        pre = opts.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != meta.get("uid"):
            raise self._precondition_failed(
                rt, name, f"the UID in the precondition ({pre['uid']}) does not match the UID in "
                f"record ({meta.get('uid')}). The object might have been deleted and then "
                "recreated")
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
            raise self._precondition_failed(
                rt, name, f"the ResourceVersion in the precondition ({pre['resourceVersion']}) "
                f"does not match the ResourceVersion in record ({meta['resourceVersion']}). The "
                "object might have been modified")
        policy = opts.get("propagationPolicy")
        if policy is None and opts.get("orphanDependents") is True:
            policy = "Orphan"
        if policy not in (None, "Orphan", "Background", "Foreground"):
            raise self.invalid(rt, name, [FieldError(
                "propagationPolicy", "FieldValueNotSupported",
                'supported values: "Foreground", "Background", "Orphan", "nil"',
                value=policy, has_value=True)])
        plan = plan_delete(cur, self._grace_option(opts), self.clock(),
                           graceful=rt.store_key == POD_KEY,
                           held=rt.store_key == NS_KEY or bool(meta.get("finalizers")))
        if plan.mark is not None:
            marked = dict(cur)
            marked["metadata"] = {**meta, **plan.mark}
            if rt.store_key == NS_KEY:
                marked["status"] = {**(cur.get("status") or {}), "phase": "Terminating"}
            if dry_run:
                return self.as_version(rt, marked), False
            cur = self.store.put(rt.store_key, marked).obj
            if not meta.get("deletionTimestamp"):
                if policy == "Orphan":
                    self._orphan(meta.get("uid", ""))
                if rt.store_key == NS_KEY:
                    self._later(lambda: self._purge_namespace(name))
        if dry_run or not plan.remove:
            return self.as_version(rt, cur), False
        gone = self.store.remove(rt.store_key, ns, name)
        assert gone is not None
        self.after_removal(gone, policy)
        return self.as_version(rt, gone.obj), True

    @staticmethod
    def _precondition_failed(rt: ResourceType, name: str, detail: str) -> ApiError:
        """rest.BeforeDelete's 409: it names the kind (``Pod``, ``ResourceClaim.resource.k8s.io``)
        where other conflicts name the resource."""
        kind = f"{rt.kind}.{rt.group}" if rt.group else rt.kind
        return ApiError(status(409, "Conflict",
                               f'Operation cannot be fulfilled on {kind} "{name}": {detail}',
                               name=name, group=rt.group, kind=rt.kind))

    def _grace_option(self, opts: JSON) -> int | None:
        """``gracePeriodSeconds`` from the body or the query (a string there)."""
        value = opts.get("gracePeriodSeconds")
        if value is None:
            return None
        try:
            return int(value)
        except (TypeError, ValueError):
            raise self.bad_request(f"invalid gracePeriodSeconds: {value}") from None

    def after_removal(self, ev: Event, policy: str | None) -> None:
        """Follow-ups of an object really leaving storage: GC, namespace/CRD cleanup."""
        uid = ev.obj["metadata"].get("uid", "")
        if policy == "Orphan":
            self._orphan(uid)
        elif uid in self.store.dependents:
            self._later(lambda: self._collect(uid))
        if ev.key == CRD_KEY:
            self._unregister_crd(ev.obj)
        if ev.key == NS_KEY:
            return
        if ev.namespace:
            nso = self.store.get(NS_KEY, "", ev.namespace)
            if nso is not None and nso["metadata"].get("deletionTimestamp"):
                self._later(lambda: self._finish_namespace(ev.namespace))

    def _later(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` right after the current request, like the real background controllers."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            fn()
            return
        loop.call_soon(fn)

    def _orphan(self, owner_uid: str) -> None:
        for key, ns, name in list(self.store.dependents.get(owner_uid, ())):
            obj = self.store.get(key, ns, name)
            if obj is None:
                continue
            refs = [r for r in obj["metadata"].get("ownerReferences") or []
                    if r.get("uid") != owner_uid]
            new = dict(obj)
            new["metadata"] = {**obj["metadata"], "ownerReferences": refs}
            if not refs:
                del new["metadata"]["ownerReferences"]
            self.store.put(key, new)

    def _collect(self, owner_uid: str) -> None:
        """Garbage-collect dependents all of whose owners are gone."""
        for key, ns, name in list(self.store.dependents.get(owner_uid, ())):
            self._collect_if_orphaned(key, ns, name)

    def _owner_present(self, rt: ResourceType, ns: str, ref: Any) -> bool:
        """Whether the garbage collector would find ``ref``'s owner (or cannot tell).

        Like the real GC, an owner is looked up by kind and name in the *dependent's*
        namespace (owner references carry none) and must have the referenced uid; a missing
        one, or one with another uid, is absent. A kind the server does not serve, or a
        namespaced owner of a cluster-scoped dependent, cannot be resolved: the GC then
        reports it and leaves the dependent alone.
        """
        if not isinstance(ref, dict):
            return True
        owner_rt = self.registry.by_kind(str(ref.get("apiVersion", "")), str(ref.get("kind", "")))
        if owner_rt is None or (owner_rt.namespaced and not rt.namespaced):
            return True
        owner = self.store.get(owner_rt.store_key, ns if owner_rt.namespaced else "",
                               str(ref.get("name", "")))
        return owner is not None and owner["metadata"].get("uid") == ref.get("uid")

    def _collect_if_orphaned(self, key: tuple[str, str], ns: str, name: str) -> None:
        obj = self.store.get(key, ns, name)
        rt = self.rt_for_key(key)
        if obj is None or rt is None:
            return
        refs = obj["metadata"].get("ownerReferences") or []
        if not refs or any(self._owner_present(rt, ns, r) for r in refs):
            return
        try:
            self.delete(rt, ns, name, {"propagationPolicy": "Background"})
        except ApiError:
            return

    def check_owners_later(self, rt: ResourceType, obj: JSON) -> None:
        """The GC's check of a new dependent: one whose owners are all absent (never existed,
        another uid, another namespace) is deleted shortly after it was written."""
        meta = obj["metadata"]
        target = (rt.store_key, meta.get("namespace", ""), meta["name"])
        self.pending_owner_checks.append(target)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # in-process setup before start(): checked once the server runs
        loop.call_soon(self.run_owner_checks)

    def run_owner_checks(self) -> None:
        pending, self.pending_owner_checks = self.pending_owner_checks, []
        for key, ns, name in pending:
            self._collect_if_orphaned(key, ns, name)

    def _purge_namespace(self, ns: str) -> None:
        for key in self.store.keys():  # noqa: SIM118 (a method, not a dict)
            rt = self.rt_for_key(key)
            if rt is None or not rt.namespaced:
                continue
            for entry in list(self.store.iter_entries(key, ns)):
                try:
                    self.delete(rt, ns, entry.obj["metadata"]["name"], {})
                except ApiError:
                    continue
        self._finish_namespace(ns)

    def _finish_namespace(self, ns: str) -> None:
        nso = self.store.get(NS_KEY, "", ns)
        if nso is None or not nso["metadata"].get("deletionTimestamp"):
            return
        for key in self.store.keys():  # noqa: SIM118 (a method, not a dict)
            if key != NS_KEY and next(self.store.iter_entries(key, ns), None) is not None:
                return
        ev = self.store.remove(NS_KEY, "", ns)
        if ev is not None:
            self.after_removal(ev, None)

    def bind(self, rt: ResourceType, ns: str, name: str, body: Any) -> JSON:
        """POST pods/NAME/binding: what the scheduler does to place a pod."""
        pod = self.store.get(rt.store_key, ns, name)
        if pod is None:
            raise self.not_found(rt, name)
        if not isinstance(body, dict) or not (body.get("target") or {}).get("name"):
            raise self.invalid(rt, name, [FieldError("target.name", "FieldValueRequired", "")])
        node = body["target"]["name"]
        if pod.get("spec", {}).get("nodeName"):
            raise ApiError(status(
                409, "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is already '
                f'assigned to node "{pod["spec"]["nodeName"]}"', name=name, kind="pods/binding"))
        if pod["metadata"].get("deletionTimestamp"):
            raise self.conflict(rt, name, "pod is being deleted, cannot be assigned to a host")
        new = dict(pod)
        new["spec"] = {**pod.get("spec", {}), "nodeName": node}
        st = dict(pod.get("status") or {})
        conds = [c for c in st.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conds.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": self.now()})
        st["conditions"] = conds
        new["status"] = st
        new["metadata"] = dict(pod["metadata"])
        self.store.put(rt.store_key, new)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "code": 201}

    # ------------------------------------------------------------------ CRDs
    def _crd_errors(self, crd: JSON) -> list[FieldError]:
        errs: list[FieldError] = []
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        want = f"{names.get('plural')}.{spec.get('group')}"
        name = crd["metadata"].get("name")
        if name != want:
            errs.append(FieldError("metadata.name", INVALID,
                                   'must be spec.names.plural+"."+spec.group', name, True))
        for msg in validate_crd_manifest(crd):
            errs.append(FieldError("spec", INVALID, msg))
        for i, ver in enumerate(spec.get("versions") or []):
            try:
                CRDSchema.from_openapi(((ver.get("schema") or {}).get("openAPIV3Schema")) or {})
            except SchemaError as exc:
                errs.append(FieldError(f"spec.versions[{i}].schema.openAPIV3Schema", INVALID,
                                       str(exc)))
        return errs

    def _crd_status(self, crd: JSON) -> None:
        spec = crd.get("spec") or {}
        now = self.now()
        crd["status"] = {
            "acceptedNames": spec.get("names") or {},
            "storedVersions": [v["name"] for v in spec.get("versions") or []
                               if v.get("storage")],
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                 "message": "no conflicts found", "lastTransitionTime": now},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted", "lastTransitionTime": now},
            ],
        }

    def _register_crd(self, crd: JSON) -> None:
        schemas: dict[str, Any] = {}
        for ver in crd["spec"].get("versions") or []:
            raw = (ver.get("schema") or {}).get("openAPIV3Schema")
            if raw is not None:
                schemas[ver["name"]] = CRDSchema.from_openapi(raw)
        self.registry.add_crd(crd, schemas)

    def _unregister_crd(self, crd: JSON) -> None:
        gone = self.registry.remove_crd(crd["metadata"]["name"])
        for key in {rt.store_key for rt in gone}:
            for ev in self.store.drop_resource(key):
                self.after_removal(ev, None)


def _same(a: JSON, b: JSON) -> bool:
    """Equal apart from resourceVersion/managedFields (what makes a write a no-op)."""
    if a.keys() != b.keys():
        return False
    for k, v in a.items():
        if k == "metadata":
            ma, mb = v, b[k]
            ignore = ("resourceVersion", "managedFields")
            if {x: y for x, y in ma.items() if x not in ignore} != {
                x: y for x, y in mb.items() if x not in ignore
            }:
                return False
        elif v != b[k]:
            return False
    return True


NAME_COLUMN = PrinterColumn(
    name="Name", type="string", format="name",
    description="Name must be unique within a namespace. Is required when creating resources, "
    "although some resources may allow a client to request the generation of an appropriate "
    "name automatically. Name is primarily intended for creation idempotence and configuration "
    "definition. Cannot be updated. More info: "
    "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
)

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
        self.core = ApiCore(self.store, self.registry, self.clock)
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
        asyncio.get_running_loop().call_soon(self.core.run_owner_checks)

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
        return _copy(self._obj_bytes(rt, created))

    def seed(self, objs: Iterable[JSON]) -> int:
        """Bulk create for benchmark/test setup; same validation as ``create`` but the server
        takes ownership of the dicts (no copies in or out) and encodes each object right
        away so the first list is as fast as later ones. Returns how many were created."""
        n = 0
        for obj in objs:
            rt = self.resource_type(obj.get("apiVersion", ""), obj.get("kind", ""))
            ns = obj.get("metadata", {}).get("namespace") if rt.namespaced else None
            created, _ = self.core.create(rt, ns, obj)
            self._obj_bytes(rt, created)
            n += 1
        return n

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None
            ) -> JSON | None:
        rt = self.resource_type(api_version, kind)
        obj = self.store.get(rt.store_key, namespace or "" if rt.namespaced else "", name)
        return None if obj is None else _copy(self._obj_bytes(rt, obj))

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
        return [_copy(self._entry_raw(rt, e)) for e in snap.items]

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
        return _copy(self._obj_bytes(rt, updated))

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
        content_type: str = MERGE,
        subresource: str = "",
    ) -> JSON:
        rt = self.resource_type(api_version, kind)
        obj, _, _ = self.core.patch(rt, namespace or "" if rt.namespaced else "", name,
                                    content_type, encode(body), subresource=subresource)
        return _copy(self._obj_bytes(rt, obj))

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
        return _copy(self._obj_bytes(rt, obj))

    def load_manifests(self, path: Path) -> JSONList:
        """Create every object in a (multi-document) YAML file."""
        out: JSONList = []
        with Path(path).open() as f:
            for doc in yaml.safe_load_all(f):
                if isinstance(doc, dict) and doc:
                    out.append(self.create(doc))
        return out

    # ------------------------------------------------------------------ HTTP: dispatch
    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        try:
            if path.startswith("/fake/"):
                return await self._fake(request)
            if path.rstrip("/") in ("/healthz", "/readyz", "/livez") or path.startswith(
                ("/healthz/", "/readyz/", "/livez/")
            ):
                return web.Response(text="ok")
            if path == "/version":
                return self._json(VERSION_INFO)
            if path.rstrip("/") == "/openapi/v3":
                return self._json(self.registry.openapi_v3_root())
            if path.startswith("/openapi/v3/"):
                return self._openapi_gv(path[len("/openapi/v3/"):])
            return await self._api(request)
        except ApiError as exc:
            return self._error(exc)

    def _json(self, obj: Any, code: int = 200, headers: dict[str, str] | None = None
              ) -> web.Response:
        return self._raw(encode(obj), code, headers)

    @staticmethod
    def _raw(body: bytes, code: int = 200, headers: dict[str, str] | None = None
             ) -> web.Response:
        return web.Response(body=body, status=code, content_type="application/json",
                            headers=headers)

    def _error(self, exc: ApiError) -> web.Response:
        return self._json(exc.body, exc.code, exc.headers or None)

    @staticmethod
    def _not_found_path() -> ApiError:
        return ApiError(status(404, "NotFound", "the server could not find the requested "
                               "resource"))

    def _openapi_gv(self, gv: str) -> web.Response:
        segs = gv.strip("/").split("/")
        doc = None
        if len(segs) == 2 and segs[0] == "api":
            doc = self.registry.openapi_v3_gv("", segs[1])
        elif len(segs) == 3 and segs[0] == "apis":
            doc = self.registry.openapi_v3_gv(segs[1], segs[2])
        if doc is None:
            raise self._not_found_path()
        return self._json(doc)

    def _discovery(self, segs: StrList) -> web.Response:
        if segs == ["api"]:
            return self._json(self.registry.core_versions(f"{self.host}:{self._port}"))
        if segs == ["apis"]:
            return self._json(self.registry.group_list())
        if segs[0] == "apis" and len(segs) == 2:
            doc = self.registry.group(segs[1])
            if doc is None:
                raise self._not_found_path()
            return self._json(doc)
        group, version = ("", segs[1]) if segs[0] == "api" else (segs[1], segs[2])
        rl = self.registry.resource_list(group, version)
        if rl is None:
            raise self._not_found_path()
        return self._json(rl)

    async def _api(self, request: web.Request) -> web.StreamResponse:
        segs = [s for s in request.path.split("/") if s]
        if not segs or segs[0] not in ("api", "apis"):
            raise self._not_found_path()
        if segs[0] == "api":
            if len(segs) <= 2:
                return self._discovery(segs)
            group, version, rest = "", segs[1], segs[2:]
        else:
            if len(segs) <= 3:
                return self._discovery(segs)
            group, version, rest = segs[1], segs[2], segs[3:]
        q = request.query
        watch = parse_bool(q.get("watch"))
        if rest[0] == "watch":  # deprecated /watch/ paths
            watch, rest = True, rest[1:]
        ns: str | None = None
        if (rest and rest[0] == "namespaces" and len(rest) >= 3
                and not (len(rest) == 3 and rest[2] in ("status", "finalize"))):
            ns, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise self._not_found_path()
        rt = self.registry.lookup(group, version, rest[0])
        if rt is None or (ns is not None and not rt.namespaced):
            raise self._not_found_path()
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else ""
        if sub and sub not in rt.subresources:
            raise self._not_found_path()
        if sub == "finalize":
            sub = ""
        method = request.method
        verb = {
            "GET": "watch" if watch else ("get" if name else "list"),
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if name else "deletecollection",
        }.get(method, "")
        if not verb:
            raise ApiError(status(405, "MethodNotAllowed",
                                  "the server does not allow this method on the requested "
                                  "resource"))
        body = await request.read() if method in ("POST", "PUT", "PATCH", "DELETE") else b""
        ctype = request.headers.get("Content-Type", "")
        if method in ("POST", "PUT") and body and "protobuf" in ctype:
            # JSON only: typed client-go writes (e.g. `kubectl create configmap`) send
            # protobuf, and an honest 415 beats a confusing decode error.
            raise ApiError(status(415, "UnsupportedMediaType",
                                  'the body of the request was in an unknown format - accepted '
                                  'media types include: application/json, application/yaml'))
        info = RequestInfo(verb=verb, method=method, path=request.path, group=group,
                           version=version, resource=rt.plural, subresource=sub, namespace=ns,
                           name=name, content_type=request.headers.get("Content-Type", ""),
                           body_bytes=body)
        self.request_counts[(verb, f"{rt.plural}/{sub}" if sub else rt.plural)] += 1
        delay = self.faults.latency_for(info)
        if delay > 0:
            await asyncio.sleep(delay)  # injected latency, on purpose
        rule = self.faults.take(info)
        if rule is not None and not rule.after_commit:
            st, headers = fault_status(rule.code, info, rule.message)
            return self._json(st, rule.code, headers)
        if rt.namespaced and ns is None and verb not in ("list", "watch", "create"):
            raise self._not_found_path()
        resp = await self._handle(request, rt, ns, name, sub, verb, body)
        if rule is not None:
            st, headers = fault_status(rule.code, info, rule.message)
            return self._json(st, rule.code, headers)
        return resp

    async def _handle(
        self,
        request: web.Request,
        rt: ResourceType,
        ns: str | None,
        name: str | None,
        sub: str,
        verb: str,
        body: bytes,
    ) -> web.StreamResponse:
        q = request.query
        core = self.core
        nsv = ns or ""
        dry_run = "All" in q.getall("dryRun", [])
        validation = q.get("fieldValidation", "")
        if verb == "watch":
            if name:  # legacy single-object watch
                fs = f"metadata.name={name}"
                extra = q.get("fieldSelector")
                return await self._watch(request, rt, ns, fs + ("," + extra if extra else ""))
            return await self._watch(request, rt, ns, q.get("fieldSelector"))
        if verb == "list":
            return await self._list(request, rt, ns)
        if verb == "get":
            assert name is not None
            obj = core.get(rt, nsv, name)
            if _wants_table(request):
                return self._json(self._table(rt, [obj], None, q.get("includeObject")))
            return self._raw(self._obj_bytes(rt, obj))
        if verb == "create":
            data = _decode(body)
            if name:
                if sub != "binding":
                    raise ApiError(status(405, "MethodNotAllowed", "the server does not allow "
                                          "this method on the requested resource"))
                return self._json(core.bind(rt, nsv, name, data), 201)
            made, warnings = core.create(rt, ns, data, dry_run=dry_run,
                                         field_validation=validation)
            return self._raw(self._obj_bytes(rt, made), 201, _warning_headers(warnings))
        if verb == "update":
            assert name is not None
            updated, warnings = core.update(rt, nsv, name, _decode(body), subresource=sub,
                                            dry_run=dry_run, field_validation=validation)
            return self._raw(self._obj_bytes(rt, updated), 200, _warning_headers(warnings))
        if verb == "patch":
            assert name is not None
            force = parse_bool(q.get("force"))
            patched, created, warnings = core.patch(
                rt, nsv, name, request.headers.get("Content-Type", ""), body, subresource=sub,
                field_manager=q.get("fieldManager"), force=force, dry_run=dry_run,
                field_validation=validation)
            return self._raw(self._obj_bytes(rt, patched), 201 if created else 200,
                             _warning_headers(warnings))
        opts = _decode(body) if body.strip() else {}
        if not isinstance(opts, dict):
            raise core.bad_request("DeleteOptions must be an object")
        for key in ("propagationPolicy", "gracePeriodSeconds"):
            if key in q and key not in opts:
                opts[key] = q[key]
        if verb == "delete":
            assert name is not None
            obj, deleted = core.delete(rt, nsv, name, opts, dry_run=dry_run)
            # The real server answers 202 when deletion is pending and a policy was given.
            code = 202 if not deleted and opts.get("propagationPolicy") in (
                "Foreground", "Background") else 200
            return self._json(obj, code)
        # deletecollection
        match = self._matcher(rt, q.get("labelSelector"), q.get("fieldSelector"))
        page = self.store.page(rt.store_key, ns, match)
        victims = [e.obj["metadata"]["name"] for e in page.items]
        for victim in victims:
            try:
                core.delete(rt, nsv if rt.namespaced else "", victim, opts, dry_run=dry_run)
            except ApiError as exc:
                if exc.code != 404:
                    raise
        return self._json({"kind": "Status", "apiVersion": "v1", "metadata": {},
                           "status": "Success"})

    # ------------------------------------------------------------------ list / table
    def _matcher(self, rt: ResourceType, labels: str | None, fields: str | None
                 ) -> Callable[[JSON], bool] | None:
        try:
            return combine(label_matcher(labels), field_matcher(fields, rt.allowed_fields()))
        except SelectorError as exc:
            raise self.core.bad_request(str(exc)) from None

    async def _list_rv(self, q: Any) -> int | None:
        """The resourceVersion a list must be served at (None: the current state), after
        ListOptions validation and, for a version the store has not reached yet, the
        watch cache's bounded wait ("Too large resource version")."""
        rv_s = q.get("resourceVersion", "")
        rv_match = q.get("resourceVersionMatch", "")
        errs: list[FieldError] = []
        if rv_match:
            if not rv_s:
                errs.append(FieldError("resourceVersionMatch", FORBIDDEN,
                                       "resourceVersionMatch is forbidden unless "
                                       "resourceVersion is provided"))
            if q.get("continue"):
                errs.append(FieldError("resourceVersionMatch", FORBIDDEN,
                                       "resourceVersionMatch is forbidden when continue is "
                                       "provided"))
            if rv_match not in ("Exact", "NotOlderThan"):
                errs.append(FieldError("resourceVersionMatch", "FieldValueNotSupported",
                                       'supported values: "Exact", "NotOlderThan", ""',
                                       rv_match, True))
            if rv_match == "Exact" and rv_s == "0":
                errs.append(FieldError("resourceVersionMatch", FORBIDDEN,
                                       'resourceVersionMatch "exact" is forbidden for '
                                       'resourceVersion "0"'))
        if "sendInitialEvents" in q:
            errs.append(FieldError("sendInitialEvents", FORBIDDEN,
                                   "sendInitialEvents is forbidden for list"))
        if errs:
            raise ApiError(invalid_status("ListOptions", "meta.k8s.io", "", errs))
        if q.get("continue"):
            if rv_s not in ("", "0"):
                raise self.core.bad_request("specifying resource version is not allowed when "
                                            "using continue")
            return None
        if rv_s in ("", "0"):
            return None
        try:
            rv = int(rv_s)
        except ValueError:
            raise self.core.bad_request(f"invalid resource version: {rv_s}") from None
        await self._wait_for_rv(rv)
        return rv if rv_match == "Exact" else None

    async def _wait_for_rv(self, rv: int) -> None:
        """Block (like the watch cache, for at most ``too_large_rv_wait`` seconds) until the
        store reaches ``rv``; then 504 with the ResourceVersionTooLarge cause client-go
        reflectors look for."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.too_large_rv_wait
        while self.store.rv < rv:
            if loop.time() >= deadline:
                body = status(504, "Timeout",
                              f"Timeout: Too large resource version: {rv}, current: "
                              f"{self.store.rv}",
                              causes=[{"reason": "ResourceVersionTooLarge",
                                       "message": "Too large resource version"}],
                              retry_after_seconds=1)
                raise ApiError(body)
            await asyncio.sleep(0.01)

    async def _list(self, request: web.Request, rt: ResourceType, ns: str | None
                    ) -> web.Response:
        q = request.query
        match = self._matcher(rt, q.get("labelSelector"), q.get("fieldSelector"))
        limit_s = q.get("limit")
        try:
            limit = int(limit_s) if limit_s else None
        except ValueError:
            raise self.core.bad_request(f"invalid limit: {limit_s}") from None
        token = q.get("continue") or None
        at_rv = await self._list_rv(q)
        try:
            snap = self.store.page(rt.store_key, ns, match, limit if limit and limit > 0 else None,
                                   token, at_rv=at_rv)
        except Expired:
            if at_rv is not None:
                raise ApiError(status(410, "Expired", "The resourceVersion for the provided "
                                      "list is too old.")) from None
            raise ApiError(status(
                410, "Expired",
                "The provided continue parameter is too old to display a consistent list "
                "result. You can start a new list without the continue parameter.")) from None
        except ValueError as exc:
            raise self.core.bad_request(str(exc)) from None
        if _wants_table(request):
            objs = [self.core.as_version(rt, e.obj) for e in snap.items]
            table = self._table(rt, objs, str(snap.rv), q.get("includeObject"))
            if snap.continue_token:
                table["metadata"]["continue"] = snap.continue_token
            return self._json(table)
        meta: JSON = {"resourceVersion": str(snap.rv)}
        if snap.continue_token:
            meta["continue"] = snap.continue_token
            if snap.remaining is not None:
                meta["remainingItemCount"] = snap.remaining
        head = encode({"kind": rt.list_kind, "apiVersion": rt.api_version, "metadata": meta})
        # Splice the cached per-object encodings in: one list of 10k objects costs a join.
        parts = [self._entry_raw(rt, e) for e in snap.items]
        return self._raw(head[:-1] + b',"items":[' + b",".join(parts) + b"]}")

    def _obj_bytes(self, rt: ResourceType, obj: JSON) -> bytes:
        """The encoding of ``obj``, reusing (and filling) the store's cache when it is the
        stored version: every write is then encoded once, for its response and all lists."""
        meta = obj.get("metadata") or {}
        entry = self.store.entry(rt.store_key, meta.get("namespace", ""), meta.get("name", ""))
        if entry is not None and entry.obj is obj:
            return self._entry_raw(rt, entry)
        return encode(self.core.as_version(rt, obj))

    def _entry_raw(self, rt: ResourceType, e: Entry) -> bytes:
        if e.obj.get("apiVersion") == rt.api_version:
            return e.raw
        return encode(self.core.as_version(rt, e.obj))

    def _table(self, rt: ResourceType, objs: JSONList, rv: str | None,
               include: str | None) -> JSON:
        cols = (NAME_COLUMN, *(rt.printer_columns or (AGE,)))
        now = self.clock()
        rows = []
        for o in objs:
            row: JSON = {"cells": [o["metadata"].get("name", "")]
                         + [cell_value(c, o, now) for c in cols[1:]]}
            if include == "Object":
                row["object"] = o
            elif include != "None":
                row["object"] = {"kind": "PartialObjectMetadata",
                                 "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}
            rows.append(row)
        meta: JSON = {"resourceVersion": rv} if rv else {}
        return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta,
                "columnDefinitions": [c.definition() for c in cols], "rows": rows}

    # ------------------------------------------------------------------ watch
    def _bookmark(self, rt: ResourceType, rv: int, initial_end: bool = False) -> bytes:
        meta: JSON = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return encode({"type": "BOOKMARK", "object": {"kind": rt.kind,
                                                      "apiVersion": rt.api_version,
                                                      "metadata": meta}}) + b"\n"

    def _line(self, rt: ResourceType, typ: str, entry: Entry) -> bytes:
        return b'{"type":"' + typ.encode() + b'","object":' + self._entry_raw(rt, entry) + b"}\n"

    @staticmethod
    def _translate(ev: Event, ns: str | None, match: Callable[[JSON], bool] | None
                   ) -> tuple[str, Entry] | None:
        """One store event as this watcher sees it (selector transitions become ADDED/DELETED)."""
        if ns is not None and ev.namespace != ns:
            return None
        if match is None:
            return ev.type, ev.entry
        new_ok = match(ev.obj)
        if ev.type == "ADDED":
            return ("ADDED", ev.entry) if new_ok else None
        old_ok = ev.old is not None and match(ev.old)
        if ev.type == "DELETED":
            return ("DELETED", ev.entry) if old_ok else None
        if new_ok and old_ok:
            return "MODIFIED", ev.entry
        if new_ok:
            return "ADDED", ev.entry
        if old_ok:
            return "DELETED", ev.entry
        return None

    def _renderer(self, request: web.Request, rt: ResourceType
                  ) -> Callable[[str, Entry], bytes]:
        """How watch events are encoded: raw objects, or one-row Tables for ``kubectl get -w``
        (column definitions only in the first event, as the real server does)."""
        if not _wants_table(request):
            return lambda typ, entry: self._line(rt, typ, entry)
        include = request.query.get("includeObject")
        first = True

        def table_line(typ: str, entry: Entry) -> bytes:
            nonlocal first
            table = self._table(rt, [self.core.as_version(rt, entry.obj)],
                                entry.obj["metadata"].get("resourceVersion"), include)
            if not first:
                table["columnDefinitions"] = []
            first = False
            return encode({"type": typ, "object": table}) + b"\n"

        return table_line

    async def _watch(self, request: web.Request, rt: ResourceType, ns: str | None,
                     field_selector: str | None) -> web.StreamResponse:
        q = request.query
        match = self._matcher(rt, q.get("labelSelector"), field_selector)
        send_initial = parse_bool(q.get("sendInitialEvents"))
        bookmarks = parse_bool(q.get("allowWatchBookmarks"))
        rv_param = q.get("resourceVersion", "")
        if send_initial and q.get("resourceVersionMatch") != "NotOlderThan":
            raise self.core.invalid(rt, "", [FieldError(
                "resourceVersionMatch", FORBIDDEN,
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan")])
        timeout: float | None = None
        if q.get("timeoutSeconds"):
            try:
                timeout = float(q["timeoutSeconds"])
            except ValueError:
                raise self.core.bad_request("invalid timeoutSeconds") from None
        start_rv: int | None = None
        if rv_param not in ("", "0") and not send_initial:
            try:
                start_rv = int(rv_param)
            except ValueError:
                raise self.core.bad_request(f"invalid resource version: {rv_param}") from None

        # Register and take the starting point in one synchronous step: nothing can be
        # written in between, so the stream has no gap and no duplicate.
        key = rt.store_key
        render = self._renderer(request, rt)
        watcher = self.store.add_watcher(key, ns)
        lines: BytesList = []
        expired: Expired | None = None
        if start_rv is None:
            lines = [render("ADDED", e) for e in self.store.iter_entries(key, ns)
                     if match is None or match(e.obj)]
            if send_initial:
                lines.append(self._bookmark(rt, self.store.rv, initial_end=True))
        else:
            try:
                for ev in self.store.events_since(key, start_rv):
                    seen = self._translate(ev, ns, match)
                    if seen is not None:
                        lines.append(render(*seen))
            except Expired as exc:
                expired = exc
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        try:
            await resp.prepare(request)
            if expired is not None:
                self.store.remove_watcher(watcher)
                err = status(410, "Expired", str(expired))
                await resp.write(encode({"type": "ERROR", "object": err}) + b"\n")
                return resp
            if lines:
                await resp.write(b"".join(lines))
            await self._stream(resp, rt, watcher, match, timeout, bookmarks, render,
                               start_rv or 0)
        except ConnectionResetError:
            return resp  # the client went away; nothing left to tell it
        finally:
            self.store.remove_watcher(watcher)
        return resp

    async def _stream(self, resp: web.StreamResponse, rt: ResourceType, watcher: Watcher,
                      match: Callable[[JSON], bool] | None,
                      timeout_s: float | None, bookmarks: bool,
                      render: Callable[[str, Entry], bytes], min_rv: int = 0) -> None:
        """Send live events. A watch started at a version the store has not reached yet
        (``min_rv``) gets only later events, like the watch cache's per-watcher filter."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            wait_for: float | None = None
            if deadline is not None:
                wait_for = deadline - loop.time()
                if wait_for <= 0:
                    return
            if bookmarks:
                wait_for = (self.bookmark_interval if wait_for is None
                            else min(wait_for, self.bookmark_interval))
            try:
                async with asyncio.timeout(wait_for):
                    await watcher.wait()
            except TimeoutError:
                if deadline is not None and loop.time() >= deadline:
                    return
                # Queue empty ⇒ everything up to the store's version has been sent.
                if bookmarks and watcher.pending() == 0 and self.store.rv >= min_rv:
                    await resp.write(self._bookmark(rt, self.store.rv))
                continue
            events = watcher.drain()
            if events:
                out = [render(*seen) for ev in events
                       if ev.rv > min_rv
                       and (seen := self._translate(ev, None, match)) is not None]
                if out:
                    await resp.write(b"".join(out))
            if watcher.closed is not None:
                return

    # ------------------------------------------------------------------ /fake/ control API
    async def _fake(self, request: web.Request) -> web.Response:
        action = request.path[len("/fake/"):].strip("/")
        data: JSON = {}
        if request.method == "POST" and request.can_read_body:
            raw = await request.read()
            if raw.strip():
                parsed = _decode(raw)
                if not isinstance(parsed, dict):
                    raise self.core.bad_request("expected a JSON object")
                data = parsed
        if action == "state" and request.method == "GET":
            counts = {"/".join(k).lstrip("/"): self.store.count(k) for k in self.store.keys()}  # noqa: SIM118
            return self._json({"resourceVersion": self.store.rv,
                               "oldestResourceVersion": self.store.oldest_rv,
                               "objects": counts,
                               "watchers": sum(1 for _ in self.store.watchers()),
                               "requests": {f"{v} {r}": n
                                            for (v, r), n in self.request_counts.items()}})
        if request.method != "POST":
            raise ApiError(status(405, "MethodNotAllowed", "use POST"))
        if action == "fail":
            self.faults.fail_next(int(data.get("count", 1)), int(data.get("code", 500)),
                                  verb=data.get("verb"), resource=data.get("resource"),
                                  message=data.get("message"),
                                  after_commit=bool(data.get("afterCommit", False)))
            return self._json({"pending": self.faults.pending_rules})
        if action == "latency":
            self.faults.set_latency(float(data.get("seconds", 0)), verb=data.get("verb"))
            return self._json({})
        if action == "drop-watches":
            return self._json({"dropped": self.faults.drop_watches()})
        if action == "compact":
            return self._json({"resourceVersion": self.faults.compact()})
        if action == "clear":
            self.faults.clear()
            return self._json({})
        raise self._not_found_path()


def _copy(raw: bytes) -> JSON:
    """A private copy for in-process callers, decoded from the cached encoding."""
    out: JSON = json.loads(raw)
    return out


def _decode(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError as exc:
        # YAML is what kubectl never sends but humans with curl do; accept it too.
        try:
            return yaml.safe_load(body)
        except yaml.YAMLError:
            raise ApiError(status(400, "BadRequest",
                                  f"couldn't get version/kind; json parse error: {exc}")) from None


def _wants_table(request: web.Request) -> bool:
    return "as=Table" in request.headers.get("Accept", "")


def _warning_headers(warnings: StrList) -> dict[str, str] | None:
    if not warnings:
        return None
    return {"Warning": ", ".join(f'299 - {json.dumps(w)}' for w in warnings)}
