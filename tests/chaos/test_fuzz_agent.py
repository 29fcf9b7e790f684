"""A handful of the fuzz experiment's worst cases through the real agent, in both modes: bombs, special files
and out-of-range numbers in the manifest directory, and hostile pods and objects from the API server double.

Each must be reported once (naming the file, or the pod), and the agent must keep working: the good pod runs,
a pod added afterwards runs too (the sync loop is alive), /healthz says ok, no traceback, memory stays small.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time

import pytest

from edgelet.podconfig.manifest import load_manifest_file
from tests.chaos.fuzzing import _alias_bomb
from tests.chaos.harness import ChaosAgent
from tests.helpers import busybox_manifest, wait_for
from tests.integration.cluster_harness import CLUSTER_TOML, api_pod, running_in_api
from tests.kubeapi_double import ApiServerDouble

RSS_GOAL_MB = 100
MAX_LOG_LINE = 4096
SETTLE_S = 8.0


def _pod_json(name: str, **spec_fields) -> str:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 1, **spec_fields,
                    "containers": [{"name": "main", "image": "docker.io/library/busybox:local",
                                    "imagePullPolicy": "Never", "command": ["sh", "-c", "exec sleep 3600"]}]}}
    return json.dumps(pod)


def reports(log: str, needle: str) -> int:
    return sum(1 for line in log.splitlines() if needle in line and re.search(r" (WARNING|ERROR|CRITICAL) ", line))


def agent_health(agent: ChaosAgent, log: str) -> list[str]:
    problems = []
    if not agent.alive():
        problems.append("the agent exited")
    else:
        status, body = agent.healthz()
        if status != 200:
            problems.append(f"/healthz says {status}: {body[:200]}")
        agent.record_rss()
        if agent.peak_rss_mb > RSS_GOAL_MB:
            problems.append(f"peak RSS {agent.peak_rss_mb:.0f} MB")
    if "Traceback" in log:
        problems.append("traceback in the log")
    if (longest := max((len(line) for line in log.splitlines()), default=0)) > MAX_LOG_LINE:
        problems.append(f"a log line of {longest} characters")
    return problems


def record(figures, what: str, cases: int, failures: list[str]) -> None:
    figures.add("fuzz_cases", cases)
    figures.add("fuzz_failures", len(failures))
    figures.note(f"fuzz through the agent ({what}): cases={cases} failures={len(failures)}"
                 + "".join(f"\n    {f[:200]}" for f in failures))


@pytest.mark.timeout(300)
def test_hostile_manifest_directory(tmp_path, containerd, runtime, figures):
    agent = ChaosAgent(tmp_path, containerd.endpoint, figures, healthz=True)
    manifests = agent.manifest_dir
    agent.write_manifest("good.yaml", busybox_manifest("good", "exec sleep 3600"))
    bad = {
        "alias-bomb.yaml": _alias_bomb(9, 9),
        "deep.json": b"[" * 10_000 + b"]" * 10_000,
        "huge-deadline.json": _pod_json("deadline", activeDeadlineSeconds=2**70).encode(),
        "huge-grace.json": _pod_json("grace", terminationGracePeriodSeconds=2**64).encode(),
        "huge-field.json": _pod_json("n" * 1_000_000).encode(),
        "zz-same-name.yaml": busybox_manifest("good", "echo impostor; exec sleep 3600").encode(),
    }
    for name, data in bad.items():
        (manifests / name).write_bytes(data)
    os.mkfifo(manifests / "fifo.yaml")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(manifests / "socket.yaml"))
    os.symlink("loop.yaml", manifests / "loop.yaml")
    (manifests / "directory.yaml").mkdir()
    specials = ("fifo.yaml", "socket.yaml", "loop.yaml", "directory.yaml")
    good_uid = load_manifest_file(str(manifests / "good.yaml"), agent.node_name).pods[0]["metadata"]["uid"]
    failures: list[str] = []
    try:
        agent.start()
        try:
            wait_for(lambda: runtime.view().all_running({good_uid}), 60, what="the good pod running")
        except AssertionError as err:
            failures.append(str(err)[-200:])
        time.sleep(SETTLE_S)
        agent.write_manifest("later.yaml", busybox_manifest("later", "exec sleep 3600"))
        later_uid = load_manifest_file(str(manifests / "later.yaml"), agent.node_name).pods[0]["metadata"]["uid"]
        try:
            wait_for(lambda: runtime.view().all_running({later_uid}), 30, what="a pod added later running")
        except AssertionError:
            failures.append("a pod added after the hostile files never ran: the sync loop is stuck")
        log = agent.log_text()
        for name in [*bad, *specials]:
            count = reports(log, name) or (reports(log, "deadline") if name == "huge-deadline.json" else 0)
            if count != 1:
                failures.append(f"{name}: reported {count} times, not once")
        if len(runtime.view().running(good_uid)) != 1:
            failures.append("the first manifest's pod 'good' does not run (replaced by the second?)")
        failures += agent_health(agent, log)
    finally:
        listener.close()
        agent.close()
    record(figures, "manifest directory", len(bad) + len(specials) + 1, failures)
    assert not failures, "\n".join(failures)


@pytest.mark.timeout(300)
def test_hostile_api_objects(tmp_path, containerd, runtime, figures):
    failures: list[str] = []
    with ApiServerDouble(bookmark_interval=0.5) as api:
        kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
        agent = ChaosAgent(tmp_path, containerd.endpoint, figures, healthz=True,
                           extra_toml=CLUSTER_TOML.format(kubeconfig=kubeconfig))
        api.create("pods", api_pod("good"))
        # Within int64, as anything from a real API server (and what the double can encode), but out of range.
        hostile = {
            "deadline": {"activeDeadlineSeconds": 2**63 - 1},
            "grace": {"terminationGracePeriodSeconds": -2**63},
            "runas": {"securityContext": {"runAsUser": 2**63 - 1}},
            "deep": {"nodeSelector": {"x": json.loads("[" * 200 + "]" * 200)}},
            "wrongtypes": {"containers": [{"name": "main", "image": 5, "command": "not a list",
                                           "ports": [{"containerPort": "x"}]}]},
        }
        for name, fields in hostile.items():
            pod = api_pod(name)
            pod["spec"].update(fields)
            api.create("pods", pod)
        api.create("pods", {**api_pod("biglabel"), "metadata": {"name": "biglabel", "namespace": "default",
                                                               "labels": {"x": "v" * 1_000_000}}})
        api.create("configmaps",
                   {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "weird", "namespace": "default"},
                                  "data": {"k": 5, "../x": "y"}})
        api.create("pods", api_pod("usesweird", volumes=[{"name": "weird", "configMap": {"name": "weird"}}]))
        try:
            agent.start()
            try:
                wait_for(lambda: running_in_api(api, "good"), 60, what="the good pod running")
            except AssertionError as err:
                failures.append(str(err)[-200:])
            time.sleep(SETTLE_S)
            api.create("pods", api_pod("later"))
            try:
                wait_for(lambda: running_in_api(api, "later"), 30, what="a pod added later running")
            except AssertionError:
                failures.append("a pod created after the hostile ones never ran: the sync loop is stuck")
            log = agent.log_text()
            for name in [*hostile, "biglabel", "usesweird"]:
                reported, running = reports(log, "weird" if name == "usesweird" else name), running_in_api(api, name)
                if name == "deadline":  # within int64: refused by validation or run, either is fine
                    if not (reported or running):
                        failures.append("pod deadline: neither reported nor running")
                    continue
                if not reported:
                    failures.append(f"pod {name}: never reported")
                if running:
                    failures.append(f"pod {name}: runs although it is invalid")
            failures += agent_health(agent, log)
        finally:
            agent.close()
    record(figures, "API objects", len(hostile) + 3, failures)
    assert not failures, "\n".join(failures)
