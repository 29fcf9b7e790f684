"""Container logs on a real containerd: rotation by size, `edgelet logs` current, --previous and -f."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.helpers import wait_for
from tests.integration.agent_harness import REPO, AgentProcess, container_state, fails_first_run_pod, is_running

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]

CHATTY = """\
    apiVersion: v1
    kind: Pod
    metadata:
      name: chatty
    spec:
      hostNetwork: true
      terminationGracePeriodSeconds: 1
      containers:
        - name: main
          image: docker.io/library/busybox:local
          imagePullPolicy: Never
          command:
            - sh
            - -c
            - i=0; while true; do i=$((i+1)); echo line $i $(seq -s x 40 | head -c 200); sleep 0.01; done
    """


def test_logs_rotate_at_the_size_limit_and_keep_max_files(tmp_path, containerd):
    agent = AgentProcess(tmp_path, containerd.endpoint, extra_toml="""
[logs]
container_log_max_size = "4Ki"
container_log_max_files = 3
""")
    try:
        agent.start()
        agent.write_manifest("chatty.yaml", CHATTY)
        pod = wait_for(lambda: (p := agent.pod("chatty")) and is_running(p) and p, 60, what="chatty Running")
        log_dir = agent.pod_logs_dir / f"default_chatty-testnode_{pod['metadata']['uid']}" / "main"

        def rotated():
            return sorted(n for n in os.listdir(log_dir) if n.startswith("0.log."))

        wait_for(lambda: len(rotated()) >= 2, 60, interval=0.5, what="two rotations")
        time.sleep(12)  # at least one more rotation period: old files must be deleted, not accumulate
        files = rotated()
        assert 1 <= len(files) <= 2, files  # max_files 3 = the live file + 2 rotated
        logs = agent.cli("logs", "chatty")
        assert logs.returncode == 0
        numbers = [int(line.split()[1]) for line in logs.stdout.splitlines()]
        assert numbers == sorted(numbers) and numbers[-1] - numbers[0] + 1 == len(numbers), \
            "rotated and live files must read as one gap-free stream"
    finally:
        agent.close()


def test_logs_previous_and_follow(tmp_path, containerd):
    agent = AgentProcess(tmp_path, containerd.endpoint)
    try:
        agent.start()
        agent.write_manifest("twice.yaml", fails_first_run_pod(
            "twice", "echo first run", "echo second run; while true; do echo tick; sleep 0.2; done"))
        wait_for(lambda: (p := agent.pod("twice")) and is_running(p) and container_state(p)["restartCount"] == 1,
                 40, what="second run")
        previous = agent.cli("logs", "twice", "--previous", "-c", "main")
        assert previous.returncode == 0 and previous.stdout == "first run\n"
        current = agent.cli("logs", "-n", "default", "twice")
        assert current.stdout.startswith("second run\n")

        env = dict(os.environ, PYTHONPATH=str(REPO))
        follower = subprocess.Popen(
            [sys.executable, "-m", "edgelet", "logs", "twice", "-f", "--config", str(agent.config_path)],
            cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
        try:
            lines = [follower.stdout.readline() for _ in range(3 + current.stdout.count("\n"))]
            assert lines[0] == "second run\n" and lines[-1] == "tick\n"
        finally:
            follower.kill()
            follower.wait()
        missing = agent.cli("logs", "nosuchpod")
        assert missing.returncode != 0 and "nosuchpod" in missing.stderr
    finally:
        agent.close()


def test_a_log_ending_without_a_newline_is_read_whole(tmp_path, containerd):
    """`cat` of files without a final newline leaves the runtime a P line no F line finishes: it is read all the
    same, as the kubelet reads it (the upstream projected-volume spec checks exactly such an output)."""
    agent = AgentProcess(tmp_path, containerd.endpoint)
    try:
        agent.start()
        agent.write_manifest("unfinished.yaml", """\
            apiVersion: v1
            kind: Pod
            metadata:
              name: unfinished
            spec:
              hostNetwork: true
              restartPolicy: Never
              containers:
                - name: main
                  image: docker.io/library/busybox:local
                  imagePullPolicy: Never
                  command: ["sh", "-c", "echo whole; printf first; printf -second"]
            """)
        wait_for(lambda: (p := agent.pod("unfinished")) and p["status"].get("phase") == "Succeeded", 40,
                 what="pod Succeeded")
        logs = agent.cli("logs", "unfinished")
        assert logs.returncode == 0 and logs.stdout == "whole\nfirst-second"
        followed = agent.cli("logs", "unfinished", "-f")
        assert followed.returncode == 0 and followed.stdout == "whole\nfirst-second"
    finally:
        agent.close()
