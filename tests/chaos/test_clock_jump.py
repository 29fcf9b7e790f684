"""Wall-clock jumps of +10 and -10 years under the agent (libfaketime; the monotonic clock keeps running, as with
an NTP step or a dead RTC battery) while a pod crash-loops beside a steady one.

Restarts are counted from CRI (containerd keeps the real clock) in equal windows before and after each jump.
Goal: the crash-looping container keeps restarting at its back-off pace (no storm, never stuck) and the steady
container is never restarted.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from edgelet.podconfig.manifest import load_manifest_file
from tests.chaos.harness import ChaosAgent, Runtime
from tests.helpers import busybox_manifest, wait_for

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
TEN_YEARS = "3650d"
INITIAL_BACKOFF_S, MAX_BACKOFF_S = 1.0, 4.0


class CreatedTimes(threading.Thread):
    """Samples CRI every 0.2 s; keeps each container's creation time (containerd's clock) by id."""

    def __init__(self, runtime: Runtime, uid: str):
        super().__init__(daemon=True, name="created-times")
        self.runtime, self.uid = runtime, uid
        self.created: dict[str, float] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.2):
            view = self.runtime.try_view()
            if view is None:
                continue
            for sandbox_uid, seen in view.containers.items():
                if sandbox_uid == self.uid:
                    for container in seen:
                        self.created.setdefault(container.id, time.time())

    def between(self, start: float, end: float) -> list[float]:
        return sorted(t for t in self.created.values() if start <= t < end)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def uid_of(agent: ChaosAgent, name: str) -> str:
    return load_manifest_file(str(agent.manifest_dir / f"{name}.yaml"), agent.node_name).pods[0]["metadata"]["uid"]


@pytest.mark.timeout(600)
def test_clock_jumps(tmp_path, containerd, runtime, scale, figures):
    assert Path(LIBFAKETIME).exists(), "libfaketime is missing (Debian package faketime; `make deps` installs it)"
    clock = tmp_path / "faketime"
    clock.write_text("+0\n")
    agent = ChaosAgent(tmp_path, containerd.endpoint, figures, healthz=True)
    agent.env = {"LD_PRELOAD": LIBFAKETIME, "FAKETIME_TIMESTAMP_FILE": str(clock), "FAKETIME_CACHE_DURATION": "1",
                 "DONT_FAKE_MONOTONIC": "1"}
    agent.write_manifest("crasher.yaml", busybox_manifest("crasher", "exit 1"))
    agent.write_manifest("steady.yaml", busybox_manifest("steady", "exec sleep 3600"))
    crasher, steady = uid_of(agent, "crasher"), uid_of(agent, "steady")
    sampler = CreatedTimes(runtime, crasher)
    window = scale.clock_window_s
    windows: dict[str, list[float]] = {}
    failures: list[str] = []
    try:
        agent.start()
        sampler.start()
        wait_for(lambda: runtime.view().running(steady), 60, what="the steady pod running")
        steady_ids = {c.id for c in runtime.view().running(steady)}
        # Three quick crashes bring the back-off to its ceiling; the baseline is measured there.
        wait_for(lambda: len(sampler.created) >= 4, 60, what="the crash loop reaching its back-off ceiling")
        for label, offset in (("baseline", "+0"), ("+10y", f"+{TEN_YEARS}"), ("-10y", f"-{TEN_YEARS}"), ("back", "+0")):
            clock.write_text(offset + "\n")
            time.sleep(1.5)  # libfaketime re-reads the file every second
            start = time.time()
            time.sleep(window)
            windows[label] = sampler.between(start, time.time())
            if not agent.alive():
                failures.append(f"{label}: the agent exited")
                break
        now_running = {c.id for c in runtime.view().running(steady)}
        if now_running != steady_ids:
            failures.append("the steady container was restarted by a clock jump")
        years = {line[:4] for line in agent.log_text().splitlines() if line[:4].isdigit()}
        this_year = time.gmtime().tm_year
        if not {str(this_year + 10), str(this_year - 10)} <= years:
            failures.append(f"the agent's clock never jumped (log years: {sorted(years)})")
        status, body = agent.healthz()
        if status != 200:
            failures.append(f"/healthz says {status}: {body[:200]}")
    finally:
        sampler.stop()
        agent.close()

    ceiling = int(window / MAX_BACKOFF_S) + 2
    summary = []
    for label, times in windows.items():
        gaps = [b - a for a, b in zip(times, times[1:])]
        summary.append(f"{label}={len(times)}" + (f"(min gap {min(gaps):.1f}s)" if gaps else ""))
        if not times:
            failures.append(f"{label}: no restart in {window:.0f} s (back-off stuck)")
        if len(times) > ceiling:
            failures.append(f"{label}: {len(times)} restarts in {window:.0f} s, more than {ceiling} (restart storm)")
        if gaps and min(gaps) < INITIAL_BACKOFF_S * 0.5:
            failures.append(f"{label}: restarts {min(gaps):.2f} s apart (back-off lost)")
    figures.note(f"clock jumps: window={window:.0f}s restarts per window: {' '.join(summary)} "
                 f"(ceiling {ceiling}) failures={len(failures)}" + "".join(f"\n    {f}" for f in failures))
    assert not failures, "\n".join(failures)
