"""The CLI against a real agent on the private containerd: kubectl habits of `logs` and `pods`, and a status
that says when the agent or the runtime is gone, or a pod is being deleted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
import yaml

from tests.helpers import busybox_manifest, wait_for
from tests.integration.agent_harness import REPO, TWO_CONTAINERS, AgentProcess, container_state, free_port, is_running
from tests.integration.cri_harness import SocketProxy

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]


def _popen(agent: AgentProcess, *args: str, **kwargs) -> subprocess.Popen:
    """The CLI as a terminal starts it: Ctrl-C (SIGINT) at its default, even where the test itself runs in a
    shell's background job, which ignores SIGINT and passes that on (Python then never raises KeyboardInterrupt)."""
    return subprocess.Popen([sys.executable, "-m", "edgelet", *args, "--config", str(agent.config_path)],
                            cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **kwargs)


def _phase(pod: dict | None) -> str | None:
    return pod["status"].get("phase") if pod else None


@pytest.fixture
def agent(tmp_path, containerd):
    process = AgentProcess(tmp_path, containerd.endpoint)
    yield process
    process.close()


def test_logs_default_container_tail_timestamps_since_and_all_containers(agent):
    agent.start()
    agent.write_manifest("duo.yaml", TWO_CONTAINERS.replace("{ANNOTATIONS}", "{}"))
    wait_for(lambda: _phase(agent.pod("duo")) == "Running"
             and "first 5" in agent.cli("logs", "duo", "-c", "first").stdout, 60, what="duo Running with its output")

    default = agent.cli("logs", "duo")
    assert default.returncode == 0
    assert default.stderr == 'Defaulted container "first" out of: first, second\n'
    assert default.stdout == "".join(f"first {i}\n" for i in range(1, 6))

    assert agent.cli("logs", "duo", "--tail", "2").stdout == "first 4\nfirst 5\n"
    stamped = agent.cli("logs", "duo", "-c", "second", "--timestamps").stdout
    stamp, text = stamped.rstrip("\n").split(" ", 1)
    assert text == "second" and stamp.startswith(time.strftime("%Y-", time.gmtime()))
    assert agent.cli("logs", "duo", "--since", "1h").stdout == default.stdout
    assert agent.cli("logs", "duo", "--since-time", "2999-01-01T00:00:00Z").stdout == ""
    both = agent.cli("logs", "duo", "--all-containers")
    assert both.stdout == default.stdout + "second\n" and both.stderr == ""

    agent.write_manifest("duo.yaml", TWO_CONTAINERS.replace(
        "{ANNOTATIONS}", "{kubectl.kubernetes.io/default-container: second}"))
    wait_for(lambda: agent.cli("logs", "duo").stdout == "second\n", 60, what="the annotated container by default")
    assert 'Defaulted container "second" out of: first, second' in agent.cli("logs", "duo").stderr


def test_logs_follow_ends_with_the_container_and_with_the_pod(agent):
    agent.start()
    agent.write_manifest("brief.yaml",
                         busybox_manifest("brief", "echo start; sleep 3; echo done", restart_policy="Never"))
    agent.write_manifest("lasting.yaml", busybox_manifest("lasting", "echo up; exec sleep 3600"))
    wait_for(lambda: is_running(agent.pod("brief")) and is_running(agent.pod("lasting")), 60, what="both Running")

    brief = _popen(agent, "logs", "-f", "brief", stdout=subprocess.PIPE)
    lasting = _popen(agent, "logs", "-f", "lasting", stdout=subprocess.PIPE)
    try:
        first = brief.stdout.readline()
        assert first == "start\n", _explain(agent, brief, "brief", first)
        assert lasting.stdout.readline() == "up\n"
        assert brief.wait(30) == 0, "-f must end when the container ends"
        assert brief.stdout.read() == "done\n"

        (agent.manifest_dir / "lasting.yaml").unlink()
        assert lasting.wait(60) == 0, "-f must end when the pod is gone"
    finally:
        for process in (brief, lasting):
            if process.poll() is None:
                process.kill()
                process.wait()


def _explain(agent: AgentProcess, process: subprocess.Popen, pod: str, first: str) -> str:
    """What a `logs -f` that printed the wrong first line left to go on: its exit status, the pod's log files and
    status, and the agent's last lines."""
    code = process.wait(10)
    files = sorted(str(path.relative_to(agent.workdir)) + f" ({path.stat().st_size} bytes)"
                   for path in agent.workdir.rglob("*.log") if f"_{pod}-" in str(path) or f"_{pod}_" in str(path))
    status = (agent.pod(pod) or {}).get("status")
    return (f"logs -f printed {first!r} first and exited {code}; log files: {files}; status: {status}; "
            f"the agent's last lines:\n" + "\n".join(agent.log_text().splitlines()[-30:]))


def test_a_closed_pipe_ends_logs_follow_quietly(agent):
    agent.start()
    agent.write_manifest("chatty.yaml", busybox_manifest("chatty", "while true; do echo tick; sleep 0.05; done"))
    wait_for(lambda: is_running(agent.pod("chatty")), 60, what="chatty Running")
    pipeline = subprocess.run(
        f"{sys.executable} -m edgelet logs -f chatty --config {agent.config_path} | head -n 3",
        shell=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True,
        timeout=60)
    assert pipeline.stdout == "tick\ntick\ntick\n"
    assert pipeline.stderr == "", pipeline.stderr


def test_pods_name_namespace_selector_and_output_formats(agent):
    agent.start()
    agent.write_manifest("duo.yaml", TWO_CONTAINERS.replace("{ANNOTATIONS}", "{}"))
    agent.write_manifest("solo.yaml", busybox_manifest("solo", "exec sleep 3600"))
    agent.write_manifest("system.yaml", busybox_manifest("sys", "exec sleep 3600").replace(
        "name: sys", "name: sys\n          namespace: kube-system"))
    wait_for(lambda: all(_phase(agent.pod(n)) == "Running" for n in ("duo", "solo", "sys")), 60, what="three Running")

    table = agent.cli("pods")
    assert table.stdout.splitlines()[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert sorted(line.split()[0] for line in table.stdout.splitlines()[1:]) == ["duo-testnode", "solo-testnode"]
    every = agent.cli("pods", "-A").stdout.splitlines()
    assert every[0].startswith("NAMESPACE") and any(line.startswith("kube-system") for line in every)
    assert agent.cli("pods", "-n", "kube-system", "-o", "name").stdout == "pod/sys-testnode\n"
    assert agent.cli("pods", "-l", "app=duo,tier", "-o", "name").stdout == "pod/duo-testnode\n"
    assert agent.cli("pods", "-A", "-l", "app notin (duo)", "-o", "name").stdout == \
        "pod/solo-testnode\npod/sys-testnode\n"  # notin matches pods without the label, as in Kubernetes
    single = json.loads(agent.cli("pods", "duo", "-o", "json").stdout)
    assert single["kind"] == "Pod" and single["metadata"]["name"] == "duo-testnode"
    as_yaml = yaml.safe_load(agent.cli("pods", "solo-testnode", "-o", "yaml").stdout)
    assert as_yaml["metadata"]["name"] == "solo-testnode"
    missing = agent.cli("pods", "nope")
    assert missing.returncode == 1 and missing.stderr == "edgelet: pod 'nope' not found in namespace 'default'\n"
    bad = agent.cli("pods", "-l", "a=b=c")
    assert bad.returncode == 2 and "a=b=c" in bad.stderr


def test_pods_watch_prints_changes_and_terminating_during_the_grace_period(agent):
    agent.start()
    agent.write_manifest("slow.yaml", busybox_manifest("slow", "exec sleep 3600", grace=30))
    wait_for(lambda: is_running(agent.pod("slow")), 60, what="slow Running")
    watcher = _popen(agent, "pods", "-w", stdout=subprocess.PIPE)
    try:
        assert watcher.stdout.readline().split()[0] == "NAME"
        assert watcher.stdout.readline().split()[:3] == ["slow-testnode", "1/1", "Running"]
        (agent.manifest_dir / "slow.yaml").unlink()  # sleep as PID 1 ignores SIGTERM: 30 s of grace
        assert watcher.stdout.readline().split()[:3] == ["slow-testnode", "1/1", "Terminating"]
    finally:
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(10) == 0
    pod = agent.pod("slow")
    assert pod["metadata"]["deletionTimestamp"] and pod["metadata"]["deletionGracePeriodSeconds"] == 30


def test_pods_say_when_the_agent_is_not_running_and_a_removed_manifest_is_not_running(agent):
    agent.start()
    agent.write_manifest("kept.yaml", busybox_manifest("kept", "exec sleep 3600"))
    agent.write_manifest("dropped.yaml", busybox_manifest("dropped", "exec sleep 3600"))
    wait_for(lambda: is_running(agent.pod("kept")) and is_running(agent.pod("dropped")), 60, what="both Running")
    assert agent.cli("pods").stderr == ""

    agent.stop()
    (agent.manifest_dir / "dropped.yaml").unlink()
    stopped = agent.cli("pods")
    assert stopped.returncode == 0
    assert stopped.stderr.startswith("edgelet: the agent is not running: it stopped at ")
    rows = {line.split()[0]: line.split() for line in stopped.stdout.splitlines()[1:]}
    assert rows["kept-testnode"][2] == "Running" and rows["dropped-testnode"][2] == "Terminating"

    agent.start()
    wait_for(lambda: agent.pod("dropped") is None, 60, what="the dropped pod removed once the agent is back")
    assert agent.cli("pods").stderr == ""
    agent.kill9()
    crashed = agent.cli("pods")
    assert "the agent is not running: it ended without stopping (pid " in crashed.stderr
    agent.start()
    wait_for(lambda: "adopted 1 pod with running containers from the runtime" in agent.log_text(), 30,
             what="the adoption line")
    startup = [line for line in agent.log_text().splitlines() if " INFO " in line and "air-gap" in line]
    assert startup == [], "nothing is said at INFO about air-gap images when there is no images directory"


def test_pods_of_a_gone_runtime_are_unknown_in_pods_and_the_ops_endpoint(tmp_path, containerd):
    proxy_path = str(tmp_path / "cri.sock")
    proxy = SocketProxy(proxy_path, containerd.socket)
    ops = f"127.0.0.1:{free_port()}"
    agent = AgentProcess(tmp_path, f"unix://{proxy_path}", server_address=ops)
    agent.write_manifest("steady.yaml", busybox_manifest("steady", "exec sleep 3600"))
    proxy.up()
    try:
        agent.start()
        wait_for(lambda: is_running(agent.pod("steady")), 60, what="steady Running")
        proxy.down()
        wait_for(lambda: agent.pod("steady")["status"]["phase"] == "Unknown", 30, what="Unknown in edgelet pods")
        row = agent.cli("pods").stdout.splitlines()[1].split()
        assert row[1:3] == ["0/1", "Unknown"]
        (listed,) = httpx.get(f"http://{ops}/pods").json()["items"]
        assert listed["status"]["phase"] == "Unknown" and "runtime" in listed["status"]["message"]
        proxy.up()
        wait_for(lambda: is_running(agent.pod("steady")), 60, what="Running again with the runtime back")
        assert container_state(agent.pod("steady"))["ready"] is True
    finally:
        agent.close()
        proxy.down()


def test_pods_say_when_the_agent_hangs_and_it_writes_nothing_while_idle(tmp_path, containerd):
    """The agent's record is written when something changes, never on a timer (flash wear); a hung agent is
    told by its ops endpoint not answering."""
    ops = f"127.0.0.1:{free_port()}"
    agent = AgentProcess(tmp_path, f"unix://{containerd.socket}", server_address=ops)
    agent.write_manifest("steady.yaml", busybox_manifest("steady", "exec sleep 3600"))
    try:
        agent.start()
        wait_for(lambda: is_running(agent.pod("steady")), 60, what="steady Running")
        record = agent.root_dir / "state" / "pods" / "agent.json"
        written = record.stat()
        time.sleep(6)  # longer than the 5 s the record was once rewritten at
        assert (record.stat().st_ino, record.stat().st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
        assert agent.cli("pods").stderr == ""
        agent.proc.send_signal(signal.SIGSTOP)
        try:
            hung = agent.cli("pods")
        finally:
            agent.proc.send_signal(signal.SIGCONT)
        assert hung.returncode == 0
        assert hung.stderr.startswith(f"edgelet: the agent (pid {agent.proc.pid}) is not responding: its ops "
                                      f"endpoint {ops} did not answer /healthz within 2s;")
        assert agent.cli("pods").stderr == ""
        # The running gauges are recounted only when the runtime's view moves, and they follow it.
        assert running_gauges(ops) == (1, 1)
        (agent.manifest_dir / "steady.yaml").unlink()
        wait_for(lambda: running_gauges(ops) == (0, 0), 60, what="the running gauges back at 0")
    finally:
        agent.close()


def running_gauges(ops: str) -> tuple[int, int]:
    lines = httpx.get(f"http://{ops}/metrics").text.splitlines()
    pods = next(line for line in lines if line.startswith("kubelet_running_pods "))
    containers = next(line for line in lines
                      if line.startswith('kubelet_running_containers{container_state="running"} '))
    return int(float(pods.split()[1])), int(float(containers.split()[1]))


def test_a_typo_in_a_manifest_is_one_error_naming_file_field_and_the_fix(agent):
    agent.start()
    path = agent.write_manifest("typo.yaml", busybox_manifest("typo", "exec sleep 3600").replace("command:", "comand:"))
    wait_for(lambda: "typo.yaml" in agent.log_text(), 30, what="the manifest error")
    (line,) = [line for line in agent.log_text().splitlines() if "typo.yaml" in line]
    assert f'{path}: spec.containers[0].comand: unknown field "comand" (did you mean "command"?)' in line
    assert agent.pod("typo") is None


def test_a_burst_of_pods_wakes_no_more_io_threads_than_the_agent_allows(agent):
    """asyncio's default pool would grow to CPUs + 4 threads under a burst (about 200 KiB each); the agent's
    blocking file I/O shares IO_THREADS. By name: gRPC's threads have their own, Python's are all `python`: the
    event loop's, the logind signal reader's where a system bus answers, and the I/O pool's."""
    from edgelet.kubelet.agent import IO_THREADS

    agent.start()
    for index in range(8):
        agent.write_manifest(f"io-{index}", busybox_manifest(f"io-{index}", "exec sleep 3600"))
    wait_for(lambda: sum(is_running(agent.pod(f"io-{index}")) for index in range(8)) == 8, 60, what="8 pods running")
    task_dir = f"/proc/{agent.proc.pid}/task"
    names = [open(os.path.join(task_dir, task, "comm")).read().strip() for task in os.listdir(task_dir)]
    assert names.count("python") <= 2 + IO_THREADS, names
