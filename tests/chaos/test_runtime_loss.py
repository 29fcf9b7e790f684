"""Runtime loss, as after a power cut or a crash of the whole container stack: containerd, every shim and every
container killed with SIGKILL, containerd's state directory (the part under /run on a real node) wiped, then
containerd started again. The agent runs throughout with the kubelet's own back-off (10 s doubling to 300 s).

Measured per loss: how long /healthz keeps saying ok while the runtime is gone (it must turn not ok), and the
time from containerd answering again until every pod runs again. Goal: p95 <= 10 s.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from edgelet.podconfig.manifest import load_manifest_file
from tests.chaos.harness import ChaosAgent, percentile
from tests.conftest import LOCAL_CONTAINERD, _wait_until_ready
from tests.helpers import busybox_manifest, wait_for

RECOVER_GOAL_S = 10.0
UNHEALTHY_TIMEOUT_S = 20.0
RECOVER_TIMEOUT_S = 90.0


def _pids_naming(needle: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def lose_runtime(containerd) -> None:
    """SIGKILL containerd and its shims, let the stop script clear containers and mounts, wipe the state dir."""
    state = containerd.state_dir
    for pid in _pids_naming(containerd.socket) + _pids_naming(str(state / "config.toml")):
        if pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    subprocess.run(["bash", str(LOCAL_CONTAINERD), "stop", str(state)], capture_output=True, timeout=120)
    for volatile in ("state", "runc"):
        shutil.rmtree(state / volatile, ignore_errors=True)


def start_runtime(containerd) -> None:
    started = subprocess.run(["bash", str(LOCAL_CONTAINERD), "start", str(containerd.state_dir)],
                             capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    _wait_until_ready(containerd.endpoint, (containerd.image, containerd.pause_image))


def manifest_uids(agent: ChaosAgent) -> set[str]:
    return {load_manifest_file(str(path), agent.node_name).pods[0]["metadata"]["uid"]
            for path in agent.manifest_dir.glob("*.yaml")}


@pytest.mark.timeout(1200)
def test_runtime_loss(tmp_path, containerd, runtime, scale, figures):
    agent = ChaosAgent(tmp_path, containerd.endpoint, figures, healthz=True)
    agent.set_backoff("10s", "300s")
    agent.write_manifest("host-a.yaml", busybox_manifest("host-a", "exec sleep 3600"))
    agent.write_manifest("host-b.yaml", busybox_manifest("host-b", "exec sleep 3600"))
    agent.write_manifest("podnet.yaml", busybox_manifest("podnet", "exec sleep 3600", host_network=False))
    wanted = manifest_uids(agent)
    recover_times: list[float] = []
    unhealthy_after: list[float] = []
    said_ok_while_down = 0
    try:
        agent.start()
        wait_for(lambda: runtime.view().all_running(wanted), 60, what="pods running before the first loss")
        for _ in range(scale.runtime_losses):
            lost_at = time.monotonic()
            lose_runtime(containerd)
            code, body = wait_for(lambda: (h := agent.healthz())[0] not in (200, 0) and h, UNHEALTHY_TIMEOUT_S,
                                  interval=0.2, what="/healthz to say not ok while the runtime is down")
            unhealthy_after.append(time.monotonic() - lost_at)
            assert "runtime" in body, body
            time.sleep(1.0)
            said_ok_while_down += agent.healthz()[0] == 200
            start_runtime(containerd)
            back_at = time.monotonic()
            wait_for(lambda: (view := runtime.try_view()) is not None and view.all_running(wanted),
                     RECOVER_TIMEOUT_S, interval=0.1, what="every pod running again after the runtime came back")
            recover_times.append(time.monotonic() - back_at)
            assert agent.alive(), "the agent died with its runtime"
            agent.record_rss()
        wait_for(lambda: agent.healthz()[0] == 200, 30, what="/healthz ok again")
    finally:
        agent.close()

    p95 = percentile(recover_times, 0.95)
    figures.add("runtime_losses", len(recover_times))
    figures.peak("recover_p95_s", round(p95, 1))
    figures.note(f"runtime loss: losses={len(recover_times)} recover_s={[round(t, 1) for t in recover_times]} "
                 f"p95={p95:.1f} healthz_not_ok_after_s_max={max(unhealthy_after):.1f} "
                 f"healthz_ok_while_down={said_ok_while_down}")
    assert said_ok_while_down == 0
    assert p95 <= RECOVER_GOAL_S, f"pods came back {recover_times} s after the runtime"
