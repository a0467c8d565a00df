"""The per-claim device metadata file (KEP-5304): a prepared claim's devices and their
attributes, for programs in the container (docs/configuration.md, "Device metadata file").

The format is Kubernetes' (k8s.io/dynamic-resource-allocation: ``api/metadata``, written by
its ``kubeletplugin`` helper with ``EnableDeviceMetadata``, read by its ``devicemetadata``
decoder; v0.36 and v0.37 agree on all of it). Nothing in the kubelet takes part, so it works
on every Kubernetes minor. What the container sees:

* one file per claim request, at
  ``/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/<pod claim
  name>/<request>/<driver>-metadata.json`` for a claim made from a template (the name the
  pod gives the claim: the claim's own name is generated, so a program could not know it),
  else ``.../resourceclaims/<claim name>/<request>/<driver>-metadata.json``. ``<request>``
  is the base request (a ``req/sub`` subrequest's file is under ``req``);
* the file is a JSON stream: the same ``DeviceMetadata`` object once per API version,
  newest first (``metadata.resource.k8s.io/v1beta1``, then ``v1alpha1`` for programs built
  with the 1.36 library); each has the claim's identity (``metadata``: name, namespace,
  uid, generation 1), ``podClaimName`` and one ``requests`` entry listing the request's
  devices (driver, pool, name, ``attributes`` in the ResourceSlice format).

How it gets there: the file is written on the host at ``<root>/<claim uid>_<request>.json``
and bind-mounted read-only (``["ro", "bind"]``) by a CDI mount on the request's first
device. Differences from the helper, none visible inside the container: the host file is
named by the claim's uid (the helper's ``<namespace>_<name>/<request>/metadata.json`` lets
the Unprepare of a deleted claim remove the file of a successor of the same name, which a
restarted container then cannot mount) and sits directly in the root (no directories to
make and remove on every Prepare and Unprepare); the mount rides in the claim's own CDI spec
rather than in a second spec per request, so a claim's files are written, restored and
removed together (:mod:`.claimfiles`); and the JSON is compact (Python's fast encoder does
not indent; readers do not care).

Attributes, every name qualified with its domain: the device's ResourceSlice attributes as
published when the claim is prepared (without ``healthy``, which changes afterwards), plus
what the claim's containers were prepared with: the LNC, the device's cores, the
UltraServer mode and ids, the rank and the rank-0 host. Those come from the function that
makes the ``NEURON_*`` variables (:func:`~neuron_dra.nodeplugin.prepare.cdi.claim_env`), so file
and environment agree. An admin-access claim gets the slice attributes only: the runtime
settings belong to the claims that use the devices. The format allows 32 attributes per
device; where the slice's leave too little room (the fullest device, a trn2u in a workload
with every optional attribute, would have 34), the ones of least use to a program in the
container go first (:data:`_DROP_FIRST`).

Pure: the files are written, checked and removed by :mod:`.claimfiles`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

from neuron_dra.common import constants as c
from neuron_dra.common.profiles import UltraServerMode
from neuron_dra.common.ultraserver import UltraServerPeers
from neuron_dra.nodeplugin.prepare.cdi import (
    ENV_GLOBAL_TOPOID,
    ENV_GLOBAL_TOPOID0_HOST,
    ENV_US_MODE,
    ENV_US_NODE_ID,
    ENV_US_SERVER_ID,
    claim_env,
    minimum_cdi_version,
    visible_cores,
)
from neuron_dra.nodeplugin.prepare.claims import ClaimPlan
from neuron_dra.nodeplugin.prepare.node import PrepareNode

METADATA_GROUP: Final = "metadata.resource.k8s.io"
#: Newest first: a reader takes the first object whose version it knows.
API_VERSIONS: Final = (f"{METADATA_GROUP}/v1beta1", f"{METADATA_GROUP}/v1alpha1")
KIND: Final = "DeviceMetadata"

CONTAINER_DIR: Final = "/var/run/kubernetes.io/dra-device-attributes"
CLAIMS_SUBDIR: Final = "resourceclaims"
TEMPLATES_SUBDIR: Final = "resourceclaimtemplates"
FILE_SUFFIX: Final = "-metadata.json"

#: Under the plugin's data directory (next to the checkpoint), as the helper keeps it.
HOST_SUBDIR: Final = "dra-device-metadata"
HOST_SUFFIX: Final = ".json"
MOUNT_OPTIONS: Final = ("ro", "bind")

#: ``maxProperties`` of a device's attributes in the format.
MAX_ATTRIBUTES: Final = 32

#: Slice attributes the file leaves out: the file is written once, and ``healthy`` changes.
_LEFT_OUT: Final = frozenset({c.ATTR_HEALTHY})
#: Slice attributes that make room first when a device would have more than
#: :data:`MAX_ATTRIBUTES` (then the rest, last name first).
_DROP_FIRST: Final = (
    c.ATTR_DRA_DRIVER_VERSION,
    c.ATTR_NETWORK_NODE_LAYER3,
    c.ATTR_NETWORK_NODE_LAYER2,
    c.ATTR_NETWORK_NODE_LAYER1,
    c.ATTR_CAPACITY_BLOCK_ID,
    c.ATTR_ULTRASERVER_MODES,
    c.ATTR_TOPOLOGY8_ID,
    c.ATTR_TOPOLOGY4_ID,
)

Attribute = dict[str, Any]
Document = Mapping[str, Any]


def base_request(name: str) -> str:
    return name.split("/", 1)[0]


def _segment(value: str, what: str) -> str:
    # Names Kubernetes validated (a uid, DNS labels); checked again because they become paths.
    if not value or "/" in value or value in (".", ".."):
        raise ValueError(f"{what} {value!r} cannot name a metadata file")
    return value


def pod_claim_name(claim: Mapping[str, Any]) -> str | None:
    """The name the pod gives a claim made from a template (the annotation Kubernetes'
    resourceclaim controller sets on it), None for a claim the pod names itself."""
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    name = annotations.get(c.ANNOTATION_POD_CLAIM_NAME)
    return str(name) if name else None


def container_path(
    plan: ClaimPlan, request: str, *, driver: str, pod_claim_name: str | None
) -> str:
    """Where the container finds the file of ``request`` (a base request name)."""
    if pod_claim_name:
        under = f"{TEMPLATES_SUBDIR}/{_segment(pod_claim_name, 'pod claim name')}"
    else:
        under = f"{CLAIMS_SUBDIR}/{_segment(plan.name, 'claim name')}"
    return f"{CONTAINER_DIR}/{under}/{_segment(request, 'request')}/{driver}{FILE_SUFFIX}"


def host_file_prefix(claim_uid: str) -> str:
    """What the names of a claim's host files start with."""
    uid = _segment(claim_uid, "claim uid")
    if "_" in uid:  # the separator (a uid is a UUID; a request, a DNS label)
        raise ValueError(f"claim uid {claim_uid!r} cannot name a metadata file")
    return f"{uid}_"


def host_path(root: str, claim_uid: str, request: str) -> str:
    """The host file of ``request`` under ``root`` (the files' directory)."""
    return f"{root}/{host_file_prefix(claim_uid)}{_segment(request, 'request')}{HOST_SUFFIX}"


def claim_of_host_file(name: str) -> str | None:
    """The claim uid a file name in the files' directory belongs to; None for other names
    (hidden ones: temporary files of atomic writes)."""
    if name.startswith(".") or not name.endswith(HOST_SUFFIX) or "_" not in name:
        return None
    return name.partition("_")[0]


def _int(value: int) -> Attribute:
    return {"int": value}


def _str(value: str) -> Attribute:
    return {"string": value}


def _qualified(name: str, driver: str) -> str:
    """A ResourceSlice attribute name with its domain (a short one is in the driver's)."""
    return name if "/" in name else f"{driver}/{name}"


def runtime_attributes(
    plan: ClaimPlan,
    node: PrepareNode,
    *,
    topology: UltraServerPeers | None,
    driver: str,
) -> dict[str, Attribute]:
    """What every device of a (non admin-access) claim was prepared with, as the claim's
    own ``NEURON_*`` variables say it: the effective LNC, the UltraServer node count, mode
    number, server and node id, the rank and the rank-0 host. A value the format cannot hold
    (a host name over 64 characters) is left out; the variable still has it."""
    env = claim_env(plan, node, topology=topology)
    lnc = plan.lnc if plan.lnc is not None else node.default_lnc
    out: dict[str, Attribute] = {c.METADATA_ATTR_LOGICAL_NEURON_CORE: _int(lnc)}
    if ENV_US_MODE in env:
        mode = UltraServerMode(int(env[ENV_US_MODE]))
        out[c.METADATA_ATTR_ULTRASERVER_NODE_COUNT] = _int(mode.node_count)
        out[c.METADATA_ATTR_ULTRASERVER_RUNTIME_MODE] = _int(int(mode))
    if ENV_US_SERVER_ID in env:
        out[c.METADATA_ATTR_ULTRASERVER_SERVER_ID] = _str(env[ENV_US_SERVER_ID])
    if ENV_US_NODE_ID in env:
        out[c.METADATA_ATTR_ULTRASERVER_SERVER_NODE_ID] = _int(int(env[ENV_US_NODE_ID]))
    if ENV_GLOBAL_TOPOID in env:
        out[c.METADATA_ATTR_GLOBAL_TOPOLOGY_ID] = _int(int(env[ENV_GLOBAL_TOPOID]))
    host = env.get(ENV_GLOBAL_TOPOID0_HOST, "")
    if host and len(host) <= c.MAX_ATTRIBUTE_VALUE_LENGTH:
        out[c.METADATA_ATTR_GLOBAL_TOPOLOGY_ID0_HOST] = _str(host)
    return {_qualified(k, driver): v for k, v in out.items()}


def device_runtime_attributes(
    plan: ClaimPlan, device: str, node: PrepareNode, *, driver: str
) -> dict[str, Attribute]:
    """One device's part: its cores as ``NEURON_RT_VISIBLE_CORES`` numbers them (all of the
    node's for ``neuronnode``) and, for a single device, its logical core count at the
    claim's LNC (the slice's is at the node's default)."""
    profile = node.profile
    lnc = plan.lnc if plan.lnc is not None else node.default_lnc
    per_device = profile.cores_per_device // lnc
    if device == c.NODE_DEVICE_NAME:
        indices: tuple[int, ...] = plan.device_indices
    else:
        index = c.device_index(device)
        if index is None:
            raise ValueError(f"unexpected device name {device!r}")
        indices = (index,)
    out = {c.METADATA_ATTR_VISIBLE_CORES: _str(visible_cores(indices, per_device))}
    if device != c.NODE_DEVICE_NAME:
        out[c.ATTR_LOGICAL_CORE_COUNT] = _int(per_device)
    return {_qualified(k, driver): v for k, v in out.items()}


def fit_attributes(
    published: Mapping[str, Any], runtime: Mapping[str, Attribute], *, driver: str
) -> dict[str, Attribute]:
    """The device's attributes for the file: the slice's (``published``, names as in the
    slice) under the runtime ones (which win a name both have), at most
    :data:`MAX_ATTRIBUTES`, sorted by name as the helper's encoder writes a map."""
    from_slice = {
        _qualified(k, driver): dict(v)
        for k, v in published.items()
        if k not in _LEFT_OUT and isinstance(v, Mapping)
    }
    names = [n for n in from_slice if n not in runtime]
    room = MAX_ATTRIBUTES - len(runtime)
    if len(names) > room:
        order = [_qualified(n, driver) for n in _DROP_FIRST] + sorted(names, reverse=True)
        dropped: set[str] = set()
        for name in order:
            if len(names) - len(dropped) <= room:
                break
            if name in from_slice and name not in runtime:
                dropped.add(name)
        names = [n for n in names if n not in dropped]
    return dict(sorted({**{n: from_slice[n] for n in names}, **runtime}.items()))


def documents(
    plan: ClaimPlan,
    *,
    node: PrepareNode,
    topology: UltraServerPeers | None,
    published: Mapping[str, Mapping[str, Any]],
    driver: str,
    pool: str,
    pod_claim_name: str | None,
) -> dict[str, dict[str, Any]]:
    """Per base request of the claim: its ``DeviceMetadata`` object, without ``apiVersion``
    and ``kind`` (:func:`encode` adds them per version). ``published``: this node's devices
    as its ResourceSlice has them (device name -> attributes)."""
    card: dict[str, Attribute] = {}
    if not plan.admin_access:
        card = runtime_attributes(plan, node, topology=topology, driver=driver)
    requests: dict[str, tuple[str, list[dict[str, Any]]]] = {}
    for names, device in plan.devices:
        runtime = dict(card)
        if not plan.admin_access:
            runtime.update(device_runtime_attributes(plan, device, node, driver=driver))
        entry: dict[str, Any] = {"driver": driver, "pool": pool, "name": device}
        attributes = fit_attributes(published.get(device) or {}, runtime, driver=driver)
        if attributes:
            entry["attributes"] = attributes
        for name in names:
            requests.setdefault(base_request(name), (name, []))[1].append(entry)
    meta = {"name": plan.name, "namespace": plan.namespace, "uid": plan.claim_uid}
    out: dict[str, dict[str, Any]] = {}
    for base, (name, devices) in requests.items():
        doc: dict[str, Any] = {"metadata": {**meta, "generation": 1}}
        if pod_claim_name:
            doc["podClaimName"] = pod_claim_name
        doc["requests"] = [{"name": name, "devices": devices}]
        out[base] = doc
    return out


#: The helper's field order (its Go structs'); map keys (attribute names) sort after them
#: by name, as Go writes a map.
_FIELD_ORDER: Final = {
    name: i
    for i, name in enumerate(
        (
            *("kind", "apiVersion", "metadata", "name", "namespace", "uid", "generation"),
            *("podClaimName", "requests", "devices", "driver", "pool", "attributes"),
            "networkData",
        )
    )
}


_COMPACT: Final = (",", ":")


def _ordered(value: Any) -> Any:
    # Scalars first: most values are, and the Mapping check is an ABC's (slow).
    if isinstance(value, str | int | float) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_ordered(v) for v in value]
    if isinstance(value, Mapping):
        keys = sorted(value, key=lambda k: (_FIELD_ORDER.get(k, len(_FIELD_ORDER)), k))
        return {k: _ordered(value[k]) for k in keys}
    return value


def encode(document: Document) -> bytes:
    """The file's bytes: the object once per API version, newest first, each on a line of
    its own, fields in the helper's order whatever the order of ``document`` (one read back
    from the checkpoint has its keys sorted), so a rewrite gives the same bytes."""
    # The fields are encoded once and put behind each version's head: the same bytes as
    # encoding each object whole, with one encoding of the fields instead of two.
    body = json.dumps(_ordered(document), separators=_COMPACT)[1:]
    sep = "," if body != "}" else ""
    return "".join(
        json.dumps({"kind": KIND, "apiVersion": version}, separators=_COMPACT)[:-1] + sep + body
        + "\n"
        for version in API_VERSIONS
    ).encode()  # fmt: skip


def decode(raw: str) -> list[dict[str, Any]]:
    """Every object of a metadata stream, in order (for tests and tools; the first one whose
    ``apiVersion`` a reader knows is the one to use)."""
    decoder = json.JSONDecoder()
    out: list[dict[str, Any]] = []
    at = 0
    while True:
        while at < len(raw) and raw[at].isspace():
            at += 1
        if at == len(raw):
            return out
        obj, at = decoder.raw_decode(raw, at)
        out.append(obj)


def with_mounts(
    spec: Mapping[str, Any],
    plan: ClaimPlan,
    requests: Iterable[str],
    *,
    root: str,
    driver: str,
    pod_claim_name: str | None,
) -> dict[str, Any]:
    """``spec`` (the claim's CDI spec, devices in ``plan.devices`` order) with the read-only
    bind mount of each request's file on the first device of the request: a runtime applies a
    device's edits to a container that gets the device, which the kubelet gives to the
    containers naming the claim or that request."""
    devices = [
        {**d, "containerEdits": dict(d.get("containerEdits") or {})} for d in spec["devices"]
    ]
    if len(devices) != len(plan.devices):
        raise ValueError(f"claim {plan.key}: spec devices do not match the plan")
    first: dict[str, int] = {}
    for i, (names, _) in enumerate(plan.devices):
        for name in names:
            first.setdefault(base_request(name), i)
    for request in sorted(set(requests)):
        edits = devices[first[request]]["containerEdits"]
        mount = {
            "hostPath": host_path(root, plan.claim_uid, request),
            "containerPath": container_path(
                plan, request, driver=driver, pod_claim_name=pod_claim_name
            ),
            "options": list(MOUNT_OPTIONS),
        }
        edits["mounts"] = [*(edits.get("mounts") or []), mount]
    out = {**spec, "devices": devices}
    out["cdiVersion"] = minimum_cdi_version(out)
    return out
