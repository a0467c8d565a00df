"""No comment, docstring or doc points at a file the repository does not hold.

The project was designed from notes kept outside the repository (a design document, reference
notes, the AWS documents called "seed 000" to "seed 004"); a clone has none of them, so a
citation of them is a dead end for its reader. The rule is grep-level, over the checkout's text
files (``git ls-files``: Markdown, Python, YAML, shell, TOML, proto, Dockerfile and scripts):

- a token that looks like a file path, a bare ``name.md`` or a ``dir/file.ext``, must name a
  file of the checkout: relative to the repository root or to the citing file's directory, as
  the tail of a path in it (``publish/publisher.py``), or, for a bare ``name.md``, by name;
- a section number (``§3.5``), the design document and paths into the notes' folders
  (``seeds/``, ``../shared``) are refused wherever they appear: the repository's own docs
  have no numbered sections.

In Python files only comments and docstrings are read for paths: string literals are code,
which builds paths at run time. URLs, absolute paths (``/var/run/cdi/...``) and templated
ones (``<plugins dir>/neuron.aws.com/checkpoint.json``) are no citations and are skipped.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()

TEXT_SUFFIXES = {".md", ".py", ".yaml", ".yml", ".sh", ".toml", ".proto", ".tpl"}
TEXT_NAMES = {"Dockerfile"}

#: A path-like token: ``dir/file.ext`` with a text file's extension, or a bare ``name.md`` (a
#: bare ``name.yaml`` is as often a user's file in an example command). Not preceded by what
#: makes it part of a URL, an absolute or templated path or a dotted name.
PATH = re.compile(
    r"(?<![\w./:<>${}~*@%-])"
    r"((?:\.\.?/|[\w-][\w.-]*/)+[\w-][\w.-]*\.(?:md|py|pyi|yaml|yml|sh|toml|txt|tpl|rst)"
    r"|[\w-][\w.-]*\.md)"
    r"(?!\.?[\w/-])"
)
#: (file, cited path) pairs known to be stale and being fixed elsewhere; remove an entry with
#: its fix.
KNOWN_STALE: set[tuple[str, str]] = set()
#: Citations of the notes outside the repository, refused wherever they appear.
OUTSIDE = re.compile(r"§\s?\d|\bDESIGN\b|\.\./shared\b|(?<![\w/.-])seeds/")


def checkout_files() -> set[str]:
    """Tracked and new (not ignored) files of the checkout that exist, relative to ROOT."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return {p for p in out.decode().split("\0") if p and (ROOT / p).is_file()}


def is_text(path: str) -> bool:
    p = Path(path)
    if p.suffix in TEXT_SUFFIXES or p.name in TEXT_NAMES:
        return True
    if p.suffix:
        return False
    with open(ROOT / p, "rb") as f:  # an extensionless script: hack/soak, .ci/run
        return f.read(2) == b"#!"


def python_prose(source: str) -> str:
    """The comments and docstrings of a Python module, one per line."""
    parts = [
        tok.string
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                parts.append(doc)
    return "\n".join(parts)


def resolves(token: str, citing: str, files: set[str]) -> bool:
    for base in ("", Path(citing).parent.as_posix()):
        # Lexically, not Path.resolve(): the question is the checkout's paths, not the disk's.
        if _normalize(f"{base}/{token}") in files:
            return True
    if "/" not in token:
        return any(Path(f).name == token for f in files)
    tail = "/" + token.lstrip("./")
    return any(f.endswith(tail) for f in files)


def _normalize(path: str) -> str:
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return "../" + path  # outside the repository: never a file of it
            parts.pop()
        else:
            parts.append(part)
    return "/".join(parts)


def missing_citations(path: str, text: str, files: set[str]) -> list[str]:
    """``path:line: token`` for every citation in ``text`` (the file ``path``) that the
    checkout cannot satisfy."""
    problems: list[str] = []
    lines = text.splitlines()
    for lineno, line in enumerate(lines, 1):
        if OUTSIDE.search(line):
            problems.append(
                f"{path}:{lineno}: {line.strip()[:90]!r} cites notes outside the repository"
            )
    python = path.endswith(".py") or text.startswith("#!/usr/bin/env python")
    prose = python_prose(text) if python else text
    for line in prose.splitlines():
        for m in PATH.finditer(line):
            cited = m.group(1)
            if (path, cited) in KNOWN_STALE or resolves(cited, path, files):
                continue
            lineno = next((i for i, text_line in enumerate(lines, 1) if cited in text_line), 0)
            problems.append(f"{path}:{lineno}: {cited!r} is not a file of the repository")
    return problems


def test_every_cited_path_is_in_the_repository() -> None:
    files = checkout_files()
    problems: list[str] = []
    for path in sorted(files):
        if path == SELF or not is_text(path):
            continue
        text = (ROOT / path).read_text(encoding="utf-8", errors="replace")
        problems += missing_citations(path, text, files)
    assert not problems, (
        "citations of files the repository does not hold (say the fact in a few words, or "
        "point into docs/):\n" + "\n".join(problems)
    )


@pytest.mark.parametrize(
    ("path", "text", "expected"),
    [
        ("common/neuron_dra/common/x.py", '"""Names (DESIGN §3.1)."""\n', 1),
        ("common/neuron_dra/common/x.py", "# see DESIGN.md\nX = 1\n", 2),
        ("common/neuron_dra/common/x.py", "X = 1  # (reference/neuron.md §2.2)\n", 2),
        ("common/neuron_dra/common/x.py", "# (kubelet-dra.md)\n", 1),
        ("docs/sim.md", "See [the notes](../shared/DESIGN.md).\n", 2),
        ("examples/specs/x.yaml", "# seeds/001 Example 1\n", 1),
        # Not citations: repository files, URLs, absolute and templated paths, code.
        ("docs/sim.md", "[architecture](architecture.md), `docs/testing.md`, README.md\n", 0),
        ("docs/sim.md", "https://example.com/a/b.md and /var/run/cdi/spec.yaml\n", 0),
        ("docs/sim.md", "`<plugins dir>/neuron.aws.com/checkpoint.yaml`, publish/publisher.py", 0),
        ("common/neuron_dra/common/x.py", 'P = "notes/missing.md"\n', 0),
    ],
)
def test_the_check_can_fail(path: str, text: str, expected: int) -> None:
    files = {"README.md", "docs/sim.md", "docs/testing.md", "docs/architecture.md"}
    files.add("nodeplugin/neuron_dra/nodeplugin/publish/publisher.py")
    assert len(missing_citations(path, text, files)) == expected
