"""Workload features through the real agent: probes, init containers, local ConfigMaps/Secrets, env,
resources, and bad references reported on the pod."""

from __future__ import annotations

import time

import pytest

from tests.helpers import wait_for
from tests.integration.agent_harness import container_state, is_running

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]

IMAGE = "docker.io/library/busybox:local"


def conditions(pod: dict) -> dict[str, str]:
    return {c["type"]: c["status"] for c in pod["status"].get("conditions") or []}


def exec_in(containerd, pod: dict, command: list[str], name: str = "main") -> str:
    import asyncio

    from edgelet.cri.client import RuntimeClient

    container_id = container_state(pod, name)["containerID"].split("://", 1)[1]

    async def run():
        async with RuntimeClient(containerd.endpoint) as client:
            code, out, err = await client.exec_sync(container_id, command, 10)
            assert code == 0, err
            return out.decode()

    return asyncio.run(run())


def test_readiness_gates_ready_and_liveness_restarts(agent, containerd):
    agent.write_manifest("probed.yaml", f"""\
        apiVersion: v1
        kind: Pod
        metadata:
          name: probed
        spec:
          hostNetwork: true
          terminationGracePeriodSeconds: 1
          containers:
            - name: main
              image: {IMAGE}
              imagePullPolicy: Never
              command: ["sh", "-c", "exec sleep 3600"]
              readinessProbe:
                exec:
                  command: ["test", "-f", "/tmp/ready"]
                periodSeconds: 1
              livenessProbe:
                exec:
                  command: ["sh", "-c", "! test -f /tmp/sick"]
                periodSeconds: 1
                failureThreshold: 2
        """)
    pod = wait_for(lambda: (p := agent.pod("probed")) and is_running(p) and p, 60, what="Running")
    time.sleep(2)  # several probe periods
    pod = agent.pod("probed")
    assert conditions(pod)["Ready"] == "False"  # running, but the readiness probe has not passed yet
    assert container_state(pod)["ready"] is False
    exec_in(containerd, pod, ["touch", "/tmp/ready"])
    pod = wait_for(lambda: (p := agent.pod("probed")) and conditions(p).get("Ready") == "True" and p,
                   30, what="Ready after the readiness probe passed")
    assert container_state(pod)["ready"] is True

    # Make the liveness probe fail: the container is killed and restarted.
    exec_in(containerd, pod, ["touch", "/tmp/sick"])
    restarted = wait_for(lambda: (p := agent.pod("probed")) and container_state(p).get("restartCount", 0) >= 1
                         and p, 40, what="restart after liveness failure")
    assert restarted["status"]["phase"] == "Running"


def test_init_containers_run_in_order_before_the_app(agent, containerd):
    agent.write_manifest("init.yaml", f"""\
        apiVersion: v1
        kind: Pod
        metadata:
          name: init
        spec:
          hostNetwork: true
          terminationGracePeriodSeconds: 1
          volumes:
            - name: work
              emptyDir: {{}}
          initContainers:
            - name: first
              image: {IMAGE}
              imagePullPolicy: Never
              command: ["sh", "-c", "echo first >> /work/order"]
              volumeMounts: [{{name: work, mountPath: /work}}]
            - name: second
              image: {IMAGE}
              imagePullPolicy: Never
              command: ["sh", "-c", "sleep 1; echo second >> /work/order"]
              volumeMounts: [{{name: work, mountPath: /work}}]
          containers:
            - name: main
              image: {IMAGE}
              imagePullPolicy: Never
              command: ["sh", "-c", "echo main >> /work/order; exec sleep 3600"]
              volumeMounts: [{{name: work, mountPath: /work}}]
        """)
    pod = wait_for(lambda: (p := agent.pod("init")) and is_running(p) and p, 60, what="Running after init")
    assert conditions(pod)["Initialized"] == "True"
    inits = pod["status"]["initContainerStatuses"]
    assert [s["name"] for s in inits] == ["first", "second"]
    assert all(s["state"]["terminated"]["reason"] == "Completed" for s in inits)
    assert exec_in(containerd, pod, ["cat", "/work/order"]) == "first\nsecond\nmain\n"


APP_CONFIG = """\
    apiVersion: v1
    kind: ConfigMap
    metadata:
      name: app-config
    data:
      greeting: hello
      settings.ini: |
        mode={mode}
    ---
    apiVersion: v1
    kind: Secret
    metadata:
      name: app-secret
    stringData:
      token: s3cr3t
    """


def test_local_configmap_and_secret_as_env_and_volumes(agent, containerd):
    agent.write_manifest("config.yaml", APP_CONFIG.format(mode="edge"))
    agent.write_manifest("app.yaml", f"""\
        apiVersion: v1
        kind: Pod
        metadata:
          name: app
        spec:
          hostNetwork: true
          terminationGracePeriodSeconds: 1
          volumes:
            - name: config
              configMap:
                name: app-config
            - name: secret
              secret:
                secretName: app-secret
          containers:
            - name: main
              image: {IMAGE}
              imagePullPolicy: Never
              command: ["sh", "-c", "exec sleep 3600"]
              env:
                - name: GREETING
                  valueFrom:
                    configMapKeyRef: {{name: app-config, key: greeting}}
                - name: MESSAGE
                  value: "$(GREETING) from $(POD)"
                - name: POD
                  valueFrom:
                    fieldRef: {{fieldPath: metadata.name}}
              resources:
                requests: {{cpu: 100m, memory: 32Mi}}
                limits: {{cpu: 100m, memory: 32Mi}}
              volumeMounts:
                - {{name: config, mountPath: /etc/app}}
                - {{name: secret, mountPath: /var/run/secret, readOnly: true}}
        """)
    pod = wait_for(lambda: (p := agent.pod("app")) and is_running(p) and p, 60, what="app Running")
    assert pod["status"]["qosClass"] == "Guaranteed"
    env = exec_in(containerd, pod, ["env"])
    assert "GREETING=hello\n" in env
    assert "MESSAGE=hello from $(POD)\n" in env  # POD is defined after MESSAGE: left as written
    assert exec_in(containerd, pod, ["cat", "/etc/app/settings.ini"]) == "mode=edge\n"
    assert exec_in(containerd, pod, ["cat", "/var/run/secret/token"]) == "s3cr3t"

    # A changed ConfigMap manifest reaches the volume of a running pod in seconds, not at the pod's periodic resync
    # (a minute here). The API's objects take the same way (tests/e2e/test_pods.py).
    agent.write_manifest("config.yaml", APP_CONFIG.format(mode="cloud"))
    wait_for(lambda: exec_in(containerd, pod, ["cat", "/etc/app/settings.ini"]) == "mode=cloud\n", 6, interval=0.2,
             what="the changed ConfigMap in the volume")


def test_bad_references_are_reported_on_the_pod(agent):
    agent.write_manifest("badref.yaml", f"""\
        apiVersion: v1
        kind: Pod
        metadata:
          name: badref
        spec:
          hostNetwork: true
          containers:
            - name: main
              image: {IMAGE}
              imagePullPolicy: Never
              command: ["sleep", "3600"]
              env:
                - name: X
                  valueFrom:
                    configMapKeyRef: {{name: missing-config, key: x}}
        """)
    agent.write_manifest("badhost.yaml", f"""\
        apiVersion: v1
        kind: Pod
        metadata:
          name: badhost
        spec:
          hostNetwork: true
          volumes:
            - name: data
              hostPath:
                path: /nonexistent/edgelet-test-path
                type: Directory
          containers:
            - name: main
              image: {IMAGE}
              imagePullPolicy: Never
              command: ["sleep", "3600"]
              volumeMounts: [{{name: data, mountPath: /data}}]
        """)
    agent.write_manifest("neverpull.yaml", """\
        apiVersion: v1
        kind: Pod
        metadata:
          name: neverpull
        spec:
          hostNetwork: true
          containers:
            - name: main
              image: example.invalid/not-here:1.0
              imagePullPolicy: Never
        """)

    def waiting(name):
        pod = agent.pod(name)
        return pod and (container_state(pod).get("state") or {}).get("waiting")

    badref = wait_for(lambda: waiting("badref"), 60, what="badref waiting")
    assert badref["reason"] == "CreateContainerConfigError"
    assert 'configmap "missing-config" not found' in badref["message"]
    badhost = wait_for(lambda: waiting("badhost"), 60, what="badhost waiting")
    assert badhost["reason"] == "CreateContainerConfigError"
    assert "/nonexistent/edgelet-test-path" in badhost["message"]
    never = wait_for(lambda: waiting("neverpull"), 60, what="neverpull waiting")
    assert never["reason"] == "ErrImageNeverPull"
    assert agent.proc.poll() is None


def test_unsupported_pod_fails_admission_and_others_run(agent):
    agent.write_manifest("claim.yaml", f"""\
        apiVersion: v1
        kind: Pod
        metadata:
          name: claim
        spec:
          hostNetwork: true
          volumes:
            - name: data
              persistentVolumeClaim:
                claimName: data
          containers:
            - name: main
              image: {IMAGE}
              imagePullPolicy: Never
              command: ["sleep", "3600"]
        """)
    agent.write_manifest("fine.yaml", f"""\
        apiVersion: v1
        kind: Pod
        metadata:
          name: fine
        spec:
          hostNetwork: true
          terminationGracePeriodSeconds: 1
          containers:
            - name: main
              image: {IMAGE}
              imagePullPolicy: Never
              command: ["sleep", "3600"]
        """)
    claim = wait_for(lambda: (p := agent.pod("claim")) and p["status"].get("phase") == "Failed" and p,
                     60, what="claim Failed")
    assert claim["status"]["reason"] == "UnsupportedFeature"
    assert "persistentVolumeClaim" in claim["status"]["message"]
    wait_for(lambda: is_running(agent.pod("fine")), 60, what="fine Running")
    (agent.manifest_dir / "claim.yaml").unlink()
    wait_for(lambda: agent.pod("claim") is None, 30, what="rejected pod forgotten once its manifest is gone")
