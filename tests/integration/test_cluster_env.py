"""What an API pod's containers find in their environment: the Services' variables (the kubelet's service
informer: own namespace, the master `kubernetes` Service, enableServiceLinks) and the entries of a ConfigMap
created after the pod (read when the pod needs it, not at the next refresh). The real agent against the API
server double and the private containerd.
"""

from __future__ import annotations

import time

import pytest

from tests.helpers import wait_for
from tests.integration.cluster_harness import api_get, api_pod, main_status, running_in_api

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]


@pytest.fixture
def agent(cluster_node):
    """This module's agent is a cluster node."""
    return cluster_node

PRINT_ENV = "env | sort; exec sleep 3600"


def service(name: str, namespace: str, cluster_ip: str, *ports: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterIP": cluster_ip, "ports": list(ports) or [{"port": 80, "protocol": "TCP"}]}}


def environment(agent, name: str) -> dict[str, str]:
    """The variables the pod's container printed (`env | sort` at its start)."""
    lines = wait_for(lambda: [line for line in agent.cli("logs", name).stdout.splitlines() if "=" in line], 20,
                     what=f"{name}'s environment in its log", interval=0.5)
    return dict(line.split("=", 1) for line in lines)


def test_services_of_the_namespace_and_the_master_service_become_variables(agent, api):
    api.create("services", service("kubernetes", "default", "10.96.0.1", {"name": "https", "port": 443}))
    api.create("services", service("fooservice", "default", "10.96.0.20", {"port": 8765}))
    api.create("services", service("web-front", "default", "10.96.0.21",
                                   {"name": "http", "port": 80, "protocol": "TCP"},
                                   {"name": "metrics", "port": 9100, "protocol": "TCP"}))
    api.create("services", service("headless", "default", "None"))
    api.create("services", service("elsewhere", "kube-system", "10.96.0.22"))
    agent.start()
    linked = api_pod("linked", PRINT_ENV,
                     env=[{"name": "FOOSERVICE_SERVICE_PORT", "value": "overridden"},
                          {"name": "FROM_SERVICE", "value": "$(WEB_FRONT_SERVICE_HOST)"}])
    unlinked = api_pod("unlinked", PRINT_ENV)
    unlinked["spec"]["enableServiceLinks"] = False
    for pod in (linked, unlinked):
        api.create("pods", pod)
    for name in ("linked", "unlinked"):
        wait_for(lambda name=name: running_in_api(api, name), 30, what=f"{name} Running")

    env = environment(agent, "linked")
    assert env["FOOSERVICE_SERVICE_HOST"] == "10.96.0.20"
    assert env["FOOSERVICE_SERVICE_PORT"] == "overridden"  # the container's own env wins
    assert env["FOOSERVICE_PORT"] == "tcp://10.96.0.20:8765"
    assert env["FOOSERVICE_PORT_8765_TCP"] == "tcp://10.96.0.20:8765"
    assert env["FOOSERVICE_PORT_8765_TCP_PROTO"] == "tcp"
    assert env["FOOSERVICE_PORT_8765_TCP_PORT"] == "8765"
    assert env["FOOSERVICE_PORT_8765_TCP_ADDR"] == "10.96.0.20"
    assert env["WEB_FRONT_SERVICE_PORT_METRICS"] == "9100" and env["WEB_FRONT_SERVICE_PORT"] == "80"
    assert env["FROM_SERVICE"] == "10.96.0.21"  # $(VAR) expands Service variables
    assert not any(key.startswith(("HEADLESS_", "ELSEWHERE_")) for key in env)
    # The master Service points where this agent reaches the API server (the double, on loopback).
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert env["KUBERNETES_SERVICE_PORT"] == api.url.rsplit(":", 1)[1]

    env = environment(agent, "unlinked")
    assert not any(key.startswith(("FOOSERVICE_", "WEB_FRONT_")) for key in env)
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"


def test_a_service_created_while_the_agent_runs_reaches_the_next_pod(agent, api):
    agent.start()
    api.create("pods", api_pod("before", PRINT_ENV))
    wait_for(lambda: running_in_api(api, "before"), 30, what="before Running")
    assert not any(key.startswith("LATE_") for key in environment(agent, "before"))
    api.create("services", service("late", "default", "10.96.0.30", {"port": 8080}))
    time.sleep(0.5)  # the watch event on its way
    api.create("pods", api_pod("after", PRINT_ENV))
    wait_for(lambda: running_in_api(api, "after"), 30, what="after Running")
    assert environment(agent, "after")["LATE_SERVICE_HOST"] == "10.96.0.30"


def test_a_config_map_created_after_its_pod_is_read_when_the_pod_is_synced_again(agent, api):
    """Missing when the pod came (CreateContainerConfigError, retried in 10 s): created then, it is read at the
    retry, long before the 60 s refresh of referenced objects."""
    agent.start()
    pod = api_pod("late-config", PRINT_ENV)
    pod["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "late"}},
                                               {"prefix": "P_", "configMapRef": {"name": "late"}}]
    api.create("pods", pod)
    waiting = wait_for(lambda: (main_status(api_get(api, "pods", "late-config", "default")).get("state") or {})
                       .get("waiting"), 30, what="the container waiting for its ConfigMap")
    assert waiting["reason"] == "CreateContainerConfigError" and 'configmap "late" not found' in waiting["message"]
    api.create("configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                              "metadata": {"name": "late", "namespace": "default"},
                              "data": {"DATA_1": "value-1", "DATA_2": "value-2"}})
    created = time.monotonic()
    wait_for(lambda: running_in_api(api, "late-config"), 30, what="late-config Running")
    assert time.monotonic() - created < 20
    env = environment(agent, "late-config")
    assert (env["DATA_1"], env["DATA_2"], env["P_DATA_1"], env["P_DATA_2"]) == ("value-1", "value-2", "value-1",
                                                                                "value-2")


def test_envfrom_keys_the_shell_would_drop_reach_the_process(agent, api):
    """The upstream spec's keys (`data-1`, prefix `p-`) are valid names (the relaxed rule): they reach the
    container's process. (A busybox 1.35 shell drops such names from what it passes on, so `sh -c env` there does
    not show them; `env` run directly does.)"""
    api.create("configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                              "metadata": {"name": "dashed", "namespace": "default"},
                              "data": {"data-1": "value-1", "data-2": "value-2"}})
    agent.start()
    pod = api_pod("dashed")
    pod["spec"]["restartPolicy"] = "Never"
    container = pod["spec"]["containers"][0]
    container["command"] = ["env"]
    container["envFrom"] = [{"configMapRef": {"name": "dashed"}}, {"prefix": "p-", "configMapRef": {"name": "dashed"}}]
    api.create("pods", pod)
    wait_for(lambda: (api_get(api, "pods", "dashed", "default") or {}).get("status", {}).get("phase") == "Succeeded",
             30, what="dashed Succeeded")
    env = environment(agent, "dashed")
    assert (env["data-1"], env["data-2"], env["p-data-1"], env["p-data-2"]) == ("value-1", "value-2", "value-1",
                                                                                "value-2")
