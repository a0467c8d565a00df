"""Kubernetes object semantics over a Store, shared by HTTP and in-process seeding (so
both take the same validation path): ``ApiCore`` creates, updates, deletes and binds like
kube-apiserver's generic registry does: resourceVersion concurrency, status subresources,
generation, finalizers and graceful deletion, no-op writes. What a write must pass is in
:mod:`.admission`, what follows it in the background in :mod:`.collector`."""

from __future__ import annotations

import copy
import json
import random
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from .admission import (
    check_type,
    namespace_usable,
    prepare_builtin,
    prepare_custom,
    validate,
)
from .collector import after_removal, check_owners_later, later, orphan, purge_namespace
from .crds import register_crd, set_crd_status
from .deletion import plan_delete, removed_by_update
from .errors import FORBIDDEN, INVALID, FieldError, invalid_status, status
from .registry import Registry
from .rejections import bad_request, conflict, invalid, not_found, precondition_failed
from .resource_types import CRD_KEY, NS_KEY, POD_KEY, ResourceType
from .store import JSON, ApiError, Store
from .validation.builtin import apply_builtin_defaults, gate_device_taints
from .validation.consumable import gate_consumable_capacity

# Built-ins whose server-side defaulting writes into nested objects.
_DEFAULTED = frozenset({("resource.k8s.io", "resourceclaims"),
                        ("resource.k8s.io", "resourceclaimtemplates")})


def _rfc3339(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _generated_suffix() -> str:
    # The real server's generateName suffix: 5 chars from a consonant/digit alphabet.
    return "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))


def as_version(rt: ResourceType, obj: JSON) -> JSON:
    """Objects of multi-version CRDs are stored once; reads relabel the version."""
    if obj.get("apiVersion") == rt.api_version:
        return obj
    return {**obj, "apiVersion": rt.api_version}


class ApiCore:
    """Kubernetes object semantics over a Store (no HTTP here)."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        clock: Callable[[], datetime],
        *,
        device_taints: bool = False,
    ) -> None:
        self.store = store
        self.registry = registry
        self.clock = clock
        #: The DRADeviceTaints feature: off, as in 1.34 and 1.35 by default (slice taints are
        #: dropped); on, taints are kept and their ``timeAdded`` defaulted (1.36+).
        self.device_taints = device_taints
        #: The DRAConsumableCapacity feature: off, as in 1.34 and 1.35 by default (its fields
        #: are dropped: validation/consumable.py); tests of shared devices turn it on (1.36+).
        self.consumable_capacity = False
        # Dependents written with ownerReferences, waiting for the GC's owner check.
        self.pending_owner_checks: list[tuple[tuple[str, str], str, str]] = []

    def now(self) -> str:
        return _rfc3339(self.clock())

    def rt_for_key(self, key: tuple[str, str]) -> ResourceType | None:
        vs = self.registry.versions_of(*key)
        return vs[0] if vs else None

    def get(self, rt: ResourceType, ns: str, name: str) -> JSON:
        obj = self.store.get(rt.store_key, ns, name)
        if obj is None:
            raise not_found(rt, name)
        return as_version(rt, obj)

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
        obj = check_type(self.registry, rt, body)
        meta = obj["metadata"]
        if rt.namespaced:
            body_ns = meta.get("namespace")
            if ns is None:
                ns = body_ns or "default"
            if body_ns and body_ns != ns:
                raise bad_request("the namespace of the provided object does not match "
                                  "the namespace sent on the request")
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
            ns = ""
        if meta.get("resourceVersion"):
            raise bad_request("resourceVersion should not be set on objects to be created")
        name = meta.get("name")
        generate = not name and meta.get("generateName")
        if generate:
            name = self._generate_name(rt, ns, str(meta["generateName"]))
            meta["name"] = name
        namespace_usable(self.store, rt, ns, str(name or ""))
        if not name:
            raise invalid(rt, "", [FieldError("metadata.name", "FieldValueRequired",
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
        warnings = prepare_custom(rt, obj, field_validation)
        if rt.crd is None:
            apply_builtin_defaults(rt.group, rt.plural, obj)
            gate_device_taints(rt.plural, obj, None, enabled=self.device_taints, now=self.now())
            if not self.consumable_capacity:
                gate_consumable_capacity(rt.plural, obj, None)
        validate(rt, obj, None)
        if self.store.get(rt.store_key, ns, str(name)) is not None:
            raise ApiError(status(409, "AlreadyExists", f'{rt.qualified} "{name}" already exists',
                                  name=str(name), group=rt.group, kind=rt.plural))
        if rt.store_key == CRD_KEY:
            set_crd_status(obj, self.now())
        if dry_run:
            return obj, warnings
        ev = self.store.put(rt.store_key, obj)
        if rt.store_key == CRD_KEY:
            register_crd(self.registry, ev.obj)
        if meta.get("ownerReferences"):
            check_owners_later(self, rt, ev.obj)
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
                return self._create_on_update(rt, ns, name, body, dry_run=dry_run,
                                              field_validation=field_validation)
            raise not_found(rt, name)
        new = check_type(self.registry, rt, body)
        builtin_warnings = prepare_builtin(rt, new, field_validation)
        new["metadata"] = dict(new["metadata"])
        old_meta = old["metadata"]
        _check_update_preconditions(rt, ns, name, new["metadata"], old_meta)
        if subresource == "status":
            new = _status_write(old, new)
        else:
            _keep_server_fields(rt, ns, name, old, new)
        new["metadata"]["resourceVersion"] = old_meta["resourceVersion"]
        warnings: list[str] = builtin_warnings
        if rt.schema is not None:
            new = copy.deepcopy(new)  # pruning/defaulting mutate nested values
            warnings = prepare_custom(rt, new, field_validation)
        elif rt.store_key in _DEFAULTED:
            new = copy.deepcopy(new)  # defaulting writes into nested values shared with old
            apply_builtin_defaults(rt.group, rt.plural, new)
        if rt.crd is None and subresource != "status":
            gate_device_taints(rt.plural, new, old, enabled=self.device_taints, now=self.now())
        if rt.crd is None and not self.consumable_capacity:
            gate_consumable_capacity(rt.plural, new, old)  # status writes too: shareID
        meta = new["metadata"]
        if old_meta.get("deletionTimestamp"):
            _check_no_new_finalizers(rt, name, meta, old_meta)
        if subresource != "status" and _generation_changes(rt, new, old):
            meta["generation"] = int(old_meta.get("generation", 1)) + 1
        validate(rt, new, old)
        if rt.store_key == CRD_KEY:
            set_crd_status(new, self.now())
        if _same(new, old):
            return as_version(rt, old), warnings  # no-op writes don't bump the version
        if dry_run:
            return new, warnings
        if removed_by_update(old_meta, meta):
            ev = self.store.remove(rt.store_key, ns, name)
            assert ev is not None
            after_removal(self, ev, None)
            # Like genericregistry's deleteWithoutFinalizers: the watch's DELETED event carries
            # the last stored state, but the PUT/PATCH answers with the object as updated.
            return as_version(rt, new), warnings
        ev = self.store.put(rt.store_key, new)
        if rt.store_key == CRD_KEY:
            register_crd(self.registry, ev.obj)
        if meta.get("ownerReferences") and meta.get("ownerReferences") != old_meta.get(
                "ownerReferences"):
            check_owners_later(self, rt, ev.obj)
        return as_version(rt, ev.obj), warnings

    def _create_on_update(self, rt: ResourceType, ns: str, name: str, body: JSON, *,
                          dry_run: bool, field_validation: str) -> tuple[JSON, list[str]]:
        """AllowCreateOnUpdate (leases, events): a PUT of a missing object creates it."""
        bmeta = body.get("metadata")
        if isinstance(bmeta, dict):
            if bmeta.get("name") not in (None, "", name):
                raise bad_request(f"the name of the object ({bmeta['name']}) does "
                                  f"not match the name on the URL ({name})")
            bmeta["name"] = name
            bmeta.pop("resourceVersion", None)
        return self.create(rt, ns if rt.namespaced else None, body, dry_run=dry_run,
                           field_validation=field_validation)

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
            raise not_found(rt, name)
        meta = cur["metadata"]
        pre = opts.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != meta.get("uid"):
            raise precondition_failed(
                rt, name, f"the UID in the precondition ({pre['uid']}) does not match the UID in "
                f"record ({meta.get('uid')}). The object might have been deleted and then "
                "recreated")
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
            raise precondition_failed(
                rt, name, f"the ResourceVersion in the precondition ({pre['resourceVersion']}) "
                f"does not match the ResourceVersion in record ({meta['resourceVersion']}). The "
                "object might have been modified")
        policy = opts.get("propagationPolicy")
        if policy is None and opts.get("orphanDependents") is True:
            policy = "Orphan"
        if policy not in (None, "Orphan", "Background", "Foreground"):
            raise invalid(rt, name, [FieldError(
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
                return as_version(rt, marked), False
            cur = self.store.put(rt.store_key, marked).obj
            if not meta.get("deletionTimestamp"):
                if policy == "Orphan":
                    orphan(self, meta.get("uid", ""))
                if rt.store_key == NS_KEY:
                    later(lambda: purge_namespace(self, name))
        if dry_run or not plan.remove:
            return as_version(rt, cur), False
        gone = self.store.remove(rt.store_key, ns, name)
        assert gone is not None
        after_removal(self, gone, policy)
        return as_version(rt, gone.obj), True

    def _grace_option(self, opts: JSON) -> int | None:
        """``gracePeriodSeconds`` from the body or the query (a string there)."""
        value = opts.get("gracePeriodSeconds")
        if value is None:
            return None
        try:
            return int(value)
        except (TypeError, ValueError):
            raise bad_request(f"invalid gracePeriodSeconds: {value}") from None

    # ------------------------------------------------------------------ pods/binding
    def bind(self, rt: ResourceType, ns: str, name: str, body: Any) -> JSON:
        """POST pods/NAME/binding: what the scheduler does to place a pod."""
        pod = self.store.get(rt.store_key, ns, name)
        if pod is None:
            raise not_found(rt, name)
        if not isinstance(body, dict) or not (body.get("target") or {}).get("name"):
            raise invalid(rt, name, [FieldError("target.name", "FieldValueRequired", "")])
        node = body["target"]["name"]
        if pod.get("spec", {}).get("nodeName"):
            raise ApiError(status(
                409, "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is already '
                f'assigned to node "{pod["spec"]["nodeName"]}"', name=name, kind="pods/binding"))
        if pod["metadata"].get("deletionTimestamp"):
            raise conflict(rt, name, "pod is being deleted, cannot be assigned to a host")
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


def _check_update_preconditions(rt: ResourceType, ns: str, name: str, meta: JSON,
                                old_meta: JSON) -> None:
    """The body must name the URL's object, and its resourceVersion and uid (when given;
    the resourceVersion is required for kinds without unconditional updates) must be the
    stored ones."""
    if meta.get("name") not in (None, "", name):
        raise bad_request(f"the name of the object ({meta['name']}) does not match the "
                          f"name on the URL ({name})")
    if rt.namespaced and meta.get("namespace") not in (None, "", ns):
        raise bad_request("the namespace of the provided object does not match the "
                          "namespace sent on the request")
    rv = meta.get("resourceVersion")
    if not rv and not rt.unconditional_update:
        # genericregistry.Store.Update: the Invalid names the resource, not the kind.
        raise ApiError(invalid_status(rt.plural, rt.group, name, [FieldError(
            "metadata.resourceVersion", INVALID, "must be specified for an update", 0,
            True)]))
    if rv and str(rv) != old_meta["resourceVersion"]:
        raise conflict(rt, name)
    if meta.get("uid") and meta["uid"] != old_meta.get("uid"):
        raise conflict(rt, name, f"Precondition failed: UID in precondition: "
                                 f"{meta['uid']}, UID in object meta: {old_meta['uid']}")


def _status_write(old: JSON, new: JSON) -> JSON:
    """Writes to /status change only .status: the stored object with the body's status."""
    result = dict(old)
    result["metadata"] = dict(old["metadata"])
    if "status" in new:
        result["status"] = new["status"]
    else:
        result.pop("status", None)
    return result


def _keep_server_fields(rt: ResourceType, ns: str, name: str, old: JSON, new: JSON) -> None:
    """A main-resource write keeps (in ``new``, in place) what clients cannot change there:
    the status (when it is a subresource), identity, and the server-managed metadata."""
    if rt.has_status:
        if "status" in old:
            new["status"] = old["status"]
        else:
            new.pop("status", None)
    meta, old_meta = new["metadata"], old["metadata"]
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


def _check_no_new_finalizers(rt: ResourceType, name: str, meta: JSON, old_meta: JSON) -> None:
    """An object being deleted may lose finalizers but not gain any."""
    added = [f for f in meta.get("finalizers") or []
             if f not in (old_meta.get("finalizers") or [])]
    if added:
        go_list = "[]string{" + ", ".join(json.dumps(f) for f in added) + "}"
        raise invalid(rt, name, [FieldError(
            "metadata.finalizers", FORBIDDEN,
            f"no new finalizers can be added if the object is being deleted, found new "
            f"finalizers {go_list}")])


def _generation_changes(rt: ResourceType, new: JSON, old: JSON) -> bool:
    """Whether the write bumps metadata.generation (the caller skips /status writes)."""
    if rt.crd is not None:
        # customResourceStrategy.PrepareForUpdate: any change outside metadata bumps it
        # (a status change too, when there is no status subresource).
        return any(new.get(k) != old.get(k) for k in new.keys() | old.keys()
                   if k != "metadata")
    return _spec_part(new) != _spec_part(old)


def _spec_part(obj: JSON) -> object:
    if "spec" in obj:
        return obj["spec"]
    return {k: v for k, v in obj.items()
            if k not in ("metadata", "status", "apiVersion", "kind")}


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
