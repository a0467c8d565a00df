"""Server-side printing (``kubectl get``): the printer-column JSONPath subset, kubectl's
age format, and the ``meta.k8s.io/v1`` Table the server answers ``Accept: as=Table`` with."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from .resource_types import PrinterColumn, ResourceType
from .store import JSON


def _parse_path(path: str) -> list[str]:
    """Split the printer-column JSONPath subset (``.a.b``, ``.a[*].b``, ``.a[0]``, ``{...}``)."""
    p = path.strip()
    if p.startswith("{") and p.endswith("}"):
        p = p[1:-1]
    out: list[str] = []
    for part in p.lstrip(".").split("."):
        if not part:
            continue
        while "[" in part:
            head, _, rest = part.partition("[")
            if head:
                out.append(head)
            idx, _, part = rest.partition("]")
            out.append(f"[{idx}]")
        if part:
            out.append(part)
    return out


def eval_jsonpath(obj: Any, path: str) -> list[Any]:
    """All values at ``path`` (empty list when the path does not resolve)."""
    current: list[Any] = [obj]
    for seg in _parse_path(path):
        nxt: list[Any] = []
        for v in current:
            if seg.startswith("["):
                if not isinstance(v, list):
                    continue
                idx = seg[1:-1]
                if idx == "*":
                    nxt.extend(v)
                else:
                    try:
                        nxt.append(v[int(idx)])
                    except (ValueError, IndexError):
                        continue
            elif isinstance(v, dict) and seg in v:
                nxt.append(v[seg])
        current = nxt
    return current


def human_duration(seconds: float) -> str:
    """kubectl's age format (apimachinery duration.HumanDuration)."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rem = s % 60
        return f"{minutes}m{rem}s" if rem else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        rem_m = (s % 3600) // 60
        return f"{hours}h{rem_m}m" if rem_m else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 192:
        rem_h = hours % 24
        return f"{hours // 24}d{rem_h}h" if rem_h else f"{hours // 24}d"
    days = hours // 24
    if days < 365 * 2:
        return f"{days}d"
    years, rem_d = days // 365, days % 365
    if years < 8:
        return f"{years}y{rem_d}d" if rem_d else f"{years}y"
    return f"{years}y"


def parse_time(value: str) -> datetime | None:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None


def age_of(obj: dict[str, Any], now: datetime) -> str:
    ts = parse_time(obj.get("metadata", {}).get("creationTimestamp", ""))
    return "<unknown>" if ts is None else human_duration((now - ts).total_seconds())


AGE = PrinterColumn(
    name="Age",
    type="string",
    description="CreationTimestamp is a timestamp representing the server time when this "
    "object was created.",
    func=age_of,
)


def cell_value(col: PrinterColumn, obj: dict[str, Any], now: datetime) -> Any:
    """A Table cell as the real server renders it (dates become ages)."""
    if col.func is not None:
        return col.func(obj, now)
    if not col.json_path:
        return None
    values = eval_jsonpath(obj, col.json_path)
    if not values:
        return None
    if col.type == "date":
        ts = parse_time(values[0]) if isinstance(values[0], str) else None
        return "<unknown>" if ts is None else human_duration((now - ts).total_seconds())
    if len(values) == 1:
        v = values[0]
        if isinstance(v, (dict, list)):
            return json.dumps(v, separators=(",", ":"))
        if col.type == "string" and not isinstance(v, str):
            return json.dumps(v) if isinstance(v, bool) else str(v)
        return v
    return ",".join(v if isinstance(v, str) else json.dumps(v) for v in values)


NAME_COLUMN = PrinterColumn(
    name="Name", type="string", format="name",
    description="Name must be unique within a namespace. Is required when creating resources, "
    "although some resources may allow a client to request the generation of an appropriate "
    "name automatically. Name is primarily intended for creation idempotence and configuration "
    "definition. Cannot be updated. More info: "
    "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
)


def table(rt: ResourceType, objs: list[JSON], rv: str | None, include: str | None,
          now: datetime) -> JSON:
    """The Table of ``objs``; ``include`` is the includeObject query (Object, None, or the
    default Metadata)."""
    cols = (NAME_COLUMN, *(rt.printer_columns or (AGE,)))
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
