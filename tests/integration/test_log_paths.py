"""Container logs where collectors look, on a real containerd: `<pod_logs_dir>/<ns>_<pod>_<uid>/<container>/<n>.log`
and the `/var/log/containers` links through create, restart and rotation; a tailer that follows a link by its name
across rotations; the move of an existing node's logs from root_dir, on one file system and across two."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import busybox_manifest, wait_for
from tests.integration.agent_harness import AgentProcess, fails_first_run_pod, is_running

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]

ROTATE_SMALL = """
[logs]
container_log_max_size = "4Ki"
container_log_max_files = 3
"""
# About 10 KiB a second: a rotation at every 10 s check.
CHATTY = "i=0; while true; do i=$((i+1)); echo n $i $(seq -s x 40 | head -c 150); sleep 0.02; done"
_ROTATED = re.compile(r"^0\.log\.\d{8}-\d{6}(\.\d+)?(\.gz)?$")


def links(agent: AgentProcess) -> dict[str, str]:
    """name -> target of each link in the agent's container_logs_dir."""
    directory = agent.container_logs_dir
    if not directory.is_dir():
        return {}
    return {name: os.readlink(directory / name) for name in os.listdir(directory)}


def numbers(text: str) -> list[int]:
    return [int(line.split()[1]) for line in text.splitlines() if line.startswith("n ")]


def container_ids(pod: dict) -> tuple[str, str]:
    status = pod["status"]["containerStatuses"][0]
    last = (status.get("lastState") or {}).get("terminated") or {}
    return status.get("containerID", "").partition("://")[2], last.get("containerID", "").partition("://")[2]


def test_paths_and_links_through_create_rotation_and_restart(tmp_path, containerd):
    agent = AgentProcess(tmp_path, containerd.endpoint, extra_toml=ROTATE_SMALL)
    try:
        agent.start()
        # The first run writes for about 25 s (two rotations or more), exits 1; the next one sleeps.
        first = "i=0; while [ $i -lt 1100 ]; do i=$((i+1)); echo n $i $(seq -s x 40 | head -c 150); sleep 0.02; done"
        agent.write_manifest("chatty.yaml", fails_first_run_pod("chatty", first, "sleep 3600"))
        pod = wait_for(lambda: (p := agent.pod("chatty")) and is_running(p) and p, 60, what="chatty Running")
        uid = pod["metadata"]["uid"]
        container_dir = agent.pod_logs_dir / f"default_chatty-testnode_{uid}" / "main"
        first_id, _ = container_ids(pod)
        first_link = f"chatty-testnode_default_main-{first_id}.log"
        assert links(agent) == {first_link: str(container_dir / "0.log")}

        def rotated() -> list[str]:
            return sorted(name for name in os.listdir(container_dir) if _ROTATED.match(name))

        # Rotation names the files as the kubelet does; the one before the newest is gzipped.
        files = wait_for(lambda: (r := rotated()) and r[0].endswith(".gz") and not r[-1].endswith(".gz") and r, 60,
                         interval=0.2, what="a gzipped file and a plain newer one")
        assert len(files) == 2, files  # max_files 3, the live file included

        restarted = wait_for(lambda: (p := agent.pod("chatty")) and container_ids(p)[1] and is_running(p) and p, 90,
                             interval=0.5, what="chatty restarted")
        second_id, previous_id = container_ids(restarted)
        assert previous_id == first_id
        # The restart has its own file and link; the dead container keeps its own until it is removed.
        assert (container_dir / "1.log").exists()
        assert links(agent) == {first_link: str(container_dir / "0.log"),
                                f"chatty-testnode_default_main-{second_id}.log": str(container_dir / "1.log")}
        # `edgelet logs --previous` reads the first run from its rotated files (gzipped ones too) and live file.
        previous = agent.cli("logs", "chatty", "--previous")
        assert previous.returncode == 0, previous.stderr
        seen = numbers(previous.stdout)
        assert seen[-1] == 1100 and seen == list(range(seen[0], 1101))
    finally:
        agent.close()


class Tailer(threading.Thread):
    """Follows a file by its name as fluent-bit's tail input does: reads on, and when the name leads to another
    file (rotation), reads the old one to its end and opens the name afresh."""

    def __init__(self, path: Path):
        super().__init__(daemon=True)
        self.path = path
        self.lines: list[bytes] = []
        self.reopened = 0
        self.stop = threading.Event()

    def run(self) -> None:
        handle, buffer = None, b""
        while not self.stop.is_set():
            if handle is None:
                try:
                    handle = open(self.path, "rb")
                except FileNotFoundError:
                    time.sleep(0.02)
                    continue
            chunk = handle.read()
            if chunk:
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                self.lines += complete
                continue
            try:
                moved = os.stat(self.path).st_ino != os.fstat(handle.fileno()).st_ino
            except FileNotFoundError:
                moved = False  # between the rename and the runtime's reopen
            if moved:
                buffer += handle.read()
                handle.close()
                handle = None
                self.reopened += 1
                continue
            time.sleep(0.05)
        if handle is not None:
            handle.close()


def test_a_tailer_following_the_link_by_name_loses_no_line_across_rotations(tmp_path, containerd):
    agent = AgentProcess(tmp_path, containerd.endpoint, extra_toml=ROTATE_SMALL)
    tailer = None
    try:
        agent.start()
        agent.write_manifest("chatty.yaml", busybox_manifest("chatty", CHATTY))
        wait_for(lambda: links(agent), 60, what="the container's link")
        (name,) = links(agent)
        tailer = Tailer(agent.container_logs_dir / name)
        tailer.start()
        wait_for(lambda: tailer.reopened >= 3, 90, interval=0.5, what="three rotations followed")
        time.sleep(0.5)
        tailer.stop.set()
        tailer.join(5)
        seen = [int(line.split(b" ")[4]) for line in tailer.lines]
        assert seen == list(range(1, len(seen) + 1)), "a line was lost or doubled across a rotation"
    finally:
        if tailer is not None:
            tailer.stop.set()
        agent.close()


@pytest.mark.parametrize("file_systems", ["one", "two"])
def test_an_upgraded_node_moves_its_logs_without_losing_a_line(tmp_path, containerd, file_systems):
    agent = AgentProcess(tmp_path, containerd.endpoint)
    legacy = agent.root_dir / "logs"
    new_setting = f'pod_logs_dir = "{agent.pod_logs_dir}"'
    config = agent.config_path.read_text()
    agent.config_path.write_text(config.replace(new_setting, f'pod_logs_dir = "{legacy}"'))  # the layout before
    try:
        agent.start()
        agent.write_manifest("counter.yaml", busybox_manifest("counter", "i=0; while true; do i=$((i+1)); echo n $i; "
                                                                         "sleep 0.02; done"))
        pod = wait_for(lambda: (p := agent.pod("counter")) and is_running(p) and p, 60, what="counter Running")
        uid = pod["metadata"]["uid"]
        wait_for(lambda: len(numbers(agent.cli("logs", "counter").stdout)) > 50, 30, what="lines before the upgrade")
        agent.stop()  # its containers keep running and writing
        if file_systems == "two":
            agent.pod_logs_dir.mkdir(parents=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(agent.pod_logs_dir)], check=True)
            assert os.stat(agent.pod_logs_dir).st_dev != os.stat(agent.root_dir).st_dev
        before = len(numbers((legacy / f"default_counter-testnode_{uid}" / "main" / "0.log").read_text()))
        agent.config_path.write_text(config)
        agent.start()
        wait_for(lambda: "now written under" in agent.log_text(), 60, what="the logs moved")
        if file_systems == "two":
            wait_for(lambda: "copied to" in agent.log_text(), 60, what="the old files copied")
        assert legacy.is_symlink() and os.readlink(legacy) == str(agent.pod_logs_dir)
        container_dir = agent.pod_logs_dir / f"default_counter-testnode_{uid}" / "main"
        assert (container_dir / "0.log").exists()
        container_id = agent.pod("counter")["status"]["containerStatuses"][0]["containerID"].partition("://")[2]
        assert links(agent) == {f"counter-testnode_default_main-{container_id}.log": str(container_dir / "0.log")}
        time.sleep(1)  # lines written after the move
        seen = numbers(agent.cli("logs", "counter").stdout)
        assert seen == list(range(1, len(seen) + 1)) and len(seen) > before + 20, (before, seen[-5:])
        assert not (agent.root_dir / "logs.moving").exists()
    finally:
        agent.close()
