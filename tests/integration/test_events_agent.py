"""Events end to end: the real agent on the private containerd records what happens to pods, and
`edgelet get events` / `edgelet describe pod` show it from the local event log, also once the agent stopped."""

from __future__ import annotations

import pytest

from tests.helpers import busybox_manifest, wait_for
from tests.integration.agent_harness import AgentProcess, is_running

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]

# Port 9 on loopback refuses connections: a pull that fails at once, without leaving the machine.
UNREACHABLE_IMAGE = "127.0.0.1:9/missing/image:1"


@pytest.fixture
def agent(tmp_path, containerd):
    process = AgentProcess(tmp_path, containerd.endpoint)
    yield process
    process.close()


def event_rows(agent: AgentProcess, *args: str) -> list[list[str]]:
    result = agent.cli("get", "events", *args)
    assert result.returncode == 0, result.stderr
    return [line.split(None, 4) for line in result.stdout.splitlines()[1:]]


def reasons_for(agent: AgentProcess, obj: str) -> set[str]:
    return {row[2] for row in event_rows(agent, "--for", obj) if len(row) > 3}


def test_a_pod_with_an_unpullable_image_shows_the_pull_events(agent):
    agent.start()
    agent.write_manifest("badimage.yaml", busybox_manifest("badimage", "sleep 3600").replace(
        "docker.io/library/busybox:local", UNREACHABLE_IMAGE).replace("imagePullPolicy: Never",
                                                                      "imagePullPolicy: Always"))
    wanted = {"Pulling", "Failed", "BackOff"}
    wait_for(lambda: wanted <= reasons_for(agent, "pod/badimage"), 60, interval=0.5, what="pull events")
    rows = event_rows(agent, "--for", "pod/badimage")
    messages = {(row[2], row[4]) for row in rows}
    assert ("Pulling", f'Pulling image "{UNREACHABLE_IMAGE}"') in messages
    assert ("Failed", "Error: ErrImagePull") in messages
    assert ("BackOff", f'Back-off pulling image "{UNREACHABLE_IMAGE}"') in messages
    assert any(r == "Failed" and m.startswith(f'Failed to pull image "{UNREACHABLE_IMAGE}": ') for r, m in messages)
    assert all(row[3] == f"pod/badimage-{agent.node_name}" for row in rows)

    # The reason is logged once per change, not on every retry.
    log_lines = [line for line in agent.log_text().splitlines() if "container main: ErrImagePull" in line]
    assert 1 <= len(log_lines) <= 4 and "Failed to pull image" in log_lines[0]

    agent.stop()  # describe reads the files: it answers with the agent down
    result = agent.cli("describe", "pod", "badimage")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert f"Name:         badimage-{agent.node_name}" in text
    assert ["Image:", UNREACHABLE_IMAGE] in [line.split() for line in text.splitlines()]
    assert "    State:          Waiting\n      Reason:       " in text
    events = text[text.index("\nEvents:\n"):].splitlines()
    assert events[2].split() == ["Type", "Reason", "Age", "From", "Message"]
    assert any(line.split()[:2] == ["Normal", "Pulling"] and line.rstrip().endswith(f'"{UNREACHABLE_IMAGE}"')
               for line in events)
    assert any(line.split()[:2] == ["Warning", "Failed"] and "kubelet" in line for line in events)


def test_a_crash_looping_container_shows_back_off_and_node_events(agent):
    agent.start()
    agent.write_manifest("crasher.yaml", busybox_manifest("crasher", "exit 3"))
    wait_for(lambda: "BackOff" in reasons_for(agent, "pod/crasher"), 60, interval=0.5, what="BackOff event")
    rows = event_rows(agent, "--for", "pod/crasher")
    by_reason = {row[2]: row[4] for row in rows}
    assert by_reason["Created"] == "Created container main" and by_reason["Started"] == "Started container main"
    assert by_reason["BackOff"] == "Back-off restarting failed container"
    assert by_reason["Pulled"] == 'Container image "docker.io/library/busybox:local" already present on machine'

    text = agent.cli("describe", "pod", "crasher").stdout
    assert "    Last State:     Terminated\n      Reason:       Error\n      Exit Code:    3\n" in text
    assert any("(x" in line for line in text.splitlines() if "Started" in line or "BackOff" in line)

    node_rows = event_rows(agent, "--for", f"node/{agent.node_name}")
    assert [row[2] for row in node_rows] == ["Starting"] and node_rows[0][4] == "Starting kubelet."
    everything = agent.cli("get", "events", "-A")
    assert everything.stdout.splitlines()[0].split()[:3] == ["NAMESPACE", "LAST", "SEEN"]


def test_removing_a_pod_records_killing(agent):
    agent.start()
    path = agent.write_manifest("sleeper.yaml", busybox_manifest("sleeper", "exec sleep 3600"))
    wait_for(lambda: is_running(agent.pod("sleeper")), 60, what="sleeper Running")
    path.unlink()
    wait_for(lambda: "Killing" in reasons_for(agent, "pod/sleeper"), 60, interval=0.5, what="Killing event")
    assert ("Killing",
            "Stopping container main") in {(row[2], row[4]) for row in event_rows(agent, "--for", "pod/sleeper")}
    wait_for(lambda: agent.pod("sleeper") is None, 60, what="sleeper gone")
    missing = agent.cli("describe", "pod", "sleeper")
    assert missing.returncode == 1 and 'pod "sleeper" not found' in missing.stderr


def sleeper_with_volume(name: str, volume: str) -> str:
    """A pod manifest with one volume, given as its YAML source lines (e.g. `configMap: {name: x}`)."""
    return f"""\
        apiVersion: v1
        kind: Pod
        metadata:
          name: {name}
        spec:
          hostNetwork: true
          containers:
            - name: main
              image: docker.io/library/busybox:local
              imagePullPolicy: Never
              command: ["sleep", "3600"]
          volumes:
            - name: data
              {volume}
        """


def test_a_missing_config_map_is_a_failed_mount(agent):
    agent.start()
    agent.write_manifest("noconf.yaml", sleeper_with_volume("noconf", "configMap: {name: absent}"))
    wait_for(lambda: "FailedMount" in reasons_for(agent, "pod/noconf"), 60, interval=0.5, what="FailedMount")
    (message,) = {row[4] for row in event_rows(agent, "--for", "pod/noconf") if row[2] == "FailedMount"}
    assert message == 'MountVolume.SetUp failed for volume "data" : configmap "absent" not found'


def test_a_rejected_pod_has_its_reason_as_an_event(agent):
    agent.start()
    agent.write_manifest("claim.yaml", sleeper_with_volume("claim", "persistentVolumeClaim: {claimName: data}"))
    wait_for(lambda: "UnsupportedFeature" in reasons_for(agent, "pod/claim"), 60, interval=0.5, what="rejection event")
    (row,) = [row for row in event_rows(agent, "--for", "pod/claim") if row[2] == "UnsupportedFeature"]
    assert row[1] == "Warning" and "persistentVolumeClaim" in row[4]
    text = agent.cli("describe", "pod", "claim").stdout
    assert "Status:       Failed\nReason:       UnsupportedFeature\n" in text
