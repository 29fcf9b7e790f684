"""The cluster-side wiring the agent and the simulator's hollow nodes share: which part feeds which, and that a
hollow node gets exactly those parts with its timings. Nothing here talks to a server."""

from __future__ import annotations

import random

from edgelet.api import podutil
from edgelet.cluster.clusterapi import ClusterApi, MirrorSplitter, NodeReport
from edgelet.config import ClusterConfig
from edgelet.pod.manager import PodManager
from edgelet.simulate.node import HollowNode, Timings
from edgelet.status.manager import StatusManager


class Downstream:
    def __init__(self) -> None:
        self.pods: list[dict] = []
        self.ready = False

    def set(self, pods) -> None:
        self.pods = list(pods)

    def mark_ready(self) -> None:
        self.ready = True


def api_pod(name: str, uid: str, *, mirror: bool = False) -> dict:
    annotations = {podutil.CONFIG_MIRROR_ANNOTATION: "hash"} if mirror else {}
    return {"metadata": {"name": name, "namespace": "default", "uid": uid, "annotations": annotations}}


def cluster_api(tmp_path, downstream: Downstream, pod_manager: PodManager, **cluster) -> ClusterApi:
    report = NodeReport(facts=lambda: None, health=lambda: {}, runtime_version=lambda: "")
    return ClusterApi(object(), "node-a", ClusterConfig(**cluster), report=report, api_pods=downstream,
                      pod_manager=pod_manager, status_manager=StatusManager(str(tmp_path)))


def test_mirror_pods_go_to_the_pod_manager_and_every_other_api_pod_downstream(tmp_path):
    downstream, pods = Downstream(), PodManager()
    api = cluster_api(tmp_path, downstream, pods)
    web, mirror = api_pod("web", "u1"), api_pod("etcd-node-a", "m1", mirror=True)
    api.splitter.set([web, mirror])
    assert downstream.pods == [web]
    assert pods.mirror_pods() == [mirror] and len(pods) == 0
    assert api.splitter.latest("u1") is web and api.splitter.latest("m1") is None
    assert not api.splitter.ready
    api.splitter.mark_ready()
    assert downstream.ready and api.splitter.ready


def test_the_parts_are_wired_to_each_other_and_take_the_cluster_settings(tmp_path):
    api = cluster_api(tmp_path, Downstream(), PodManager(), lease_duration=20.0, lease_renew_interval=5.0,
                      node_status_update_frequency=4.0, node_status_report_frequency=60.0, status_resync=3.0)
    assert api.source.handle is api.splitter
    # The Lease's lapse ending makes the node status look at the server (the controller may have marked it), the
    # pod watch end its backoff (within 2 s, or 3 renew intervals when the renewal showed a crowded API server),
    # and whatever else asked (the tunnel) reconnect.
    seen: list = []
    api.node_status.reconcile_with_server = lambda: seen.append("node status")
    api.source.reconnect_soon = lambda spread: seen.append(("pod watch", spread))
    api.when_link_back(lambda: seen.append("tunnel"))
    for took, spread in [(0.02, 2.0), (0.99, 2.0), (1.0, 15.0), (9.5, 15.0)]:
        seen.clear()
        api.lease.last_renew_took = took
        api.lease._on_lapse_ended()
        assert seen == ["node status", ("pod watch", spread), "tunnel"], took
    api.node_status.node_uid = "uid-1"
    assert api.lease._node_uid_provider() == "uid-1" and api.mirrors._node_uid() == "uid-1"
    assert api.status.mirrors is api.mirrors  # the syncer runs the mirror manager's passes
    assert (api.lease.duration, api.lease.renew_interval) == (20, 5.0)
    assert (api.node_status.update_frequency, api.node_status.report_frequency, api.status.resync) == (4.0, 60.0, 3.0)


def test_a_hollow_node_runs_the_agents_wiring_with_its_timings(tmp_path):
    timings = Timings(lease_duration=8.0, lease_renew_interval=2.0, node_status_update_frequency=2.0,
                      node_status_report_frequency=10.0, status_resync=2.0)
    node = HollowNode("hollow-0000", object(), state_dir=str(tmp_path), timings=timings, rng=random.Random(0))
    assert isinstance(node.api, ClusterApi) and isinstance(node.api.splitter, MirrorSplitter)
    assert (node.lease, node.node_status, node.source, node.syncer) == \
        (node.api.lease, node.api.node_status, node.api.source, node.api.status)
    assert (node.lease.duration, node.lease.renew_interval, node.syncer.resync) == (8, 2.0, 2.0)
    assert (node.node_status.update_frequency, node.node_status.report_frequency) == (2.0, 10.0)
    node.api.splitter.set([api_pod("web", "u1")])
    assert [podutil.uid(p) for p in node.pod_config.get_pods()] == ["u1"]
