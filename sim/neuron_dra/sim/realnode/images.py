"""The real nodes' container images, made without a registry from Debian's busybox-static.

One OCI image archive (``oci-layout``, ``index.json``, ``blobs/``) that ``ctr images import``
loads into a node's containerd under every name the tests and the seeds' manifests use:

- the **test image**: busybox (``/bin/sh`` and every applet) with ``/etc/passwd``. Its
  stop signal is SIGKILL (the image config's ``StopSignal``, which containerd uses to stop
  a container): a test pod's ``sleep`` or ``sh`` is its PID 1, which never sees a SIGTERM
  it has no handler for, and the kubelet would wait out the pod's grace period (30 s by
  default) on every deletion. Nothing in a test container has anything to clean up;
- the **sandbox image** (containerd's ``pinned_images.sandbox``): the same layer with
  ``sleep`` as its entrypoint: the kubelet and containerd never need more of a pause.

The seeds' manifests name public images (``public.ecr.aws/ubuntu/ubuntu:22.04`` ...); they
run ``sleep`` or ``sh``, which busybox has, so the test image is imported under those names
too (:data:`ALIASES`). A pod naming an image outside these fails fast in the harness
(:func:`check_local_images`) instead of waiting on a pull that cannot happen here.

The archive is deterministic (fixed times and owners, sorted entries): its digest depends
only on the busybox binary, so it is cached by that binary's hash.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
TEST_IMAGE = "local.test/busybox:1.35"
SANDBOX_IMAGE = "local.test/pause:3.10"
#: The public images the seeds' manifests and our examples name, served by the test image.
ALIASES: tuple[str, ...] = (
    "public.ecr.aws/docker/library/alpine:latest",
    "public.ecr.aws/ubuntu/ubuntu:22.04",
    "docker.io/library/busybox:latest",
)
LOCAL_IMAGES: tuple[str, ...] = (TEST_IMAGE, SANDBOX_IMAGE, *ALIASES)
#: Bumped when the image's content changes for reasons other than busybox.
_FORMAT = "2"


class ImageError(RuntimeError):
    """The images cannot be made here (no busybox-static); the message says what to install."""


@dataclass(frozen=True)
class _Blob:
    media_type: str
    data: bytes

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.data).hexdigest()

    def descriptor(self, **extra: object) -> dict[str, object]:
        return {
            "mediaType": self.media_type,
            "digest": self.digest,
            "size": len(self.data),
            **extra,
        }


def _tar_entries(busybox: bytes, applets: Sequence[str]) -> bytes:
    """The root file system: one deterministic tar layer."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(name: str, kind: bytes, mode: int, data: bytes = b"", link: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime, info.uid, info.gid = kind, mode, 0, 0, 0
            info.uname = info.gname = "root"
            if link:
                info.linkname = link
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

        for d in ("bin", "dev", "etc", "proc", "sys", "tmp", "var", "var/run"):
            add(d, tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755)
        add("bin/busybox", tarfile.REGTYPE, 0o755, busybox)
        for applet in sorted(set(applets) - {"busybox"}):
            add(f"bin/{applet}", tarfile.SYMTYPE, 0o777, link="busybox")
        add("etc/passwd", tarfile.REGTYPE, 0o644, b"root:x:0:0:root:/:/bin/sh\n")
        add("etc/group", tarfile.REGTYPE, 0o644, b"root:x:0:\n")
    return buf.getvalue()


def _image(layer: _Blob, config: Mapping[str, object]) -> tuple[_Blob, _Blob]:
    diff_id = "sha256:" + hashlib.sha256(layer.data).hexdigest()  # uncompressed: same digest
    cfg = _Blob(
        "application/vnd.oci.image.config.v1+json",
        json.dumps(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": dict(config),
                "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            },
            sort_keys=True,
        ).encode(),
    )
    manifest = _Blob(
        "application/vnd.oci.image.manifest.v1+json",
        json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": cfg.descriptor(),
                "layers": [layer.descriptor()],
            },
            sort_keys=True,
        ).encode(),
    )
    return cfg, manifest


def image_archive(busybox: bytes, applets: Sequence[str]) -> bytes:
    """The OCI archive of the test and sandbox images under every local name (pure)."""
    layer = _Blob("application/vnd.oci.image.layer.v1.tar", _tar_entries(busybox, applets))
    common = {"Env": ["PATH=/bin"], "WorkingDir": "/", "StopSignal": "SIGKILL"}
    test_cfg, test_manifest = _image(layer, {**common, "Cmd": ["/bin/sh"]})
    sandbox_cfg, sandbox_manifest = _image(
        layer, {**common, "Entrypoint": ["/bin/sleep"], "Cmd": ["2147483647"]}
    )
    platform = {"architecture": "amd64", "os": "linux"}

    def entry(manifest: _Blob, name: str) -> dict[str, object]:
        tag = name.rpartition(":")[2]
        annotations = {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag}
        return manifest.descriptor(platform=platform, annotations=annotations)

    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            entry(sandbox_manifest, SANDBOX_IMAGE),
            *(entry(test_manifest, n) for n in (TEST_IMAGE, *ALIASES)),
        ],
    }
    files: dict[str, bytes] = {
        "oci-layout": b'{"imageLayoutVersion":"1.0.0"}',
        "index.json": json.dumps(index, sort_keys=True).encode(),
    }
    for blob in (layer, test_cfg, test_manifest, sandbox_cfg, sandbox_manifest):
        files[f"blobs/sha256/{blob.digest.removeprefix('sha256:')}"] = blob.data
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def image_cache_dir() -> Path:
    base = os.environ.get("NEURON_DRA_K8S_CACHE")
    root = Path(base).parent if base else Path.home() / ".cache" / "neuron-dra"
    return root / "images"


def build_images(busybox: Path = BUSYBOX, cache: Path | None = None) -> Path:
    """The archive file, made once per busybox binary (and image format) and reused."""
    if not busybox.is_file():
        raise ImageError(
            f"{busybox} not found: install Debian's busybox-static (hack/k8s/node-packages)"
        )
    binary = busybox.read_bytes()
    key = hashlib.sha256(binary + _FORMAT.encode()).hexdigest()[:12]
    path = (cache or image_cache_dir()) / f"images-{key}.tar"
    if path.is_file():
        return path
    applets = subprocess.run(
        [str(busybox), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_bytes(image_archive(binary, applets))
    partial.rename(path)
    return path


def check_local_images(images: Iterable[str]) -> None:
    """Refuse an image the real nodes cannot have: nothing can be pulled here."""
    unknown = sorted({i for i in images if i not in LOCAL_IMAGES})
    if unknown:
        raise ImageError(
            f"images {unknown} are not on the real nodes (no registry here); use one of "
            f"{list(LOCAL_IMAGES)} or add an alias in neuron_dra.sim.realnode.images.ALIASES"
        )
