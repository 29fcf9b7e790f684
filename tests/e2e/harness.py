"""What the end-to-end tests share: the pods they run and the ways they drive and watch them."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import termios
import time
import urllib.error
import urllib.parse
import urllib.request

from tests.helpers import wait_for
from tests.integration.agent_harness import is_running

IMAGE = "docker.io/library/busybox:local"


def pod_manifest(name: str, node: str, command: str, *, restart_policy: str = "Always", grace: int = 2,
                 extra_spec: dict | None = None, container: dict | None = None) -> str:
    main = {"name": "main", "image": IMAGE, "imagePullPolicy": "Never", "command": ["sh", "-c", command]}
    main.update(container or {})
    spec = {"nodeName": node, "hostNetwork": True, "restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": grace, "containers": [main]}
    spec.update(extra_spec or {})
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})


def run_pod(kubectl, agent, name: str, command: str, **kwargs) -> None:
    kubectl.apply(pod_manifest(name, agent.node_name, command, **kwargs))
    wait_for(lambda: is_running(agent.pods().get(name)), 60, interval=0.3, what=f"pod {name} running")


class Background:
    """A kubectl that keeps running (logs -f, attach, port-forward), read as it writes, stopped at the end."""

    def __init__(self, kubectl, *args: str):
        self.proc = subprocess.Popen(kubectl.command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL)
        self._pending = b""

    def read_until(self, needle: str, timeout: float = 30) -> str:
        """Output up to and including `needle` (the rest is kept for the next call)."""
        wanted = needle.encode()
        deadline = time.monotonic() + timeout
        while wanted not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                stderr = self.proc.stderr.read().decode() if self.proc.poll() is not None else ""
                raise AssertionError(f"{needle!r} not seen; got {self._pending!r}; stderr {stderr!r}")
            ready, _, _ = select.select([self.proc.stdout], [], [], min(left, 0.5))
            if ready:
                self._pending += os.read(self.proc.stdout.fileno(), 65536)
        end = self._pending.index(wanted) + len(wanted)
        seen, self._pending = self._pending[:end], self._pending[end:]
        return seen.decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def on_terminal(kubectl, *args: str, rows: int = 30, columns: int = 100) -> tuple[str, int]:
    """kubectl run on a pseudo-terminal of the given size: (everything it printed, exit code)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    proc = subprocess.Popen(kubectl.command(*args), stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    output = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 30)
            if not ready:
                break
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal closed with the process
                break
            if not chunk:
                break
            output += chunk
        return output.decode(errors="replace"), proc.wait(30)
    finally:
        os.close(master)


def download_mb_s(url: str, size: int) -> float:
    started = time.monotonic()
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=60) as reply:
        got = 0
        while chunk := reply.read(1 << 20):
            got += len(chunk)
    assert got == size
    return size / (1 << 20) / (time.monotonic() - started)
