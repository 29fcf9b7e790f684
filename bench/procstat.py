"""What /proc tells the benchmarks: a process's resident memory and CPU time, and how busy the machine was."""

from __future__ import annotations

import os
import time

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float | None:
    """VmRSS from /proc/<pid>/status, in MiB; None when the process has none (a zombie)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return None


def pss_mb(pid: int) -> float | None:
    """Pss from /proc/<pid>/smaps_rollup, in MiB: resident pages with each shared one divided among its sharers."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def process_cpu_clock(pid: int) -> int:
    """The clock id of another process's CPU time (Linux's MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)): every
    thread's time on the CPU in nanoseconds, the threads that already ended included."""
    return (~pid << 3) | 2


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of the process so far. Read from the process's CPU clock to the nanosecond:
    /proc/<pid>/stat gives the same sum (fields 14 and 15) in clock ticks, which over an 18 s window of an idle
    agent is a step of 0.056 % of a core. The ticks are the fallback where the clock cannot be read."""
    try:
        return time.clock_gettime_ns(process_cpu_clock(pid)) / 1e9
    except OSError:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (all cores, everything but idle and iowait)."""
    with open("/proc/stat") as stat:
        ticks = [int(value) for value in stat.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / _CLOCK_TICKS
