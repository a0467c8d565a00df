"""neuron_dra.sim.imagebuild: the image is rebuilt exactly when what the Dockerfile reads
changes (its cache key), and the archive is named after it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from neuron_dra.sim import imagebuild, scratch


def tree(tmp: Path) -> Path:
    root = tmp / "repo"
    for name in ("common/neuron_dra/common", "controller", "nodeplugin", "proto", "tests"):
        (root / name).mkdir(parents=True)
    (root / "Dockerfile").write_text("FROM ${PYTHON_IMAGE}\n")
    (root / ".dockerignore").write_text("*\n")
    (root / "pyproject.toml").write_text('[project]\nname = "neuron-dra"\nversion = "0.1.0"\n')
    (root / "README.md").write_text("readme\n")
    (root / "common/neuron_dra/common/x.py").write_text("X = 1\n")
    return root


def test_the_key_follows_what_the_build_reads_and_nothing_else(tmp_path: Path) -> None:
    root = tree(tmp_path)
    first = imagebuild.plan(root)
    assert first.version == "0.1.0"
    assert first.ref == f"local.test/neuron-dra:0.1.0-{first.context_hash}"
    assert first.archive.name == f"neuron-dra-{first.context_hash}.tar"
    # Not read by the build: tests, caches, compiled files.
    (root / "tests" / "test_x.py").write_text("def test(): pass\n")
    cache = root / "common/neuron_dra/common/__pycache__"
    cache.mkdir()
    (cache / "x.cpython-311.pyc").write_bytes(b"\0")
    assert imagebuild.plan(root).context_hash == first.context_hash
    # Read by the build: the sources, the Dockerfile.
    (root / "common/neuron_dra/common/x.py").write_text("X = 2\n")
    second = imagebuild.plan(root).context_hash
    assert second != first.context_hash
    (root / "Dockerfile").write_text("FROM ${PYTHON_IMAGE}\nUSER 65532\n")
    assert imagebuild.plan(root).context_hash not in (first.context_hash, second)


def test_the_key_follows_the_base_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tree(tmp_path)
    before = imagebuild.plan(root)
    monkeypatch.setattr(imagebuild, "BASE_PACKAGES", (*imagebuild.BASE_PACKAGES, "curl"))
    after = imagebuild.plan(root)
    assert after.base_hash != before.base_hash
    assert after.context_hash != before.context_hash


def test_a_builds_runroot_is_named_as_the_sweep_expects(tmp_path: Path) -> None:
    # imagebuild writes the work directory's name by hand (it imports only the standard
    # library): a killed build's runroot must still be one the next run sweeps.
    buildah = imagebuild.Buildah(tmp_path / "cache", tmp_path / "log")
    try:
        assert buildah.runroot.is_dir()
        assert scratch.maker(buildah.runroot) == os.getpid(), buildah.runroot.name
    finally:
        buildah.close()
    assert not buildah.runroot.exists()
