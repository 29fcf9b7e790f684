"""A full disk under root_dir (a small tmpfs): writes fail with ENOSPC, nothing is half-written, and the
pending state is written once space is freed, without another change to prompt it."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess

import pytest

from edgelet.status import manager as status_manager
from edgelet.status.manager import StatusManager
from edgelet.util.checkpoint import CheckpointStore
from edgelet.volumes.hosts import write_hosts_file


@pytest.fixture
def small_disk(tmp_path):
    mountpoint = tmp_path / "disk"
    mountpoint.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mountpoint)], check=True)
    yield mountpoint
    subprocess.run(["umount", "-l", str(mountpoint)], check=True)


def fill(disk) -> str:
    """Takes every free byte of the file system; returns the filler's path (remove it to free the space)."""
    filler = os.path.join(disk, "filler")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 512)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def leftovers(directory) -> list[str]:
    return [name for name in os.listdir(directory) if ".tmp" in name]


def test_checkpoint_write_on_a_full_disk_keeps_the_old_version(small_disk):
    store = CheckpointStore(small_disk / "state", kind="test")
    store.write("key", b"old")
    fill(small_disk)
    with pytest.raises(OSError) as caught:
        store.write("key", b"new" * 50_000)
    assert caught.value.errno == errno.ENOSPC
    assert store.read("key") == b"old" and leftovers(small_disk / "state") == []


def test_hosts_file_on_a_full_disk_keeps_the_old_one_and_is_repaired_later(small_disk):
    path = str(small_disk / "etc-hosts")
    write_hosts_file(path, b"127.0.0.1\tlocalhost\n")
    filler = fill(small_disk)
    with pytest.raises(OSError):
        write_hosts_file(path, b"127.0.0.1\tlocalhost\n" * 20_000)
    assert open(path, "rb").read() == b"127.0.0.1\tlocalhost\n" and leftovers(small_disk) == []
    os.unlink(filler)
    with open(path, "r+b") as damaged:  # damage in place: the next write notices and replaces it
        damaged.truncate(5)
    assert write_hosts_file(path, b"127.0.0.1\tlocalhost\n") is True
    assert open(path, "rb").read() == b"127.0.0.1\tlocalhost\n"
    assert write_hosts_file(path, b"127.0.0.1\tlocalhost\n") is False  # unchanged: not rewritten


async def test_pod_statuses_are_written_once_space_is_freed(small_disk, monkeypatch, caplog):
    monkeypatch.setattr(status_manager, "WRITE_RETRY_DELAY", 0.1)
    directory = small_disk / "pods"
    manager = StatusManager(str(directory))
    pod = {"metadata": {"uid": "u1", "name": "web", "namespace": "default"}, "spec": {"containers": []}}
    writer = asyncio.create_task(manager.run())
    try:
        manager.set_pod_status(pod, {"phase": "Pending"})
        while manager.disk_writes < 1:
            await asyncio.sleep(0.01)
        filler = fill(small_disk)
        manager.set_pod_status(pod, {"phase": "Running", "message": "x" * 100_000})
        while "retrying" not in caplog.text:
            await asyncio.sleep(0.01)
        assert leftovers(directory) == []
        reread = StatusManager(str(directory))
        reread.load()
        assert reread.get_status("u1") == {"phase": "Pending"}  # the old version, whole
        os.unlink(filler)
        async with asyncio.timeout(10):
            while manager.disk_writes < 2:  # no further change needed: the retry writes it
                await asyncio.sleep(0.01)
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
    reread = StatusManager(str(directory))
    reread.load()
    assert reread.get_status("u1")["phase"] == "Running"
