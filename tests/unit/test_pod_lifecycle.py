"""The pod lifecycle as a whole: SyncLoop, PodWorkers and PodSyncer together over a fake runtime.

Each case is a sequence of what the node hears (ADD/UPDATE/DELETE/REMOVE/RECONCILE from a source, PLEG events,
evictions, resyncs, containers exiting) and asserts the runtime calls made and where the pod ends.
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from edgelet import core
from edgelet.api.kubetime import format_time
from edgelet.config import SyncConfig
from edgelet.container.cache import PodCache
from edgelet.container.runtime import ContainerState, ContainerStatus, PodRuntimeStatus, SandboxState, SandboxStatus
from edgelet.kubelet.podsync import DEADLINE_REASON, PodSyncer
from edgelet.kubelet.syncloop import Collaborators, SyncLoop
from edgelet.kuberuntime.manager import SyncResult
from edgelet.pleg.generic import PodLifecycleEvent
from edgelet.pod.manager import PodManager
from edgelet.pod.workers import RESYNC_JITTER, PodRecords, PodState, PodWorkers
from edgelet.podconfig.config import Op, PodConfig, PodUpdate
from edgelet.util.errors import EdgeletError

RESYNC = 60.0
LONG_GRACE = 60  # a kill given this much grace or more does not end by itself in these tests


def pod(uid: str, *, policy: str = "Always", deadline: int | None = None, deleted_grace: int | None = None) -> dict:
    spec = {"containers": [{"name": "main", "image": "busybox"}], "restartPolicy": policy}
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    meta = {"uid": uid, "name": f"pod-{uid}", "namespace": "default",
            "annotations": {"kubernetes.io/config.source": "file"}}  # validated at its source
    if deleted_grace is not None:
        meta.update(deletionTimestamp="2024-01-01T00:00:00Z", deletionGracePeriodSeconds=deleted_grace)
    return {"metadata": meta, "spec": spec}


class Runtime:
    """What the fake runtime holds per pod, and every call the node made of it."""

    def __init__(self):
        self.pods: dict[str, dict] = {}  # uid -> {"sandbox": bool, "containers": {name: (state, exit code)}}
        self.calls: list[tuple] = []
        self.broken: set[str] = set()  # pods the relist fails to inspect

    def status(self, uid: str) -> PodRuntimeStatus:
        state = self.pods.get(uid)
        status = PodRuntimeStatus(uid=uid, timestamp=time.monotonic())
        if state is None:
            return status
        status.sandboxes.append(SandboxStatus(
            id=f"s-{uid}", name=f"pod-{uid}", namespace="default", uid=uid, attempt=0,
            state=SandboxState.READY if state["sandbox"] else SandboxState.NOTREADY, created_at=1, ip="10.0.0.9"))
        for name, (container_state, exit_code) in state["containers"].items():
            status.containers.append(ContainerStatus(
                id=f"c-{uid}-{name}", name=name, sandbox_id=f"s-{uid}", state=container_state, created_at=2,
                started_at=3, finished_at=4 if container_state == ContainerState.EXITED else 0, exit_code=exit_code))
        return status


class RuntimeManager:
    """The runtime manager's contract: start what is not running (restart policy permitting), kill, remove."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime

    async def sync_pod(self, pod, status, **_):
        uid = pod["metadata"]["uid"]
        state = self.runtime.pods.setdefault(uid, {"sandbox": True, "containers": {}})
        started = []
        for container in pod["spec"]["containers"]:
            name = container["name"]
            current = state["containers"].get(name)
            policy = pod["spec"]["restartPolicy"]
            if current is None or (current[0] == ContainerState.EXITED and
                                   (policy == "Always" or (policy == "OnFailure" and current[1] != 0))):
                self.runtime.calls.append(("start", uid))
                state["containers"][name] = (ContainerState.RUNNING, 0)
                started.append(name)
        return SyncResult(started=started)

    async def kill_pod(self, pod, status, grace):
        uid = pod["metadata"]["uid"]
        self.runtime.calls.append(("kill", uid, grace))
        if grace is not None and grace >= LONG_GRACE:
            await asyncio.Event().wait()  # the container ignores SIGTERM: only the grace period ends it
        state = self.runtime.pods.get(uid)
        if state is not None:
            state["sandbox"] = False
            state["containers"] = {name: (ContainerState.EXITED, 137 if s == ContainerState.RUNNING else code)
                                   for name, (s, code) in state["containers"].items()}

    async def remove_pod(self, status):
        self.runtime.calls.append(("remove", status.uid))
        self.runtime.pods.pop(status.uid, None)

    def resize_view(self, pod):
        return None  # no resizer: the status carries no resources


class Pleg:
    """The PLEG's side of the pod cache: a relist stores every pod's status, or the error inspecting it."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self.cache = PodCache()

    def relist(self) -> None:
        now = time.monotonic()
        for uid in self.runtime.pods:
            if uid in self.runtime.broken:
                self.cache.set_error(uid, "rpc error: code = DeadlineExceeded", now)
            else:
                self.cache.set(self.runtime.status(uid))
        self.cache.update_time(now)

    def get_status(self, uid):
        return self.cache.get(uid)

    async def inspect_now(self, uid):
        self.cache.set(self.runtime.status(uid))
        return self.cache.get(uid)


class Prober:
    def liveness_failed(self, uid):
        return set()

    startup_failed = liveness_failed

    def readiness(self, pod):
        return {}

    started = readiness

    def __getattr__(self, name):  # update_pod, stop_liveness_and_startup, remove_pod
        return lambda *args: None


class Statuses:
    def __init__(self):
        self.pods: dict[str, dict] = {}
        self.forced: list[str] = []  # uids whose status was announced again once their containers stopped

    def get_status(self, uid):
        return self.pods.get(uid)

    def force_update(self, uid):
        self.forced.append(uid)

    def set_pod_status(self, pod, status):
        self.pods[pod["metadata"]["uid"]] = status

    def mark_deleted(self, uid, *, at, grace):
        pass

    def remove(self, uid):
        self.pods.pop(uid, None)


class Volumes:
    async def teardown_pod(self, uid):
        pass


class Recorder:
    def __init__(self):
        self.events: list[tuple[str, str]] = []

    def event(self, ref, kind, reason, message):
        self.events.append((ref["uid"], reason))


class Node:
    """The loop, the workers and the syncer wired as the agent wires them, over the fakes."""

    def __init__(self, max_pods: int = 110, prober: Prober | None = None):
        self.clock = 1000.0
        self.runtime = Runtime()
        self.pleg = Pleg(self.runtime)
        self.pods = PodManager()
        self.statuses = Statuses()
        self.recorder = Recorder()
        self.syncer = PodSyncer(pod_manager=self.pods, pleg=self.pleg, runtime_manager=RuntimeManager(self.runtime),
                                prober=prober or Prober(), status=self.statuses, volumes=Volumes(),
                                node_ip="10.0.0.1",
                                recorder=self.recorder)
        self.records = PodRecords()
        self.workers = PodWorkers(self.records, self.syncer, resync_interval=RESYNC, clock=lambda: self.clock,
                                  rng=random.Random(7))
        collaborators = Collaborators(pod_config=PodConfig(), pod_manager=self.pods, pleg=self.pleg,
                                      records=self.records, workers=self.workers, syncer=self.syncer, prober=Prober(),
                                      probe_results=asyncio.Queue(), status=self.statuses, runtime_state=None,
                                      volumes=None, log_rotator=None, recorder=self.recorder)
        self.loop = SyncLoop(SyncConfig(), collaborators, max_pods=max_pods, on_runtime_ready=None)

    async def hear(self, step: tuple) -> None:
        what, *args = step
        if what in ("ADD", "UPDATE", "DELETE", "REMOVE", "RECONCILE"):
            self.loop._handle_config(PodUpdate(Op[what], [args[0]], "api"))
        elif what == "PLEG":
            self.loop._handle_pleg(PodLifecycleEvent(args[0], core.CONTAINER_DIED, "c"))
        elif what == "EVICT":  # as the agent's eviction and node shutdown stop a pod
            uid, grace = args
            self.workers.evict(self.pods.get(uid), "Evicted", "The node was low on resource: memory.", grace)
        elif what == "RESYNC":  # the whole resync period (and its jitter) passes
            self.clock += RESYNC * (1 + RESYNC_JITTER) + 1
            self.workers.sync_due()
        elif what == "EXIT":  # the pod's containers exit with this code
            uid, code = args
            state = self.runtime.pods[uid]
            state["containers"] = {name: (ContainerState.EXITED, code) for name in state["containers"]}
            self.pleg.relist()
            self.loop._handle_pleg(PodLifecycleEvent(uid, core.CONTAINER_DIED, "c"))
        elif what == "BREAK":  # the relist cannot inspect the pod any more
            self.runtime.broken.add(args[0])
        else:
            raise AssertionError(f"unknown step {what}")
        await self.settle()

    async def settle(self) -> None:
        """Until every worker is idle: relists keep coming, as they do every second on a node."""
        for _ in range(40):
            self.pleg.relist()
            try:
                await asyncio.wait_for(self.workers.wait_idle(), 0.02)
                return
            except TimeoutError:
                continue


def starts(node: Node, uid: str) -> int:
    return sum(1 for call in node.runtime.calls if call[:2] == ("start", uid))


STOPPED_FOR_GOOD = [
    # (steps, runtime calls, the pod's state at the end)
    pytest.param([("ADD", pod("a")), ("EVICT", "a", 0), ("UPDATE", pod("a")), ("RECONCILE", pod("a")),
                  ("PLEG", "a"), ("RESYNC",)],
                 [("start", "a"), ("kill", "a", 0)], PodState.FINISHED, id="evicted-then-update-pleg-resync"),
    pytest.param([("ADD", pod("a", policy="Never")), ("EXIT", "a", 0), ("UPDATE", pod("a", policy="Never")),
                  ("RESYNC",)],
                 [("start", "a"), ("kill", "a", 30)], PodState.FINISHED, id="terminal-by-restart-policy"),
    pytest.param([("ADD", pod("a", policy="OnFailure")), ("EXIT", "a", 1), ("RESYNC",)],
                 [("start", "a"), ("start", "a")], PodState.SYNCING, id="onfailure-restarts-after-failure"),
    pytest.param([("ADD", pod("a")), ("DELETE", pod("a", deleted_grace=60)), ("DELETE", pod("a", deleted_grace=1))],
                 [("start", "a"), ("kill", "a", 60), ("kill", "a", 1), ("remove", "a")], None,
                 id="shorter-grace-cancels-the-kill-under-way"),
    pytest.param([("ADD", pod("a")), ("DELETE", pod("a", deleted_grace=60)), ("EVICT", "a", 2)],
                 [("start", "a"), ("kill", "a", 60), ("kill", "a", 2), ("remove", "a")], None,
                 id="node-shutdown-budget-cuts-a-deletion-short"),
    pytest.param([("ADD", pod("a")), ("DELETE", pod("a", deleted_grace=60)), ("DELETE", pod("a", deleted_grace=90)),
                  ("DELETE", pod("a", deleted_grace=1))],
                 [("start", "a"), ("kill", "a", 60), ("kill", "a", 1), ("remove", "a")], None,
                 id="a-longer-grace-changes-nothing"),
    pytest.param([("ADD", pod("a")), ("REMOVE", pod("a")), ("PLEG", "a")],
                 [("start", "a"), ("kill", "a", 30), ("remove", "a")], None, id="removed"),
    pytest.param([("ADD", pod("a")), ("BREAK", "a"), ("PLEG", "a"), ("DELETE", pod("a", deleted_grace=0))],
                 [("start", "a"), ("kill", "a", 0), ("remove", "a")], None,
                 id="termination-does-not-wait-on-a-failed-inspection"),
    pytest.param([("ADD", pod("a", policy="Never")), ("EXIT", "a", 0), ("DELETE", pod("a", deleted_grace=0))],
                 [("start", "a"), ("kill", "a", 30), ("remove", "a")], None, id="finished-then-deleted-is-removed"),
]


@pytest.mark.parametrize(("steps", "calls", "state"), STOPPED_FOR_GOOD)
async def test_a_pod_stopped_for_good_never_starts_again(steps, calls, state):
    node = Node()
    for step in steps:
        await node.hear(step)
    assert node.runtime.calls == calls
    assert node.records.state("a") is state


async def test_admission_decides_every_pod_not_yet_admitted_whatever_the_op():
    node = Node(max_pods=1)
    await node.hear(("ADD", pod("a")))
    await node.hear(("ADD", pod("b")))
    assert node.statuses.pods["b"]["reason"] == "OutOfpods" and node.recorder.events == [("b", "OutOfpods")]
    # The refused pod is kept, finished: a label change, a status-only change, a resync do not start it.
    for step in [("UPDATE", pod("b")), ("RECONCILE", pod("b")), ("PLEG", "b"), ("RESYNC",)]:
        await node.hear(step)
    assert starts(node, "b") == 0 and node.records.state("b") is PodState.FINISHED
    assert node.recorder.events == [("b", "OutOfpods")]  # reported once
    # A pod first heard of through an UPDATE is admitted too.
    await node.hear(("UPDATE", pod("c")))
    assert starts(node, "c") == 0 and node.statuses.pods["c"]["phase"] == "Failed"
    # Removed, it is gone; a new uid is admitted afresh once there is room.
    await node.hear(("REMOVE", pod("a")))
    await node.hear(("REMOVE", pod("b")))
    assert "b" not in node.records and "b" not in node.pods
    await node.hear(("ADD", pod("d")))
    assert starts(node, "d") == 1


async def test_a_pod_past_its_active_deadline_fails_and_is_killed():
    node = Node()
    await node.hear(("ADD", pod("a", deadline=4)))
    assert node.statuses.pods["a"]["phase"] == "Running"
    # The sync asked to be woken when the deadline passes (4 s after startTime, not at the next resync).
    next_attempt = node.records.by_uid["a"].next_attempt
    assert next_attempt is not None and next_attempt - node.clock <= 4
    node.statuses.pods["a"]["startTime"] = format_time(time.time() - 5)
    node.clock += 5
    node.workers.sync_due()
    await node.settle()
    status = node.statuses.pods["a"]
    assert (status["phase"], status["reason"]) == ("Failed", DEADLINE_REASON)
    assert node.runtime.calls == [("start", "a"), ("kill", "a", 30)]
    assert node.recorder.events == [("a", DEADLINE_REASON)]
    # Its containers stopped: the worker says so, and the status, terminal phase included, is announced again.
    assert not node.records.could_have_running_containers("a") and node.statuses.forced == ["a"]
    await node.hear(("UPDATE", pod("a", deadline=4)))
    assert starts(node, "a") == 1 and node.records.state("a") is PodState.FINISHED


async def test_a_failed_inspection_fails_the_sync_with_a_growing_jittered_backoff():
    node = Node()
    await node.hear(("ADD", pod("a")))
    await node.hear(("ADD", pod("b")))
    for uid in "ab":
        await node.hear(("BREAK", uid))
    delays = {"a": [], "b": []}
    for _ in range(4):
        for uid in "ab":
            node.loop.sync_if_known(uid)
        await node.settle()
        for uid in "ab":
            delays[uid].append(node.records.by_uid[uid].next_attempt - node.clock)
    for uid in "ab":
        # Each wait between the doubling step (1, 2, 4, 8 s) and twice it.
        assert [step <= delay <= 2 * step for step, delay in zip([1, 2, 4, 8], delays[uid])] == [True] * 4
    assert delays["a"] != delays["b"]  # jittered: pods failing together do not retry together
    node.runtime.broken.clear()
    node.clock += 20
    node.workers.sync_due()
    await node.settle()
    assert node.records.by_uid["a"].retry is None  # synced again: the streak is over


async def test_resyncs_are_spread_across_the_period():
    node = Node()
    for i in range(20):
        await node.hear(("ADD", pod(f"p{i}")))
    due = [node.records.by_uid[f"p{i}"].next_attempt - node.clock for i in range(20)]
    assert all(RESYNC <= d <= RESYNC * (1 + RESYNC_JITTER) for d in due)
    assert len({round(d, 3) for d in due}) == 20


async def test_termination_is_retried_until_it_succeeds():
    node = Node()
    await node.hear(("ADD", pod("a")))
    inspect = node.pleg.inspect_now
    failures = [EdgeletError("runtime busy")]

    async def flaky(uid):
        if failures:
            raise failures.pop()
        return await inspect(uid)

    node.pleg.inspect_now = flaky
    await node.hear(("REMOVE", pod("a")))
    assert node.records.state("a") is PodState.TERMINATING and node.records.by_uid["a"].next_attempt is not None
    node.clock += 3
    node.workers.sync_due()
    await node.settle()
    assert node.runtime.calls == [("start", "a"), ("kill", "a", 30), ("kill", "a", 30), ("remove", "a")]
    assert "a" not in node.records


class ReadinessProber(Prober):
    def __init__(self):
        self.ready = True

    def readiness(self, pod):
        return {"main": self.ready}


async def test_a_readiness_change_of_a_pod_being_stopped_is_published():
    prober = ReadinessProber()
    node = Node(prober=prober)
    ready_pod = pod("a")
    ready_pod["spec"]["containers"][0]["readinessProbe"] = {"exec": {"command": ["true"]}}
    await node.hear(("ADD", ready_pod))
    assert {c["type"]: c["status"] for c in node.statuses.pods["a"]["conditions"]}["Ready"] == "True"
    deleted = pod("a", deleted_grace=LONG_GRACE)
    deleted["spec"] = ready_pod["spec"]
    await node.hear(("DELETE", deleted))  # its container ignores SIGTERM: the kill lasts
    assert node.records.state("a") is PodState.TERMINATING
    prober.ready = False  # its readiness probe fails while it stops
    node.loop.probe_result_changed("a")
    assert {c["type"]: c["status"] for c in node.statuses.pods["a"]["conditions"]}["Ready"] == "False"
    assert starts(node, "a") == 1


async def test_a_readiness_gate_set_by_someone_else_makes_the_pod_ready():
    node = Node()
    gated = pod("a")
    gated["spec"]["readinessGates"] = [{"conditionType": "example.com/lb"}]
    await node.hear(("ADD", gated))
    status = node.statuses.pods["a"]
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "False"
    # The load balancer's controller patches its condition: the source sends the pod back with that status.
    patched = {**gated, "status": {**status, "conditions": [
        *status["conditions"], {"type": "example.com/lb", "status": "True"}]}}
    await node.hear(("RECONCILE", patched))
    assert {c["type"]: c["status"] for c in node.statuses.pods["a"]["conditions"]}["Ready"] == "True"
    assert starts(node, "a") == 1


async def test_the_record_keeps_what_the_node_knows_of_a_pod_until_it_is_gone():
    node = Node()
    await node.hear(("ADD", pod("a")))
    record = node.records.get("a")
    assert record.acted_at > 0 and record.first_seen is None  # it ran: the start SLI was observed once
    assert [p["metadata"]["uid"] for p in node.pods.active_pods(node.records.is_active)] == ["a"]
    # Evicted: it holds no resources from that moment on, before its worker even ran.
    node.workers.evict(node.pods.get("a"), "Evicted", "The node was low on resource: memory.", 0)
    assert not node.records.is_active("a") and node.pods.active_pods(node.records.is_active) == []
    await node.settle()
    # Stopped and still listed by its source: kept, finished, its final status saying why it stopped.
    assert node.records.state("a") is PodState.FINISHED and node.statuses.pods["a"]["reason"] == "Evicted"
    assert node.records.eviction("a") == ("Evicted", "The node was low on resource: memory.")
    await node.hear(("REMOVE", pod("a")))
    # Gone: the one deletion of its record forgot everything, and a new pod of that uid starts afresh.
    assert node.records.get("a") is None and node.records.eviction("a") is None and "a" not in node.pods
    await node.hear(("ADD", pod("a")))
    assert node.records.get("a") is not record and node.statuses.pods["a"]["phase"] == "Running"
