"""Build Go binaries from a pinned module into a cache directory, all or nothing.

Standard library only: ``hack/k8s/build`` and ``hack/bench/build-peer`` import the builders
that use this (:mod:`.kubebuild`, :mod:`.peerbuild`) with a bare ``python3`` before any
virtualenv exists.

A build is keyed by the module's pinned version and the hash of its ``go.mod`` + ``go.sum``
(:func:`read_go_mod`), so a change of pin builds anew and an unchanged pin is reused. It is
written into ``<bin dir>.partial`` and renamed into place only when every binary built, so
an interrupted build never passes for a cached one.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


class BuildError(RuntimeError):
    """A component failed to build; the message carries the go command's output."""


@dataclass(frozen=True)
class GoBinary:
    """One ``go build`` of a staged build: the file it writes, its package, its link flags."""

    name: str
    package: str
    ldflags: str


def repo_root() -> Path:
    # sim/neuron_dra/sim/gobuild.py -> the checkout's root
    return Path(__file__).resolve().parents[3]


def read_go_mod(directory: Path) -> tuple[str, str]:
    """``go.mod``'s text and the build's cache key (the hash of go.mod and go.sum)."""
    go_mod = (directory / "go.mod").read_text()
    go_sum = (directory / "go.sum").read_bytes()
    return go_mod, hashlib.sha256(go_mod.encode() + b"\0" + go_sum).hexdigest()[:12]


def required_version(go_mod: str, module: str) -> str:
    """The version ``go_mod`` requires of ``module``."""
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod, re.MULTILINE)
    if not match:
        raise BuildError(f"{module} is not required in go.mod")
    return match.group(1)


def logger(command: str) -> Callable[[str], None]:
    """A build command's progress lines, on stderr: ``[<command>] <message>``."""

    def log(message: str) -> None:
        print(f"[{command}] {message}", file=sys.stderr, flush=True)

    return log


def staged_go_build(
    directory: Path,
    bin_dir: Path,
    binaries: Sequence[GoBinary],
    *,
    reuse: bool,
    label: str,
    log: Callable[[str], None],
    go_missing: str,
    env: Mapping[str, str],
) -> Path:
    """Download the module's dependencies and build ``binaries`` into ``bin_dir``; with
    ``reuse`` (a complete build is there and no rebuild was asked for), only say so.

    ``env`` is added to ``CGO_ENABLED=0`` and a read-only, VCS-free ``GOFLAGS``; ``go_missing``
    is the error when there is no Go toolchain on PATH."""
    if reuse:
        log(f"{label}: cached in {bin_dir}")
        return bin_dir
    go = shutil.which("go")
    if go is None:
        raise BuildError(go_missing)
    staging = bin_dir.with_name(bin_dir.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    full_env = {
        **os.environ,
        "CGO_ENABLED": "0",
        "GOFLAGS": "-mod=readonly -buildvcs=false",
        **env,
    }
    log(f"{label}: downloading modules")
    _run([go, "mod", "download"], directory, full_env)
    for binary in binaries:
        started = time.monotonic()
        log(f"{label}: building {binary.name}")
        cmd = [
            go,
            "build",
            "-trimpath",
            "-ldflags",
            binary.ldflags,
            "-o",
            str(staging / binary.name),
        ]
        _run([*cmd, binary.package], directory, full_env)
        log(f"{label}: {binary.name} built in {time.monotonic() - started:.0f} s")
    shutil.rmtree(bin_dir, ignore_errors=True)
    staging.rename(bin_dir)
    return bin_dir


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> None:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildError(
            f"{' '.join(cmd[:2])} failed in {cwd} (exit {proc.returncode}):\n"
            f"{proc.stdout}{proc.stderr}"
        )


def add_build_flags(parser: argparse.ArgumentParser, *, skips: str, bin_dir: str) -> None:
    """The flags every build command shares: --force, --optional, --print-bin-dir."""
    parser.add_argument("--force", action="store_true", help="rebuild even when cached")
    parser.add_argument(
        "--optional",
        action="store_true",
        help=f"without a Go toolchain, say so in one line and exit 0 ({skips}); with CI=true "
        "a missing toolchain still fails",
    )
    parser.add_argument("--print-bin-dir", action="store_true", help=bin_dir)


def skip_without_go(args: argparse.Namespace) -> bool:
    """``--optional`` off CI with no Go toolchain: the build is skipped, not failed."""
    on_ci = os.environ.get("CI", "").lower() == "true"
    return bool(args.optional) and not on_ci and shutil.which("go") is None
