"""Pod security contexts on the real runtime, observed from inside the containers as the kubelet's e2e specs do:
privileged pods, seccomp (RuntimeDefault, Unconfined, Localhost, the node default), masked /proc paths, sysctls,
runAsNonRoot and AppArmor (this host's kernel decides which refusal a pod gets)."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.helpers import wait_for
from tests.integration.agent_harness import AgentProcess, container_state

pytestmark = pytest.mark.usefixtures("clean_runtime")

# What each container prints of itself: its seccomp mode and capabilities, how much of /proc/timer_list (masked
# unless privileged; /proc/kcore is not in every kernel) it reads,
# how /proc/sys is mounted, the device nodes it sees, then the pod's own probe.
REPORT = ("grep -E '^(Seccomp|CapEff):' /proc/self/status | tr -d '\\t '; "
          "echo MASKED=$(head -c 16 /proc/timer_list | wc -c); "
          "echo SYS=$(awk '$2==\"/proc/sys\"{split($4,o,\",\"); print o[1]}' /proc/mounts); "
          "echo DEVICES=$(ls /dev | wc -l)")

def host_capabilities() -> str:
    """The capabilities this machine lets a privileged container have (a test host may lack some)."""
    with open("/proc/self/status") as status:
        return next(line.split()[1] for line in status if line.startswith("CapBnd:"))


HOST_APPARMOR = (os.path.isdir("/sys/kernel/security/apparmor")
                 and open("/sys/module/apparmor/parameters/enabled").read(1) == "Y")
DENY_MKDIR = {"defaultAction": "SCMP_ACT_ALLOW",
              "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}]}


def pod(name: str, *, probe: str = "", container_sc: dict | None = None, pod_sc: dict | None = None,
        host_network: bool = True) -> str:
    container = {"name": "main", "image": "docker.io/library/busybox:local", "imagePullPolicy": "Never",
                 "command": ["sh", "-c", "; ".join(filter(None, (REPORT, probe, "echo DONE; sleep 3600")))]}
    if container_sc is not None:
        container["securityContext"] = container_sc
    spec = {"hostNetwork": host_network, "terminationGracePeriodSeconds": 1, "containers": [container]}
    if pod_sc is not None:
        spec["securityContext"] = pod_sc
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})


def report(agent: AgentProcess, name: str) -> dict[str, str]:
    """The container's report, KEY -> value, once it is complete."""
    def complete():
        result = agent.cli("logs", name)
        return result.stdout if "DONE" in result.stdout else None
    text = wait_for(complete, 60, 0.5, f"{name}'s report")
    return dict(re.split(r"[:=]", line, maxsplit=1) for line in text.splitlines() if re.match(r"[A-Za-z]+[:=]", line))


def waiting(agent: AgentProcess, name: str) -> dict:
    """The container's waiting state once it has a reason other than ContainerCreating."""
    def state():
        current = (container_state(agent.pod(name) or {}).get("state") or {}).get("waiting") or {}
        return current if current.get("reason") not in (None, "ContainerCreating") else None
    return wait_for(state, 60, 0.5, f"{name} waiting")


def rejected(agent: AgentProcess, name: str) -> dict:
    return wait_for(lambda: (agent.pod(name) or {}).get("status", {}).get("phase") == "Failed"
                    and agent.pod(name)["status"], 60, 0.5, f"{name} rejected")


@pytest.fixture
def security_agent(tmp_path, containerd):
    process = AgentProcess(tmp_path, containerd.endpoint,
                           extra_toml='\n[security]\nallowed_unsafe_sysctls = ["fs.mqueue.*"]\n')
    profiles = process.root_dir / "seccomp"
    profiles.mkdir(parents=True)
    (profiles / "deny-mkdir.json").write_text(json.dumps(DENY_MKDIR))
    yield process.start()
    process.close()


def test_privileged_seccomp_and_masked_paths(security_agent):
    agent = security_agent
    agent.write_manifest("priv.yaml", pod("priv", container_sc={"privileged": True}))
    agent.write_manifest("plain.yaml", pod("plain"))
    agent.write_manifest("rtdefault.yaml", pod("rtdefault", pod_sc={"seccompProfile": {"type": "RuntimeDefault"}}))
    agent.write_manifest("unconfined.yaml", pod("unconfined", pod_sc={"seccompProfile": {"type": "RuntimeDefault"}},
                                                container_sc={"seccompProfile": {"type": "Unconfined"}}))
    agent.write_manifest("nomkdir.yaml", pod("nomkdir", probe="mkdir /tmp/x && echo MKDIR=ok || echo MKDIR=denied",
                                             container_sc={"seccompProfile": {"type": "Localhost",
                                                                              "localhostProfile": "deny-mkdir.json"}}))
    agent.write_manifest("noprofile.yaml", pod("noprofile", container_sc={
        "seccompProfile": {"type": "Localhost", "localhostProfile": "missing.json"}}))

    privileged = report(agent, "priv")
    assert privileged["CapEff"] == host_capabilities(), privileged  # every capability
    assert privileged["MASKED"] == "16" and privileged["SYS"] == "", privileged  # nothing masked or remounted
    plain = report(agent, "plain")
    assert int(privileged["DEVICES"]) > int(plain["DEVICES"]) + 10, (privileged, plain)  # the host's /dev
    assert plain["CapEff"] == "00000000a80425fb", plain  # the runtime's default set
    assert plain["MASKED"] == "0" and plain["SYS"] == "ro", plain  # /proc/timer_list masked, /proc/sys read-only
    assert plain["Seccomp"] == "0", plain  # no filter unless asked for (seccomp_default off, as the kubelet's)
    assert report(agent, "rtdefault")["Seccomp"] == "2"  # the pod's field
    assert report(agent, "unconfined")["Seccomp"] == "0"  # the container's field wins over the pod's
    confined = report(agent, "nomkdir")
    assert (confined["Seccomp"], confined["MKDIR"]) == ("2", "denied"), confined

    # A Localhost profile that is not there: the runtime refuses to create the container, as under the kubelet.
    state = waiting(agent, "noprofile")
    assert state["reason"] == "CreateContainerError", state
    assert str(agent.root_dir / "seccomp" / "missing.json") in state["message"], state


def test_sysctls_run_as_non_root_and_apparmor(security_agent):
    agent = security_agent
    agent.write_manifest("safe.yaml", pod("safe", probe="echo RMID=$(cat /proc/sys/kernel/shm_rmid_forced)",
                                          pod_sc={"sysctls": [{"name": "kernel.shm_rmid_forced", "value": "1"}]}))
    agent.write_manifest("unsafe.yaml", pod("unsafe", pod_sc={"sysctls": [{"name": "kernel.msgmax", "value": "9000"}]}))
    agent.write_manifest("allowed.yaml", pod("allowed", probe="echo MQ=$(cat /proc/sys/fs/mqueue/msg_max)",
                                             pod_sc={"sysctls": [{"name": "fs.mqueue.msg_max", "value": "20"}]}))
    agent.write_manifest("hostnet.yaml", pod("hostnet", pod_sc={
        "sysctls": [{"name": "net.ipv4.ip_local_port_range", "value": "20000 30000"}]}))
    agent.write_manifest("nonroot.yaml", pod("nonroot", pod_sc={"runAsNonRoot": True}))
    agent.write_manifest("rootuser.yaml", pod("rootuser", pod_sc={"runAsNonRoot": True},
                                              container_sc={"runAsUser": 0}))
    agent.write_manifest("user.yaml", pod("user", probe="echo UID=$(id -u)", pod_sc={"runAsNonRoot": True,
                                                                                     "runAsUser": 1000}))
    agent.write_manifest("armor.yaml", pod("armor", container_sc={"appArmorProfile": {"type": "RuntimeDefault"}}))
    agent.write_manifest("noarmor.yaml", pod("noarmor", pod_sc={"appArmorProfile": {"type": "Unconfined"}}))

    assert report(agent, "safe")["RMID"] == "1"
    assert report(agent, "allowed")["MQ"] == "20"  # allowed_unsafe_sysctls = ["fs.mqueue.*"]
    status = rejected(agent, "unsafe")
    assert (status["reason"], status["message"]) == ("SysctlForbidden",
                                                     'forbidden sysctl: "kernel.msgmax" not allowlisted')
    status = rejected(agent, "hostnet")
    assert (status["reason"], status["message"]) == (
        "SysctlForbidden", 'forbidden sysctl: "net.ipv4.ip_local_port_range" not allowed with host Net enabled')

    uid = agent.pod("nonroot")["metadata"]["uid"]
    state = waiting(agent, "nonroot")
    assert state == {"reason": "CreateContainerConfigError", "message": "container has runAsNonRoot and image will "
                     f'run as root (pod: "nonroot-testnode_default({uid})", container: main)'}, state
    state = waiting(agent, "rootuser")
    assert state["reason"] == "CreateContainerConfigError", state
    assert state["message"].startswith("container's runAsUser breaks non-root policy (pod: "), state
    assert report(agent, "user")["UID"] == "1000"

    assert "Seccomp" in report(agent, "noarmor")  # Unconfined needs nothing of the host
    if HOST_APPARMOR:
        assert "Seccomp" in report(agent, "armor")
    else:
        status = rejected(agent, "armor")
        assert (status["reason"], status["message"]) == ("AppArmor",
                                                         "Cannot enforce AppArmor: AppArmor is not enabled on the host")


def test_seccomp_default(tmp_path, containerd):
    agent = AgentProcess(tmp_path, containerd.endpoint, extra_toml="\n[security]\nseccomp_default = true\n").start()
    try:
        agent.write_manifest("plain.yaml", pod("plain"))
        agent.write_manifest("unconfined.yaml",
                             pod("unconfined", container_sc={"seccompProfile": {"type": "Unconfined"}}))
        assert report(agent, "plain")["Seccomp"] == "2"
        assert report(agent, "unconfined")["Seccomp"] == "0"
    finally:
        agent.close()
