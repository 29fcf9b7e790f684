"""The pod list as a user may trust it: the agent's record, and the stored statuses adjusted for what it says.

The agent writes `agent.json` in the status directory when it starts, when the runtime's health changes and,
marked stopped, on the way out: never while nothing changes, because the devices it runs on wear their flash
with every write (a rewrite every 5 s, as before, was 17,000 a day). `edgelet pods` tells a running agent from
a stopped or crashed one by the record and the agent's PID, and a hung one by asking its ops endpoint. What
the record and the manifests tell is folded into the pods by `present_pods`, a pure function the ops `/pods`
shares with the CLI.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import orjson

from edgelet.api import podutil
from edgelet.api.kubetime import format_time
from edgelet.api.podutil import Pod

log = logging.getLogger(__name__)

RECORD_NAME = "agent.json"


@dataclass(frozen=True, slots=True)
class AgentRecord:
    pid: int
    started_at: float
    heartbeat_at: float  # when the record was last written: the start, a change of the runtime's health
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
    """Replaces the record atomically; no fsync: a record lost in a power cut belongs to an agent that is gone,
    and the CLI tells that from its PID."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    target = os.path.join(directory, RECORD_NAME)
    temp = f"{target}.{os.getpid()}.new"
    with open(temp, "wb") as file:
        file.write(orjson.dumps(asdict(record)))
    os.replace(temp, target)


class Heartbeat:
    """Writes the agent record when the agent starts, again whenever `beat_now` finds the runtime's health
    changed, and a last time, stopped, on the way out."""

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
        written: tuple[bool, str] | None = None
        while True:
            health = self._runtime_health()
            if health != written:
                try:
                    await asyncio.to_thread(write_agent_record, self._directory, self.record())
                    written = health
                except OSError as exc:  # tried again at the next change
                    log.warning("writing the agent record under %s failed: %s", self._directory, exc)
            await self._wake.wait()
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


def agent_state(record: AgentRecord | None, *, now: float, alive: bool, responding: str = "") -> AgentState:
    """Running, or since when it is not: stopped cleanly, gone without a word, or hung. `responding` is
    empty, or what asking the agent's ops endpoint found wrong (it did not answer)."""
    if record is None:
        return AgentState(False, "the agent has not run with this root_dir (no agent record)")
    if record.stopped_at is not None:
        return AgentState(False, f"the agent is not running: it stopped at {_when(record.stopped_at, now)}")
    if not alive:
        return AgentState(False, f"the agent is not running: it ended without stopping (pid {record.pid}, "
                                 f"started {_when(record.started_at, now)})")
    if responding:
        return AgentState(False, f"the agent (pid {record.pid}) is not responding: {responding}")
    return AgentState(True, "")


def ask_ops_endpoint(host: str, port: int, *, timeout: float = 2.0) -> str:
    """Empty when the agent's ops endpoint answers /healthz (whatever the verdict: it answered), else what
    went wrong. A hung event loop accepts the connection (the kernel does) but never answers."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: edgelet\r\nConnection: close\r\n\r\n")
            if conn.recv(16).startswith(b"HTTP/1."):
                return ""
            return f"its ops endpoint {host}:{port} gave no HTTP answer"
    except TimeoutError:
        return f"its ops endpoint {host}:{port} did not answer /healthz within {timeout:.0f}s"
    except OSError as exc:
        return f"its ops endpoint {host}:{port} cannot be reached: {exc.strerror or exc}"


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
