"""Pulls judged by progress (edgelet.images.progress): who guards a pull, the stall clock, and the guard's race
with a pull, on a fake clock and fake samples (pure units; the integration tests run it against containerd)."""

from __future__ import annotations

import asyncio
import json

import pytest

from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.images import progress
from edgelet.images.progress import RuntimeGuard, StallClock, choose_judge, runtime_guard
from edgelet.util.errors import EdgeletError


@pytest.mark.parametrize(
    ("name", "version", "info", "expected"),
    [
        # containerd 1.7 reports its value in Status's config.
        ("containerd", "v1.7.24", {"config": json.dumps({"imagePullProgressTimeout": "1m30s"})}, RuntimeGuard(90.0)),
        ("containerd", "v1.7.24", {"config": json.dumps({"imagePullProgressTimeout": "0s"})}, RuntimeGuard(0.0)),
        # 2.x has the setting but Status does not show it: known to exist, value its default.
        ("containerd", "v2.1.9", {"config": json.dumps({"enableCDI": True})}, RuntimeGuard(300.0, known=False)),
        ("containerd", "2.0.0", {}, RuntimeGuard(300.0, known=False)),
        # 1.6 has none; nor does a runtime we know nothing of.
        ("containerd", "1.6.20~ds1", {"config": "{}"}, RuntimeGuard(None)),
        ("cri-o", "1.31.0", {}, RuntimeGuard(None)),
        # Garbage is not a value.
        ("containerd", "1.6.20", {"config": "not json"}, RuntimeGuard(None)),
        ("containerd", "v1.7.0", {"config": json.dumps({"imagePullProgressTimeout": "soon"})},
         RuntimeGuard(300.0, known=False)),
    ],
)
def test_runtime_guard(name, version, info, expected):
    assert runtime_guard(name, version, info) == expected


@pytest.mark.parametrize(
    ("agent", "runtime", "agent_guard", "warn", "says"),
    [
        (300.0, RuntimeGuard(300.0), 0.0, False, "after 5m"),
        (300.0, RuntimeGuard(60.0), 0.0, True, "set the runtime's to match"),
        (300.0, RuntimeGuard(300.0, known=False), 0.0, False, "not reported over CRI"),
        (300.0, RuntimeGuard(None), 300.0, False, "the agent cancels"),
        (300.0, RuntimeGuard(0.0), 300.0, False, "the agent cancels"),
        (0.0, RuntimeGuard(None), 0.0, True, "waits until its connection fails"),
        (0.0, RuntimeGuard(60.0), 0.0, True, "0 (never)"),
    ],
)
def test_choose_judge(agent, runtime, agent_guard, warn, says):
    judge = choose_judge(agent, runtime, "containerd x")
    assert (judge.agent_timeout, judge.warn) == (agent_guard, warn)
    assert says in judge.summary


def test_stall_clock_counts_from_the_last_change():
    clock = StallClock(10.0, now=0.0, sample=(1, 1))
    assert not clock.observe(5.0, (1, 1))
    assert not clock.observe(9.0, (2, 1))  # moved at 9
    assert not clock.observe(18.0, (2, 1))
    assert not clock.observe(18.5, None)  # no sample is no progress, not a reset
    assert clock.observe(19.0, (2, 1))


def test_fs_sample_sums_image_filesystems():
    reply = pb.ImageFsInfoResponse(image_filesystems=[
        pb.FilesystemUsage(used_bytes=pb.UInt64Value(value=10), inodes_used=pb.UInt64Value(value=2)),
        pb.FilesystemUsage(used_bytes=pb.UInt64Value(value=5), inodes_used=pb.UInt64Value(value=1)),
    ], container_filesystems=[pb.FilesystemUsage(used_bytes=pb.UInt64Value(value=99))])
    assert progress.fs_sample(reply) == (15, 3)


async def hanging_pull(started: asyncio.Event, cancelled: asyncio.Event) -> str:
    """A pull that never ends on its own; says when it began and when it was cancelled."""
    started.set()
    try:
        await asyncio.Event().wait()
    finally:
        cancelled.set()
    return "never"


class Clock:
    """Time that moves only when a sample is taken."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_guard_cancels_a_pull_that_stops_moving():
    clock = Clock()
    cancelled = asyncio.Event()
    samples = iter([(1, 1), (2, 1), (3, 1)])

    async def sample():
        clock.now += 1.0
        return next(samples, (3, 1))

    with pytest.raises(progress.PullStalled) as stalled:
        await progress.guarded(hanging_pull(asyncio.Event(), cancelled), timeout=4.0, sample=sample, period=0.001,
                               clock=clock)
    assert cancelled.is_set()
    assert "no progress in 4s" in str(stalled.value)
    # It moved until t=3 and was cut at the first sample 4 s later, not 4 s after it began.
    assert clock.now == 7.0


async def test_guard_lets_a_moving_pull_finish_and_failing_samples_count_as_no_progress():
    clock = Clock()
    done = asyncio.Event()
    calls = 0

    async def pull() -> str:
        await done.wait()
        return "sha256:abc"

    async def sample():
        nonlocal calls
        calls += 1
        clock.now += 1.0
        if calls == 20:
            done.set()
        return (calls, 0)  # always moving

    assert await progress.guarded(pull(), timeout=2.0, sample=sample, period=0.001, clock=clock) == "sha256:abc"

    async def broken():
        clock.now += 1.0
        raise EdgeletError("runtime gone")

    with pytest.raises(progress.PullStalled):
        await progress.guarded(hanging_pull(asyncio.Event(), asyncio.Event()), timeout=2.0, sample=broken,
                               period=0.001, clock=clock)


async def test_cancelling_the_caller_cancels_the_pull():
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def sample():
        return (0, 0)

    guard = asyncio.ensure_future(progress.guarded(hanging_pull(started, cancelled), timeout=3600.0, sample=sample,
                                                   period=0.01))
    await started.wait()
    guard.cancel()
    with pytest.raises(asyncio.CancelledError):
        await guard
    await asyncio.wait_for(cancelled.wait(), 5)


def test_a_runtime_cancellation_is_explained_only_when_the_runtime_guards_pulls():
    by_runtime = choose_judge(300.0, RuntimeGuard(300.0, known=False), "containerd 2.1.9")
    failure = 'failed to pull and unpack image "r/x:1": context canceled'
    assert by_runtime.stalled(failure)
    assert by_runtime.explain(failure) == (
        f"{failure} (the runtime cancels a pull that makes no progress for its image_pull_progress_timeout)")
    assert not by_runtime.stalled("401 Unauthorized")
    by_agent = choose_judge(300.0, RuntimeGuard(None), "containerd 1.6.20")
    assert not by_agent.stalled(failure) and by_agent.explain(failure) == failure
