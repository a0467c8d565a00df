"""The kubelet plugin's record of prepared claims (docs/architecture.md, "Crash safety").

Why a checkpoint at all: the kubelet may call NodePrepareResources again for a claim we already
prepared (its "prepared" flag is not persisted) and NodeUnprepareResources after the claim is
gone from the API server, possibly to a restarted plugin. Both must be answered from local
state, so every prepared claim is recorded here before Prepare returns.

On disk (``<plugins dir>/<driver>/checkpoint.json``; one line of compact JSON, indented here)::

    {
      "version": 1,
      "checksum": "<hex sha256 of the canonical JSON of data>",
      "data": {
        "bootId": "<the kernel boot id when the entries were written>",
        "claims": {
          "<claim uid>": {
            "namespace": "...", "name": "...",
            "devices": [{"requestNames": ["req"], "poolName": "<node>",
                         "deviceName": "neurondevice3",
                         "cdiDeviceIds": ["k8s.neuron.aws.com/claim=<uid>-neurondevice3"],
                         "shareId": "<the allocation's shareID, where it has one>"}],
            "deviceIndices": [3],
            "coreShare": {"device": 3, "first": 2, "count": 1, "deviceCores": 4},
            "cdiSpec": {... the CDI spec as written, so it can be rewritten verbatim ...},
            "metadata": {"<request>": {... its device metadata document ...}},
            "preparedAt": "2026-01-01T00:00:00Z"
          }
        }
      }
    }

Design choices, each from a failure seen in other drivers (e.g. NVIDIA's DRA driver, issues
kubernetes-sigs/dra-driver-nvidia-gpu#1080 and #951):

* The checksum covers the canonical form (sorted keys, no whitespace) of ``data`` *as read
  from the file*, not of our model re-serialized: a later version that adds a field still
  verifies, where hashing a re-marshalled struct made every upgrade look like corruption.
* A file we cannot trust is moved aside (``checkpoint.json.corrupt-<timestamp>``, kept for
  diagnosis) and we start empty with a warning the caller turns into a Node Event. Refusing to
  start would crash-loop the plugin and block every pod on the node.
* The boot id is stored: after a reboot the CDI specs under ``/var/run`` (tmpfs) are gone and
  the containers that used the devices are dead, so old entries would only block devices.
* Writes are atomic (temp file in the same directory, then rename): a crash of the plugin
  leaves the old or the new checkpoint, never half of one. They are not fsynced: only a power
  loss or kernel crash loses the page cache, and that is a reboot, after which the boot id
  drops every entry anyway (and a torn file fails its checksum). The two fsyncs were the
  largest fixed cost of a Prepare (1-1.6 ms on the node's disk) and bought nothing.
* Fields added later are optional (``shareId``, ``coreShare``): a file written before them
  loads unchanged, and an older plugin reading a newer file ignores them (it then takes a
  share for the whole device: more cautious, never less).
* Several plugin instances may share the file during a rolling update; they take turns under
  the node lock (:mod:`.nodelock`) and re-read the file whenever its bytes differ from the
  version they last read or wrote (:func:`read_raw`, :func:`load_raw`).

Everything except :func:`save`, :func:`load`, :func:`load_raw`, :func:`read_raw` and
:func:`read_boot_id` is pure.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from neuron_dra.nodeplugin.prepare.atomicfile import read_file, replace_file

log = logging.getLogger(__name__)

CHECKPOINT_VERSION: Final = 1
CHECKPOINT_FILE: Final = "checkpoint.json"
DEFAULT_BOOT_ID_PATH: Final = Path("/proc/sys/kernel/random/boot_id")
CORRUPT_SUFFIX: Final = ".corrupt-"


class CheckpointCorrupt(ValueError):
    """The file's content cannot be trusted; ``reason`` says why (for the Node Event)."""


# --- model ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceRecord:
    """One device as answered to the kubelet (so a repeated Prepare gives the same answer)."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    #: The allocation's ``shareID`` (devices that allow several allocations); None without.
    share_id: str | None = None


@dataclass(frozen=True)
class CoreShare:
    """The logical cores ``first`` .. ``first + count - 1`` (local ids, at the node's default
    LNC, of the ``device_cores`` the device has) that a claim holds of device ``device``,
    which other claims share (core sharing)."""

    device: int
    first: int
    count: int
    device_cores: int

    def overlaps(self, other: CoreShare) -> bool:
        return (
            self.device == other.device
            and self.first < other.first + other.count
            and other.first < self.first + self.count
        )

    @property
    def global_range(self) -> tuple[int, int]:
        """First and last global logical core ids (device index x cores per device + local
        id: how ``NEURON_RT_VISIBLE_CORES`` counts)."""
        first = self.device * self.device_cores + self.first
        return first, first + self.count - 1


@dataclass(frozen=True)
class ClaimEntry:
    uid: str
    namespace: str
    name: str
    devices: tuple[DeviceRecord, ...]
    #: Every Neuron device index the claim holds (all of them for ``neuronnode``).
    device_indices: tuple[int, ...]
    #: The CDI spec as written: rewritten verbatim if the file disappears while prepared.
    cdi_spec: Mapping[str, Any]
    #: RFC 3339 UTC; for humans reading the file.
    prepared_at: str
    #: Per base request: the device metadata document its CDI spec mounts (rewritten like the
    #: spec); empty without device metadata. Omitted from the file when empty.
    metadata: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: MappingProxyType({}))
    #: The cores it holds of a device it shares with other claims (then ``device_indices`` is
    #: that one device); None: it holds its devices whole.
    share: CoreShare | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @cached_property
    def canonical(self) -> bytes:
        """The entry's canonical JSON in the file, computed once: every save writes every
        entry, and with a node's claims prepared re-encoding them all made each Prepare
        slower the more the node held (the entry is immutable, so its bytes never change)."""
        return _canonical(_entry_to_json(self))


@dataclass(frozen=True)
class Checkpoint:
    """Immutable: writers build a new one and swap it in after it is on disk."""

    boot_id: str = ""
    claims: Mapping[str, ClaimEntry] = field(default_factory=lambda: MappingProxyType({}))

    def with_claim(self, entry: ClaimEntry) -> Checkpoint:
        return replace(self, claims=MappingProxyType({**self.claims, entry.uid: entry}))

    def without_claim(self, uid: str) -> Checkpoint:
        return replace(
            self, claims=MappingProxyType({k: v for k, v in self.claims.items() if k != uid})
        )

    def without_claims(self, uids: Iterable[str]) -> Checkpoint:
        drop = set(uids)
        return replace(
            self, claims=MappingProxyType({k: v for k, v in self.claims.items() if k not in drop})
        )


def find_conflict(
    checkpoint: Checkpoint, uid: str, indices: Iterable[int], share: CoreShare | None = None
) -> tuple[int, ClaimEntry] | None:
    """The first of ``indices`` already held by a claim other than ``uid`` (and that claim).

    A Neuron device can serve one claim at a time, or several claims that each hold cores of
    their own (``share``; core sharing); ``neuronnode`` entries list every index, so a
    whole-node claim and a single-device claim collide here too.
    """
    wanted = sorted(set(indices))
    for index in wanted:
        for entry in checkpoint.claims.values():
            if entry.uid == uid or index not in entry.device_indices:
                continue
            if share is not None and entry.share is not None and not share.overlaps(entry.share):
                continue
            return index, entry
    return None


def holders(checkpoint: Checkpoint, uid: str, indices: Iterable[int]) -> list[ClaimEntry]:
    """Every claim other than ``uid`` that holds one of ``indices``."""
    wanted = set(indices)
    return [
        e
        for e in checkpoint.claims.values()
        if e.uid != uid and wanted.intersection(e.device_indices)
    ]


# --- encoding (pure) -----------------------------------------------------------------------


def _canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def checksum(data: Mapping[str, Any]) -> str:
    return hashlib.sha256(_canonical(data)).hexdigest()


def _entry_to_json(entry: ClaimEntry) -> dict[str, Any]:
    out: dict[str, Any] = {
        "namespace": entry.namespace,
        "name": entry.name,
        "devices": [
            {
                "requestNames": list(d.request_names),
                "poolName": d.pool_name,
                "deviceName": d.device_name,
                "cdiDeviceIds": list(d.cdi_device_ids),
                **({"shareId": d.share_id} if d.share_id else {}),
            }
            for d in entry.devices
        ],
        "deviceIndices": list(entry.device_indices),
        "cdiSpec": _plain(entry.cdi_spec),
        "preparedAt": entry.prepared_at,
    }
    if entry.metadata:
        out["metadata"] = _plain(entry.metadata)
    if entry.share is not None:
        out["coreShare"] = {
            "device": entry.share.device,
            "first": entry.share.first,
            "count": entry.share.count,
            "deviceCores": entry.share.device_cores,
        }
    return out


def _plain(value: Any) -> Any:
    """Mapping proxies and tuples back to JSON types."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def encode(checkpoint: Checkpoint) -> bytes:
    """The file's bytes: one line of compact JSON, ``data`` in its canonical form.

    Written on every Prepare and Unprepare, before the kubelet gets its answer, so it is
    built from one encoding of ``data`` (the canonical bytes the checksum is taken over, by
    the C encoder) rather than a second, indented one. ``jq .`` shows it to humans.
    """
    # _canonical({"bootId": ..., "claims": {uid: entry JSON}}) from the entries' cached bytes:
    # the same bytes (keys sorted, no whitespace; "bootId" sorts before "claims").
    claims = b",".join(
        b"%s:%s" % (_canonical(uid), entry.canonical)
        for uid, entry in sorted(checkpoint.claims.items())
    )
    canonical = b'{"bootId":%s,"claims":{%s}}' % (_canonical(checkpoint.boot_id), claims)
    digest = hashlib.sha256(canonical).hexdigest()
    # The document's own keys in sorted order, like the canonical form inside it.
    return b'{"checksum":"%s","data":%s,"version":%d}\n' % (
        digest.encode(),
        canonical,
        CHECKPOINT_VERSION,
    )


def _str(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise CheckpointCorrupt(f"{where}.{key}: expected a string, got {type(value).__name__}")
    return value


def _list(obj: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = obj.get(key)
    if not isinstance(value, list):
        raise CheckpointCorrupt(f"{where}.{key}: expected a list, got {type(value).__name__}")
    return value


def _strs(obj: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    items = _list(obj, key, where)
    if not all(isinstance(i, str) for i in items):
        raise CheckpointCorrupt(f"{where}.{key}: expected strings")
    return tuple(items)


def _entry_from_json(uid: str, raw: Any) -> ClaimEntry:
    where = f"data.claims[{uid}]"
    if not isinstance(raw, dict):
        raise CheckpointCorrupt(f"{where}: expected an object")
    devices = []
    for i, d in enumerate(_list(raw, "devices", where)):
        dwhere = f"{where}.devices[{i}]"
        if not isinstance(d, dict):
            raise CheckpointCorrupt(f"{dwhere}: expected an object")
        devices.append(
            DeviceRecord(
                request_names=_strs(d, "requestNames", dwhere),
                pool_name=_str(d, "poolName", dwhere),
                device_name=_str(d, "deviceName", dwhere),
                cdi_device_ids=_strs(d, "cdiDeviceIds", dwhere),
                share_id=_optional_str(d, "shareId", dwhere),
            )
        )
    indices = _list(raw, "deviceIndices", where)
    # bool is an int subclass; a true/false here is not an index.
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in indices):
        raise CheckpointCorrupt(f"{where}.deviceIndices: expected non-negative integers")
    spec = raw.get("cdiSpec")
    if not isinstance(spec, dict) or not isinstance(spec.get("devices"), list):
        raise CheckpointCorrupt(f"{where}.cdiSpec: expected a CDI spec object")
    metadata = raw.get("metadata", {})
    if not isinstance(metadata, dict) or not all(isinstance(d, dict) for d in metadata.values()):
        raise CheckpointCorrupt(f"{where}.metadata: expected an object of documents")
    return ClaimEntry(
        uid=uid,
        namespace=_str(raw, "namespace", where),
        name=_str(raw, "name", where),
        devices=tuple(devices),
        device_indices=tuple(sorted(indices)),
        cdi_spec=spec,
        prepared_at=_str(raw, "preparedAt", where),
        metadata=metadata,
        share=_core_share(raw.get("coreShare"), f"{where}.coreShare"),
    )


def _optional_str(obj: Mapping[str, Any], key: str, where: str) -> str | None:
    return None if obj.get(key) is None else _str(obj, key, where)


def _core_share(raw: Any, where: str) -> CoreShare | None:
    if raw is None:
        return None  # a whole-device holder, or a file written before core sharing
    keys = ("device", "first", "count", "deviceCores")
    if not isinstance(raw, dict) or not all(
        isinstance(raw.get(k), int) and not isinstance(raw.get(k), bool) and raw[k] >= 0
        for k in keys
    ):
        raise CheckpointCorrupt(f"{where}: expected non-negative integers {', '.join(keys)}")
    share = CoreShare(*(int(raw[k]) for k in keys))
    if share.count < 1 or share.first + share.count > share.device_cores:
        raise CheckpointCorrupt(f"{where}: cores outside the device")
    return share


def decode(raw: bytes) -> Checkpoint:
    """Parse and verify a checkpoint file's bytes; :class:`CheckpointCorrupt` if untrustworthy.

    Unknown fields inside ``data`` are ignored (a newer writer may add some; the checksum
    still covers them), but an unknown ``version`` is refused: it may change their meaning.
    """
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointCorrupt(f"not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise CheckpointCorrupt("not a JSON object")
    version = doc.get("version")
    if version != CHECKPOINT_VERSION:
        raise CheckpointCorrupt(
            f"unsupported version {version!r} (this plugin reads version {CHECKPOINT_VERSION})"
        )
    data = doc.get("data")
    if not isinstance(data, dict):
        raise CheckpointCorrupt("data: expected an object")
    stored = doc.get("checksum")
    actual = checksum(data)
    if stored != actual:
        raise CheckpointCorrupt(f"checksum mismatch (file says {stored!r}, content is {actual})")
    claims = data.get("claims")
    if not isinstance(claims, dict):
        raise CheckpointCorrupt("data.claims: expected an object")
    return Checkpoint(
        boot_id=_str(data, "bootId", "data"),
        claims=MappingProxyType({uid: _entry_from_json(uid, e) for uid, e in claims.items()}),
    )


# --- files (edge) --------------------------------------------------------------------------


def checkpoint_path(plugins_dir: Path, driver_name: str) -> Path:
    return plugins_dir / driver_name / CHECKPOINT_FILE


def read_boot_id(path: Path = DEFAULT_BOOT_ID_PATH) -> str:
    """The kernel's per-boot random id; "" if unreadable (then reboots cannot be detected)."""
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("cannot read boot id from %s: %s; node reboots will not be detected", path, exc)
        return ""


def save(path: Path, checkpoint: Checkpoint) -> bytes:
    """Write atomically and durably: readers and crashes see the old file or the new one.

    Returns the bytes written (what a later :func:`read_raw` of an unchanged file gives).
    The file is private to the plugin (mode 0600).
    """
    raw = encode(checkpoint)
    replace_file(path, raw, mode=0o600, durable=False)  # why not durable: module docstring
    return raw


@dataclass(frozen=True)
class LoadResult:
    checkpoint: Checkpoint
    #: Problems a human should see (corrupt file moved aside): the caller emits Node Events.
    warnings: tuple[str, ...] = ()
    #: Expected resets (node rebooted): logged, no Event.
    notes: tuple[str, ...] = ()
    #: Where an untrusted file was moved.
    moved_to: Path | None = None
    #: Entries dropped because the node rebooted.
    dropped: tuple[ClaimEntry, ...] = ()
    #: The in-memory checkpoint differs from the file (new boot id, dropped entries, reset):
    #: the caller should save it.
    dirty: bool = False


def _aside_path(path: Path, now: datetime) -> Path:
    stamp = now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    candidate = path.with_name(f"{path.name}{CORRUPT_SUFFIX}{stamp}")
    n = 1
    while candidate.exists():  # two resets within a second: keep both files
        candidate = path.with_name(f"{path.name}{CORRUPT_SUFFIX}{stamp}.{n}")
        n += 1
    return candidate


def read_raw(path: Path) -> bytes | None:
    """The file's bytes, None if it does not exist (other OSErrors propagate)."""
    return read_file(path)


def load(path: Path, *, boot_id: str, now: datetime | None = None) -> LoadResult:
    """Read the checkpoint at ``path`` for the current ``boot_id``. Never raises for content.

    Missing file: empty. Untrustworthy file: moved aside, empty, with a warning. Written in an
    earlier boot: entries dropped, with a note. OSErrors other than "missing" (permissions,
    I/O) propagate: they are not the file's fault and moving it would lose state.
    """
    return load_raw(path, read_raw(path), boot_id=boot_id, now=now)


def load_raw(
    path: Path, raw: bytes | None, *, boot_id: str, now: datetime | None = None
) -> LoadResult:
    """:func:`load` for bytes already read from ``path`` (None: the file does not exist).

    For a caller that compares the bytes with the last version it knew before decoding them
    (several plugin instances share the file). An untrustworthy file is still moved aside,
    so call it only while no other writer can replace ``path`` in between.
    """
    now = now or datetime.now(UTC)
    if raw is None:
        return LoadResult(Checkpoint(boot_id=boot_id), dirty=False)
    try:
        loaded = decode(raw)
    except CheckpointCorrupt as exc:
        aside = _aside_path(path, now)
        os.replace(path, aside)
        warning = (
            f"prepared-claims checkpoint {path} is unusable ({exc}); moved it to {aside.name} "
            "and started empty. Claims prepared before are not known to this plugin any more: "
            "pods using them keep running, but a new claim may be given the same devices."
        )
        return LoadResult(
            Checkpoint(boot_id=boot_id), warnings=(warning,), moved_to=aside, dirty=True
        )
    if boot_id and loaded.boot_id and loaded.boot_id != boot_id:
        dropped = tuple(loaded.claims.values())
        note = (
            f"node rebooted (boot id {loaded.boot_id} -> {boot_id}): dropped "
            f"{len(dropped)} prepared claim(s) from the checkpoint; their containers are gone"
        )
        return LoadResult(Checkpoint(boot_id=boot_id), notes=(note,), dropped=dropped, dirty=True)
    if boot_id and loaded.boot_id != boot_id:
        # Written without a boot id (it was unreadable then): adopt the current one.
        return LoadResult(replace(loaded, boot_id=boot_id), dirty=True)
    return LoadResult(loaded)
