"""What a manifest needs to run its pods on the real nodes of this machine (pure).

Two things differ from a cluster on EKS, and only these are changed, in a copy:

- **hostNetwork**: the nodes have no pod network (loopback only: no bridge, no address of
  our own), so every pod shares its node's network namespace;
- **no registry**: nothing can be pulled. The images the manifests name are imported into
  every node under those names (:mod:`.images`); a container whose pull policy would be
  ``Always`` (an unset policy with a ``:latest`` or no tag) gets ``IfNotPresent``, and an
  image that is not there is refused before anything is created.

Everything else (commands, claims, labels, affinities) reaches the API server as written.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any

from .images import check_local_images

JsonDict = dict[str, Any]

#: Where each workload kind keeps its pod specs.
_POD_SPEC_PATHS: dict[str, tuple[tuple[str, ...], ...]] = {
    "Pod": (("spec",),),
    "Deployment": (("spec", "template", "spec"),),
    "ReplicaSet": (("spec", "template", "spec"),),
    "StatefulSet": (("spec", "template", "spec"),),
    "DaemonSet": (("spec", "template", "spec"),),
    "Job": (("spec", "template", "spec"),),
    "LeaderWorkerSet": (
        ("spec", "leaderWorkerTemplate", "leaderTemplate", "spec"),
        ("spec", "leaderWorkerTemplate", "workerTemplate", "spec"),
    ),
}


def pod_specs(manifest: JsonDict) -> Iterator[JsonDict]:
    """The pod specs inside ``manifest`` (none for kinds without pods)."""
    for path in _POD_SPEC_PATHS.get(str(manifest.get("kind")), ()):
        node: Any = manifest
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            yield node


def _pulls_always(image: str) -> bool:
    """The kubelet's default pull policy: Always for ``:latest`` or no tag (and no digest)."""
    if "@" in image:
        return False
    last = image.rsplit("/", 1)[-1]
    return ":" not in last or last.endswith(":latest")


def for_real_nodes(manifest: Mapping[str, Any]) -> JsonDict:
    """A copy of ``manifest`` whose pods can run on the real nodes (see the module doc)."""
    out: JsonDict = copy.deepcopy(dict(manifest))
    for spec in pod_specs(out):
        spec.setdefault("hostNetwork", True)
        containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        check_local_images(str(c.get("image", "")) for c in containers)
        for c in containers:
            if "imagePullPolicy" not in c and _pulls_always(str(c.get("image", ""))):
                c["imagePullPolicy"] = "IfNotPresent"
    return out
