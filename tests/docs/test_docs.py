"""The reference docs keep up with the code: every flag, env var and metric is documented, and
nothing documented has disappeared from the code.

Flags come from the real argparse parsers (importing the entry-point modules has no side
effects); metric names are read from the source with ``ast`` (every ``prometheus_client``
Counter/Gauge/Histogram/Summary constructed with a literal name), so a metric added anywhere
is caught without having to run the component that registers it.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from neuron_dra.controller import main as controller_main
from neuron_dra.nodeplugin import main as plugin_main
from neuron_dra.sim import cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PACKAGES = [ROOT / "common", ROOT / "controller", ROOT / "nodeplugin"]
METRIC_TYPES = {"Counter", "Gauge", "Histogram", "Summary"}


def _long_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {
        flag
        for action in parser._actions
        for flag in action.option_strings
        if flag.startswith("--") and flag != "--help"
    }


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _section(text: str, heading: str) -> str:
    """The body of the markdown section whose heading line contains ``heading`` (up to the
    next heading of the same or a higher level)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("#") and heading in line:
            level = len(line) - len(line.lstrip("#"))
            body = []
            for nxt in lines[i + 1 :]:
                if nxt.startswith("#") and len(nxt) - len(nxt.lstrip("#")) <= level:
                    break
                body.append(nxt)
            return "\n".join(body)
    raise AssertionError(f"docs/configuration.md has no section titled {heading!r}")


@pytest.fixture(scope="module")
def configuration() -> str:
    return (DOCS / "configuration.md").read_text(encoding="utf-8")


def _missing(flags: set[str] | list[str], text: str) -> list[str]:
    return sorted(f for f in flags if f"`{f}" not in text)


def test_every_kubelet_plugin_flag_is_documented(configuration: str) -> None:
    section = _section(configuration, "neuron-dra-kubelet-plugin")
    flags = _long_flags(plugin_main.build_parser())
    assert "--emulation-mode" in flags  # the parser is the one we think it is
    assert _missing(flags, section) == []


def test_every_kubelet_plugin_env_var_is_documented(configuration: str) -> None:
    source = Path(plugin_main.__file__).read_text(encoding="utf-8")
    env_vars = set(re.findall(r'_env\(\s*"([A-Z0-9_]+)"', source))
    assert {"NODE_NAME", "NEURON_DRA_DRIVER_EMULATION_MODE"} <= env_vars
    section = _section(configuration, "neuron-dra-kubelet-plugin")
    assert sorted(v for v in env_vars if f"`{v}`" not in section) == []


def test_every_controller_flag_is_documented(configuration: str) -> None:
    section = _section(configuration, "neuron-dra-controller")
    flags = _long_flags(controller_main.build_parser())
    assert "--leader-elect" in flags
    assert _missing(flags, section) == []


def test_every_cli_subcommand_and_flag_is_documented(configuration: str) -> None:
    subcommands = _subparsers(cli._parser())
    assert {"sim", "fake-apiserver", "check-claim"} <= set(subcommands)
    # Flags every command shares (logging) are documented once, before the first command.
    tool = _section(configuration, "`neuron-dra` (tool)")
    shared = tool.split("\n### ", 1)[0]
    missing: dict[str, list[str]] = {}
    for name, parser in subcommands.items():
        section = _section(configuration, f"neuron-dra {name}")
        gaps = _missing(_missing(_long_flags(parser), section), shared)
        if gaps:
            missing[name] = gaps
    assert missing == {}


def _prometheus_names(tree: ast.Module) -> dict[str, str]:
    """Local name -> metric type for names this module imports from prometheus_client."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "prometheus_client":
            for alias in node.names:
                if alias.name in METRIC_TYPES:
                    out[alias.asname or alias.name] = alias.name
    return out


def _registered_metrics() -> Iterator[tuple[str, str, Path]]:
    """(exposed name, type, file) for every metric constructed with a literal name."""
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            local = _prometheus_names(tree)
            if not local:
                continue
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                    continue
                kind = local.get(node.func.id)
                if kind is None:
                    continue
                first = node.args[0] if node.args else None
                assert isinstance(first, ast.Constant) and isinstance(first.value, str), (
                    f"{path}:{node.lineno}: metric name is not a string literal; "
                    "this test cannot check it"
                )
                name = first.value
                # prometheus_client exposes counters with a _total suffix (added if missing).
                if kind == "Counter" and not name.endswith("_total"):
                    name += "_total"
                yield name, kind, path


def test_every_metric_is_documented() -> None:
    text = (DOCS / "metrics.md").read_text(encoding="utf-8")
    metrics = list(_registered_metrics())
    names = {name for name, _, _ in metrics}
    assert "neuron_dra_prepare_seconds" in names  # the scan found the plugin's metrics
    assert "neuron_dra_workqueue_depth" in names  # ... and the controller's
    undocumented = sorted(
        f"{name} ({kind}, {path.relative_to(ROOT)})"
        for name, kind, path in metrics
        if f"`{name}`" not in text
    )
    assert undocumented == []


def test_every_documented_metric_exists() -> None:
    text = (DOCS / "metrics.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"`(neuron_dra_[a-z0-9_]+)`", text))
    registered = {name for name, _, _ in _registered_metrics()}
    # Names used in prose may carry a sample suffix (`..._bucket`) of a histogram.
    suffixes = ("_bucket", "_sum", "_count", "_created")
    stale = sorted(
        n
        for n in documented
        if n not in registered
        and not any(n.endswith(s) and n[: -len(s)] in registered for s in suffixes)
    )
    assert stale == []
