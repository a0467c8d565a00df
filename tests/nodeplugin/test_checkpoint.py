"""The prepared-claims checkpoint: format, verification, atomic writes, resets."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from neuron_dra.nodeplugin.prepare import checkpoint as ckpt
from neuron_dra.nodeplugin.prepare.checkpoint import (
    Checkpoint,
    CheckpointCorrupt,
    ClaimEntry,
    CoreShare,
    DeviceRecord,
    decode,
    encode,
    find_conflict,
    load,
    read_boot_id,
    save,
)

BOOT = "3f0c1d52-8a5b-4f0e-9d3c-1b2a3c4d5e6f"
NOW = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)


def entry(uid: str, *indices: int, name: str | None = None, node: bool = False) -> ClaimEntry:
    devices = (
        (DeviceRecord(("neurons",), "trn2-node-0", "neuronnode", (f"k/c={uid}-neuronnode",)),)
        if node
        else tuple(
            DeviceRecord(
                ("neurons",), "trn2-node-0", f"neurondevice{i}", (f"k/c={uid}-neurondevice{i}",)
            )
            for i in indices
        )
    )
    return ClaimEntry(
        uid=uid,
        namespace="default",
        name=name or f"claim-{uid}",
        devices=devices,
        device_indices=tuple(range(16)) if node else tuple(indices),
        cdi_spec={"cdiVersion": "0.5.0", "kind": "k/c", "devices": [{"name": f"{uid}-x"}]},
        prepared_at="2026-01-01T00:00:00Z",
    )


def sample() -> Checkpoint:
    return Checkpoint(boot_id=BOOT).with_claim(entry("u1", 0, 1, 2, 3)).with_claim(entry("u2", 7))


def test_round_trip_and_documented_shape(tmp_path: Path) -> None:
    path = tmp_path / "neuron.aws.com" / "checkpoint.json"
    save(path, sample())
    doc = json.loads(path.read_text())
    assert doc["version"] == 1
    assert set(doc) == {"version", "checksum", "data"}
    canonical = json.dumps(doc["data"], sort_keys=True, separators=(",", ":")).encode()
    assert doc["checksum"] == hashlib.sha256(canonical).hexdigest()
    assert doc["data"]["bootId"] == BOOT
    assert doc["data"]["claims"]["u1"] == {
        "namespace": "default",
        "name": "claim-u1",
        "devices": [
            {
                "requestNames": ["neurons"],
                "poolName": "trn2-node-0",
                "deviceName": f"neurondevice{i}",
                "cdiDeviceIds": [f"k/c=u1-neurondevice{i}"],
            }
            for i in range(4)
        ],
        "deviceIndices": [0, 1, 2, 3],
        "cdiSpec": {"cdiVersion": "0.5.0", "kind": "k/c", "devices": [{"name": "u1-x"}]},
        "preparedAt": "2026-01-01T00:00:00Z",
    }
    result = load(path, boot_id=BOOT, now=NOW)
    assert result.checkpoint == sample()
    assert (result.warnings, result.notes, result.dirty) == ((), (), False)


def test_device_metadata_documents_round_trip() -> None:
    # An entry with device metadata keeps each request's document, so the file can be
    # rewritten like the spec; one without has no "metadata" key at all (files written
    # before the feature, or with it off, are unchanged).
    docs = {"neurons": {"metadata": {"name": "c", "generation": 1}, "requests": []}}
    cp = sample().with_claim(replace(entry("u3", 9), metadata=docs))
    doc = json.loads(encode(cp))
    assert doc["data"]["claims"]["u3"]["metadata"] == docs
    assert "metadata" not in doc["data"]["claims"]["u1"]
    assert decode(encode(cp)) == cp
    assert decode(encode(cp)).claims["u3"].metadata == docs


def test_file_is_the_canonical_json_of_the_document() -> None:
    # encode() builds the bytes around one canonical encoding of data; they must be exactly
    # what a JSON encoder gives for the whole document (non-ASCII names included).
    cp = sample().with_claim(
        ClaimEntry(
            uid="u3",
            namespace="équipe",
            name="claim-ü",
            devices=(),
            device_indices=(9,),
            cdi_spec={"devices": [], "note": "😀"},
            prepared_at="2026-01-01T00:00:00Z",
        )
    )
    cp = cp.with_claim(replace(entry("ü-0", 4), share=CoreShare(4, 2, 1, 4)))
    cp = replace(cp, boot_id="böot")
    for _ in range(2):  # the entries' bytes are cached after the first encode
        raw = encode(cp)
        doc = json.loads(raw)
        expected = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert raw == expected.encode() + b"\n"
        assert decode(raw) == cp
    # An entry changed is a new entry (frozen): its bytes are its own, not the old ones'.
    renamed = cp.with_claim(replace(cp.claims["u1"], name="renamed"))
    assert json.loads(encode(renamed))["data"]["claims"]["u1"]["name"] == "renamed"


def test_checkpoint_path_layout(tmp_path: Path) -> None:
    assert ckpt.checkpoint_path(tmp_path, "neuron.aws.com") == (
        tmp_path / "neuron.aws.com" / "checkpoint.json"
    )


def test_missing_file_is_empty(tmp_path: Path) -> None:
    result = load(tmp_path / "checkpoint.json", boot_id=BOOT, now=NOW)
    assert result.checkpoint == Checkpoint(boot_id=BOOT)
    assert not result.warnings and not result.dirty


def _corrupt_case(tmp_path: Path, content: bytes) -> tuple[ckpt.LoadResult, Path]:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(content)
    return load(path, boot_id=BOOT, now=NOW), path


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b"\xff\xfe", "not valid JSON"),
        (b"", "not valid JSON"),
    ],
)
def test_unparseable_file_is_moved_aside(tmp_path: Path, content: bytes, why: str) -> None:
    result, path = _corrupt_case(tmp_path, content)
    assert result.checkpoint == Checkpoint(boot_id=BOOT)
    assert result.dirty
    assert result.moved_to == tmp_path / "checkpoint.json.corrupt-20260304T050607Z"
    assert result.moved_to.read_bytes() == content  # kept for diagnosis, byte for byte
    assert not path.exists()
    [warning] = result.warnings
    assert why in warning and "checkpoint.json.corrupt-20260304T050607Z" in warning


def test_checksum_tampering_detected(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    save(path, sample())
    doc = json.loads(path.read_text())
    # A hand edit (or a bit flip) that leaves the JSON valid: only the checksum catches it.
    doc["data"]["claims"]["u1"]["deviceIndices"] = [0]
    path.write_text(json.dumps(doc))
    result = load(path, boot_id=BOOT, now=NOW)
    assert result.checkpoint.claims == {}
    assert "checksum mismatch" in result.warnings[0]
    assert result.moved_to is not None and result.moved_to.exists()


@pytest.mark.parametrize("version", [2, 0, "1", None])
def test_unknown_version_refused(tmp_path: Path, version: Any) -> None:
    raw = json.loads(encode(sample()))
    raw["version"] = version
    result, _ = _corrupt_case(tmp_path, json.dumps(raw).encode())
    assert result.checkpoint.claims == {}
    assert "unsupported version" in result.warnings[0]


def test_unknown_fields_from_a_newer_writer_still_verify() -> None:
    # The checksum is over the data as read, not our re-serialization of it: a field added by
    # a later version must not make the file look corrupt (the NVIDIA driver's upgrade bug).
    doc = json.loads(encode(sample()))
    doc["data"]["claims"]["u1"]["futureField"] = {"x": 1}
    doc["data"]["somethingNew"] = True
    doc["checksum"] = ckpt.checksum(doc["data"])
    assert decode(json.dumps(doc).encode()) == sample()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: c.pop("namespace"), "namespace: expected a string"),
        (lambda c: c.update(deviceIndices=[True]), "deviceIndices"),
        (lambda c: c.update(deviceIndices=[-1]), "deviceIndices"),
        (lambda c: c.update(cdiSpec={"kind": "k/c"}), "cdiSpec"),
        (lambda c: c["devices"][0].update(cdiDeviceIds="k/c=x"), "cdiDeviceIds"),
        (lambda c: c.update(devices=["x"]), "devices[0]: expected an object"),
        (lambda c: c.update(metadata=["x"]), "metadata: expected an object of documents"),
        (lambda c: c.update(metadata={"r": "x"}), "metadata: expected an object of documents"),
    ],
)
def test_malformed_entries_are_corrupt(mutate: Any, message: str) -> None:
    doc = json.loads(encode(sample()))
    mutate(doc["data"]["claims"]["u1"])
    doc["checksum"] = ckpt.checksum(doc["data"])
    with pytest.raises(CheckpointCorrupt, match=message.replace("[", r"\[").replace("]", r"\]")):
        decode(json.dumps(doc).encode())


def test_two_resets_in_one_second_keep_both_files(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text("garbage 1")
    first = load(path, boot_id=BOOT, now=NOW).moved_to
    path.write_text("garbage 2")
    second = load(path, boot_id=BOOT, now=NOW).moved_to
    assert first is not None and second is not None and first != second
    assert {first.read_text(), second.read_text()} == {"garbage 1", "garbage 2"}


def test_reboot_drops_every_entry(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    save(path, sample())
    result = load(path, boot_id="new-boot", now=NOW)
    assert result.checkpoint == Checkpoint(boot_id="new-boot")
    assert {e.uid for e in result.dropped} == {"u1", "u2"}
    assert result.dirty and not result.warnings
    [note] = result.notes
    assert "rebooted" in note and BOOT in note and "new-boot" in note
    assert path.exists()  # nothing wrong with the file: not moved aside


def test_unknown_boot_id_keeps_entries(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    save(path, sample())
    # Current boot id unreadable: we cannot tell a reboot, so keep what we know.
    assert load(path, boot_id="", now=NOW).checkpoint == sample()
    # Written without one: adopt the current id (and say the file needs saving).
    save(path, Checkpoint(boot_id="").with_claim(entry("u1", 0)))
    result = load(path, boot_id=BOOT, now=NOW)
    assert result.checkpoint.boot_id == BOOT and set(result.checkpoint.claims) == {"u1"}
    assert result.dirty


def test_read_boot_id(tmp_path: Path) -> None:
    f = tmp_path / "boot_id"
    f.write_text(BOOT + "\n")
    assert read_boot_id(f) == BOOT
    assert read_boot_id(tmp_path / "missing") == ""


def test_save_is_atomic_when_the_rename_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "checkpoint.json"
    save(path, sample())
    before = path.read_bytes()

    def broken_replace(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space"):
        save(path, Checkpoint(boot_id=BOOT))
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["checkpoint.json"]  # no temp file left behind


def test_save_leaves_no_temp_files_and_is_private(tmp_path: Path) -> None:
    path = tmp_path / "d" / "checkpoint.json"
    save(path, sample())
    save(path, sample().without_claim("u1"))
    assert os.listdir(path.parent) == ["checkpoint.json"]
    assert set(load(path, boot_id=BOOT, now=NOW).checkpoint.claims) == {"u2"}
    assert path.stat().st_mode & 0o077 == 0  # mkstemp's 0600: the plugin's own state


def test_find_conflict() -> None:
    state = sample()
    assert find_conflict(state, "u3", [4, 5]) is None
    index, holder = find_conflict(state, "u3", [7, 2]) or (None, None)
    assert (index, holder and holder.uid) == (2, "u1")  # lowest index first: stable messages
    assert find_conflict(state, "u1", [0, 1]) is None  # a claim never conflicts with itself
    whole = Checkpoint(boot_id=BOOT).with_claim(entry("n", node=True))
    hit = find_conflict(whole, "u9", [11])
    assert hit is not None and hit[1].uid == "n"
