"""docs/architecture.md's count of the claim's way out of ``prepare/`` is the code's.

The count comes from ``hack/claim-way-crossings`` (loaded here, so the doc, the script and the
code cannot drift apart); the issue that moved Prepare into one room set the bar at under 10.
"""

from __future__ import annotations

import re
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "claim-way-crossings"
DOC = ROOT / "docs" / "architecture.md"
LIMIT = 10


def counter() -> ModuleType:
    loader = SourceFileLoader("claim_way_crossings", str(SCRIPT))
    spec = spec_from_loader(loader.name, loader)
    assert spec is not None
    module = module_from_spec(spec)
    loader.exec_module(module)
    return module


def documented() -> tuple[int, int]:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("### The claim's way stays in one room") :]
    found = re.search(r"and now \*\*(\d+) edges reaching (\d+) parts\*\*", section)
    assert found, "the claim's way section lost its 'and now **N edges reaching M parts**'"
    return int(found.group(1)), int(found.group(2))


def test_the_documented_count_is_the_codes() -> None:
    crossings = counter()
    edges = crossings.crossings(ROOT)
    assert crossings.summary(edges) == documented(), "\n".join(f"{a} -> {b}" for a, b in edges)
    assert len(edges) < LIMIT


def _module(root: Path, rel: str, text: str) -> None:
    path = root / "nodeplugin" / "neuron_dra" / "nodeplugin" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_the_count_sees_every_kind_of_import(tmp_path: Path) -> None:
    _module(tmp_path, "__init__.py", "")
    _module(tmp_path, "prepare/__init__.py", "")
    _module(tmp_path, "discovery/__init__.py", "")
    _module(tmp_path, "discovery/model.py", "")
    _module(tmp_path, "kubeletapi/__init__.py", "")
    _module(tmp_path, "reservations.py", "")
    _module(tmp_path, "prepare/inner.py", "")
    _module(
        tmp_path,
        "prepare/way.py",
        "from typing import TYPE_CHECKING\n"
        "from neuron_dra.nodeplugin.discovery import model\n"
        "from neuron_dra.nodeplugin.kubeletapi import ClaimRef\n"
        "from . import inner\n"
        "from ..discovery.model import NodeInventory\n"
        "if TYPE_CHECKING:\n"
        "    import neuron_dra.nodeplugin.reservations\n"
        "def late() -> None:\n"
        "    from neuron_dra.nodeplugin.kubeletapi import PrepareResult\n",
    )
    crossings = counter()
    edges = crossings.crossings(tmp_path)
    assert edges == [
        ("neuron_dra.nodeplugin.prepare.way", "neuron_dra.nodeplugin.discovery.model"),
        ("neuron_dra.nodeplugin.prepare.way", "neuron_dra.nodeplugin.kubeletapi"),
        ("neuron_dra.nodeplugin.prepare.way", "neuron_dra.nodeplugin.reservations"),
    ]
    assert crossings.summary(edges) == (3, 3)
