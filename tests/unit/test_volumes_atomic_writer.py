"""The atomic writer on a scratch directory: views swap whole, leftovers go, vanished keys disappear."""

from __future__ import annotations

import os
import stat

import pytest

from edgelet.volumes import atomic_writer
from edgelet.volumes.atomic_writer import DATA_DIR_NAME, FileProjection, write_payload
from edgelet.volumes.errors import VolumeError


def _view(directory) -> dict[str, bytes]:
    """What a container sees: every regular file reachable through the user-visible names."""
    seen = {}
    for name in os.listdir(directory):
        if name.startswith(".."):
            continue
        for root, _, files in os.walk(os.path.join(directory, name), followlinks=True):
            for file in files:
                path = os.path.join(root, file)
                with open(path, "rb") as stream:
                    seen[os.path.relpath(path, directory)] = stream.read()
        if os.path.isfile(os.path.join(directory, name)):
            with open(os.path.join(directory, name), "rb") as stream:
                seen[name] = stream.read()
    return seen


def _data_dirs(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith("..") and n != DATA_DIR_NAME)


def test_first_write_lays_out_the_kubelet_structure(tmp_path):
    assert write_payload(str(tmp_path), {"a": FileProjection(b"1"), "dir/b": FileProjection(b"2", 0o600)},
                         now=lambda: 1767225600.0)
    (data_dir,) = _data_dirs(tmp_path)
    assert data_dir.startswith("..2026_01_01_00_00_00.")
    assert os.readlink(tmp_path / DATA_DIR_NAME) == data_dir
    assert os.readlink(tmp_path / "a") == "..data/a"
    assert os.readlink(tmp_path / "dir") == "..data/dir"
    assert _view(tmp_path) == {"a": b"1", "dir/b": b"2"}
    assert stat.S_IMODE(os.stat(tmp_path / "dir" / "b").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(tmp_path / data_dir).st_mode) == 0o755


def test_unchanged_payload_writes_nothing(tmp_path):
    payload = {"a": FileProjection(b"1")}
    write_payload(str(tmp_path), payload)
    before = _data_dirs(tmp_path)
    assert not write_payload(str(tmp_path), payload)
    assert _data_dirs(tmp_path) == before


def test_update_replaces_the_view_and_drops_vanished_keys(tmp_path):
    write_payload(str(tmp_path), {"keep": FileProjection(b"k"), "gone": FileProjection(b"g"),
                                  "sub/gone": FileProjection(b"s"), "nested/x/y": FileProjection(b"y")})
    (old,) = _data_dirs(tmp_path)
    assert write_payload(str(tmp_path), {"keep": FileProjection(b"k2"), "new": FileProjection(b"n"),
                                         "nested/x/z": FileProjection(b"z")})
    assert _view(tmp_path) == {"keep": b"k2", "new": b"n", "nested/x/z": b"z"}
    assert not os.path.lexists(tmp_path / "gone") and not os.path.lexists(tmp_path / "sub")
    assert old not in _data_dirs(tmp_path) and len(_data_dirs(tmp_path)) == 1


def test_old_view_stays_intact_until_the_swap(tmp_path, monkeypatch):
    write_payload(str(tmp_path), {"a": FileProjection(b"old"), "b": FileProjection(b"old")})
    seen_before_swap = {}
    real_rename = os.rename

    def observing_rename(src, dst):
        seen_before_swap.update(_view(tmp_path))
        real_rename(src, dst)

    monkeypatch.setattr(atomic_writer.os, "rename", observing_rename)
    write_payload(str(tmp_path), {"a": FileProjection(b"new"), "b": FileProjection(b"new")})
    assert seen_before_swap == {"a": b"old", "b": b"old"}
    assert _view(tmp_path) == {"a": b"new", "b": b"new"}


def test_a_failed_write_keeps_the_old_view_and_cleans_up(tmp_path, monkeypatch):
    write_payload(str(tmp_path), {"a": FileProjection(b"old")})

    def failing_rename(src, dst):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(atomic_writer.os, "rename", failing_rename)
    with pytest.raises(VolumeError, match="cannot write volume files"):
        write_payload(str(tmp_path), {"a": FileProjection(b"new")})
    assert _view(tmp_path) == {"a": b"old"}
    assert _data_dirs(tmp_path) == [os.readlink(tmp_path / DATA_DIR_NAME)]


def test_leftovers_of_an_interrupted_write_are_removed(tmp_path):
    write_payload(str(tmp_path), {"a": FileProjection(b"1")})
    stale = tmp_path / "..2020_01_01_00_00_00.123"
    stale.mkdir()
    (stale / "a").write_bytes(b"stale")
    os.symlink("..2020_01_01_00_00_00.123", tmp_path / "..data_tmp")
    assert not write_payload(str(tmp_path), {"a": FileProjection(b"1")})
    assert not stale.exists()
    assert write_payload(str(tmp_path), {"a": FileProjection(b"2")})
    assert _data_dirs(tmp_path) == [os.readlink(tmp_path / DATA_DIR_NAME)]


def test_deleted_user_visible_links_are_restored(tmp_path):
    write_payload(str(tmp_path), {"a": FileProjection(b"1")})
    os.unlink(tmp_path / "a")
    assert not write_payload(str(tmp_path), {"a": FileProjection(b"1")})
    assert _view(tmp_path) == {"a": b"1"}


def test_a_broken_data_link_is_rewritten(tmp_path):
    write_payload(str(tmp_path), {"a": FileProjection(b"1")})
    os.unlink(tmp_path / DATA_DIR_NAME)
    os.symlink("../../etc", tmp_path / DATA_DIR_NAME)
    assert write_payload(str(tmp_path), {"a": FileProjection(b"1")})
    assert os.readlink(tmp_path / DATA_DIR_NAME).startswith("..20")
    assert _view(tmp_path) == {"a": b"1"}


def test_set_perms_runs_before_the_files_are_visible(tmp_path):
    calls = []

    def set_perms(data_dir):
        calls.append((data_dir, os.path.lexists(tmp_path / "a")))
        os.chmod(os.path.join(data_dir, "a"), 0o640)

    write_payload(str(tmp_path), {"a": FileProjection(b"1")}, set_perms=set_perms)
    assert calls == [(str(tmp_path / os.readlink(tmp_path / DATA_DIR_NAME)), False)]
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o640


def test_bad_paths_are_refused_before_writing(tmp_path):
    with pytest.raises(VolumeError, match="must not contain '..'"):
        write_payload(str(tmp_path), {"../escape": FileProjection(b"x")})
    assert os.listdir(tmp_path) == []
