"""The hollow node's pure parts: names, option checks, the runtime state of a started pod, the status it
publishes through the agent's own pipeline, and the fleet figures read from audit log lines."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from bench.fleet import (
    CONTROLLER_USER,
    SIMULATOR_USER,
    lease_bunching,
    marked_not_ready,
    node_writes,
    parse_audit_line,
    peak_per_second,
    percentile,
    pod_start_phases,
    reconnects,
)
from edgelet.container.runtime import ContainerState, SandboxState
from edgelet.podconfig.config import Op, PodConfig
from edgelet.simulate.fleet import FleetOptions, node_names, options_problem
from edgelet.simulate.node import hollow_facts
from edgelet.simulate.runtime import HollowRuntime, started
from edgelet.status.manager import StatusManager


def pod(name: str = "web", uid: str = "u1", containers: tuple[str, ...] = ("main", "side"), **meta) -> dict:
    return {"metadata": {"name": name, "namespace": "default", "uid": uid, **meta},
            "spec": {"nodeName": "hollow-0000", "containers": [{"name": c, "image": f"img/{c}:1"} for c in containers]}}


@pytest.mark.parametrize("prefix, count, first, last", [
    ("hollow-", 1, "hollow-0000", "hollow-0000"),
    ("hollow-", 1000, "hollow-0000", "hollow-0999"),
    ("n", 12345, "n00000", "n12344"),
])
def test_node_names_are_zero_padded_in_start_order(prefix, count, first, last):
    names = node_names(prefix, count)
    assert (names[0], names[-1], len(names)) == (first, last, count)
    assert names == sorted(names)


@pytest.mark.parametrize("options, problem", [
    (FleetOptions(nodes=10), None),
    (FleetOptions(nodes=0), "--nodes"),
    (FleetOptions(nodes=1, pods_per_node=-1), "--pods-per-node"),
    (FleetOptions(nodes=1, start_rate=0), "--start-rate"),
    (FleetOptions(nodes=1, name_prefix="Edge_"), "--name-prefix"),
    (FleetOptions(nodes=1, name_prefix="-x"), "--name-prefix"),
    (FleetOptions(nodes=1, name_prefix="site-a.edge-"), None),
])
def test_options_problem_names_the_flag(options, problem):
    found = options_problem(options)
    assert (found is None) if problem is None else found.startswith(problem)


def test_a_started_pod_has_a_ready_sandbox_and_every_container_running():
    state = started(pod(), now=100.5)
    assert [s.state for s in state.sandboxes] == [SandboxState.READY]
    assert [(c.name, c.state, c.image) for c in state.containers] == [
        ("main", ContainerState.RUNNING, "img/main:1"), ("side", ContainerState.RUNNING, "img/side:1")]
    assert {c.started_at for c in state.containers} == {100_500_000_000}
    assert {c.sandbox_id for c in state.containers} == {state.sandboxes[0].id}


def test_hollow_facts_are_stable_per_node_and_differ_between_nodes():
    assert hollow_facts("a") == hollow_facts("a")
    assert hollow_facts("a").machine_id != hollow_facts("b").machine_id
    assert hollow_facts("a").hostname == "a"


class ListRecorder:
    def __init__(self):
        self.events = []

    def event(self, ref, event_type, reason, message):
        self.events.append((ref.get("fieldPath", ""), reason))


def test_the_runtime_publishes_running_then_forgets_a_deleted_pod(tmp_path):
    recorder = ListRecorder()

    async def scenario():
        config = PodConfig()
        status = StatusManager(str(tmp_path))
        terminated = []
        runtime = HollowRuntime(config, status, on_terminated=terminated.append, recorder=recorder,
                                clock=lambda: 1_000.0)
        handle = config.source("api")
        handle.set([pod()])
        runtime.apply(config.updates.get_nowait())
        published = status.get_status("u1")
        handle.set([pod(deletionTimestamp="2026-01-01T00:00:00Z", deletionGracePeriodSeconds=30)])
        update = config.updates.get_nowait()
        runtime.apply(update)
        return published, update.op, status.get_status("u1"), terminated, runtime.pods

    published, op, after, terminated, pods = asyncio.run(scenario())
    assert published["phase"] == "Running"
    assert [s["name"] for s in published["containerStatuses"] if s["ready"] and "running" in s["state"]] == ["main",
                                                                                                             "side"]
    assert op is Op.DELETE
    assert after is None and [p["metadata"]["uid"] for p in terminated] == ["u1"] and pods == {}
    assert [reason for _, reason in recorder.events] == ["Pulled", "Created", "Started"] * 2
    assert recorder.events[3][0] == "spec.containers{side}"


def audit_line(verb: str, at: str, *, user: str = SIMULATOR_USER, resource: str = "leases", name: str = "",
               subresource: str = "", uri: str = "/x", code: int = 200, stage: str = "ResponseComplete") -> bytes:
    ref = {"resource": resource, "name": name}
    if subresource:
        ref["subresource"] = subresource
    return json.dumps({"stage": stage, "verb": verb, "requestURI": uri, "user": {"username": user},
                       "objectRef": ref, "responseStatus": {"code": code},
                       "requestReceivedTimestamp": f"2026-12-01T10:00:{at}Z"}).encode()


def requests(*lines: bytes):
    return [r for r in map(parse_audit_line, lines) if r is not None]


def test_audit_lines_other_than_completed_requests_are_skipped():
    assert requests(audit_line("get", "01.0", stage="ResponseStarted"), b"not json", b"[]") == []


def test_node_writes_count_changes_by_the_nodes_but_not_reads_or_pod_creates():
    log = requests(
        audit_line("update", "01.0", name="n1"), audit_line("patch", "02.0", resource="nodes", subresource="status"),
        audit_line("get", "03.0"), audit_line("watch", "03.0", resource="pods"),
        audit_line("create", "04.0", resource="pods"), audit_line("update", "05.0", user="admin"),
        audit_line("update", "30.0", name="n1"))
    start = log[0].at
    assert node_writes(log, start, start + 10) == 2


def test_only_the_controllers_node_status_writes_count_as_not_ready():
    log = requests(
        audit_line("update", "01.0", user=CONTROLLER_USER, resource="nodes", subresource="status", name="n1"),
        audit_line("update", "02.0", user=CONTROLLER_USER, resource="nodes", subresource="status", name="n1"),
        audit_line("patch", "03.0", user=CONTROLLER_USER, resource="nodes", name="n2"),  # a taint, not the status
        audit_line("patch", "04.0", resource="nodes", subresource="status", name="n3"))
    assert marked_not_ready(log, log[0].at, log[0].at + 60) == {"n1"}


def test_reconnects_take_each_nodes_first_successful_lease_update_and_pod_relist():
    relist = "/api/v1/pods?fieldSelector=spec.nodeName%3D{}&limit=500"
    log = requests(
        audit_line("update", "05.0", name="n1"), audit_line("update", "06.0", name="n1"),
        audit_line("update", "04.0", name="n2", code=500),
        audit_line("list", "07.0", resource="pods", uri=relist.format("n1")),
        audit_line("list", "08.0", resource="pods", uri=relist.format("n1")),
        audit_line("list", "01.0", resource="pods", uri=relist.format("n2")))  # before the restore
    since = log[0].at - 1
    leases, lists = reconnects(log, since)
    assert leases == {"n1": since + 1}
    assert lists == {"n1": since + 3}


def test_pod_start_phases_split_each_start_at_the_nodes_first_request_and_its_status_patch():
    log = requests(
        audit_line("create", "01.0", user="admin", resource="pods", name="p1"),
        audit_line("get", "03.0", resource="pods", name="p1"),
        audit_line("patch", "04.5", resource="pods", subresource="status", name="p1"),
        audit_line("patch", "09.0", resource="pods", subresource="status", name="p1"),  # a later update
        audit_line("patch", "02.0", resource="pods", subresource="status", name="p2"),  # no GET first
        audit_line("get", "02.0", resource="pods", name="p3"))  # never patched: not counted
    base = log[0].at
    created = {"p1": base, "p2": base, "p3": base}
    running = {"p1": base + 4.0, "p2": base + 1.5, "p3": base + 9}
    phases = pod_start_phases(log, created, running)
    assert sorted(phases["to the node"]) == [1.0, 2.0]
    assert sorted(phases["node status write"]) == [0.0, 1.5]
    assert sorted(phases["to the watch"]) == [0.5, 0.5]


def test_lease_bunching_is_a_half_when_even_and_one_when_all_renew_in_half_the_period():
    even = requests(*(audit_line("update", f"{second:02d}.5", name=f"n{second}") for second in range(20)))
    bunched = requests(*(audit_line("update", f"{cycle * 10 + 2 + second % 3:02d}.5", name=f"n{second}")
                         for cycle in range(2) for second in range(10)))
    since = even[0].at - 0.5
    assert lease_bunching(even, since, since + 20) == 0.5
    assert lease_bunching(bunched, since, since + 20) == 1.0
    assert math.isnan(lease_bunching([], since, since + 20))


@pytest.mark.parametrize("values, fraction, expected", [
    ([3.0, 1.0, 2.0], 0.5, 2.0),
    (list(map(float, range(1, 101))), 0.99, 99.0),
    (list(map(float, range(1, 101))), 0.10, 10.0),
    ([7.0], 0.9, 7.0),
])
def test_percentile_is_nearest_rank(values, fraction, expected):
    assert percentile(values, fraction) == expected


def test_percentile_of_nothing_is_nan_and_peak_counts_per_whole_second():
    assert math.isnan(percentile([], 0.5))
    assert peak_per_second([10.1, 10.9, 11.0, 12.5, 12.6, 12.7]) == 3
    assert peak_per_second([]) == 0
