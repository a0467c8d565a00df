"""One reader per wire format: a second hand-written parser of a format that has its reader
in common/ fails here (grep-level, as the formats are plain strings).

- ``ultraserverModes`` (attribute and Node label, ``1_2_4``): written by
  ``constants.format_ultraserver_modes``, read only by ``constants.parse_ultraserver_modes``;
- Kubernetes name formats (DNS label, label value / qualified name, C identifier): written
  once in ``common/names.py``;
- ``NeuronUltraServer.status.allocations`` and its entries' keys: read only by
  ``ultraserver.read_allocations``, written only by the controller's ``workloads/entries.py``
  (the CRD model names the keys for the schema);
- device names ``neurondevice<N>``: written by ``constants.device_name``, read back to the index
  only by ``constants.device_index``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("common", "controller", "nodeplugin")

CONSTANTS = "common/neuron_dra/common/constants.py"
ULTRASERVER = "common/neuron_dra/common/ultraserver.py"
ENTRIES_WRITER = "controller/neuron_dra/controller/workloads/entries.py"
CRD_MODELS = "common/neuron_dra/common/models/crds.py"

#: (what, pattern of a hand-written parser, the files allowed to have it: the reader first)
READERS: tuple[tuple[str, re.Pattern[str], str | tuple[str, ...]], ...] = (
    (
        "ultraserverModes",
        re.compile(r"""\.split\(\s*["']_["']\s*\)"""),
        CONSTANTS,
    ),
    (
        "NeuronUltraServer status.allocations",
        re.compile(r"""["']allocations["']"""),
        (ULTRASERVER, ENTRIES_WRITER),
    ),
    (
        "an allocation entry",
        re.compile(r"""["'](allocatedNodes|ultraserverIndex|leaderNodeName|workloadRef)["']"""),
        (ULTRASERVER, ENTRIES_WRITER, CRD_MODELS),
    ),
    (
        "a device name's index",
        re.compile(
            r"""removeprefix\(\s*(["']neurondevice["']|(\w+\.)?DEVICE_NAME_PREFIX)"""
            r"""|re\.escape\(\s*(\w+\.)?DEVICE_NAME_PREFIX|neurondevice\(|neurondevice\\d"""
        ),
        CONSTANTS,
    ),
    (
        "a device name",
        re.compile(r"""f["']neurondevice\{"""),
        CONSTANTS,
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


def _homes(home: str | tuple[str, ...]) -> tuple[str, ...]:
    return (home,) if isinstance(home, str) else home


def second_readers(files: list[tuple[str, str]]) -> list[str]:
    """What of ``files`` ((path in the repository, text) pairs) parses a format by hand."""
    out = []
    for rel, text in files:
        for what, pattern, home in READERS:
            if rel not in _homes(home) and pattern.search(text):
                reader = _homes(home)[0]
                out.append(f"{rel}: parses {what} by hand; use the reader in {reader}")
    return out


def test_each_wire_format_has_one_reader() -> None:
    files = [(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8")) for p in product_files()]
    assert second_readers(files) == []


@pytest.mark.parametrize(
    "source",
    [
        "counts = [int(p) for p in value.split('_')]\n",
        'LABEL = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")\n',
        'entries = (nus.get("status") or {}).get("allocations") or []\n',
        'nodes = entry.get("allocatedNodes") or []\n',
        'digits = name.removeprefix("neurondevice")\n',
        "index = int(name.removeprefix(constants.DEVICE_NAME_PREFIX))\n",
        'NAME = re.compile(re.escape(DEVICE_NAME_PREFIX) + r"(0|[1-9][0-9]*)")\n',
        'name = f"neurondevice{index}"\n',
        'INDEX = re.compile(r"neurondevice\\d+")\n',
    ],
)
def test_the_check_can_fail(source: str) -> None:
    assert second_readers([("controller/neuron_dra/controller/stray.py", source)])


def test_the_writer_of_allocations_may_read_what_it_writes() -> None:
    source = 'status["allocations"] = allocations\n'
    assert second_readers([(ENTRIES_WRITER, source)]) == []
    assert second_readers([("nodeplugin/neuron_dra/nodeplugin/stray.py", source)])
