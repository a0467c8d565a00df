"""Where the clusters keep their short-lived files: the named directory, else a RAM-backed
one with room, else /tmp."""

from __future__ import annotations

from pathlib import Path

import pytest
from neuron_dra.sim import scratch
from neuron_dra.sim.scratch import ENV, scratch_root


def test_the_named_directory_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV, str(tmp_path / "mine"))
    assert scratch_root(shm=tmp_path) == tmp_path / "mine"


def meminfo(tmp_path: Path, available_kib: int) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal: 99999999 kB\nMemAvailable: {available_kib} kB\n")
    return path


def test_a_writable_shm_with_room_is_used(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(scratch, "ROOM", 1)
    got = scratch_root(shm=tmp_path, fallback=Path("/elsewhere"), meminfo=meminfo(tmp_path, 8))
    assert got == tmp_path


def test_shm_is_not_used_when_memory_is_short(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(scratch, "ROOM", 4096)
    short = meminfo(tmp_path, 3)  # 3 KiB available, 4 KiB asked
    assert scratch_root(shm=tmp_path, fallback=Path("/elsewhere"), meminfo=short) == Path(
        "/elsewhere"
    )
    unknown = tmp_path / "no-meminfo"
    assert scratch_root(shm=tmp_path, fallback=Path("/elsewhere"), meminfo=unknown) == Path(
        "/elsewhere"
    )


def test_shm_without_room_or_missing_falls_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(scratch, "ROOM", 1 << 60)  # more than any disk has
    assert scratch_root(shm=tmp_path, fallback=Path("/elsewhere")) == Path("/elsewhere")
    monkeypatch.setattr(scratch, "ROOM", 1)
    missing = tmp_path / "no-such-dir"
    enough = meminfo(tmp_path, 8)
    assert scratch_root(shm=missing, fallback=Path("/elsewhere"), meminfo=enough) == Path(
        "/elsewhere"
    )
