"""Checkpoints: round trips, and every kind of damage detected, set aside and never raised (real files in tmp_path)."""

from __future__ import annotations

import logging
import os
import stat

import pytest

from edgelet.util import checkpoint
from edgelet.util.checkpoint import CheckpointStore, CorruptCheckpoint, decode, encode, filename_to_key, key_to_filename

PAYLOAD = b'{"pod": "web", "containers": ["app", "sidecar"]}'


def corrupt_files(directory) -> list[str]:
    corrupt = directory / checkpoint.CORRUPT_DIR
    return sorted(os.listdir(corrupt)) if corrupt.exists() else []


def test_round_trip(tmp_path):
    store = CheckpointStore(tmp_path, kind="pods")
    store.write("default/web", PAYLOAD)
    store.write("empty", b"")
    assert store.read("default/web") == PAYLOAD
    assert store.read("empty") == b""
    assert store.read("absent") is None
    assert store.keys() == ["default/web", "empty"]
    assert store.load_all() == {"default/web": PAYLOAD, "empty": b""}
    # A new store over the same directory (a restart) sees the same data.
    assert CheckpointStore(tmp_path, kind="pods").load_all() == {"default/web": PAYLOAD, "empty": b""}


def test_overwrite_and_delete(tmp_path):
    store = CheckpointStore(tmp_path, kind="pods")
    store.write("k", b"one")
    store.write("k", b"two")
    assert store.read("k") == b"two"
    store.delete("k")
    store.delete("k")  # deleting twice is fine
    assert store.read("k") is None and store.keys() == []


def test_header_is_readable_text():
    data = encode("pods", PAYLOAD)
    header, _, payload = data.partition(b"\n")
    assert header.startswith(b"EDGELET-CHECKPOINT 1 pods 48 sha256:")
    assert payload == PAYLOAD


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "no header"),
        (b'{"json": true}', "no header"),
        (b"EDGELET-CHECKPOINT 1 pods", "truncated"),
        (b"EDGELET-CHECKPOINT 1 pods x sha256:00\n", "malformed"),
        (encode("pods", PAYLOAD).replace(b"CHECKPOINT 1 ", b"CHECKPOINT 2 "), "unsupported format version 2"),
        (encode("other", PAYLOAD), "holds a 'other' checkpoint, not 'pods'"),
        (encode("pods", PAYLOAD)[:-1], "truncated or torn write"),
        (encode("pods", PAYLOAD) + b"x", "header says 48"),
        (encode("pods", PAYLOAD)[:-1] + b"X", "checksum mismatch"),
    ],
)
def test_decode_reports_what_is_wrong(data, problem):
    with pytest.raises(CorruptCheckpoint, match=problem.replace("(", r"\(").replace(")", r"\)")):
        decode(data, "pods")


def test_every_truncation_is_detected():
    data = encode("pods", PAYLOAD)
    for length in range(len(data)):
        with pytest.raises(CorruptCheckpoint):
            decode(data[:length], "pods")


def test_every_single_bit_flip_is_detected():
    data = encode("pods", PAYLOAD)
    for offset in range(len(data)):
        for bit in range(8):
            damaged = bytearray(data)
            damaged[offset] ^= 1 << bit
            with pytest.raises(CorruptCheckpoint):
                decode(bytes(damaged), "pods")


def test_truncated_files_are_set_aside_at_every_offset(tmp_path):
    store = CheckpointStore(tmp_path, kind="pods")
    data = encode("pods", PAYLOAD)
    for length in range(len(data)):
        (tmp_path / key_to_filename("k")).write_bytes(data[:length])
        assert store.read("k") is None
        assert not (tmp_path / key_to_filename("k")).exists()
    assert len(corrupt_files(tmp_path)) == len(data)  # each kept for a post-mortem, none overwritten
    store.write("k", PAYLOAD)
    assert store.read("k") == PAYLOAD


def test_bit_flipped_file_is_set_aside_and_logged_once(tmp_path, caplog):
    store = CheckpointStore(tmp_path, kind="pods")
    store.write("k", PAYLOAD)
    path = tmp_path / key_to_filename("k")
    damaged = bytearray(path.read_bytes())
    damaged[-3] ^= 0x10
    path.write_bytes(bytes(damaged))
    with caplog.at_level(logging.WARNING, logger="edgelet.util.checkpoint"):
        assert store.load_all() == {}
        assert store.read("k") is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert str(path) in warnings[0] and "checksum mismatch" in warnings[0]
    (aside,) = corrupt_files(tmp_path)
    assert aside.startswith(key_to_filename("k") + ".")
    assert (tmp_path / "corrupt" / aside).read_bytes() == bytes(damaged)


def test_wrong_kind_and_foreign_files_are_set_aside(tmp_path, caplog):
    (tmp_path / "a.ckpt").write_bytes(encode("secrets", b"x"))
    (tmp_path / "b.ckpt").write_bytes(b"some other program's data")
    (tmp_path / "odd.name.ckpt").write_bytes(encode("pods", b"y"))  # not a name this module writes
    (tmp_path / "README").write_text("not ours, not a checkpoint name: left alone")
    store = CheckpointStore(tmp_path, kind="pods")
    store.write("good", b"ok")
    with caplog.at_level(logging.WARNING, logger="edgelet.util.checkpoint"):
        assert store.load_all() == {"good": b"ok"}
    assert len(corrupt_files(tmp_path)) == 3
    assert (tmp_path / "README").exists()
    text = caplog.text
    assert "holds a 'secrets' checkpoint, not 'pods'" in text
    assert "not an edgelet checkpoint" in text
    assert "not an encoded checkpoint key" in text


def test_leftover_temp_files_are_removed_on_open_and_ignored(tmp_path):
    store = CheckpointStore(tmp_path, kind="pods")
    store.write("k", PAYLOAD)
    leftover = tmp_path / f".tmp-0123456789ab-{key_to_filename('k')}"
    leftover.write_bytes(encode("pods", b"half")[:10])  # a crash during write
    assert store.keys() == ["k"]
    CheckpointStore(tmp_path, kind="pods")
    assert not leftover.exists()
    assert store.read("k") == PAYLOAD
    assert corrupt_files(tmp_path) == []


def test_secret_files_are_private_whatever_the_umask(tmp_path):
    old_umask = os.umask(0)
    try:
        store = CheckpointStore(tmp_path / "secrets", kind="secrets")
        store.write("default/token", b"s3cr3t")
        relaxed = CheckpointStore(tmp_path / "public", kind="pods", mode=0o644)
        relaxed.write("k", b"x")
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(os.stat(tmp_path / "secrets" / key_to_filename("default/token")).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "secrets").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "public" / key_to_filename("k")).st_mode) == 0o644


def test_write_leaves_no_temp_file_behind(tmp_path):
    store = CheckpointStore(tmp_path, kind="pods")
    for index in range(5):
        store.write(f"k{index}", PAYLOAD)
    assert sorted(os.listdir(tmp_path)) == sorted(key_to_filename(f"k{i}") for i in range(5))


def test_failed_write_raises_and_cleans_up(tmp_path):
    store = CheckpointStore(tmp_path, kind="pods")
    (tmp_path / key_to_filename("k")).mkdir()  # the rename onto it must fail
    with pytest.raises(OSError):
        store.write("k", b"new")
    assert os.listdir(tmp_path) == [key_to_filename("k")]  # no temp file left behind
    assert store.read("k") is None  # a directory where a checkpoint belongs is set aside
    assert corrupt_files(tmp_path) and store.keys() == []


@pytest.mark.parametrize(
    "key",
    ["simple", "default/web", "../../etc/passwd", ".", "..", ".hidden", "corrupt", "a b", "ünïcode", "%2E", "x~",
     "uid-1234_abc"],
)
def test_keys_are_safe_file_names_and_round_trip(tmp_path, key):
    name = key_to_filename(key)
    assert "/" not in name and not name.startswith(".") and name.endswith(".ckpt")
    assert name != checkpoint.CORRUPT_DIR
    assert filename_to_key(name) == key
    store = CheckpointStore(tmp_path, kind="pods")
    store.write(key, b"v")
    assert store.keys() == [key] and store.read(key) == b"v"
    assert os.listdir(tmp_path) == [name]


@pytest.mark.parametrize("key", ["", "x" * 300])
def test_unusable_keys_are_refused(key):
    with pytest.raises(ValueError):
        key_to_filename(key)


@pytest.mark.parametrize("kind", ["", "Pods", "a b", "x/y"])
def test_kinds_are_checked(tmp_path, kind):
    with pytest.raises(ValueError):
        CheckpointStore(tmp_path, kind=kind)


def test_a_reader_never_touches_the_owners_files(tmp_path):
    owner = CheckpointStore(tmp_path, kind="pod-status")
    owner.write("a", b"1")
    in_flight = tmp_path / ".tmp-0123456789ab-b.ckpt"  # the owner is writing b right now
    in_flight.write_bytes(b"half")
    (tmp_path / "c.ckpt").write_bytes(b"damaged")
    reader = CheckpointStore(tmp_path, kind="pod-status", reader=True)
    assert reader.load_all() == {"a": b"1"}
    assert in_flight.exists() and (tmp_path / "c.ckpt").exists() and not (tmp_path / "corrupt").exists()
    assert CheckpointStore(tmp_path / "missing", kind="pod-status", reader=True).load_all() == {}
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("durable, fsyncs", [(True, 2), (False, 0)])
def test_replace_file_fsyncs_only_when_durable(tmp_path, monkeypatch, durable, fsyncs):
    calls: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real_fsync(fd))[1])
    target = tmp_path / "state.json"
    checkpoint.replace_file(target, b"{}", temp=tmp_path / "state.json.new", mode=0o600, exclusive=False,
                            durable=durable)
    assert target.read_bytes() == b"{}" and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert len(calls) == fsyncs  # the file and its directory, or neither
    assert os.listdir(tmp_path) == ["state.json"]


@pytest.mark.parametrize("durable", [True, False])
def test_replace_file_leaves_no_temp_when_the_rename_fails(tmp_path, durable):
    target = tmp_path / "state.json"
    target.mkdir()  # a directory where the file should go: the rename fails
    with pytest.raises(OSError):
        checkpoint.replace_file(target, b"{}", temp=tmp_path / "state.json.new", mode=0o600, exclusive=False,
                                durable=durable)
    assert os.listdir(tmp_path) == ["state.json"]


def test_write_many_writes_and_deletes_with_one_fsync_of_the_directory(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path, kind="pod-status")
    store.write("gone", b"x")
    store.write("kept", b"old")
    fsyncs: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    store.write_many({"a": b"1", "kept": b"new", "gone": None, "absent": None})
    assert store.load_all() == {"a": b"1", "kept": b"new"}
    assert len(fsyncs) == 3  # each payload before its rename, then the directory once for the renames and unlink
    assert sorted(os.listdir(tmp_path)) == sorted(key_to_filename(k) for k in ("a", "kept"))  # no temp left


@pytest.mark.parametrize("changes", [{}, {"absent": None}])
def test_write_many_that_changes_nothing_syncs_nothing(tmp_path, monkeypatch, changes):
    store = CheckpointStore(tmp_path, kind="pod-status")
    fsyncs: list[int] = []
    monkeypatch.setattr(os, "fsync", fsyncs.append)
    store.write_many(changes)
    assert fsyncs == [] and store.keys() == []


def test_write_many_failing_part_way_leaves_every_key_whole(tmp_path):
    store = CheckpointStore(tmp_path, kind="pod-status")
    store.write("c", b"old")
    (tmp_path / key_to_filename("b")).mkdir()  # the rename onto it fails
    with pytest.raises(OSError):
        store.write_many({"a": b"new", "b": b"new", "c": b"new"})
    assert store.read("a") == b"new" and store.read("c") == b"old"  # written before the failure; untouched after
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]  # no temp file left behind
    store.write_many({"a": b"new", "c": b"new"})  # the batch again, without the broken key
    assert store.read("c") == b"new"
