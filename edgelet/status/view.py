"""The pod list as a user may trust it: the agent's heartbeat record, and the stored statuses adjusted for what it says.

The agent rewrites `agent.json` in the status directory every few seconds and marks it stopped on the way
out, so `edgelet pods` can tell a running agent from a stopped or crashed one and say since when. What the
record and the manifests tell is folded into the pods by `present_pods`, a pure function the ops `/pods`
shares with the CLI.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import orjson

from .. import podutil
from ..kubetime import format_time
from ..podutil import Pod

log = logging.getLogger(__name__)

RECORD_NAME = "agent.json"
HEARTBEAT_INTERVAL = 5.0
# A record older than this, from a process that still exists, means a hung agent.
STALE_AFTER = 6 * HEARTBEAT_INTERVAL


@dataclass(frozen=True, slots=True)
class AgentRecord:
    pid: int
    started_at: float
    heartbeat_at: float
    stopped_at: float | None = None
    runtime_ready: bool = True
    runtime_message: str = ""


def read_agent_record(directory: str) -> AgentRecord | None:
    """The last record the agent wrote, or None when there is none (never ran here) or it is unreadable."""
    try:
        with open(os.path.join(directory, RECORD_NAME), "rb") as file:
            return AgentRecord(**orjson.loads(file.read()))
    except (OSError, orjson.JSONDecodeError, TypeError):
        return None


def write_agent_record(directory: str, record: AgentRecord) -> None:
    """Replaces the record atomically; no fsync: it is rewritten every few seconds and a lost one only ages."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    target = os.path.join(directory, RECORD_NAME)
    temp = f"{target}.{os.getpid()}.new"
    with open(temp, "wb") as file:
        file.write(orjson.dumps(asdict(record)))
    os.replace(temp, target)


class Heartbeat:
    """Rewrites the agent record every HEARTBEAT_INTERVAL, at once when the runtime's health changes,
    and a last time, stopped, on the way out."""

    def __init__(self, directory: str, *, runtime_health: Callable[[], tuple[bool, str]], clock=time.time):
        self._directory = directory
        self._runtime_health = runtime_health
        self._clock = clock
        self._started_at = clock()
        self._wake = asyncio.Event()

    def record(self, *, stopped: bool = False) -> AgentRecord:
        now = self._clock()
        ready, message = self._runtime_health()
        return AgentRecord(pid=os.getpid(), started_at=self._started_at, heartbeat_at=now,
                           stopped_at=now if stopped else None, runtime_ready=ready, runtime_message=message)

    def beat_now(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                await asyncio.to_thread(write_agent_record, self._directory, self.record())
            except OSError as exc:
                log.warning("writing the agent heartbeat under %s failed: %s", self._directory, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), HEARTBEAT_INTERVAL)
            self._wake.clear()

    def write_stopped(self) -> None:
        try:
            write_agent_record(self._directory, self.record(stopped=True))
        except OSError as exc:
            log.warning("recording the agent's stop under %s failed: %s", self._directory, exc)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


@dataclass(frozen=True, slots=True)
class AgentState:
    running: bool
    message: str  # empty while running


def agent_state(record: AgentRecord | None, *, now: float, alive: bool) -> AgentState:
    """Running, or since when it is not: stopped cleanly, gone without a word, or hung."""
    if record is None:
        return AgentState(False, "the agent has not run with this root_dir (no heartbeat record)")
    if record.stopped_at is not None:
        return AgentState(False, f"the agent is not running: it stopped at {_when(record.stopped_at, now)}")
    if not alive:
        return AgentState(False, "the agent is not running: it ended without stopping (last heartbeat "
                                 f"{_when(record.heartbeat_at, now)})")
    if now - record.heartbeat_at > STALE_AFTER:
        return AgentState(False, f"the agent (pid {record.pid}) is not responding: last heartbeat "
                                 f"{_when(record.heartbeat_at, now)}")
    return AgentState(True, "")


def _when(stamp: float, now: float) -> str:
    return f"{format_time(stamp)}, {max(int(now - stamp), 0)}s ago"


def present_pods(pods: list[Pod], *, runtime_ready: bool = True, runtime_message: str = "",
                 manifest_uids: set[str] | None = None, manifests_changed_at: float | None = None) -> list[Pod]:
    """The stored pods as a user should see them; the inputs are left untouched.

    - The container runtime is down: nothing the statuses say about containers can be vouched for, so
      each pod is Unknown and not ready (the kubelet's node would be NotReady).
    - `manifest_uids` (given when the agent is not running): a file pod whose manifest is gone is being
      deleted, and shows Terminating, from when the manifest directory last changed.
    """
    shown = []
    for pod in pods:
        removed = (manifest_uids is not None and podutil.source(pod) == podutil.SOURCE_FILE
                   and podutil.uid(pod) not in manifest_uids and not podutil.deletion_requested(pod))
        if runtime_ready and not removed:
            shown.append(pod)
            continue
        pod = copy.deepcopy(pod)
        if removed:
            pod.setdefault("metadata", {})["deletionTimestamp"] = format_time(manifests_changed_at or time.time())
        if not runtime_ready:
            status = pod.setdefault("status", {})
            status["phase"] = "Unknown"
            status["message"] = runtime_message or "the container runtime is not available"
            for key in ("initContainerStatuses", "containerStatuses"):
                for container in status.get(key) or []:
                    container["ready"] = False
            for condition in status.get("conditions") or []:
                if condition.get("type") in ("Ready", "ContainersReady"):
                    condition["status"] = "False"
        shown.append(pod)
    return shown
