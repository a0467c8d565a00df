"""Where the clusters keep their short-lived files: the named directory, else a RAM-backed
one with room, else /tmp; and what a killed run left, found by the pid in its name."""

from __future__ import annotations

import os
import subprocess
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


# --- what killed runs leave -----------------------------------------------------------------


def _dead_pid() -> int:
    """The pid of a process that has exited (and was reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_work_directory_names_its_maker(tmp_path: Path) -> None:
    made = scratch.work_dir("soak", tmp_path)
    assert made.is_dir() and made.parent == tmp_path
    assert made.name.startswith(f"ndra-soak-p{os.getpid()}-")
    with pytest.raises(ValueError, match="lower-case"):
        scratch.work_dir("Bad/kind", tmp_path)


def test_a_killed_runs_directories_are_swept_and_nothing_else(tmp_path: Path) -> None:
    dead = _dead_pid()
    orphan = tmp_path / f"ndra-k8s-p{dead}-abc123_x"
    (orphan / "etcd").mkdir(parents=True)
    (orphan / "etcd" / "db").write_text("x")
    (orphan / "etcd").chmod(0o500)  # a killed run's read-only files go too
    kept = tmp_path / f"ndra-soak-p{dead}-kept1"
    kept.mkdir()
    scratch.keep(kept, "a post-mortem")
    linked = tmp_path / f"ndra-n-p{dead}-nodes1"  # a kept soak's nodes, linked from it
    linked.mkdir()
    (kept / "nodes").symlink_to(linked)
    scratch.keep(kept, "a post-mortem")
    live = scratch.work_dir("sim", tmp_path)  # this process's own
    with subprocess.Popen(["sleep", "30"]) as running:
        others = tmp_path / f"ndra-inst-p{running.pid}-zz"  # another live run's
        others.mkdir()
        unnamed = tmp_path / "ndra-old-style"  # no maker in its name: not ours to judge
        unnamed.mkdir()
        a_file = tmp_path / f"ndra-wire-p{dead}-file"
        a_file.write_text("")
        a_link = tmp_path / f"ndra-sim-p{dead}-link"
        a_link.symlink_to(live)

        assert scratch.orphaned([tmp_path]) == [orphan]
        assert scratch.sweep_orphaned([tmp_path]) == [orphan]
        running.kill()
    assert not orphan.exists()
    for still in (kept, linked, live, others, unnamed, a_file, a_link):
        assert still.exists() or still.is_symlink(), still
    assert "a post-mortem" in (linked / scratch.KEPT).read_text()


def test_a_temporary_work_directory_is_removed_however_its_block_ends(tmp_path: Path) -> None:
    with scratch.temporary("dft", tmp_path) as made:
        assert scratch.maker(made) == os.getpid()
        (made / "file").write_text("x")
    assert not made.exists()
    with pytest.raises(RuntimeError), scratch.temporary("dft", tmp_path) as failed:
        raise RuntimeError("the block failed")
    assert not failed.exists()
    assert scratch.maker(tmp_path / "ndra-old-style") is None


def test_a_missing_root_is_no_error(tmp_path: Path) -> None:
    assert scratch.sweep_orphaned([tmp_path / "gone"]) == []
