"""Build the Go peer the benchmarks compare us with: the kubelet plugin of
``sigs.k8s.io/dra-example-driver``, fetched by module version (none of its code is in this
repository).

Standard library only: ``hack/bench/build-peer`` runs it before any virtualenv exists, and
the side-by-side benchmark (``hack/bench/peer``) imports it to find the binary.

``hack/bench/go-peer/go.mod`` pins the release with a ``tool`` directive (made with ``go get
-tool <package>@<version>``; its module graph is upstream's own ``go.mod``'s, checked against
the checksum database through ``go.sum``). A module of our own rather than ``go install
<package>@<version>``: that form looks the module's version list up for deprecation notices,
which the module proxy reachable here refuses. The build is CGO off, ``-trimpath``, with
upstream's ``-s -w`` link flags, into a staging directory renamed into place when complete,
keyed like the Kubernetes builds (:mod:`.kubebuild`) by version and ``go.sum`` hash:

    $NEURON_DRA_PEER_CACHE (default ~/.cache/neuron-dra/peer)/<version>-<go.sum hash>/bin
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .gobuild import (
    BuildError,
    GoBinary,
    add_build_flags,
    logger,
    read_go_mod,
    repo_root,
    required_version,
    skip_without_go,
    staged_go_build,
)

PEER_MODULE = "sigs.k8s.io/dra-example-driver"
PEER_PACKAGE = f"{PEER_MODULE}/cmd/dra-example-kubeletplugin"
PEER_BINARY = "dra-example-kubeletplugin"
CACHE_ENV = "NEURON_DRA_PEER_CACHE"


class PeerUnavailable(Exception):
    """The peer is not built here; the message says how to build it."""


@dataclass(frozen=True)
class PeerModule:
    directory: Path
    version: str  # the pinned release of sigs.k8s.io/dra-example-driver
    go_sum_hash: str

    @property
    def bin_dir(self) -> Path:
        return cache_root() / f"{self.version}-{self.go_sum_hash}" / "bin"

    @property
    def binary(self) -> Path:
        return self.bin_dir / PEER_BINARY

    def built(self) -> bool:
        return self.binary.is_file()


def module_dir() -> Path:
    return repo_root() / "hack" / "bench" / "go-peer"


def cache_root() -> Path:
    default = Path.home() / ".cache" / "neuron-dra" / "peer"
    return Path(os.environ.get(CACHE_ENV) or default)


def peer_module(directory: Path | None = None) -> PeerModule:
    directory = directory or module_dir()
    go_mod, digest = read_go_mod(directory)
    return PeerModule(directory, required_version(go_mod, PEER_MODULE), digest)


def peer_binary() -> Path:
    """The built peer, or :class:`PeerUnavailable` saying how to build it."""
    mod = peer_module()
    if not mod.built():
        raise PeerUnavailable(
            f"the Go peer ({PEER_MODULE} {mod.version}) is not built: run "
            f"`hack/bench/build-peer` (needs Go; cache {mod.bin_dir})"
        )
    return mod.binary


_log = logger("hack/bench/build-peer")


def build(mod: PeerModule, *, force: bool = False) -> Path:
    """Build the peer into its cache directory (reused when present); its bin directory."""
    return staged_go_build(
        mod.directory,
        mod.bin_dir,
        [GoBinary(PEER_BINARY, PEER_PACKAGE, "-s -w")],  # upstream's link flags
        reuse=mod.built() and not force,
        label=f"{PEER_MODULE} {mod.version}",
        log=_log,
        go_missing="no Go toolchain on PATH: install Go >= 1.26 to build the peer",
        env={"GOTOOLCHAIN": "local"},
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hack/bench/build-peer",
        description=f"Build the kubelet plugin of {PEER_MODULE} (pinned in "
        "hack/bench/go-peer/go.mod) into a cache keyed by version and go.sum hash; reuse it "
        "when present.",
    )
    add_build_flags(
        parser,
        skips="the peer benchmark's smoke test then skips",
        bin_dir="print the bin directory on stdout",
    )
    args = parser.parse_args(argv)
    if skip_without_go(args):
        _log("no Go toolchain: the peer benchmark will skip. Install Go >= 1.26 to build it.")
        return 0
    try:
        mod = peer_module()
        started = time.monotonic()
        target = build(mod, force=args.force)
        _log(f"{PEER_MODULE} {mod.version}: ready in {time.monotonic() - started:.0f} s")
    except BuildError as err:
        _log(f"BUILD FAILED: {err}")
        return 1
    if args.print_bin_dir:
        print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
