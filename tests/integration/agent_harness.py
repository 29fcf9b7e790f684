"""Runs the real `edgelet run` as a subprocess against the private containerd, as a user would."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A loopback TCP port nothing listens on now (the kernel's pick; free until someone binds it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on the port."""
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


def unmount_under(directory: Path) -> None:
    """Detaches every mount below `directory`, deepest first."""
    prefix = str(directory.resolve()) + "/"
    with open("/proc/self/mountinfo") as mountinfo:
        points = [line.split()[4] for line in mountinfo]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


# Test agents watch no plugin registry unless a test gives one: the host's /var/lib/kubelet/plugins_registry (the
# default) may hold the sockets of other agents' plugins.
NO_PLUGIN_REGISTRY = '\n[csi]\nplugins_registry = ""\n'


class AgentProcess:
    """One edgelet agent with its own root_dir and manifest directory."""

    def __init__(self, workdir: Path, endpoint: str, *, node_name: str = "testnode", extra_toml: str = "",
                 server_address: str = "", request_timeout: str = "2m"):
        self.workdir = workdir
        self.root_dir = workdir / "root"
        self.pod_logs_dir = workdir / "log" / "pods"  # the node's /var/log/pods and /var/log/containers
        self.container_logs_dir = workdir / "log" / "containers"
        self.manifest_dir = workdir / "manifests"
        self.manifest_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "edgelet.toml"
        self.log_path = workdir / "agent.log"
        # The kubelet's device plugin and pod resources sockets, in a directory of the agent's own: not under
        # workdir, whose path under pytest's base directory can pass the 107 bytes a unix socket's path may hold.
        self.socket_dir = Path(tempfile.mkdtemp(prefix="edgelet-sockets-"))
        atexit.register(shutil.rmtree, self.socket_dir, True)
        self.plugin_dir = self.socket_dir / "device-plugins"
        self.pod_resources_socket = self.socket_dir / "pod-resources" / "kubelet.sock"
        self.node_name = node_name
        self.config_path.write_text(textwrap.dedent(f"""\
            node_name = "{node_name}"
            root_dir = "{self.root_dir}"
            pod_logs_dir = "{self.pod_logs_dir}"
            container_logs_dir = "{self.container_logs_dir}"
            log_level = "debug"

            [runtime]
            endpoint = "{endpoint}"
            request_timeout = "{request_timeout}"

            [pods]
            manifest_dir = "{self.manifest_dir}"
            file_check_frequency = "5s"

            [backoff]
            crashloop_initial = "1s"
            crashloop_max = "4s"

            [server]
            address = "{server_address}"

            [devices]
            plugin_dir = "{self.plugin_dir}"
            pod_resources_socket = "{self.pod_resources_socket}"
            """) + extra_toml + ("" if "[csi]" in extra_toml else NO_PLUGIN_REGISTRY))
        self.proc: subprocess.Popen | None = None
        self.env: dict[str, str] = {}  # added to the agent's environment (e.g. LD_PRELOAD)

    def start(self) -> AgentProcess:
        env = dict(os.environ)
        env.setdefault("PYTHONPATH", str(REPO))
        env.update(self.env)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edgelet", "run", "--config", str(self.config_path)],
            cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT,
        )
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._log.close()
        self.proc = None
        return code

    def close(self) -> None:
        """Stops the agent and unmounts what its volumes left mounted (pods outlive the agent)."""
        self.stop()
        unmount_under(self.workdir)

    def kill9(self) -> None:
        self.stop(signal.SIGKILL)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def write_manifest(self, name: str, text: str) -> Path:
        """Writes atomically, as editors and config management do (temp file + rename)."""
        path = self.manifest_dir / name
        tmp = self.manifest_dir / f".{name}.tmp"
        tmp.write_text(textwrap.dedent(text))
        tmp.rename(path)
        return path

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        env = dict(os.environ)
        env.setdefault("PYTHONPATH", str(REPO))
        return subprocess.run([sys.executable, "-m", "edgelet", *args, "--config", str(self.config_path)],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=60)

    def pods(self) -> dict[str, dict]:
        """The PodList as `edgelet pods -o json` prints it, by pod name."""
        result = self.cli("pods", "-A", "-o", "json")
        assert result.returncode == 0, result.stderr
        return {p["metadata"]["name"]: p for p in json.loads(result.stdout)["items"]}

    def pod(self, name: str) -> dict | None:
        return self.pods().get(f"{name}-{self.node_name}")


def fails_first_run_pod(name: str, first_run: str, later_runs: str) -> str:
    """A pod whose container runs `first_run` and exits 1 once, then runs `later_runs`.

    The marker lives in an emptyDir, which outlives container restarts but not the pod.
    """
    script = f"if [ -f /scratch/ran ]; then {later_runs}; fi; touch /scratch/ran; {first_run}; exit 1"
    return f"""\
        apiVersion: v1
        kind: Pod
        metadata:
          name: {name}
        spec:
          hostNetwork: true
          terminationGracePeriodSeconds: 1
          volumes:
            - name: scratch
              emptyDir: {{}}
          containers:
            - name: main
              image: docker.io/library/busybox:local
              imagePullPolicy: Never
              command: ["sh", "-c", {json.dumps(script)}]
              volumeMounts:
                - name: scratch
                  mountPath: /scratch
        """


def container_state(pod: dict, name: str = "main") -> dict:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status["name"] == name:
            return status
    return {}


def is_running(pod: dict | None) -> bool:
    return bool(pod) and pod["status"].get("phase") == "Running" and "running" in (
        container_state(pod).get("state") or {}
    )


# A pod of two containers for the CLI tests; {ANNOTATIONS} is replaced by a YAML flow mapping.
TWO_CONTAINERS = """\
    apiVersion: v1
    kind: Pod
    metadata:
      name: duo
      labels: {app: duo, tier: edge}
      annotations: {ANNOTATIONS}
    spec:
      hostNetwork: true
      terminationGracePeriodSeconds: 1
      containers:
        - name: first
          image: docker.io/library/busybox:local
          imagePullPolicy: Never
          command: ["sh", "-c", "for i in 1 2 3 4 5; do echo first $i; done; exec sleep 3600"]
        - name: second
          image: docker.io/library/busybox:local
          imagePullPolicy: Never
          command: ["sh", "-c", "echo second; exec sleep 3600"]
    """
