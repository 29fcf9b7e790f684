"""What `edgelet pods` and /pods may claim: the agent's record and whether it answers, and pods adjusted for a
down runtime or a manifest removed while the agent was away."""

from __future__ import annotations

import socket
import threading

import pytest

from edgelet.status.view import (
    AgentRecord,
    agent_state,
    ask_ops_endpoint,
    present_pods,
    read_agent_record,
    write_agent_record,
)

NOW = 1_800_000_000.0


def test_record_round_trips_and_unreadable_is_none(tmp_path):
    record = AgentRecord(pid=42, started_at=NOW - 60, heartbeat_at=NOW, runtime_ready=False, runtime_message="down")
    write_agent_record(str(tmp_path), record)
    assert read_agent_record(str(tmp_path)) == record
    (tmp_path / "agent.json").write_text("{torn")
    assert read_agent_record(str(tmp_path)) is None
    assert read_agent_record(str(tmp_path / "missing")) is None


@pytest.mark.parametrize(
    ("record", "alive", "responding", "running", "fragment"),
    [
        (AgentRecord(1, NOW - 60, NOW - 60), True, "", True, ""),
        (None, False, "", False, "has not run"),
        (AgentRecord(1, NOW - 60, NOW - 30, stopped_at=NOW - 30), False, "", False,
         "it stopped at 2027-01-15T07:59:30Z, 30s ago"),
        (AgentRecord(7, NOW - 60, NOW - 60), False, "", False,
         "ended without stopping (pid 7, started 2027-01-15T07:59:00Z, 60s ago)"),
        (AgentRecord(1, NOW - 600, NOW - 600), True, "its ops endpoint 127.0.0.1:10248 did not answer", False,
         "(pid 1) is not responding: its ops endpoint 127.0.0.1:10248 did not answer"),
    ],
)
def test_agent_state(record, alive, responding, running, fragment):
    state = agent_state(record, now=NOW, alive=alive, responding=responding)
    assert state.running is running
    assert fragment in state.message


def _pod(uid, source="file", **meta):
    return {"metadata": {"uid": uid, "name": uid, "annotations": {"kubernetes.io/config.source": source}, **meta},
            "status": {"phase": "Running", "containerStatuses": [{"name": "main", "ready": True}],
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def test_nothing_changes_when_all_is_well():
    pods = [_pod("a"), _pod("b", source="api")]
    assert present_pods(pods, manifest_uids={"a"}) == pods


def test_runtime_down_makes_every_pod_unknown_and_not_ready_without_touching_the_input():
    pods = [_pod("a")]
    (shown,) = present_pods(pods, runtime_ready=False, runtime_message="container runtime is down: EOF")
    assert shown["status"]["phase"] == "Unknown"
    assert shown["status"]["message"] == "container runtime is down: EOF"
    assert shown["status"]["containerStatuses"][0]["ready"] is False
    assert shown["status"]["conditions"][0]["status"] == "False"
    assert pods[0]["status"]["phase"] == "Running"


def test_a_file_pod_whose_manifest_is_gone_is_terminating():
    pods = [_pod("kept"), _pod("gone"), _pod("api", source="api"), _pod("http", source="http")]
    shown = {p["metadata"]["uid"]: p for p in present_pods(pods, manifest_uids={"kept"}, manifests_changed_at=NOW)}
    assert shown["gone"]["metadata"]["deletionTimestamp"] == "2027-01-15T08:00:00Z"
    assert all("deletionTimestamp" not in shown[uid]["metadata"] for uid in ("kept", "api", "http"))


def _listener(answer: bytes | None):
    """A loopback listener that answers every connection with `answer`, or never (None: a hung agent)."""
    server = socket.create_server(("127.0.0.1", 0))
    held = []

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)
            if answer is not None:
                conn.recv(1024)
                conn.sendall(answer)
                conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return server


@pytest.mark.parametrize(("answer", "problem"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", ""),
    (b"HTTP/1.1 500 Internal Server Error\r\n\r\n", ""),  # unhealthy, but it answers: not hung
    (None, "did not answer /healthz within"),
    (b"SSH-2.0-OpenSSH\r\n", "gave no HTTP answer"),
])
def test_asking_the_ops_endpoint(answer, problem):
    server = _listener(answer)
    try:
        found = ask_ops_endpoint("0.0.0.0", server.getsockname()[1], timeout=0.3)  # a wildcard is asked on loopback
    finally:
        server.close()
    assert (problem in found) if problem else found == ""


def test_asking_an_ops_endpoint_nobody_listens_on():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert "cannot be reached: Connection refused" in ask_ops_endpoint("127.0.0.1", port, timeout=0.3)


async def test_heartbeat_writes_only_when_something_changed(tmp_path):
    import asyncio

    from edgelet.status.view import Heartbeat

    heartbeat = Heartbeat(str(tmp_path), runtime_health=lambda: (True, "ok"))
    task = asyncio.create_task(heartbeat.run())
    try:
        for _ in range(100):
            if (tmp_path / "agent.json").exists():
                break
            await asyncio.sleep(0.01)
        written = (tmp_path / "agent.json").stat()
        heartbeat.beat_now()  # asked, but the runtime's health is what the record says: flash is not worn for it
        await asyncio.sleep(0.1)
        assert (tmp_path / "agent.json").stat().st_ino == written.st_ino
    finally:
        task.cancel()


async def test_heartbeat_writes_at_once_on_a_runtime_change_and_records_the_stop(tmp_path):
    import asyncio

    from edgelet.status.view import Heartbeat

    health = [(False, "waiting for the container runtime")]
    heartbeat = Heartbeat(str(tmp_path), runtime_health=lambda: health[0])
    task = asyncio.create_task(heartbeat.run())
    try:
        for _ in range(100):
            if (record := read_agent_record(str(tmp_path))) is not None:
                break
            await asyncio.sleep(0.01)
        assert record.runtime_ready is False and record.stopped_at is None
        health[0] = (True, "ok")
        heartbeat.beat_now()  # long before the next periodic beat
        for _ in range(100):
            if read_agent_record(str(tmp_path)).runtime_ready:
                break
            await asyncio.sleep(0.01)
        assert read_agent_record(str(tmp_path)).runtime_ready is True
    finally:
        task.cancel()
    heartbeat.write_stopped()
    assert read_agent_record(str(tmp_path)).stopped_at is not None
