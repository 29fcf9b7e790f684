"""The tunnel's state record: the snapshot `edgelet describe node` reads, written whole or not at all."""

from __future__ import annotations

import logging
import os
import stat

from edgelet.tunnel.wiring import STATE_NAME, StateRecord, read_state


class FakeTunnel:
    def __init__(self, snapshot: dict):
        self._snapshot = snapshot

    def snapshot(self) -> dict:
        return self._snapshot


def test_the_snapshot_is_written_and_read_back(tmp_path):
    record = StateRecord(str(tmp_path / "state"))
    record.tunnel = FakeTunnel({"agentID": "edge-1", "serverCount": 2})
    record.write()
    assert read_state(str(tmp_path / "state")) == {"agentID": "edge-1", "serverCount": 2}
    assert stat.S_IMODE(os.stat(record.path).st_mode) == 0o600
    record.tunnel = FakeTunnel({"agentID": "edge-1", "serverCount": 1})
    record.write()
    assert read_state(str(tmp_path / "state")) == {"agentID": "edge-1", "serverCount": 1}
    assert os.listdir(tmp_path / "state") == [STATE_NAME]


def test_a_failed_write_is_logged_and_leaves_no_temp(tmp_path, caplog):
    directory = tmp_path / "state"
    record = StateRecord(str(directory))
    record.tunnel = FakeTunnel({"serverCount": 2})
    os.makedirs(record.path)  # a directory where the snapshot goes: the rename fails after the temp is written
    with caplog.at_level(logging.WARNING, logger="edgelet"):
        record.write()
    assert f"cannot write {record.path}" in caplog.text
    assert os.listdir(directory) == [STATE_NAME]


def test_an_unreadable_snapshot_reads_as_none(tmp_path):
    (tmp_path / STATE_NAME).write_bytes(b"{not json")
    assert read_state(str(tmp_path)) is None
    (tmp_path / STATE_NAME).write_bytes(b"[1, 2]")
    assert read_state(str(tmp_path)) is None
    assert read_state(str(tmp_path / "absent")) is None
