"""docs/architecture.md's import rules hold for every module of every room.

The rules are read from the doc's ``import-rules`` table, so the doc and the code cannot drift
apart: a new import that breaks a rule fails here, and so does a rule nobody can satisfy. Every
``import``/``from`` statement counts, including those inside functions (a lazy import is still
a dependency), and so does any string that names a module of a forbidden room (an
``importlib.import_module("neuron_dra.sim...")`` would otherwise dodge the check).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
# The top-level folder of each room; the package inside is neuron_dra.<room>.
ROOMS = ("proto", "common", "controller", "nodeplugin", "sim")
PRODUCT_ROOMS = ("proto", "common", "controller", "nodeplugin")
GENERATED = re.compile(r"_pb2(_grpc)?\.pyi?$")


@dataclass(frozen=True)
class Rule:
    code: str  # a package or module, e.g. neuron_dra.sim.fakeapi
    allowed: frozenset[str]  # rooms/packages of neuron_dra it may import, besides itself
    stdlib_only: bool


def read_rules(text: str) -> list[Rule]:
    block = re.search(r"<!-- import-rules -->(.*?)<!-- /import-rules -->", text, re.S)
    assert block, "docs/architecture.md lost its <!-- import-rules --> table"
    rules = []
    for line in block.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            continue
        codes = re.findall(r"`([\w.]+)`", cells[0])
        allowed = frozenset("neuron_dra." + m for m in re.findall(r"`([\w.]+)`", cells[1]))
        stdlib_only = "only the standard library" in cells[1]
        # A row's modules may import each other (the build modules share code).
        own_row = frozenset(codes)
        rules.extend(Rule(code, allowed | own_row, stdlib_only) for code in codes)
    assert rules, "the import-rules table has no rows"
    return rules


def module_name(path: Path) -> str:
    room_dir = path.relative_to(ROOT).parts[0]
    parts = list(path.relative_to(ROOT / room_dir).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> list[Path]:
    return [
        path
        for room in ROOMS
        for path in sorted((ROOT / room / "neuron_dra").rglob("*.py"))
        if not GENERATED.search(path.name)
    ]


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def rule_for(module: str, rules: list[Rule]) -> Rule:
    matching = [r for r in rules if _within(module, r.code)]
    assert matching, f"{module}: no row of the import-rules table covers it"
    return max(matching, key=lambda r: len(r.code))


def imported_names(tree: ast.AST, module: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the tree, relative ones resolved."""
    package = module.rsplit(".", 1)[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            # `from neuron_dra.sim import paths` depends on neuron_dra.sim.paths (a submodule
            # or a name in the package: either way, what the rule is about).
            out.extend(
                (node.lineno, name if a.name == "*" else f"{name}.{a.name}") for a in node.names
            )
    return out


def module_strings(tree: ast.AST) -> list[tuple[int, str]]:
    return [
        (node.lineno, m)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        for m in re.findall(r"\bneuron_dra(?:\.\w+)+", node.value)
    ]


def source_violations(source: str, module: str, where: str, rules: list[Rule]) -> list[str]:
    """What in ``source`` (the text of ``module``) breaks the rules; ``where`` names it."""
    rule = rule_for(module, rules)
    tree = ast.parse(source, filename=where)
    out = []
    for line, name in imported_names(tree, module):
        top = name.split(".")[0]
        if top == "neuron_dra":
            if name == "neuron_dra" or _within(name, rule.code):
                continue
            if not any(_within(name, allowed) for allowed in rule.allowed):
                out.append(f"{where}:{line}: imports {name} (rule for {rule.code})")
        elif rule.stdlib_only and top not in sys.stdlib_module_names and top != "__future__":
            out.append(f"{where}:{line}: imports {name}, not the standard library")
    for line, name in module_strings(tree):
        if any(_within(name, f"neuron_dra.{room}") for room in ROOMS) and not (
            _within(name, rule.code) or any(_within(name, a) for a in rule.allowed)
        ):
            out.append(f"{where}:{line}: names {name} in a string (rule for {rule.code})")
    return out


def violations(path: Path, rules: list[Rule]) -> list[str]:
    source = path.read_text(encoding="utf-8")
    return source_violations(source, module_name(path), str(path.relative_to(ROOT)), rules)


RULES = read_rules(DOC.read_text(encoding="utf-8"))


def test_every_module_keeps_the_import_rules() -> None:
    modules = package_modules()
    assert len(modules) > 100, "the walk found too few modules; is ROOT right?"
    problems = [v for path in modules for v in violations(path, RULES)]
    assert not problems, "imports that break docs/architecture.md's rules:\n" + "\n".join(problems)


def test_product_rooms_never_name_the_simulation() -> None:
    # The table's most important row, stated on its own so that a loosened table cannot
    # silently allow it: no product module may depend on neuron_dra.sim.
    for room in PRODUCT_ROOMS:
        rule = rule_for(f"neuron_dra.{room}", RULES)
        assert not any(_within(a, "neuron_dra.sim") for a in rule.allowed), rule


@pytest.mark.parametrize(
    ("source", "module", "expected"),
    [
        ("from neuron_dra.sim.fakeapi.server import FakeAPIServer", "neuron_dra.common.x", 1),
        ("def f():\n    import neuron_dra.sim\n", "neuron_dra.controller.y", 1),
        ("from neuron_dra import sim\n", "neuron_dra.nodeplugin.z", 1),
        ("M = 'neuron_dra.sim.cli'\n", "neuron_dra.common.x", 1),
        ("from ..controller import manager\n", "neuron_dra.nodeplugin.z", 1),
        ("from .store import Store\n", "neuron_dra.sim.fakeapi.server", 0),
        ("from neuron_dra.controller import manager\n", "neuron_dra.sim.fakeapi.server", 1),
        ("from neuron_dra.common import names\n", "neuron_dra.controller.y", 0),
        ("import yaml\n", "neuron_dra.sim.kubebuild", 1),
        ("import hashlib, subprocess\n", "neuron_dra.sim.kubebuild", 0),
    ],
)
def test_the_check_can_fail(source: str, module: str, expected: int) -> None:
    """The checker finds each kind of forbidden import (and allows the allowed ones)."""
    found = source_violations(source, module, f"<{module}>", RULES)
    assert len(found) == expected, found


def test_build_modules_import_without_a_virtualenv() -> None:
    """hack/k8s/build and hack/bench/build-peer put sim/ on sys.path and import these with a
    bare python3 before any virtualenv exists: an isolated interpreter (no site-packages) must
    import them."""
    stdlib_only = [r.code for r in RULES if r.stdlib_only]
    present = [
        m for m in stdlib_only if (ROOT / "sim" / Path(*m.split("."))).with_suffix(".py").exists()
    ]
    assert "neuron_dra.sim.kubebuild" in present
    code = f"import sys; sys.path.insert(0, {str(ROOT / 'sim')!r}); " + "; ".join(
        f"import {m}" for m in present
    )
    subprocess.run([sys.executable, "-I", "-S", "-c", code], check=True, timeout=60)


def test_the_product_wheel_leaves_the_simulation_out() -> None:
    product = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    included = product["tool"]["hatch"]["build"]["targets"]["wheel"]["only-include"]
    assert sorted(included) == sorted(f"{room}/neuron_dra" for room in PRODUCT_ROOMS)
    assert "neuron-dra" not in product["project"]["scripts"]
    sim = tomllib.loads((ROOT / "sim" / "pyproject.toml").read_text(encoding="utf-8"))
    assert sim["project"]["scripts"]["neuron-dra"] == "neuron_dra.sim.cli:main"
    assert sim["project"]["dependencies"][0] == f"neuron-dra=={product['project']['version']}"


def _dist(requirement: str) -> str:
    name = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert name, requirement
    return re.sub(r"[-_.]+", "-", name.group(0)).lower()


def _closure(dists: set[str]) -> set[str]:
    """The distributions ``dists`` install, their own requirements included (extras aside)."""
    seen: set[str] = set()
    todo = list(dists)
    while todo:
        dist = todo.pop()
        if dist in seen:
            continue
        try:
            requires = importlib.metadata.requires(dist) or []
        except importlib.metadata.PackageNotFoundError:  # a marker left it out here
            continue
        seen.add(dist)
        for req in requires:
            if "extra ==" not in req:
                todo.append(_dist(req))
    return seen


def test_the_product_declares_what_it_imports_and_nothing_else() -> None:
    """The image installs the product's dependencies on every node: each must be imported by
    product code (anyio, cel-expr-python and jsonpatch were not, once the simulation moved
    out), and every third-party import of product code must be installed by them."""
    product = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    declared = {_dist(r) for r in product["project"]["dependencies"]}
    by_module = importlib.metadata.packages_distributions()
    imported: dict[str, set[str]] = {}
    for room in PRODUCT_ROOMS:
        for path in (ROOT / room / "neuron_dra").rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for _, name in imported_names(tree, module_name(path)):
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in ("neuron_dra", "__future__", ""):
                    continue
                dists = {_dist(d) for d in by_module.get(top, [top])}
                imported.setdefault(top, set()).update(dists)
    unused = declared - {d for dists in imported.values() for d in dists}
    assert not unused, f"product dependencies no product module imports: {sorted(unused)}"
    installed = _closure(declared)
    undeclared = {top: d for top, d in imported.items() if not d & installed}
    assert not undeclared, f"product imports nothing in its dependencies installs: {undeclared}"


def read_pure_modules(text: str) -> tuple[list[str], list[str], list[str]]:
    """(pure modules, what they may not import, the exceptions) from the doc's table."""
    block = re.search(r"<!-- pure-modules -->(.*?)<!-- /pure-modules -->", text, re.S)
    assert block, "docs/architecture.md lost its <!-- pure-modules --> table"
    pure: list[str] = []
    forbidden: list[str] = []
    allowed: list[str] = []
    for line in block.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            continue
        pure += re.findall(r"`([\w.]+)`", cells[0])
        kept = re.sub(r"\(except ([^)]*)\)", "", cells[1])
        forbidden += re.findall(r"`([\w.]+)`", kept)
        for exception in re.findall(r"\(except ([^)]*)\)", cells[1]):
            allowed += re.findall(r"`([\w.]+)`", exception)
    assert pure and forbidden, "the pure-modules table has no rows"
    return pure, forbidden, allowed


PURE, IMPURE, IMPURE_EXCEPTIONS = read_pure_modules(DOC.read_text(encoding="utf-8"))


def impure_imports(source: str, module: str) -> list[str]:
    """The I/O ``source`` (the text of pure ``module``) imports, by line."""
    tree = ast.parse(source)
    return [
        f"{module}:{line}: imports {name}"
        for line, name in imported_names(tree, module)
        if any(_within(name, bad) for bad in IMPURE)
        and not any(_within(name, ok) for ok in IMPURE_EXCEPTIONS)
    ]


def test_pure_modules_import_no_io() -> None:
    paths = {module_name(p): p for p in package_modules()}
    missing = [m for m in PURE if m not in paths]
    assert not missing, f"the pure-modules table names modules that do not exist: {missing}"
    found = [v for m in PURE for v in impure_imports(paths[m].read_text(encoding="utf-8"), m)]
    assert not found, "pure modules import I/O:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "import asyncio\n",
        "def f():\n    from pathlib import Path\n",
        "from neuron_dra.common.k8s.client import NODES\n",
        "from neuron_dra.nodeplugin.prepare.atomicfile import replace_file\n",
    ],
)
def test_the_purity_check_can_fail(source: str) -> None:
    assert impure_imports(source, "neuron_dra.nodeplugin.prepare.decide")
    assert not impure_imports(
        "from neuron_dra.common.k8s.client.resources import resource_version\n",
        "neuron_dra.nodeplugin.publish.sliceplan",
    )


def read_module_map(text: str) -> list[Path]:
    """The paths of the doc's module map. In a row's first cell the first path is relative to
    the checkout; the further names are siblings of the first (``main.py``, ``manager.py``)."""
    block = re.search(r"<!-- module-map -->(.*?)<!-- /module-map -->", text, re.S)
    assert block, "docs/architecture.md lost its <!-- module-map --> table"
    paths: list[Path] = []
    for line in block.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        names = re.findall(r"`([\w./-]+)`", cells[0]) if cells and cells[0] else []
        if not names:
            continue
        first = ROOT / names[0]
        paths.append(first)
        paths.extend(first.parent / name for name in names[1:])
    assert paths, "the module map has no rows"
    return paths


MODULE_MAP = read_module_map(DOC.read_text(encoding="utf-8"))


def test_the_module_map_names_only_what_exists() -> None:
    missing = [str(p.relative_to(ROOT)) for p in MODULE_MAP if not p.exists()]
    assert not missing, f"docs/architecture.md's module map names what is gone: {missing}"


def test_every_module_has_a_place_in_the_module_map() -> None:
    homeless = [
        str(path.relative_to(ROOT))
        for path in package_modules()
        if not (path.name == "__init__.py" and path.parent.parent.name == "neuron_dra")
        and not any(path == p or (p.is_dir() and p in path.parents) for p in MODULE_MAP)
    ]
    assert not homeless, (
        f"modules docs/architecture.md's module map does not place (add them to a row): {homeless}"
    )


def test_no_module_is_over_the_size_a_reader_holds_in_mind() -> None:
    # Issue 14's rule: split by concern past ~600 lines (generated protobuf code aside).
    too_long = {
        str(path.relative_to(ROOT)): n
        for path in package_modules()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > 600
    }
    assert not too_long, f"modules over 600 lines, split them by concern: {too_long}"


def python_scripts() -> list[Path]:
    """The Python scripts under hack/ (no .py suffix: they are commands)."""
    return [
        path
        for path in sorted((ROOT / "hack").rglob("*"))
        if path.is_file()
        and path.suffix in ("", ".py")
        and path.read_text(encoding="utf-8", errors="replace").startswith("#!/usr/bin/env python")
    ]


def _resolves(name: str) -> bool:
    """``name`` is a module, or a module's attribute (``pkg.mod.Name`` of ``from pkg.mod import
    Name``)."""
    module, _, attribute = name, "", ""
    while module:
        try:
            if importlib.util.find_spec(module) is not None:
                break
        except (ModuleNotFoundError, AttributeError):  # a parent is a module, not a package
            pass
        module, _, tail = module.rpartition(".")
        attribute = tail if not attribute else f"{tail}.{attribute}"
    if not module.startswith("neuron_dra."):
        return False
    if not attribute:
        return True
    return hasattr(importlib.import_module(module), attribute.split(".")[0])


def test_hack_scripts_import_only_what_exists() -> None:
    """The scripts are not imported by any test, so a module that moves would break them
    silently (hack/bench/prepare did once): every neuron_dra name they import must exist."""
    scripts = python_scripts()
    assert len(scripts) >= 5, scripts
    broken = [
        f"{script.relative_to(ROOT)}:{line}: {name}"
        for script in scripts
        for line, name in imported_names(
            ast.parse(script.read_text(encoding="utf-8"), filename=str(script)), "hack.script"
        )
        if name.startswith("neuron_dra.") and not _resolves(name)
    ]
    assert not broken, f"hack scripts import what does not exist: {broken}"
