"""check-claim's output: a claim's report as text or as JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TextIO

from neuron_dra.common.constants import DRIVER_NAME
from neuron_dra.sim.commands.check_claim.allocation import ClaimReport
from neuron_dra.sim.commands.check_claim.inputs import as_dict, as_list
from neuron_dra.sim.commands.check_claim.nodes import names_list


def _config_line(entry: Mapping[str, Any]) -> str:
    opaque = as_dict(entry.get("opaque"))
    params = as_dict(opaque.get("parameters"))
    source = "class" if entry.get("source") == "FromClass" else "claim"
    requests = as_list(entry.get("requests"))
    scope = f"requests {', '.join(map(str, requests))}" if requests else "all requests"
    driver = str(opaque.get("driver", ""))
    if driver == DRIVER_NAME and params.get("kind"):
        settings = ", ".join(
            f"{k}: {json.dumps(v)}" for k, v in params.items() if k not in ("apiVersion", "kind")
        )
        body = f"{params['kind']} {settings}".strip()
    else:
        body = f"driver {driver}: {json.dumps(params, sort_keys=True)}"
    return f"config from {source} for {scope}: {body}"


def render_text(report: ClaimReport, out: TextIO, *, show_file: bool = False) -> None:
    where = f" ({report.file})" if show_file and report.file else ""
    if report.error is not None:
        print(f"{report.doc.label}{where}: cannot be allocated: {report.error}", file=out)
        return
    fitting = [n for n in report.nodes if n.fits]
    failing = [n for n in report.nodes if not n.fits]
    total = len(report.nodes)
    if fitting:
        print(f"{report.doc.label}{where}: fits on {len(fitting)} of {total} nodes", file=out)
    else:
        print(f"{report.doc.label}{where}: does not fit on any of {total} nodes", file=out)
    chosen = report.chosen
    if chosen is not None and chosen.result is not None:
        kind = chosen.instance_type
        shown = f" ({kind})" if kind and kind != chosen.node else ""
        print(f"  node {chosen.node}{shown}:", file=out)
        by_request: dict[str, list[str]] = {}
        for d in chosen.result.devices:
            by_request.setdefault(d.request, []).append(d.device)
        for request, names in by_request.items():
            print(f"    request {request}: {', '.join(names)}", file=out)
        for entry in as_list(as_dict(chosen.result.allocation.get("devices")).get("config")):
            print(f"    {_config_line(as_dict(entry))}", file=out)
        for warning in chosen.result.warnings:
            print(f"    warning: {warning}", file=out)
        others = [n.node for n in fitting[1:]]
        if others:
            print(f"  also fits on: {names_list(others)}", file=out)
    groups: dict[tuple[str, ...], list[str]] = {}
    for n in failing:
        groups.setdefault(n.reasons, []).append(n.node)
    for reasons, names in groups.items():
        prefix = "not on " if fitting else ""
        label = f"node {names[0]}" if len(names) == 1 else f"nodes {names_list(names)}"
        print(f"  {prefix}{label}: {'; '.join(reasons)}", file=out)
    for hint in report.hints:
        print(f"  {hint}", file=out)


def report_json(report: ClaimReport) -> dict[str, Any]:
    nodes = []
    for n in report.nodes:
        entry: dict[str, Any] = {"node": n.node, "instanceType": n.instance_type, "fits": n.fits}
        if n.result is not None:
            entry["devices"] = [
                {"request": d.request, "driver": d.driver, "pool": d.pool, "device": d.device}
                for d in n.result.devices
            ]
            entry["allocation"] = n.result.allocation
            if n.result.warnings:
                entry["warnings"] = list(n.result.warnings)
        if n.reasons:
            entry["reasons"] = list(n.reasons)
        nodes.append(entry)
    chosen = report.chosen
    return {
        "file": report.file,
        "kind": report.doc.kind,
        "namespace": report.doc.namespace,
        "name": report.doc.name,
        "fits": report.fits,
        "node": chosen.node if chosen is not None else None,
        "error": report.error,
        "nodes": nodes,
        "hints": report.hints,
    }
