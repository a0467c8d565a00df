"""A prepared claim's files, as one: its CDI spec and its device metadata files (one per
request, which the spec bind-mounts into the containers; :mod:`.metadata`).

The content is built from the plan (pure, :func:`build`) and kept in the claim's checkpoint
entry, so the files can be rewritten verbatim. :class:`ClaimFiles` writes, checks, lists and
removes them. Their order keeps a container from ever being given a mount whose source is
missing: in, the metadata files first and the spec last; out, the spec first. With the
checkpoint around them (Prepare: files, then the entry, record.py; Unprepare: files, then
the entry, unprepare.py), a crash at any point leaves either files no entry names, which the
start-up sweep deletes, or an entry some of whose files are gone, which the start-up
recovery (or a repeated Prepare) writes again from the entry and the kubelet's Unprepare
retry removes (nodestate.py).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_dra.common.ultraserver import UltraServerPeers
from neuron_dra.nodeplugin.prepare import checkpoint as ckpt
from neuron_dra.nodeplugin.prepare import metadata
from neuron_dra.nodeplugin.prepare.atomicfile import replace_file
from neuron_dra.nodeplugin.prepare.cdi import (
    cdi_spec_for,
    list_cdi_specs,
    remove_cdi_spec,
    spec_file_name,
    write_cdi_spec,
)
from neuron_dra.nodeplugin.prepare.claims import ClaimPlan
from neuron_dra.nodeplugin.prepare.node import PrepareNode


@dataclass(frozen=True)
class ClaimContent:
    """What a prepared claim's files hold."""

    spec: dict[str, Any]
    #: Per base request name: its device metadata document; empty without device metadata.
    metadata: Mapping[str, Mapping[str, Any]]


def build(
    plan: ClaimPlan,
    node: PrepareNode,
    *,
    cdi_kind: str,
    topology: UltraServerPeers | None,
    env_indices: Sequence[int] | None,
    published: Mapping[str, Mapping[str, Any]] | None,
    driver: str,
    pool: str,
    metadata_root: Path,
    pod_claim_name: str | None = None,
) -> ClaimContent:
    """The claim's CDI spec (:func:`~neuron_dra.nodeplugin.prepare.cdi.cdi_spec_for`) and, when
    ``published`` is given (device metadata on), its metadata documents and the spec's
    mounts of them (``pod_claim_name``: :func:`.metadata.pod_claim_name` of the claim).
    Raises CdiError or ValueError for a plan that cannot be expressed."""
    spec = cdi_spec_for(plan, node, cdi_kind=cdi_kind, topology=topology, env_indices=env_indices)
    if published is None:
        return ClaimContent(spec, {})
    docs = metadata.documents(
        plan,
        node=node,
        topology=topology,
        published=published,
        driver=driver,
        pool=pool,
        pod_claim_name=pod_claim_name,
    )
    spec = metadata.with_mounts(
        spec, plan, docs, root=str(metadata_root), driver=driver, pod_claim_name=pod_claim_name
    )
    return ClaimContent(spec, docs)


class ClaimFiles:
    """The claims' files on this node: CDI specs in ``cdi_root``, metadata files under
    ``metadata_root`` (both shared by the node's plugin instances: call under the node
    lock)."""

    def __init__(self, cdi_root: Path, *, cdi_kind: str, metadata_root: Path) -> None:
        self.cdi_root = cdi_root
        self.cdi_kind = cdi_kind
        self.metadata_root = metadata_root

    def write(self, entry: ckpt.ClaimEntry) -> None:
        """Write the entry's files: metadata first, the spec that mounts them last."""
        write_metadata_files(self.metadata_root, entry.uid, entry.metadata)
        write_cdi_spec(self.cdi_root, entry.cdi_spec, entry.uid, cdi_kind=self.cdi_kind)

    def remove(self, uid: str) -> None:
        """Remove a claim's files, the spec first; already gone is fine."""
        remove_cdi_spec(self.cdi_root, uid, cdi_kind=self.cdi_kind)
        remove_metadata_files(self.metadata_root, uid)

    def complete(self, entry: ckpt.ClaimEntry) -> bool:
        """Whether every file of ``entry`` exists (someone may have emptied a directory)."""
        spec = self.cdi_root / spec_file_name(entry.uid, cdi_kind=self.cdi_kind)
        return spec.exists() and metadata_files_exist(self.metadata_root, entry.uid, entry.metadata)

    def present(self) -> set[str]:
        """Claim uids with any file here (for the start-up sweep)."""
        return list_cdi_specs(self.cdi_root, cdi_kind=self.cdi_kind) | metadata_claims(
            self.metadata_root
        )

    def sweep_temp_files(self) -> None:
        """Delete leftovers of interrupted atomic writes of metadata files (the CDI
        directory's are swept with the checkpoint's, nodestate.py)."""
        for name in _names(self.metadata_root):
            if name.startswith(".") and name.endswith(".tmp"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.metadata_root / name)


# --- metadata files -------------------------------------------------------------------------


def write_metadata_files(root: Path, claim_uid: str, docs: Mapping[str, Mapping[str, Any]]) -> None:
    """Write each request's file atomically (0644: containers read it as any user).

    Not fsynced, like the checkpoint: only a power loss or kernel crash loses the page
    cache, and after that reboot the checkpoint drops the claims and the start-up sweep
    their files.
    """
    for request, doc in sorted(docs.items()):
        path = Path(metadata.host_path(str(root), claim_uid, request))
        replace_file(path, metadata.encode(doc), mode=0o644, durable=False)


def metadata_files_exist(root: Path, claim_uid: str, requests: Iterable[str]) -> bool:
    return all(Path(metadata.host_path(str(root), claim_uid, r)).is_file() for r in requests)


def _names(root: Path) -> list[str]:
    try:
        return os.listdir(root)
    except FileNotFoundError:
        return []


def remove_metadata_files(root: Path, claim_uid: str) -> None:
    """Remove the claim's files, whichever requests they are for (a claim that was never
    recorded has orphans too); already gone is fine (Unprepare is retried)."""
    prefix = metadata.host_file_prefix(claim_uid)
    for name in _names(root):
        if name.startswith(prefix) and metadata.claim_of_host_file(name) is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(root / name)


def metadata_claims(root: Path) -> set[str]:
    """Claim uids with a metadata file in ``root`` (for the start-up sweep)."""
    return {uid for n in _names(root) if (uid := metadata.claim_of_host_file(n)) is not None}
