"""Events: naming and references as client-go makes them, the correlator's aggregation and spam filter,
node events, the local event log and the recorder's queue."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest

from edgelet.events import NORMAL, WARNING, EventRecorder, node_ref, pod_ref
from edgelet.events.correlator import COMBINED_PREFIX, EventCorrelator, repeat_patch
from edgelet.events.locallog import EventLog, read_events
from edgelet.events.model import MAX_MESSAGE, event_name, make_event
from edgelet.events.node import condition_events, exchange_boot_id, reboot_event, start_events
from edgelet.metrics import registry as metrics

POD = {"metadata": {"name": "web", "namespace": "shop", "uid": "u-1"},
       "spec": {"initContainers": [{"name": "setup"}], "containers": [{"name": "main"}]}}
T0 = 1_790_000_000.0


class Clock:
    def __init__(self, now: float = T0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def event(message: str = "Started container main", *, reason: str = "Started", ref=None, now: float = T0,
          event_type: str = NORMAL) -> dict:
    return make_event(ref or pod_ref(POD, "main"), event_type, reason, message, host="edge-1", now=now)


# -- references and naming ----------------------------------------------------------------------------

@pytest.mark.parametrize("container, field_path", [
    (None, None), ("main", "spec.containers{main}"), ("setup", "spec.initContainers{setup}"),
])
def test_pod_reference(container, field_path):
    ref = pod_ref(POD, container)
    assert {k: ref[k] for k in ("kind", "namespace", "name", "uid", "apiVersion")} == \
        {"kind": "Pod", "namespace": "shop", "name": "web", "uid": "u-1", "apiVersion": "v1"}
    assert ref.get("fieldPath") == field_path


def test_event_as_the_kubelet_posts_it():
    e = make_event(pod_ref(POD, "main"), NORMAL, "Pulled", "ok", host="edge-1", now=T0 + 0.25)
    assert e["metadata"] == {"name": f"web.{int((T0 + 0.25) * 1e9):x}", "namespace": "shop"}
    assert e["source"] == {"component": "kubelet", "host": "edge-1"}
    assert (e["reportingComponent"], e["reportingInstance"]) == ("kubelet", "edge-1")
    assert e["firstTimestamp"] == e["lastTimestamp"] == "2026-09-21T14:13:20Z"
    assert e["count"] == 1 and e["involvedObject"]["fieldPath"] == "spec.containers{main}"


def test_node_events_live_in_default_with_the_node_name_as_uid():
    e = make_event(node_ref("edge-1"), NORMAL, "Starting", "Starting kubelet.", host="edge-1", now=T0)
    assert e["metadata"]["namespace"] == "default"
    assert e["involvedObject"] == {"kind": "Node", "name": "edge-1", "uid": "edge-1"}


@pytest.mark.parametrize("name, seconds, expected", [
    ("web", 1.0, "web.3b9aca00"), ("edge-1", 0.000000001, "edge-1.1"), ("x", 1_700_000_000.5, "x.17979cfe53f76500"),
])
def test_event_name_is_object_dot_hex_nanoseconds(name, seconds, expected):
    assert event_name(name, seconds) == expected


def test_long_messages_are_cut():
    e = event("x" * 5000)
    assert len(e["message"]) == MAX_MESSAGE and e["message"].endswith("...")


# -- the correlator -----------------------------------------------------------------------------------

def test_identical_events_are_counted_on_the_first_event():
    clock = Clock()
    correlator = EventCorrelator(clock=clock)
    first = correlator.correlate(event(now=clock.now))
    clock.now += 30
    second = correlator.correlate(event(now=clock.now))
    assert not first.is_update and second.is_update
    assert second.event["metadata"]["name"] == first.event["metadata"]["name"]
    assert second.event["count"] == 2
    assert second.event["firstTimestamp"] == first.event["firstTimestamp"]
    assert second.event["lastTimestamp"] != first.event["lastTimestamp"]
    assert repeat_patch(second.event) == {"count": 2, "lastTimestamp": second.event["lastTimestamp"],
                                          "message": "Started container main"}


@pytest.mark.parametrize("case, first, second, same", [
    ("other message", event("a"), event("b"), False),
    ("other reason", event("a", reason="Pulled"), event("a", reason="Started"), False),
    ("other container", event("a", ref=pod_ref(POD, "main")), event("a", ref=pod_ref(POD, "setup")), False),
    ("other type", event("a"), event("a", event_type=WARNING), False),
    ("same everything", event("a"), event("a", now=T0 + 5), True),
])
def test_what_counts_as_identical(case, first, second, same):
    correlator = EventCorrelator(clock=Clock())
    correlator.correlate(first)
    assert correlator.correlate(second).is_update is same, case


def test_similar_events_are_combined_from_the_tenth_message_on():
    clock = Clock()
    correlator = EventCorrelator(clock=clock)
    results = []
    for i in range(12):
        clock.now += 1
        results.append(correlator.correlate(event(f"probe failed: attempt {i}", reason="Unhealthy", now=clock.now)))
    assert all(not r.is_update and not r.event["message"].startswith(COMBINED_PREFIX) for r in results[:9])
    combined = results[9:]
    assert combined[0].event["message"] == COMBINED_PREFIX + "probe failed: attempt 9"
    assert not combined[0].is_update and combined[1].is_update and combined[2].event["count"] == 3
    assert len({r.event["metadata"]["name"] for r in combined}) == 1


def test_similar_events_start_over_after_the_window():
    clock = Clock()
    correlator = EventCorrelator(clock=clock)
    for i in range(9):
        correlator.correlate(event(f"m{i}", reason="Unhealthy", now=clock.now))
    clock.now += 601
    result = correlator.correlate(event("m9", reason="Unhealthy", now=clock.now))
    assert result.event["message"] == "m9"


def test_spam_filter_allows_a_burst_of_25_per_object_then_one_per_five_minutes():
    clock = Clock()
    correlator = EventCorrelator(clock=clock)
    passed = [correlator.correlate(event(f"m{i % 5}", reason=f"R{i}")) is not None for i in range(30)]
    assert passed == [True] * 25 + [False] * 5
    other_pod = pod_ref({"metadata": {"name": "db", "namespace": "shop", "uid": "u-2"}})
    assert correlator.correlate(event("m", ref=other_pod)) is not None  # per object
    clock.now += 299
    assert correlator.correlate(event("late")) is None
    clock.now += 1
    assert correlator.correlate(event("late")) is not None
    assert correlator.correlate(event("later")) is None


def test_spam_filter_does_not_separate_containers_of_one_pod():
    correlator = EventCorrelator(clock=Clock(), spam_burst=2)
    results = [correlator.correlate(event("m", ref=pod_ref(POD, c))) for c in ("main", "setup", "main")]
    assert [r is not None for r in results] == [True, True, False]


# -- node events --------------------------------------------------------------------------------------

@pytest.mark.parametrize("previous, current, reasons", [
    ({}, {"Ready": "True", "MemoryPressure": "False", "DiskPressure": "False", "PIDPressure": "False"},
     ["NodeReady", "NodeHasSufficientMemory", "NodeHasNoDiskPressure", "NodeHasSufficientPID"]),
    ({"Ready": "True"}, {"Ready": "True"}, []),
    ({"Ready": "True"}, {"Ready": "False"}, ["NodeNotReady"]),
    ({"Ready": "Unknown"}, {"Ready": "True"}, ["NodeReady"]),
    ({"MemoryPressure": "False"}, {"MemoryPressure": "True"}, ["NodeHasInsufficientMemory"]),
    ({"DiskPressure": "False", "PIDPressure": "False"}, {"DiskPressure": "True", "PIDPressure": "True"},
     ["NodeHasDiskPressure", "NodeHasInsufficientPID"]),
])
def test_condition_transitions(previous, current, reasons):
    events = condition_events("edge-1", previous, current)
    assert [reason for _, reason, _ in events] == reasons
    assert all(t == NORMAL and m == f"Node edge-1 status is now: {r}" for t, r, m in events)


@pytest.mark.parametrize("last, now, rebooted", [("", "b1", False), ("b1", "b1", False), ("b1", "b2", True)])
def test_reboot_is_a_changed_boot_id(last, now, rebooted):
    event_ = reboot_event("edge-1", last, now)
    assert (event_ is not None) is rebooted
    if rebooted:
        assert event_ == (WARNING, "Rebooted", "Node edge-1 has been rebooted, boot id: b2")


def test_start_events_remember_the_boot_id(tmp_path):
    boot = tmp_path / "boot_id"
    boot.write_text("b1\n")
    assert start_events("edge-1", str(tmp_path / "state"), str(boot)) == [(NORMAL, "Starting", "Starting kubelet.")]
    assert len(start_events("edge-1", str(tmp_path / "state"), str(boot))) == 1
    boot.write_text("b2\n")
    assert [r for _, r, _ in start_events("edge-1", str(tmp_path / "state"), str(boot))] == ["Starting", "Rebooted"]
    assert exchange_boot_id(str(tmp_path / "state"), "b2") == "b2"


@pytest.mark.parametrize("stored", [b"\x9e\xff\x00garbled", b"not a boot id\n", b"", b"x" * 4096])
def test_a_damaged_stored_boot_id_is_unknown_and_replaced(tmp_path, stored):
    state = tmp_path / "state"
    state.mkdir()
    (state / "boot_id").write_bytes(stored)
    boot = tmp_path / "boot_id"
    boot.write_text("b2\n")
    assert start_events("edge-1", str(state), str(boot)) == [(NORMAL, "Starting", "Starting kubelet.")]
    assert (state / "boot_id").read_text() == "b2\n"


# -- the local event log ------------------------------------------------------------------------------

def test_log_keeps_the_newest_observation_of_each_event(tmp_path):
    log = EventLog(str(tmp_path))
    first = event("a")
    log.append([first, event("b", reason="Pulled", now=T0 + 1)])
    log.append([{**first, "count": 2, "lastTimestamp": "2026-09-21T14:20:00Z"}])
    events = read_events(str(tmp_path))
    assert [(e["message"], e["count"]) for e in events] == [("b", 1), ("a", 2)]


def test_log_rotates_and_keeps_the_last_max_events(tmp_path):
    log = EventLog(str(tmp_path), max_events=10)
    for i in range(35):
        log.append([event(f"m{i}", now=T0 + i)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.log", "events.log.1"]
    assert sum(len(p.read_bytes().splitlines()) for p in tmp_path.iterdir()) <= 20
    assert [e["message"] for e in read_events(str(tmp_path), max_events=10)] == [f"m{i}" for i in range(25, 35)]


def test_log_rotates_at_the_byte_bound(tmp_path):
    log = EventLog(str(tmp_path), max_bytes=2000)
    for i in range(20):
        log.append([event(f"m{i}", now=T0 + i)])
    assert (tmp_path / "events.log.1").stat().st_size < 2000 + 1000
    assert len(read_events(str(tmp_path))) < 20


def test_torn_and_garbage_lines_are_skipped_with_one_warning(tmp_path, caplog):
    log = EventLog(str(tmp_path))
    log.append([event("a", now=T0)])
    with open(tmp_path / "events.log", "ab") as handle:
        handle.write(b'not json\n[1, 2]\n{"metadata": {"name": "torn')  # a crash mid-line
    EventLog(str(tmp_path)).append([event("b", now=T0 + 1)])
    with caplog.at_level(logging.WARNING):
        events = read_events(str(tmp_path))
    assert [e["message"] for e in events] == ["a", "b"]
    assert len([r for r in caplog.records if "unreadable" in r.getMessage()]) == 1


def test_no_log_yet_reads_as_no_events(tmp_path):
    assert read_events(str(tmp_path / "missing")) == []


# -- the recorder -------------------------------------------------------------------------------------

class ListSink:
    def __init__(self):
        self.items = []

    def accept(self, items):
        self.items.extend(items)


def test_recorder_only_enqueues_and_drops_when_full(tmp_path):
    recorder = EventRecorder("edge-1", EventLog(str(tmp_path)), clock=Clock(), queue_size=3)
    sink = ListSink()
    recorder.add_sink(sink)
    before = metrics.events_dropped.labels("queue_full").value
    for i in range(5):
        recorder.event(pod_ref(POD), WARNING, "Failed", f"m{i}")
    assert not (tmp_path / "events.log").exists() and not sink.items  # nothing written by the caller
    names = [e["metadata"]["name"] for e in recorder._queue]
    assert len(set(names)) == 3  # one clock tick, three names
    assert metrics.events_dropped.labels("queue_full").value - before == 2
    batch = recorder.drain()
    assert [c.event["message"] for c in batch] == ["m0", "m1", "m2"] and sink.items == batch


async def test_recorder_task_writes_the_local_log(tmp_path):
    clock = Clock()
    recorder = EventRecorder("edge-1", EventLog(str(tmp_path)), clock=clock)
    task = asyncio.create_task(recorder.run())
    recorder.event(node_ref("edge-1"), NORMAL, "Starting", "Starting kubelet.")
    recorder.event(pod_ref(POD, "main"), WARNING, "BackOff", "Back-off restarting failed container")
    clock.now += 10
    recorder.event(pod_ref(POD, "main"), WARNING, "BackOff", "Back-off restarting failed container")
    for _ in range(100):
        await asyncio.sleep(0.01)
        if len((tmp_path / "events.log").read_bytes().splitlines() if (tmp_path / "events.log").exists() else []) == 3:
            break
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    events = read_events(str(tmp_path))
    assert [(e["reason"], e["count"]) for e in events] == [("Starting", 1), ("BackOff", 2)]
    assert orjson.loads((tmp_path / "events.log").read_bytes().splitlines()[-1])["count"] == 2
