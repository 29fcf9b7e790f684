"""The benchmark's reading of the agent's /metrics (CRI calls per relist and per pod start) and of its CPU time."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time

import pytest

from bench import procstat
from bench.bench_agent import (
    OPTIMIZE,
    REPO,
    Scrape,
    agent_environment,
    calls_between,
    calls_per_pod_start,
    parse_scrape,
    unit_environment,
)
from bench.run import bracketed_ratio, pair_ratios, paired_ratio, quartiles
from edgelet.metrics.registry import Counter, Histogram, Registry


def agent_metrics() -> str:
    """A /metrics page written by the agent's own metric types (on a registry apart from the agent's)."""
    registry = Registry()
    operations = Histogram("kubelet_runtime_operations_duration_seconds", "CRI operations.", ["operation_type"],
                           buckets=(0.005, 1), registry=registry)
    relists = Histogram("kubelet_pleg_relist_duration_seconds", "Relists.", buckets=(0.005, 1), registry=registry)
    syncs = Histogram("kubelet_pod_worker_duration_seconds", "Syncs.", ["operation_type"], buckets=(0.005, 1),
                      registry=registry)
    errors = Counter("kubelet_runtime_operations_errors", "Errors.", ["operation_type"], registry=registry)
    errors.labels("status").inc()
    for histogram, value, times in [
        (operations.labels("list_podsandbox"), 0.125, 10), (operations.labels("status"), 0.5, 2),
        (relists, 0.0625, 10), (syncs.labels("create"), 1, 3), (syncs.labels("sync"), 2, 4),
    ]:
        for _ in range(times):
            histogram.observe(value)
    return registry.exposition().decode()


def test_parse_scrape_reads_operations_relists_and_syncs():
    scrape = parse_scrape(agent_metrics())
    assert scrape.operations == {"list_podsandbox": (1.25, 10.0), "status": (1.0, 2.0)}
    assert scrape.relists == 10.0
    assert scrape.syncs == 7.0
    assert scrape.calls() == 12.0


def _scrape(relists: float, **calls: float) -> Scrape:
    return Scrape({op: (0.0, n) for op, n in calls.items()}, relists, 0.0)


def test_calls_between_leaves_out_types_without_calls():
    before = _scrape(5, list_podsandbox=5, status=1)
    after = _scrape(8, list_podsandbox=8, status=1, container_status=2)
    assert calls_between(before, after) == {"list_podsandbox": 3, "container_status": 2}


@pytest.mark.parametrize(("after", "pods", "expected"), [
    # Two pods started over four relists: the relists' own lists and Status are not the pods'.
    (_scrape(4, list_podsandbox=4, list_containers=4, status=1, run_podsandbox=2, create_container=2,
             start_container=2, container_status=4), 2,
     {"run_podsandbox": 1, "create_container": 1, "start_container": 1, "container_status": 2}),
    # A list beyond the relists' (an inspection by label) counts.
    (_scrape(2, list_podsandbox=3, list_containers=3, image_status=1), 1,
     {"list_podsandbox": 1, "list_containers": 1, "image_status": 1}),
    (_scrape(3, list_podsandbox=3, list_containers=3), 1, {}),
])
def test_calls_per_pod_start(after, pods, expected):
    assert calls_per_pod_start(_scrape(0), after, pods) == expected


def test_unit_environment_reads_every_environment_line():
    unit = "[Service]\n# Environment=IGNORED=1\nEnvironment=MALLOC_ARENA_MAX=2\nEnvironment=A=1 B=x=y\nType=notify\n"
    assert unit_environment(unit) == {"MALLOC_ARENA_MAX": "2", "A": "1", "B": "x=y"}


def test_agent_runs_at_the_bundles_optimization_level():
    """The benchmark's RSS and start figures are the package's only while both use the same bytecode."""
    spec = (REPO / "packaging" / "edgelet.spec").read_text()
    assert f"OPTIMIZE = {OPTIMIZE}\n" in spec
    assert "optimize=OPTIMIZE" in spec and '[("O", None, "OPTION")] * OPTIMIZE' in spec


def test_agent_runs_bytecode_without_column_positions_as_the_bundle():
    """PyInstaller compiles in its own process, so hack/package.sh gives every PyInstaller run the option
    (the spec refuses to build without it), and the benchmark's agents compile and run with it too."""
    package_sh = (REPO / "hack" / "package.sh").read_text()
    runs = re.findall(r"python\"? (.*)-m PyInstaller", package_sh)
    assert runs == ["-X no_debug_ranges "] * 2
    assert '"no_debug_ranges" not in sys._xoptions' in (REPO / "packaging" / "edgelet.spec").read_text()
    env = agent_environment()
    assert env["PYTHONNODEBUGRANGES"] == "1" and env["PYTHONPYCACHEPREFIX"].endswith("-nocolumns")


def test_write_counter_counts_renames_onto_files_but_not_temporary_ones(tmp_path):
    from bench.bench_agent import WriteCounter

    counter = WriteCounter(tmp_path)
    try:
        for name in ("a.ckpt", "agent.json", "a.ckpt", ".tmp"):
            (tmp_path / "staged").write_text("x")
            (tmp_path / "staged").rename(tmp_path / name)
            counter.poll()  # inotify folds identical events left unread: read between writes
        assert counter.total == 3 and counter.names == {"a.ckpt": 2, "agent.json": 1}
    finally:
        counter.close()


def test_parse_scrape_reads_the_pleg_mode():
    assert not parse_scrape(agent_metrics()).pleg_evented
    assert parse_scrape(agent_metrics() + "edgelet_pleg_evented 1\n").pleg_evented
    assert not parse_scrape(agent_metrics() + "edgelet_pleg_evented 0\n").pleg_evented


def test_the_bench_line_names_runtime_and_pleg_mode_and_the_goals_follow_the_mode():
    from bench.run import EVENTED_GOALS, GOALS, Results, bench_line

    figures = Results().bench_figures()
    line = bench_line(figures, "containerd 2.1.9", "evented")
    assert line.startswith("BENCH runtime=containerd-2.1.9 pleg=evented ")
    assert Results(pleg_mode="evented").goals() is EVENTED_GOALS
    assert Results(pleg_mode="generic").goals() is GOALS
    assert EVENTED_GOALS["idle_cpu_110_pct"] == (0.2, "max")


def test_cpu_seconds_reads_another_process_to_the_nanosecond_and_agrees_with_its_ticks():
    """The benchmark's CPU figures read the agent's process CPU clock; /proc/PID/stat has the same sum in ticks."""
    child = ("import threading, time\n"
             "def spin():\n"
             "    end = time.process_time() + 0.15\n"
             "    while time.process_time() < end:\n"
             "        pass\n"
             "thread = threading.Thread(target=spin)\n"
             "thread.start()\n"
             "thread.join()\n"  # a thread that ended: its time stays the process's
             "time.sleep(30)\n")
    busy = subprocess.Popen([sys.executable, "-c", child])
    try:
        time.sleep(1.0)
        precise = procstat.cpu_seconds(busy.pid)
        with open(f"/proc/{busy.pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        ticks = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        assert precise >= 0.15  # the ended thread's time is in it
        assert abs(precise - ticks) <= 0.02
        assert precise != round(precise, 2)  # finer than a tick
    finally:
        busy.kill()
        busy.wait()


@pytest.mark.parametrize(("agent", "floor", "expected"), [
    ([110.0, 120.0, 130.0], [100.0, 100.0, 100.0], 1.2),
    # The machine's speed moved between pairs and one agent start hit a stall: each other start is 5 % over the
    # raw one beside it, where the ratio of the two sides' medians would say 1.24.
    ([105.0, 126.0, 147.0, 200.0], [100.0, 120.0, 140.0, 100.0], 1.05),
    ([8.0, 9.0], [8.0, 7.5], (1.0 + 1.2) / 2),  # an even count: the mean of the middle two
    ([], [], float("nan")),
])
def test_paired_ratio_is_the_median_of_each_pair(agent, floor, expected):
    result = paired_ratio(agent, floor)
    assert result == pytest.approx(expected, nan_ok=True)


@pytest.mark.parametrize(("values", "expected"), [
    ([1.0, 1.1, 0.9, 1.2], [0.975, 1.05, 1.125]),
    ([1.0, 2.0], [1.25, 1.5, 1.75]),
    ([1.0], [math.nan] * 3),
])
def test_quartiles_of_the_rounds_ratios(values, expected):
    assert quartiles(values) == pytest.approx(expected, nan_ok=True)


def test_pair_ratios_leave_out_a_floor_of_zero():
    assert pair_ratios([2.0, 3.0, 4.0], [1.0, 0.0, 2.0]) == [2.0, 2.0]


def test_paired_ratio_refuses_measurements_that_are_not_pairs():
    with pytest.raises(ValueError, match="not pairs"):
        paired_ratio([1.0, 2.0], [1.0])


@pytest.mark.parametrize(("agent", "floor", "expected"), [
    ([2.0, 2.0], [1.0], 2.0),
    # A linear drift (the machine slowing by 1 s a burst, the agent 10 % slower): each bracket reads 1.1.
    ([11.0, 13.2, 15.4], [11.0, 13.0], 1.1),
    # The mean of the agent's before and after over each raw burst, then the median of those.
    ([6.0, 8.0, 7.0, 9.0], [7.0, 6.0, 10.0], 1.0),
    ([6.0, 6.0], [0.0], float("nan")),  # no usable bracket
    ([], [], float("nan")),
])
def test_bracketed_ratio_is_the_median_over_each_floor_measurement_of_its_neighbours(agent, floor, expected):
    assert bracketed_ratio(agent, floor) == pytest.approx(expected, nan_ok=True)


@pytest.mark.parametrize(("agent", "floor"), [([1.0, 2.0], [1.0, 2.0]), ([1.0], [1.0]), ([1.0, 2.0, 3.0], [1.0])])
def test_bracketed_ratio_refuses_measurements_that_do_not_bracket(agent, floor):
    with pytest.raises(ValueError, match="not brackets"):
        bracketed_ratio(agent, floor)

