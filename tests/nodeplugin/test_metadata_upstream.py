"""Our device metadata files (KEP-5304) read by Kubernetes' own decoder, the one generic tools
in a container use (k8s.io/dynamic-resource-allocation/devicemetadata): as the pinned 1.37
minor builds it (reads the v1beta1 object, validates it) and as 1.36 does (knows only
v1alpha1, skips the newer object). The decoder, ``metadata_decoder/``, is built offline from
the Go module cache that ``hack/k8s/build`` fills, once per pin (cached under
``~/.cache/neuron-dra/test-tools``)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from neuron_dra.common.ultraserver import UltraServerPeers
from neuron_dra.nodeplugin.prepare import metadata as md
from neuron_dra.sim import scratch
from test_metadata import TRN2, TRN2U, UID, documents, one_request, plan

REPO = Path(__file__).resolve().parents[2]
SOURCE = Path(__file__).resolve().parent / "metadata_decoder"
#: minor -> (build tag, the version its decoder reads)
PINS = {
    "1.37": ("metadata_v1beta1", "metadata.resource.k8s.io/v1beta1"),
    "1.36": ("", "metadata.resource.k8s.io/v1alpha1"),
}
MODULE = "k8s.io/dynamic-resource-allocation"


def _unavailable(why: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(why)
    pytest.skip(why)


def _go_env() -> dict[str, str]:
    # Offline, with the toolchain at hand: nothing is downloaded.
    return {**os.environ, "GOFLAGS": "-mod=mod", "GOPROXY": "off", "GOTOOLCHAIN": "local"}


def decoder(minor: str) -> Path:
    """The decoder built against ``minor``'s pin (skips, or fails on CI, when it cannot be)."""
    go = shutil.which("go")
    if go is None:
        _unavailable("no Go toolchain: the upstream decoder cannot be built")
    assert go is not None
    pin = REPO / "hack" / "k8s" / f"v{minor}"
    go_mod = pin.joinpath("go.mod").read_text()
    version = re.search(rf"{re.escape(MODULE)} => {re.escape(MODULE)} (v\S+)", go_mod)
    assert version, f"{MODULE} is not pinned in {pin}/go.mod"
    cache = subprocess.run(
        [go, "env", "GOMODCACHE"], capture_output=True, text=True, check=True, env=_go_env()
    ).stdout.strip()
    if not (Path(cache) / f"{MODULE}@{version.group(1)}").is_dir():
        _unavailable(
            f"{MODULE}@{version.group(1)} is not in the Go module cache: run hack/k8s/build"
        )
    tag, _ = PINS[minor]
    sources = sorted(SOURCE.glob("*.go"))
    key = hashlib.sha256(
        b"\0".join(
            [go_mod.encode(), pin.joinpath("go.sum").read_bytes(), tag.encode()]
            + [p.read_bytes() for p in sources]
        )
    ).hexdigest()[:12]
    cache_dir = Path.home() / ".cache" / "neuron-dra" / "test-tools"
    binary = cache_dir / f"metadata-decoder-{minor}-{key}"
    if binary.exists():
        return binary
    with scratch.temporary("metadata-decoder", Path(tempfile.gettempdir())) as module:
        # The pin's module without its tool directives (the Kubernetes binaries).
        text = re.sub(r"^tool \($.*?^\)$", "", go_mod, flags=re.MULTILINE | re.DOTALL)
        text = re.sub(r"^module .*$", "module mdcheck", text, count=1, flags=re.MULTILINE)
        module.joinpath("go.mod").write_text(text)
        shutil.copy(pin / "go.sum", module / "go.sum")
        for p in sources:
            shutil.copy(p, module / p.name)
        cache_dir.mkdir(parents=True, exist_ok=True)
        partial = cache_dir / f".{binary.name}.partial"
        built = subprocess.run(
            [go, "build", "-tags", tag, "-o", str(partial), "."],
            cwd=module,
            capture_output=True,
            text=True,
            env=_go_env(),
            timeout=900,
        )
        assert built.returncode == 0, built.stderr
        partial.rename(binary)
    return binary


def cases() -> dict[str, dict[str, Any]]:
    """Documents of every shape we write: a template claim (LNC 1), a claim named in the pod
    with a subrequest and two requests, an admin-access claim, an UltraServer workload's
    whole node with its rank."""
    out = {"lnc": documents(one_request(4, 5, 6, 7, lnc=1), TRN2)["neurons"]}
    two = plan(
        (("big/trn2",), "neurondevice0"),
        (("big/trn2",), "neurondevice1"),
        (("small",), "neurondevice2"),
        indices=(0, 1, 2),
    )
    for request, doc in documents(two, TRN2, pod_claim_name=None).items():
        out[f"two-{request}"] = doc
    out["admin"] = documents(one_request(0, 1, admin=True), TRN2)["neurons"]
    node = plan((("n",), "neuronnode"), indices=tuple(range(16)), mode=4, workload="w")
    peers = UltraServerPeers(1, 4, 3, "ip-10-0-9-9.us-west-2.compute.internal")
    out["rank"] = documents(node, TRN2U, topology=peers)["n"]
    return out


@pytest.mark.parametrize("minor", sorted(PINS))
def test_the_upstream_decoder_reads_our_files(minor: str, tmp_path: Path) -> None:
    binary = decoder(minor)
    docs = cases()
    paths = []
    for name, doc in docs.items():
        path = tmp_path / f"{name}.json"
        path.write_bytes(md.encode(doc))
        paths.append(str(path))
    run = subprocess.run([binary, *paths], capture_output=True, text=True, check=True)
    results = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(results) == len(docs)
    _, version = PINS[minor]
    for (name, doc), got in zip(docs.items(), results, strict=True):
        assert (got.get("error"), got.get("validation")) == (None, None), name
        assert got["version"] == version, name
        assert got["metadata"] == doc["metadata"], name
        assert got.get("podClaimName") == doc.get("podClaimName"), name
        assert got["requests"] == doc["requests"], name
    assert any(d.get("attributes") for r in results[0]["requests"] for d in r["devices"])
    assert UID in {r["metadata"]["uid"] for r in results}
