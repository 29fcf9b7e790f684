"""Offline autonomy end to end: API server outages, an agent killed and restarted while offline, changes made in
the API during an outage, and a damaged cache; the real agent, the API server double and the private containerd.
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
import time
import urllib.error
import urllib.request

import pytest

from edgelet.container import labels
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.cri.client import RuntimeClient
from edgelet.util.checkpoint import CORRUPT_DIR, key_to_filename
from tests.helpers import wait_for
from tests.integration.agent_harness import free_port
from tests.integration.cluster_harness import (
    api_get,
    api_pod,
    cluster_agent,
    log_seconds_between,
    main_status,
    remove_pod_from_runtime,
    running_container_ids,
    running_in_api,
    running_locally,
    unmount_below,
    wait_lease_renewed,
)
from tests.integration.cri_harness import runtime_objects

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]


@pytest.fixture
def agent(cluster_node):
    """This module's agent is a cluster node."""
    return cluster_node

# The pod source reconnects as the reflector does (a step doubling to 30 s, each wait up to twice it): after
# the outages here (15 s at most) its next try may be 26 s away, so waits after an outage are generous.
RECONNECT = 45


def start_pods(agent, api, *names: str, **pod_options) -> dict[str, str]:
    """Creates API pods, waits until the API shows them Running; returns name -> uid."""
    uids = {name: api.create("pods", api_pod(name, **pod_options))["metadata"]["uid"] for name in names}
    for name in names:
        wait_for(lambda name=name: running_in_api(api, name), 30, what=f"{name} Running in the API")
    return uids


def remove_containers(endpoint: str, pod_uid: str) -> None:
    """Removes the pod's containers but keeps its sandbox: a container that died and was cleaned up."""

    async def remove():
        async with RuntimeClient(endpoint) as client:
            for container in await client.list_containers(pb.ContainerFilter(label_selector={labels.POD_UID: pod_uid})):
                await client.remove_container(container.id)

    asyncio.run(remove())


def container_id(pod: dict | None) -> str:
    return (main_status(pod).get("containerID") or "").removeprefix("containerd://")


@pytest.fixture
def agent_with_server(tmp_path, containerd, api):
    port = free_port()
    process = cluster_agent(tmp_path, containerd.endpoint, api, server_address=f"127.0.0.1:{port}")
    process.healthz = f"http://127.0.0.1:{port}/healthz?verbose"
    yield process
    process.stop()
    unmount_below(tmp_path)


def healthz(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_outage_pods_keep_running_and_the_lease_resumes(agent_with_server, api, containerd):
    agent = agent_with_server
    agent.start()
    uids = start_pods(agent, api, "steady")
    (before,) = running_container_ids(containerd.endpoint, uids["steady"])

    api.go_down()
    time.sleep(5)  # longer than the 4 s lease: a control plane would call the node unreachable
    assert running_container_ids(containerd.endpoint, uids["steady"]) == [before]
    # Being offline is not ill health: /healthz must not make a watchdog restart the agent now.
    code, text = healthz(agent.healthz)
    assert code == 200 and "[+]apisync ok" in text, text
    # A container dies while offline: the agent restarts it without asking anyone.
    remove_containers(containerd.endpoint, uids["steady"])
    restarted = wait_for(lambda: (p := running_locally(agent, "steady")) and container_id(p) != before and p, 30,
                         what="container restarted offline")

    back = time.monotonic()
    api.come_up()
    wait_lease_renewed(api, timeout=RECONNECT)
    lease_after = time.monotonic() - back
    pod = wait_for(lambda: (p := api_get(api, "pods", "steady", "default")) and
                   container_id(p) == container_id(restarted) and p, RECONNECT, what="offline status sent")
    status_after = time.monotonic() - back
    assert "running" in main_status(pod)["state"]
    print(f"\nafter the outage: lease renewed in {lease_after * 1000:.0f} ms, "
          f"the offline status in the API in {status_after * 1000:.0f} ms")


SETTINGS = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": "default"},
            "data": {"greeting": "hello-from-the-api"}}
TOKEN = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "token", "namespace": "default"},
         "data": {"token": "c2VjcmV0"}}
READS_OBJECTS = {
    "command": 'echo "greeting=$GREETING"; exec sleep 3600',
    "env": [{"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "greeting"}}}],
    "volumes": [{"name": "token", "secret": {"secretName": "token"}}],
}


def test_agent_killed_and_restarted_offline_brings_pods_back_from_the_cache(agent, api, containerd):
    api.create("configmaps", SETTINGS)
    api.create("secrets", TOKEN)
    agent.start()
    uids = start_pods(agent, api, "kept", "lost", **READS_OBJECTS)
    kept_before = running_container_ids(containerd.endpoint, uids["kept"])
    lost_before = running_container_ids(containerd.endpoint, uids["lost"])
    assert "greeting=hello-from-the-api" in agent.cli("logs", "lost").stdout

    api.go_down()
    agent.kill9()
    remove_pod_from_runtime(containerd.endpoint, uids["lost"])  # gone while the agent was down
    started = time.monotonic()
    agent.start()
    wait_for(lambda: (p := running_locally(agent, "lost")) and container_id(p) not in ("", *lost_before), 30,
             interval=0.1, what="lost pod recreated from the cache")
    to_running = time.monotonic() - started
    assert running_locally(agent, "kept")
    assert running_container_ids(containerd.endpoint, uids["kept"]) == kept_before  # untouched
    # The recreated container read the ConfigMap and mounted the Secret from the offline object cache.
    assert "greeting=hello-from-the-api" in agent.cli("logs", "lost").stdout
    secret_file = agent.root_dir / "pods" / uids["lost"] / "volumes" / "kubernetes.io~secret" / "token" / "token"
    assert secret_file.read_text() == "secret"
    for entry in (agent.root_dir / "cache" / "objects").glob("*.ckpt"):
        assert stat.S_IMODE(entry.stat().st_mode) == 0o600, entry
    for entry in (agent.root_dir / "cache" / "pods").glob("*.ckpt"):
        assert stat.S_IMODE(entry.stat().st_mode) == 0o600, entry
    inside = log_seconds_between(agent, "edgelet starting", "pod lost_default: started container main",
                                 start_at="edgelet starting")
    print(f"\nagent start with the API down -> cached pods Running in `edgelet pods`: {to_running * 1000:.0f} ms "
          f"(process start to Running as `edgelet pods` shows it); agent's first log line -> recreated "
          f"container started: {inside * 1000:.0f} ms")

    api.come_up()
    wait_lease_renewed(api, timeout=RECONNECT)
    lost_now = running_container_ids(containerd.endpoint, uids["lost"])
    wait_for(lambda: container_id(api_get(api, "pods", "lost", "default")) in lost_now, RECONNECT,
             what="recreated container's status in the API")
    assert running_container_ids(containerd.endpoint, uids["kept"]) == kept_before


def test_changes_made_during_an_outage_are_reconciled_after_it(agent, api, containerd):
    agent.start()
    uids = start_pods(agent, api, "stays", "leaves")
    stays_before = running_container_ids(containerd.endpoint, uids["stays"])

    api.go_down()
    api.delete("pods", "leaves", "default", grace_period=1)  # graceful: waits for the node
    new_uid = api.create("pods", api_pod("arrives"))["metadata"]["uid"]
    time.sleep(2)
    assert running_container_ids(containerd.endpoint, uids["leaves"])  # the agent cannot know yet

    api.come_up()
    wait_for(lambda: api_get(api, "pods", "leaves", "default") is None, RECONNECT, what="deleted pod finally removed")
    assert runtime_objects(containerd.endpoint, uids["leaves"]) == ([], [])
    wait_for(lambda: running_in_api(api, "arrives"), RECONNECT, what="pod added offline Running")
    assert running_container_ids(containerd.endpoint, new_uid)
    assert running_container_ids(containerd.endpoint, uids["stays"]) == stays_before


def test_damaged_cache_entries_are_reported_set_aside_and_never_fatal(agent, api, containerd):
    agent.start()
    uids = start_pods(agent, api, "intact", "damaged")
    ids = {name: running_container_ids(containerd.endpoint, uid) for name, uid in uids.items()}
    agent.stop()

    cache_dir = agent.root_dir / "cache" / "pods"
    entry = cache_dir / key_to_filename(uids["damaged"])
    data = bytearray(entry.read_bytes())
    data[-2] ^= 0x20  # one flipped bit, as a power cut or a failing card leaves it
    entry.write_bytes(bytes(data))
    (cache_dir / key_to_filename("not-a-pod")).write_bytes(b"garbage left by something else")

    api.go_down()
    agent.start()
    wait_for(lambda: "damaged" in agent.log_text() and re.search(r"moved it to .*corrupt", agent.log_text()), 20,
             what="damage reported")
    wait_for(lambda: running_locally(agent, "intact"), 30, what="intact pod Running")
    assert agent.proc is not None and agent.proc.poll() is None
    assert sorted(os.listdir(cache_dir / CORRUPT_DIR)) and not entry.exists()
    assert running_container_ids(containerd.endpoint, uids["intact"]) == ids["intact"]
    # With an entry lost the cache is no complete list: the unknown pod's containers are not removed
    # as orphans while offline (two housekeeping periods pass here).
    time.sleep(4)
    assert running_container_ids(containerd.endpoint, uids["damaged"]) == ids["damaged"]

    # Once the API lists it again the agent adopts the running containers (and, knowing the pod, acts on it).
    api.come_up()
    wait_for(lambda: api.active_watches, RECONNECT, what="pod source watching again")
    api.delete("pods", "damaged", "default", grace_period=1)
    wait_for(lambda: api_get(api, "pods", "damaged", "default") is None, RECONNECT, what="damaged pod handled again")
    assert runtime_objects(containerd.endpoint, uids["damaged"]) == ([], [])
    assert running_container_ids(containerd.endpoint, uids["intact"]) == ids["intact"]
