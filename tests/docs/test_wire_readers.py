"""One reader per wire format: a second hand-written parser of a format that has its reader
in common/ fails here (grep-level, as the formats are plain strings).

- ``ultraserverModes`` (attribute and Node label, ``1_2_4``): written by
  ``constants.format_ultraserver_modes``, read only by ``constants.parse_ultraserver_modes``;
- Kubernetes name formats (DNS label, label value / qualified name, C identifier): written
  once in ``common/names.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("common", "controller", "nodeplugin")

#: (what, pattern of a hand-written parser, the one file allowed to have it)
READERS = (
    (
        "ultraserverModes",
        re.compile(r"""\.split\(\s*["']_["']\s*\)"""),
        "common/neuron_dra/common/constants.py",
    ),
    (
        "the DNS label format",
        re.compile(re.escape("[-a-z0-9]*[a-z0-9]")),
        "common/neuron_dra/common/names.py",
    ),
    (
        "the label value format",
        re.compile(re.escape("[-A-Za-z0-9_.]*")),
        "common/neuron_dra/common/names.py",
    ),
    (
        "the C identifier format",
        re.compile(re.escape("[A-Za-z_][A-Za-z0-9_]*")),
        "common/neuron_dra/common/names.py",
    ),
)


def product_files() -> list[Path]:
    return sorted(
        p for room in PRODUCT for p in (ROOT / room).rglob("*.py") if "_pb2" not in p.name
    )


def second_readers(files: list[tuple[str, str]]) -> list[str]:
    """What of ``files`` ((path in the repository, text) pairs) parses a format by hand."""
    out = []
    for rel, text in files:
        for what, pattern, home in READERS:
            if rel != home and pattern.search(text):
                out.append(f"{rel}: parses {what} by hand; use the reader in {home}")
    return out


def test_each_wire_format_has_one_reader() -> None:
    files = [(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8")) for p in product_files()]
    assert second_readers(files) == []


@pytest.mark.parametrize(
    "source",
    [
        "counts = [int(p) for p in value.split('_')]\n",
        'LABEL = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")\n',
    ],
)
def test_the_check_can_fail(source: str) -> None:
    assert second_readers([("controller/neuron_dra/controller/stray.py", source)])
