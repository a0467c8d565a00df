"""Atomic replacement and reads of the plugin's state files."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from neuron_dra.nodeplugin.prepare import atomicfile
from neuron_dra.nodeplugin.prepare.atomicfile import read_file, replace_file, temp_path


@pytest.fixture
def strict_umask() -> Iterator[None]:
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def test_replace_creates_the_directory_and_replaces_whole_files(tmp_path: Path) -> None:
    path = tmp_path / "new" / "state.json"
    replace_file(path, b"first")
    replace_file(path, b"second, longer")
    assert read_file(path) == b"second, longer"
    assert os.listdir(path.parent) == ["state.json"]


def test_modes_hold_whatever_the_umask(tmp_path: Path, strict_umask: None) -> None:
    private, shared = tmp_path / "private", tmp_path / "shared"
    replace_file(private, b"x", mode=0o600)
    replace_file(shared, b"x", mode=0o644)
    assert private.stat().st_mode & 0o777 == 0o600
    assert shared.stat().st_mode & 0o777 == 0o644


def test_a_failed_replace_keeps_the_old_file_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.json"
    replace_file(path, b"old")

    def no_space(fd: int, data: Any) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", no_space)
    with pytest.raises(OSError, match="No space"):
        replace_file(path, b"new")
    monkeypatch.undo()
    assert read_file(path) == b"old"
    assert os.listdir(tmp_path) == ["state.json"]


def test_a_leftover_temp_file_with_the_same_name_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.json"
    names = iter([0xABC, 0xABC, 0xDEF])
    monkeypatch.setattr(atomicfile._names, "getrandbits", lambda _bits: next(names))
    leftover = temp_path(path)
    leftover.write_bytes(b"crashed mid-write")
    replace_file(path, b"data")
    assert read_file(path) == b"data"
    assert leftover.read_bytes() == b"crashed mid-write"  # not ours to reuse or remove
    assert sorted(os.listdir(tmp_path)) == sorted([leftover.name, "state.json"])


def test_temp_names_are_hidden_and_not_json(tmp_path: Path) -> None:
    name = temp_path(tmp_path / "spec.json").name
    assert name.startswith(".spec.json.") and name.endswith(".tmp")


def test_read_file(tmp_path: Path) -> None:
    assert read_file(tmp_path / "missing") is None
    big = os.urandom(300_000)  # more than one read
    (tmp_path / "big").write_bytes(big)
    assert read_file(tmp_path / "big") == big
    with pytest.raises(IsADirectoryError):
        read_file(tmp_path)


def test_durable_writes_fsync_file_and_directory_and_others_do_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    replace_file(tmp_path / "a", b"1")
    assert len(calls) == 2  # the file, then its directory
    calls.clear()
    replace_file(tmp_path / "b", b"2", durable=False)
    assert calls == []
    assert (tmp_path / "b").read_bytes() == b"2"
