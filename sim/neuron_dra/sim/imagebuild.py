"""Build the product's image from the repository's Dockerfile without a Docker daemon or a
container registry: buildah (Debian's package) builds the Dockerfile as it is, and the base it
names (``python:3.11-slim``, on Docker Hub, which this machine cannot reach) is replaced by one
made from Debian's packages with mmdebstrap and passed as the Dockerfile's ``PYTHON_IMAGE``.
One recipe, two bases: ``hack/build-image`` uses Docker and the official base where a daemon
runs, this where none does (docs/testing.md, "The image").

Standard library only (``hack/build-image`` runs it before any virtualenv exists). The result
is a Docker-format archive (what ``ctr images import`` and ``docker load`` read) cached by the
hash of the build context and the base recipe, so an unchanged tree is not built twice:

    $NEURON_DRA_IMAGE_CACHE (default ~/.cache/neuron-dra/image)/neuron-dra-<hash>.tar

The build reaches PyPI (``pip wheel`` in the Dockerfile) and Debian's mirror (the base, and the
Dockerfile's ``apt-get install libudev1``); nothing that runs the image does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "NEURON_DRA_IMAGE_CACHE"
#: The name pods on the test nodes use (no registry answers for it: the archive is imported
#: into each node's containerd, and the pull policy is IfNotPresent).
LOCAL_REPOSITORY = "local.test/neuron-dra"

BASE_SUITE = "bookworm"
#: python:3.11-slim's equivalents: Debian 12's Python is 3.11 too; python-is-python3 gives the
#: ``python`` the Dockerfile's checks call (without it ``! python -c 'import …sim'`` would pass
#: for the wrong reason).
BASE_PACKAGES = ("python3", "python3-pip", "python-is-python3", "ca-certificates")
BASE_SOURCES = (
    f"deb http://deb.debian.org/debian {BASE_SUITE} main",
    f"deb http://deb.debian.org/debian {BASE_SUITE}-updates main",
    f"deb http://deb.debian.org/debian-security {BASE_SUITE}-security main",
)
#: The official image's interpreter is not Debian's, so pip installs into it; Debian marks its
#: own as externally managed (PEP 668), which our base removes to behave the same. The apt
#: option the bootstrap needed here (below) does not stay in the image.
BASE_HOOK = 'rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED "$1"/etc/apt/apt.conf.d/99mmdebstrap'
BASE_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8")
#: What the Dockerfile copies (.dockerignore allow-lists the same); junk inside is skipped.
CONTEXT = (
    "Dockerfile",
    ".dockerignore",
    "pyproject.toml",
    "constraints.txt",
    "README.md",
    "common",
    "controller",
    "nodeplugin",
    "proto",
)
JUNK = ("__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache")
#: Host files the build's RUN steps read: the machine's CA bundle (pip reaches PyPI through
#: it) and its apt settings (the mirror's Release files may be past their Valid-Until).
BUILD_VOLUMES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/apt/apt.conf.d")


class ImageBuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class ImagePlan:
    root: Path  # the repository
    cache: Path
    base_hash: str
    context_hash: str
    version: str

    @property
    def archive(self) -> Path:
        return self.cache / f"neuron-dra-{self.context_hash}.tar"

    @property
    def base_tar(self) -> Path:
        return self.cache / f"base-{self.base_hash}.tar"

    @property
    def base_ref(self) -> str:
        return f"localhost/neuron-dra-base:{self.base_hash}"

    @property
    def ref(self) -> str:
        """The image's name in the archive: version and content, so two trees never share
        a tag on a node."""
        return f"{LOCAL_REPOSITORY}:{self.version}-{self.context_hash}"


def repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "neuron-dra" / "image")


def project_version(root: Path) -> str:
    for line in (root / "pyproject.toml").read_text().splitlines():
        if line.startswith("version") and "=" in line:
            return line.split("=", 1)[1].strip().strip('"')
    raise ImageBuildError(f"no version in {root / 'pyproject.toml'}")


def base_hash() -> str:
    recipe = {
        "suite": BASE_SUITE,
        "packages": BASE_PACKAGES,
        "sources": BASE_SOURCES,
        "hook": BASE_HOOK,
        "env": BASE_ENV,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def context_hash(root: Path, base: str) -> str:
    """Every byte the build reads from the tree, and the base it starts from."""
    digest = hashlib.sha256(base.encode())
    for name in CONTEXT:
        path = root / name
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for f in files:
            rel = f.relative_to(root)
            if any(part in JUNK or part.endswith(".egg-info") for part in rel.parts):
                continue
            if f.suffix in (".pyc", ".pyo", ".pyd"):
                continue
            digest.update(str(rel).encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def plan(root: Path | None = None) -> ImagePlan:
    top = root or repo_root()
    base = base_hash()
    return ImagePlan(top, cache_root(), base, context_hash(top, base), project_version(top))


def missing_tools() -> list[str]:
    return [t for t in ("buildah", "mmdebstrap") if shutil.which(t) is None]


def _run(argv: list[str], log: Path) -> None:
    with log.open("ab") as out:
        out.write(("\n$ " + " ".join(argv) + "\n").encode())
        out.flush()
        proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise ImageBuildError(f"{argv[0]} exited with {proc.returncode}; log {log}:\n{tail}")


class Buildah:
    """buildah with storage of our own under the cache (the host's /var/lib/containers stays
    untouched), chroot isolation and the host's network: RUN steps need no OCI runtime or
    network setup of their own, and reach the registries as the host does."""

    def __init__(self, cache: Path, log: Path) -> None:
        self.log = log
        # Named as neuron_dra.sim.scratch.work_dir names its directories (this module imports
        # only the standard library), so a killed build's runroot is swept like theirs.
        self.runroot = Path(tempfile.mkdtemp(prefix=f"ndra-buildah-p{os.getpid()}-"))
        self.base = [
            "buildah",
            "--root",
            str(cache / "storage"),
            "--runroot",
            str(self.runroot),
            "--storage-driver",
            "overlay",
        ]

    def __call__(self, *args: str) -> None:
        _run([*self.base, *args], self.log)

    def output(self, *args: str) -> str:
        return subprocess.run(
            [*self.base, *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    def has_image(self, ref: str) -> bool:
        return (
            subprocess.run(
                [*self.base, "inspect", "--type", "image", ref], capture_output=True, check=False
            ).returncode
            == 0
        )

    def close(self) -> None:
        shutil.rmtree(self.runroot, ignore_errors=True)


def build_base(p: ImagePlan, b: Buildah) -> None:
    if not p.base_tar.is_file():
        # mmdebstrap picks its output format by the name's ending: keep ".tar".
        partial = p.base_tar.with_name(p.base_tar.stem + ".partial.tar")
        _run(
            [
                "mmdebstrap",
                "--variant=minbase",
                "--include=" + ",".join(BASE_PACKAGES),
                '--aptopt=Acquire::Check-Valid-Until "false"',
                "--dpkgopt=path-exclude=/usr/share/doc/*",
                "--dpkgopt=path-exclude=/usr/share/man/*",
                "--dpkgopt=path-exclude=/usr/share/locale/*",
                f"--customize-hook={BASE_HOOK}",
                BASE_SUITE,
                str(partial),
                *BASE_SOURCES,
            ],
            b.log,
        )
        partial.rename(p.base_tar)
    if b.has_image(p.base_ref):
        return
    container = b.output("from", "scratch")
    try:
        b("add", container, str(p.base_tar), "/")
        b("config", *(a for e in BASE_ENV for a in ("--env", e)), "--cmd", "python3", container)
        b("commit", "--quiet", container, p.base_ref)
    finally:
        subprocess.run([*b.base, "rm", container], capture_output=True, check=False)


def build(p: ImagePlan, *, revision: str = "unknown", force: bool = False) -> Path:
    """The image archive for the tree as it is; built when the cache has none."""
    if p.archive.is_file() and not force:
        return p.archive
    missing = missing_tools()
    if missing:
        raise ImageBuildError(
            f"{' and '.join(missing)} not installed: hack/k8s/node-packages installs them"
        )
    p.cache.mkdir(parents=True, exist_ok=True)
    log = p.cache / f"build-{p.context_hash}.log"
    log.write_text("")
    b = Buildah(p.cache, log)
    try:
        started = time.monotonic()
        build_base(p, b)
        volumes = [
            a for v in BUILD_VOLUMES if os.path.exists(v) for a in ("--volume", f"{v}:{v}:ro")
        ]
        b(
            "bud",
            "--isolation",
            "chroot",
            "--network",
            "host",
            "--layers",
            *volumes,
            "--build-arg",
            f"PYTHON_IMAGE={p.base_ref}",
            "--build-arg",
            f"VERSION={p.version}",
            "--build-arg",
            f"REVISION={revision}",
            "--build-arg",
            "CREATED=" + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "--file",
            str(p.root / "Dockerfile"),
            "--tag",
            p.ref,
            str(p.root),
        )
        partial = p.archive.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        b("push", p.ref, f"docker-archive:{partial}:{p.ref}")
        partial.rename(p.archive)
        prune(p)
        print(
            f"[imagebuild] {p.ref} in {time.monotonic() - started:.0f} s: {p.archive} "
            f"({p.archive.stat().st_size / 2**20:.0f} MiB)",
            file=sys.stderr,
        )
    finally:
        b.close()
    return p.archive


def prune(p: ImagePlan, keep: int = 2) -> None:
    """Archives and logs of older trees go (the newest ``keep`` stay: a branch switched back
    and forth is not rebuilt), and so do the layers no image names any more."""
    archives = sorted(p.cache.glob("neuron-dra-*.tar"), key=lambda f: f.stat().st_mtime)
    for old in archives[:-keep]:
        old.unlink(missing_ok=True)
        (p.cache / old.name.replace("neuron-dra-", "build-").replace(".tar", ".log")).unlink(
            missing_ok=True
        )


def git_revision(root: Path) -> str:
    proc = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return proc.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="hack/build-image --local",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--force", action="store_true", help="build even when the cache has it")
    ap.add_argument(
        "--print-archive",
        action="store_true",
        help="print where the archive is (or would be) and its image name",
    )
    ap.add_argument(
        "--optional",
        action="store_true",
        help="without buildah/mmdebstrap or root, say so and exit 0 (not on CI)",
    )
    args = ap.parse_args(argv)
    p = plan()
    if args.print_archive:
        print(p.archive, p.ref)
        return 0
    problem = "not root" if os.geteuid() != 0 else ", ".join(missing_tools())
    if problem:
        msg = f"[imagebuild] cannot build the image here ({problem})"
        if args.optional and os.environ.get("CI") != "true":
            print(msg + "; the image tests will skip", file=sys.stderr)
            return 0
        print(msg, file=sys.stderr)
        return 1
    try:
        build(p, revision=git_revision(p.root), force=args.force)
    except ImageBuildError as err:
        print(f"[imagebuild] {err}", file=sys.stderr)
        return 1
    print(p.archive, p.ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())
