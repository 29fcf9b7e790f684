"""Image pulls judged by their progress, never by a clock: who may cancel a pull that stopped moving, and the
agent's own guard where nobody else does.

What CRI shows of a pull in flight: nothing. PullImage answers once, at the end; ImageFsInfo reports the
snapshotters' usage only (unpacked layers, refreshed by containerd every 10 s; its content store, where the
download lands, is left out), so a layer being downloaded does not move it. The bytes are counted by the runtime:
containerd cancels a pull whose registry connections read nothing for its `image_pull_progress_timeout` (from
1.7; 5 min by default), which is what the kubelet relies on, setting no deadline of its own. Hence:

- a runtime that cancels stalled pulls itself is the judge, and the agent adds no guard: one that saw only
  unpacked bytes would cut a healthy half-hour download of one large layer, the very failure a clock deadline
  has. containerd 1.7 says its value in CRI Status (verbose); 2.x has the setting but does not say it;
- a runtime without one (containerd 1.6, or the setting at "0") gets the agent's guard,
  `[images] pull_progress_timeout`, measured on what CRI shows: the image file systems' used bytes and inodes.
  It sees a layer only once unpacked, so there it must be longer than the largest layer takes to download.

Nothing here discards what a cancelled pull fetched: the agent never talks to the runtime but through CRI, so it
removes no lease and no ingest, and its image GC removes only whole images; containerd resumes a layer's download
from the bytes it kept (an HTTP range request).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from edgelet.config import format_duration, parse_duration
from edgelet.util.errors import EdgeletError

log = logging.getLogger(__name__)

T = TypeVar("T")

# containerd's CRI plugin refreshes the usage ImageFsInfo reports this often (its stats_collect_period).
SAMPLE_PERIOD = 10.0
# The release that brought containerd's image_pull_progress_timeout, and the default it has had since.
CONTAINERD_PROGRESS_TIMEOUT_SINCE = (1, 7)
CONTAINERD_DEFAULT_PROGRESS_TIMEOUT = 300.0


class PullStalled(EdgeletError):
    """The agent cancelled a pull that showed no progress for `timeout` seconds."""

    def __init__(self, timeout: float):
        super().__init__(f"cancelled: no progress in {format_duration(timeout)} (images.pull_progress_timeout)")
        self.timeout = timeout


@dataclass(frozen=True, slots=True)
class RuntimeGuard:
    """What the runtime does with a pull that stops moving: `timeout` seconds before it cancels (0: never),
    None when it does not say; `known` is False when it has a guard whose value CRI does not report."""

    timeout: float | None
    known: bool = True


NO_RUNTIME_GUARD = RuntimeGuard(None)


def _release(version: str) -> tuple[int, int] | None:
    match = re.match(r"v?(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else None


def runtime_guard(runtime_name: str, runtime_version: str, info: Mapping[str, str]) -> RuntimeGuard:
    """The runtime's own no-progress timeout from CRI Version and Status(verbose) replies (pure).

    containerd 1.7 reports `imagePullProgressTimeout` in Status's "config"; 2.x keeps it in its image plugin,
    which Status does not show, so there the guard is known to exist but not its value; 1.6 has none.
    """
    try:
        config = orjson.loads(info.get("config") or "{}")
    except orjson.JSONDecodeError:
        config = {}
    reported = config.get("imagePullProgressTimeout") if isinstance(config, dict) else None
    if isinstance(reported, str) and reported:
        try:
            return RuntimeGuard(max(parse_duration(reported), 0.0))
        except ValueError:
            pass
    release = _release(runtime_version)
    if runtime_name == "containerd" and release is not None and release >= CONTAINERD_PROGRESS_TIMEOUT_SINCE:
        return RuntimeGuard(CONTAINERD_DEFAULT_PROGRESS_TIMEOUT, known=False)
    return NO_RUNTIME_GUARD


@dataclass(frozen=True, slots=True)
class Judge:
    """Who cancels a stalled pull: `agent_timeout` > 0 means the agent's guard runs with it; `summary` is the one
    line the agent logs about it."""

    agent_timeout: float
    summary: str
    warn: bool = False
    runtime_cancels: str = ""  # how the runtime's own cancellation reads, when it guards pulls

    def stalled(self, failure: str) -> bool:
        """Whether the runtime cancelled the pull for lack of progress (containerd says only "context canceled")."""
        return bool(self.runtime_cancels) and "context canceled" in failure

    def explain(self, failure: str) -> str:
        """A pull's failure, saying why when the runtime cancelled it for lack of progress."""
        return f"{failure} ({self.runtime_cancels})" if self.stalled(failure) else failure


def choose_judge(agent_timeout: float, runtime: RuntimeGuard, runtime_label: str) -> Judge:
    """The runtime when it guards pulls itself, else the agent with `[images] pull_progress_timeout` (pure)."""
    wanted = format_duration(agent_timeout) if agent_timeout else "0 (never)"
    if runtime.timeout:
        after = format_duration(runtime.timeout) if runtime.known else "its image_pull_progress_timeout"
        cancels = f"the runtime cancels a pull that makes no progress for {after}"
        if not runtime.known:
            return Judge(0.0, f"{runtime_label} cancels a pull with no progress after its image_pull_progress_timeout "
                              f"(not reported over CRI; 5m0s unless set); keep it at pull_progress_timeout = {wanted}",
                         runtime_cancels=cancels)
        if runtime.timeout != agent_timeout:
            return Judge(0.0, f"{runtime_label} cancels a pull with no progress after "
                              f"{format_duration(runtime.timeout)} (its image_pull_progress_timeout), not the "
                              f"{wanted} of [images] pull_progress_timeout: set the runtime's to match", warn=True,
                         runtime_cancels=cancels)
        return Judge(0.0, f"{runtime_label} cancels a pull with no progress after {format_duration(runtime.timeout)} "
                          "(its image_pull_progress_timeout)", runtime_cancels=cancels)
    if agent_timeout:
        return Judge(agent_timeout, f"{runtime_label} does not cancel stalled pulls: the agent cancels one when the "
                                    f"image file system shows no progress for {wanted} (counts unpacked layers only: "
                                    "keep it above the download time of the largest layer)")
    return Judge(0.0, f"{runtime_label} does not cancel stalled pulls and [images] pull_progress_timeout is 0: a "
                      "stalled pull waits until its connection fails", warn=True)


def fs_sample(reply: Any) -> tuple[int, int]:
    """(used bytes, used inodes) over the image file systems of an ImageFsInfo reply."""
    filesystems = reply.image_filesystems
    return (sum(fs.used_bytes.value for fs in filesystems), sum(fs.inodes_used.value for fs in filesystems))


class StallClock:
    """Progress is any change of the sample; stalled once none came for `timeout` seconds (pure)."""

    def __init__(self, timeout: float, now: float, sample: object = None):
        self.timeout = timeout
        self._sample = sample
        self._moved_at = now

    def observe(self, now: float, sample: object) -> bool:
        if sample is not None and sample != self._sample:
            self._sample, self._moved_at = sample, now
        return now - self._moved_at >= self.timeout


async def guarded(pull: Awaitable[T], *, timeout: float, sample: Callable[[], Awaitable[object]],
                  period: float = SAMPLE_PERIOD, clock: Callable[[], float] = time.monotonic) -> T:
    """Awaits `pull`, cancelling it (PullStalled) once `sample()` showed no change for `timeout` seconds; a
    failing sample counts as no change. Cancelling the caller cancels the pull."""
    task = asyncio.ensure_future(pull)
    try:
        stall = StallClock(timeout, clock(), await _sample_or_none(sample))
        period = min(period, timeout / 4)
        while True:
            done, _ = await asyncio.wait((task,), timeout=period)
            if done:
                return task.result()
            if stall.observe(clock(), await _sample_or_none(sample)):
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                else:
                    return task.result()  # it ended as it was cancelled
                raise PullStalled(timeout)
    finally:
        if not task.done():
            task.cancel()


async def _sample_or_none(sample: Callable[[], Awaitable[object]]) -> object:
    try:
        return await sample()
    except EdgeletError as err:
        log.debug("image file system usage unavailable while pulling: %s", err)
        return None
