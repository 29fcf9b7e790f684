"""The benchmark's kubelet side: its figures and ratios, its configuration, and the clean-up of what the kubelet
changes on the machine (cgroups, log links, kernel tunables), on temporary directories."""

from __future__ import annotations

import json
import math
import os

import pytest

from bench.bench_agent import Usage
from bench.bench_kubelet import (
    KERNEL_TUNABLES,
    KubeletResults,
    cgroup_hierarchies,
    kept_kernel_tunables,
    kubelet_config,
    parse_version,
    remove_cgroup_tree,
    remove_log_links,
)
from bench.run import Results, bench_line, kubelet_lines, kubelet_ratios


@pytest.mark.parametrize(("text", "expected"), [
    ("Kubernetes v1.36.2\n", "1.36.2"),
    ("Kubernetes v1.37.0-alpha.1", "1.37.0-alpha.1"),
])
def test_parse_version(text, expected):
    assert parse_version(text) == expected


def test_parse_version_refuses_text_without_one():
    with pytest.raises(ValueError, match="no version"):
        parse_version("kubelet: unknown flag --version")


def _usage(cpu_pct: float, rss_mb: float) -> Usage:
    return Usage(cpu_pct=cpu_pct, rss_mb=rss_mb, window_s=18.0)


def _measured() -> Results:
    return Results(
        agent_seq_ms=[100.0, 110.0, 120.0], raw_seq_returned_ms=[100.0] * 3, agent_burst_s=[6.0, 7.0, 8.0],
        raw_burst_returned_s=[6.0] * 2,
        idle110=[_usage(0.2, 48.0), _usage(0.1, 48.0), _usage(0.3, 50.0)], burst_pods=110,
        kubelet=KubeletResults(version="1.36.2", seq_ms=[130.0, 140.0, 150.0, 160.0], burst_s=[20.0, 14.0],
                               burst_cpu_s=[30.0, 28.0], idle=[_usage(4.0, 96.0), _usage(2.0, 100.0)]))


@pytest.mark.parametrize(("results", "expected"), [
    # edgelet's median over the kubelet's: 110/145, 7/17, 48/98, 0.2/3.
    (_measured(), {"kubelet_start": 110 / 145, "kubelet_burst": 7 / 17, "kubelet_rss": 48 / 98,
                   "kubelet_idle_cpu": 0.2 / 3}),
    # The kubelet left out (--skip-kubelet): every ratio not measured.
    (Results(agent_seq_ms=[100.0], agent_burst_s=[6.0], idle110=[_usage(0.2, 48.0)]),
     dict.fromkeys(("kubelet_start", "kubelet_burst", "kubelet_rss", "kubelet_idle_cpu"), math.nan)),
])
def test_kubelet_ratios_are_edgelets_median_over_the_kubelets(results, expected):
    assert kubelet_ratios(results) == pytest.approx(expected, nan_ok=True)


def test_the_bench_line_ends_with_the_kubelet_ratios_and_the_table_shows_the_kubelets_figures():
    results = _measured()
    figures = results.bench_figures()
    assert bench_line(figures, "containerd 2.1.9", "evented").endswith(
        " kubelet_start=0.76 kubelet_burst=0.41 kubelet_rss=0.49 kubelet_idle_cpu=0.07")
    table = "\n".join(kubelet_lines(results, figures))
    assert "kubelet 1.36.2" in table and "145ms" in table and "17.00s" in table and "98.0" in table
    assert "20.00 / 14.00; its CPU during them 58.00s" in table
    assert kubelet_lines(Results(), Results().bench_figures()) == []


def test_the_kubelet_config_keeps_every_path_under_its_directory(tmp_path):
    config = kubelet_config(endpoint="unix:///run/x.sock", static_pod_path=tmp_path / "manifests",
                            pod_logs_dir=tmp_path / "logs", volume_plugin_dir=tmp_path / "plugins",
                            cgroup_root="/bench-kubelet", port=40001, healthz_port=40002)
    assert json.loads(json.dumps(config)) == config  # written as JSON, which the kubelet reads as YAML
    paths = [value for value in config.values() if isinstance(value, str) and value.startswith("/")]
    assert sorted(paths) == ["/bench-kubelet", *sorted(str(tmp_path / name) for name in ("logs", "manifests",
                                                                                          "plugins"))]
    assert (config["address"], config["healthzBindAddress"], config["readOnlyPort"]) == ("127.0.0.1", "127.0.0.1", 0)
    assert (config["port"], config["healthzPort"]) == (40001, 40002)


def test_cgroup_hierarchies_on_v1_take_each_hierarchy_once_and_the_hybrid_unified_one(tmp_path):
    for name in ("cpu,cpuacct", "memory", "unified"):
        (tmp_path / name).mkdir()
    for alias in ("cpu", "cpuacct"):
        (tmp_path / alias).symlink_to(tmp_path / "cpu,cpuacct")
    (tmp_path / "README").write_text("not a hierarchy")
    assert cgroup_hierarchies(tmp_path) == [tmp_path / "cpu,cpuacct", tmp_path / "memory", tmp_path / "unified"]


def test_cgroup_hierarchies_on_v2_is_the_mount_itself(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    (tmp_path / "system.slice").mkdir()
    assert cgroup_hierarchies(tmp_path) == [tmp_path]


def test_remove_cgroup_tree_removes_deepest_first_and_reports_what_stays(tmp_path):
    for hierarchy in ("memory", "pids"):
        (tmp_path / hierarchy / "bench" / "kubepods" / "besteffort" / "pod1").mkdir(parents=True)
    (tmp_path / "memory" / "other").mkdir()
    # A cgroup still holding a process cannot be removed; here a directory that is not empty stands for one.
    (tmp_path / "pids" / "bench" / "kubepods" / "busy").mkdir()
    (tmp_path / "pids" / "bench" / "kubepods" / "busy" / "tasks").write_text("1\n")
    left = remove_cgroup_tree("/bench", tmp_path)
    assert not (tmp_path / "memory" / "bench").exists() and (tmp_path / "memory" / "other").is_dir()
    assert [entry.split(":")[0] for entry in left] == [
        str(tmp_path / "pids" / "bench" / "kubepods" / "busy"), str(tmp_path / "pids" / "bench" / "kubepods"),
        str(tmp_path / "pids" / "bench")]
    assert remove_cgroup_tree("/absent", tmp_path) == []


def test_remove_log_links_removes_only_the_links_into_the_kubelets_logs(tmp_path):
    links, logs, others = tmp_path / "containers", tmp_path / "kubelet" / "pod-logs", tmp_path / "other-logs"
    links.mkdir()
    (links / "ours.log").symlink_to(logs / "default_a_1" / "main" / "0.log")  # dangling: the pod is gone
    (links / "theirs.log").symlink_to(others / "default_b_2" / "main" / "0.log")
    (links / "prefix.log").symlink_to(str(logs) + "-2/x.log")
    (links / "file.log").write_text("")
    remove_log_links(logs, links)
    assert sorted(os.listdir(links)) == ["file.log", "prefix.log", "theirs.log"]
    remove_log_links(logs, tmp_path / "absent")


def test_kept_kernel_tunables_puts_back_what_changed(tmp_path):
    for name in KERNEL_TUNABLES[:-1]:  # one the kernel does not have
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("0\n")
    unchanged = tmp_path / KERNEL_TUNABLES[1]
    with kept_kernel_tunables(tmp_path) as found:
        assert set(found) == set(KERNEL_TUNABLES[:-1])
        (tmp_path / "vm/overcommit_memory").write_text("1\n")
        (tmp_path / "kernel/panic").write_text("10\n")
        mtime = unchanged.stat().st_mtime_ns
    assert (tmp_path / "vm/overcommit_memory").read_text() == "0\n"
    assert (tmp_path / "kernel/panic").read_text() == "0\n"
    assert unchanged.stat().st_mtime_ns == mtime  # not written
    assert not (tmp_path / KERNEL_TUNABLES[-1]).exists()
