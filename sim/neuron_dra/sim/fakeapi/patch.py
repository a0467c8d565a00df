"""PATCH semantics: JSON merge patch, JSON patch, strategic merge patch and server-side apply.

Strategic merge and apply are approximations of the real algorithms, driven by a
table of well-known list fields and their merge keys instead of Go struct tags /
OpenAPI extensions. That covers the lists our code and kubectl touch (conditions,
containers, ownerReferences, finalizers, ...); every other list is atomic.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import jsonpatch

JSON = dict[str, Any]

# Lists merged by a key when patched strategically / applied. Keyed by the field name,
# which is unambiguous for the objects this fake serves.
MERGE_KEYS: dict[str, str] = {
    "conditions": "type",
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
    "resourceClaims": "name",
    "resourceClaimStatuses": "name",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "hostAliases": "ip",
}
# Primitive lists with patchStrategy "merge" (set union).
SET_LISTS = frozenset({"finalizers"})


class PatchError(ValueError):
    """The patch cannot be applied; ``code`` is the HTTP status the real server uses."""

    def __init__(self, message: str, code: int = 422) -> None:
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------- RFC 7386


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch; returns a new value and never mutates ``target``."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result: JSON = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            result[key] = merge_patch(result.get(key), value)
        else:
            result[key] = copy.deepcopy(value)
    return result


# --------------------------------------------------------------------------- RFC 6902


def json_patch(target: JSON, ops: Any) -> JSON:
    if not isinstance(ops, list):
        # The real server's words (Go's decoder); kubernetes_asyncio sends a dict body as
        # json-patch unless _content_type says merge-patch, so people will see this one.
        kind = "object" if isinstance(ops, dict) else type(ops).__name__
        raise PatchError(f"json: cannot unmarshal {kind} into Go value of type jsonpatch.Patch",
                         400)
    try:
        patch = jsonpatch.JsonPatch(ops)
        result = patch.apply(target, in_place=False)
    except jsonpatch.JsonPatchTestFailed as exc:
        raise PatchError(f"the server rejected our request due to an error in our request: "
                         f"{exc}") from None
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
        raise PatchError(str(exc)) from None
    except (TypeError, KeyError, IndexError) as exc:
        raise PatchError(f"invalid json patch: {exc}", 400) from None
    if not isinstance(result, dict):
        raise PatchError("json patch produced a non-object document")
    return result


# --------------------------------------------------------------------------- strategic merge


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Strategic merge patch approximated with the MERGE_KEYS/SET_LISTS table."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result: JSON = dict(target) if isinstance(target, dict) else {}
    # `$deleteFromPrimitiveList/<field>` and `$setElementOrder/<field>` are directives
    # kubectl sends; $retainKeys lists the keys to keep.
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            current = result.get(field)
            if isinstance(current, list) and isinstance(value, list):
                result[field] = [v for v in current if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = strategic_merge_patch(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            result[key] = value
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [copy.deepcopy(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    if field in SET_LISTS:
        out = list(current) if isinstance(current, list) else []
        for item in patch:
            if item not in out:
                out.append(item)
        return out
    key = MERGE_KEYS.get(field)
    if key is None or not isinstance(current, list) or not all(
        isinstance(p, dict) for p in patch
    ):
        return [copy.deepcopy(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    out = list(current)
    for item in patch:
        k = item.get(key)
        idx = next(
            (i for i, c in enumerate(out) if isinstance(c, dict) and c.get(key) == k), None
        )
        if item.get("$patch") == "delete":
            if idx is not None:
                del out[idx]
            continue
        if idx is None:
            out.append(strategic_merge_patch({}, item))
        else:
            out[idx] = strategic_merge_patch(out[idx], item)
    return out


# --------------------------------------------------------------------------- server-side apply

# A managed field path: a tuple of "f:<field>" / "k:<json key>" / "v:<json value>" segments,
# the notation of FieldsV1 in managedFields.
FieldPath = tuple[str, ...]


def _key_segment(key: str, item: JSON) -> str:
    return "k:" + json.dumps({key: item.get(key)}, separators=(",", ":"), sort_keys=True)


def field_paths(obj: Any, prefix: FieldPath = ()) -> Iterator[FieldPath]:
    """Leaf paths owned by an applied configuration (maps recurse, keyed lists recurse)."""
    if not isinstance(obj, dict):
        return
    for k, v in obj.items():
        if not prefix and k in ("apiVersion", "kind"):
            continue
        if prefix == ("f:metadata",) and k not in ("labels", "annotations", "finalizers",
                                                   "ownerReferences"):
            continue
        path = (*prefix, f"f:{k}")
        if isinstance(v, dict) and v:
            yield from field_paths(v, path)
        elif isinstance(v, list) and k in MERGE_KEYS and v and all(
            isinstance(i, dict) for i in v
        ):
            key = MERGE_KEYS[k]
            for item in v:
                sub = (*path, _key_segment(key, item))
                yield sub
                yield from field_paths(item, sub)
        elif isinstance(v, list) and k in SET_LISTS:
            for item in v:
                yield (*path, "v:" + json.dumps(item))
        else:
            yield path


def paths_to_fields_v1(paths: Iterator[FieldPath] | list[FieldPath]) -> JSON:
    """Render a path set as a FieldsV1 tree (``{"f:spec": {"f:x": {}}}``)."""
    root: JSON = {}
    for path in paths:
        node = root
        for seg in path:
            node = node.setdefault(seg, {})
        if path and path[-1].startswith("k:"):
            node["."] = {}
    return root


def fields_v1_to_paths(tree: JSON, prefix: FieldPath = ()) -> set[FieldPath]:
    out: set[FieldPath] = set()
    for seg, sub in tree.items():
        if seg == ".":
            out.add(prefix)
            continue
        path = (*prefix, seg)
        if isinstance(sub, dict) and any(k != "." for k in sub):
            out |= fields_v1_to_paths(sub, path)
            if "." in sub:
                out.add(path)
        else:
            out.add(path)
    return out


def get_path(obj: Any, path: FieldPath) -> tuple[bool, Any]:
    """Value at ``path``; (False, None) when absent."""
    cur = obj
    parent_field = ""
    for seg in path:
        kind, _, rest = seg.partition(":")
        if kind == "f":
            if not isinstance(cur, dict) or rest not in cur:
                return False, None
            cur = cur[rest]
            parent_field = rest
        elif kind == "k":
            if not isinstance(cur, list):
                return False, None
            want = json.loads(rest)
            key = MERGE_KEYS.get(parent_field, next(iter(want)))
            cur = next((i for i in cur if isinstance(i, dict) and i.get(key) == want[key]),
                       _MISSING)
            if cur is _MISSING:
                return False, None
        elif kind == "v":
            if not isinstance(cur, list) or json.loads(rest) not in cur:
                return False, None
            return True, json.loads(rest)
    return True, cur


_MISSING: Any = object()


def remove_path(obj: Any, path: FieldPath) -> None:
    """Delete the value at ``path`` in place (no-op when absent)."""
    if not path:
        return
    ok, parent = get_path(obj, path[:-1])
    if not ok:
        return
    kind, _, rest = path[-1].partition(":")
    if kind == "f" and isinstance(parent, dict):
        parent.pop(rest, None)
    elif kind in ("k", "v") and isinstance(parent, list):
        if kind == "v":
            val = json.loads(rest)
            parent[:] = [i for i in parent if i != val]
        else:
            want = json.loads(rest)
            (key, val), = want.items()
            parent[:] = [i for i in parent if not (isinstance(i, dict) and i.get(key) == val)]


def apply_merge(current: Any, applied: Any, field: str = "") -> Any:
    """Merge an applied configuration into the live object (list-maps by key)."""
    if isinstance(applied, dict):
        result: JSON = dict(current) if isinstance(current, dict) else {}
        for k, v in applied.items():
            if v is None:
                result.pop(k, None)
            else:
                result[k] = apply_merge(result.get(k), v, k)
        return result
    if isinstance(applied, list):
        if field in SET_LISTS and isinstance(current, list):
            return list(current) + [i for i in applied if i not in current]
        key = MERGE_KEYS.get(field)
        if key and isinstance(current, list) and all(isinstance(i, dict) for i in applied):
            out = list(current)
            for item in applied:
                idx = next((i for i, c in enumerate(out)
                            if isinstance(c, dict) and c.get(key) == item.get(key)), None)
                if idx is None:
                    out.append(copy.deepcopy(item))
                else:
                    out[idx] = apply_merge(out[idx], item, "")
            return out
        return copy.deepcopy(applied)
    return copy.deepcopy(applied)


class ApplyConflict(PatchError):
    """Conflicting field ownership, worded like structured-merge-diff's conflict errors."""

    def __init__(self, conflicts: list[tuple[str, FieldPath]]) -> None:
        n = len(conflicts)
        if n == 1:
            manager, path = conflicts[0]
            message = f"Apply failed with 1 conflict: conflict with {json.dumps(manager)}: " + (
                dotted_path(path))
        else:
            by_manager: dict[str, list[FieldPath]] = {}
            for manager, path in conflicts:
                by_manager.setdefault(manager, []).append(path)
            lines: list[str] = []
            for manager in sorted(by_manager):
                lines.append(f"conflicts with {json.dumps(manager)}:")
                lines.extend(f"- {dotted_path(p)}" for p in by_manager[manager])
            message = f"Apply failed with {n} conflicts: " + "\n".join(lines)
        super().__init__(message, 409)
        self.conflicts = conflicts

    def causes(self) -> list[JSON]:
        """``details.causes`` of the 409: one FieldManagerConflict per conflicting field."""
        return [{"reason": "FieldManagerConflict",
                 "message": f"conflict with {json.dumps(manager)}",
                 "field": dotted_path(path)} for manager, path in self.conflicts]


def dotted_path(path: FieldPath) -> str:
    """A managed-fields path the way fieldpath.Path prints it: ``.spec.containers[name="c"]``,
    ``.metadata.finalizers[="x"]``."""
    out = ""
    for seg in path:
        kind, _, rest = seg.partition(":")
        if kind == "f":
            out += f".{rest}"
        elif kind == "k":
            keys = json.loads(rest)
            out += "[" + ",".join(f"{k}={json.dumps(v, separators=(',', ':'))}"
                                  for k, v in sorted(keys.items())) + "]"
        elif kind == "v":
            out += f"[={rest}]"
        else:
            out += f"[{rest}]"
    return out


def server_side_apply(
    live: JSON | None,
    applied: JSON,
    *,
    manager: str,
    force: bool,
    now: str,
    api_version: str,
) -> JSON:
    """Merge ``applied`` into ``live`` the way server-side apply would (approximately).

    Ownership is tracked per leaf path in ``metadata.managedFields`` (Apply entries
    only). A path owned by another applier with a different value conflicts (409)
    unless ``force``; paths this manager applied before but no longer does are removed
    when nobody else owns them, which is what makes apply declarative.
    """
    base: JSON = copy.deepcopy(live) if live is not None else {}
    new_paths = set(field_paths(applied))
    managed: list[JSON] = list(base.get("metadata", {}).get("managedFields") or [])
    mine_before: set[FieldPath] = set()
    others: list[tuple[JSON, set[FieldPath]]] = []
    for entry in managed:
        paths = fields_v1_to_paths(entry.get("fieldsV1") or {})
        if entry.get("manager") == manager and entry.get("operation") == "Apply":
            mine_before = paths
        else:
            others.append((entry, paths))
    conflicts: list[tuple[str, FieldPath]] = []
    for entry, paths in others:
        if entry.get("operation") != "Apply":
            continue
        for p in sorted(paths & new_paths):
            ok_live, live_val = get_path(base, p)
            _, new_val = get_path(applied, p)
            if ok_live and live_val != new_val and not isinstance(new_val, dict):
                conflicts.append((str(entry.get("manager")), p))
    if conflicts and not force:
        raise ApplyConflict(conflicts)
    owned_by_others = set().union(*(p for _, p in others)) if others else set()
    for p in sorted(mine_before - new_paths - owned_by_others, key=len, reverse=True):
        remove_path(base, p)
    result = apply_merge(base, applied)
    if not isinstance(result, dict):
        raise PatchError("apply produced a non-object document", 400)
    new_managed: list[JSON] = []
    conflict_paths = {p for _, p in conflicts}
    for entry, paths in others:
        if force and conflict_paths & paths:
            remaining = paths - conflict_paths
            if not remaining:
                continue
            entry = {**entry, "fieldsV1": paths_to_fields_v1(sorted(remaining))}
        new_managed.append(entry)
    new_managed.append(
        {
            "manager": manager,
            "operation": "Apply",
            "apiVersion": api_version,
            "time": now,
            "fieldsType": "FieldsV1",
            "fieldsV1": paths_to_fields_v1(sorted(new_paths)),
        }
    )
    result.setdefault("metadata", {})["managedFields"] = new_managed
    return result
