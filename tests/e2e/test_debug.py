"""Ephemeral containers against the real kube-apiserver 1.36: `kubectl debug -i` adds one to a running pod through
the pods/ephemeralcontainers subresource (a Pod object), the agent runs it in its target's PID namespace, kubectl
attaches to it, and it is reported in ephemeralContainerStatuses.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time

import pytest

from tests.e2e.conftest import container_status, pod_phase, wait_pod
from tests.e2e.harness import IMAGE, pod_manifest

pytestmark = pytest.mark.containerd


def read_until(process: subprocess.Popen, needle: bytes, timeout: float = 30) -> bytes:
    got = b""
    deadline = time.monotonic() + timeout
    while needle not in got:
        left = deadline - time.monotonic()
        assert left > 0 and process.poll() is None, (got, process.poll())
        ready, _, _ = select.select([process.stdout], [], [], min(left, 0.5))
        if ready:
            got += os.read(process.stdout.fileno(), 65536)
    return got


def ephemeral_status(pod: dict, name: str) -> dict:
    statuses = (pod.get("status") or {}).get("ephemeralContainerStatuses") or []
    return next((s for s in statuses if s["name"] == name), {})


def test_kubectl_debug_adds_an_ephemeral_container_and_attaches(node_ready, control_plane, kubectl):
    kubectl.apply(pod_manifest("target", control_plane.node, "exec sleep 3600"))
    wait_pod(kubectl, "target", lambda p: pod_phase(p) == "Running", 60)

    # What goes in through kubectl's stdin reaches the shell; what it prints comes back while the session is
    # open. Its PID 1 is the target's process: it shares the target's PID namespace.
    debug = subprocess.Popen(kubectl.command("debug", "-i", "target", f"--image={IMAGE}", "--image-pull-policy=Never",
                                             "--target=main", "-c", "debugger", "--", "sh"),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        pod = wait_pod(kubectl, "target", lambda p: "running" in ephemeral_status(p, "debugger").get("state", {}), 60)
        status = ephemeral_status(pod, "debugger")
        assert status["containerID"].startswith("containerd://") and status["restartCount"] == 0
        (spec,) = pod["spec"]["ephemeralContainers"]
        assert (spec["name"], spec["targetContainerName"], spec["stdin"]) == ("debugger", "main", True)
        debug.stdin.write(b"echo from-debugger; tr '\\0' ' ' < /proc/1/cmdline; echo; echo done\n")
        debug.stdin.flush()
        output = read_until(debug, b"done\n")
        assert b"from-debugger\n" in output and b"sleep 3600" in output, output
        debug.stdin.write(b"exit 4\n")
        debug.stdin.close()
        debug.wait(30)
    finally:
        if debug.poll() is None:
            debug.kill()
            debug.wait()

    pod = wait_pod(kubectl, "target", lambda p: "terminated" in ephemeral_status(p, "debugger").get("state", {}), 60)
    ended = ephemeral_status(pod, "debugger")
    assert (ended["state"]["terminated"]["exitCode"], ended["restartCount"]) == (4, 0)  # never restarted
    assert "from-debugger" in kubectl("logs", "target", "-c", "debugger")
    assert pod_phase(pod) == "Running" and container_status(pod)["restartCount"] == 0  # the pod goes on

    # The subresource takes a Pod; the API refuses to change or remove an ephemeral container, the node is not asked.
    path = "/api/v1/namespaces/default/pods/target/ephemeralcontainers"
    current = json.loads(kubectl("get", "--raw", path))
    assert current["kind"] == "Pod"
    current["spec"]["ephemeralContainers"] = []
    refused = kubectl.run("replace", "--raw", path, "-f", "-", input=json.dumps(current), check=False)
    assert refused.returncode != 0 and "may not be removed" in refused.stderr, refused.stderr
