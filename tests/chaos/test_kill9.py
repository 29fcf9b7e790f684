"""kill -9 at random points while manifests are added, removed and edited; CRI is sampled all along.

Each round starts the agent, applies a batch of at most MAX_BATCH changes at a random moment (only while no stale
container is left from the previous batch, so the batch size bounds what may legitimately be stale) and kills
the agent with SIGKILL at an independent random moment 0.1-4 s after its start: during start-up, adoption,
admission, CreateContainer/StartContainer or the stopping of old pod versions. Every few rounds the agent gets
to converge, and then the runtime must hold exactly what the manifests ask for.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import defaultdict

import pytest

from edgelet.podconfig.manifest import load_manifest_file
from tests.chaos.harness import ChaosAgent, Runtime, RuntimeView, percentile
from tests.helpers import busybox_manifest

SEED = 10_9001
MAX_BATCH = 2
MIN_PODS, MAX_PODS = 3, 8
CONVERGE_TIMEOUT_S = 40.0


class Churn:
    """The manifests the test wants, and the pod uids they stand for (computed as the agent computes them)."""

    def __init__(self, agent: ChaosAgent, rng: random.Random):
        self.agent = agent
        self.rng = rng
        self.versions: dict[str, int] = {}
        self.uids: dict[str, str] = {}
        self.lock = threading.Lock()
        self._next = 0

    def wanted(self) -> set[str]:
        with self.lock:
            return set(self.uids.values())

    def _write(self, name: str, version: int) -> None:
        path = self.agent.write_manifest(f"{name}.yaml", busybox_manifest(name, f"exec sleep 3600 # version {version}"))
        uid = load_manifest_file(os.path.join(str(self.agent.manifest_dir), path.name),
                                 self.agent.node_name).pods[0]["metadata"]["uid"]
        with self.lock:
            self.versions[name] = version
            self.uids[name] = uid

    def add(self) -> None:
        self._next += 1
        self._write(f"churn{self._next}", 1)

    def plan(self) -> list[tuple[str, str]]:
        """A batch of changes, chosen now so the sequence depends on the seed only, never on timing."""
        size = self.rng.choice((1, 1, 2))
        names = sorted(self.versions)
        batch: list[tuple[str, str]] = []
        count = len(names)
        for _ in range(size):
            choices = ["add"] * (count < MAX_PODS) + ["remove", "edit", "edit"] * (count > MIN_PODS)
            op = self.rng.choice(choices)
            candidates = [n for n in names if n not in {name for _, name in batch}]
            name = self.rng.choice(candidates) if op != "add" else ""
            batch.append((op, name))
            count += {"add": 1, "remove": -1, "edit": 0}[op]
        return batch

    def apply(self, batch: list[tuple[str, str]]) -> None:
        for op, name in batch:
            if op == "add":
                self.add()
            elif op == "edit":
                self._write(name, self.versions[name] + 1)
            else:
                os.unlink(self.agent.manifest_dir / f"{name}.yaml")
                with self.lock:
                    del self.versions[name], self.uids[name]


class Sampler(threading.Thread):
    """Samples CRI every 100 ms: the peak of running containers of unwanted pods, duplicates, the ids that ran."""

    def __init__(self, runtime: Runtime, churn: Churn):
        super().__init__(daemon=True, name="cri-sampler")
        self.runtime = runtime
        self.churn = churn
        self.stale_now = 0
        self.stale_peak = 0
        self.duplicate_keys: set[tuple[str, str]] = set()
        self.container_ids: dict[str, set[str]] = defaultdict(set)
        self.max_attempt: dict[str, int] = defaultdict(int)
        # Containers that never ran and that the runtime still listed beside a later attempt: containerd 2.x keeps
        # a container whose start a SIGKILL cancelled while it made the task, and the agent then starts the next
        # attempt (as the kubelet would). Those attempts are the runtime's doing, not needless restarts.
        self.kept_never_ran: dict[str, set[str]] = defaultdict(set)
        self._halt = threading.Event()

    def observe(self, view: RuntimeView) -> None:
        wanted = self.churn.wanted()
        stale = 0
        for uid, containers in view.containers.items():
            running_by_name: dict[str, int] = defaultdict(int)
            for container in containers:
                self.max_attempt[uid] = max(self.max_attempt[uid], container.attempt)
                if container.state == 1:  # CONTAINER_RUNNING
                    # Only containers that ran count: a StartContainer cut short by the kill leaves one that
                    # never did, and replacing it restarts nothing (its replacement keeps its attempt).
                    self.container_ids[uid].add(container.id)
                    running_by_name[container.name] += 1
                    stale += uid not in wanted
            self.duplicate_keys.update((uid, name) for name, count in running_by_name.items() if count > 1)
            latest = max((c.attempt for c in containers), default=0)  # exited (2) before a later attempt:
            self.kept_never_ran[uid].update(c.id for c in containers if c.state == 2 and c.attempt < latest)
        self.stale_now = stale
        self.stale_peak = max(self.stale_peak, stale)

    def run(self) -> None:
        while not self._halt.wait(0.1):
            if (view := self.runtime.try_view()) is not None:
                self.observe(view)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def converge(agent: ChaosAgent, runtime: Runtime, churn: Churn, sampler: Sampler) -> tuple[list[str], int, float]:
    """Lets the agent run until the runtime holds exactly the wanted pods; (uids of lost pods, orphans, seconds
    taken)."""
    started = time.monotonic()
    agent.start()
    wanted = churn.wanted()
    view = runtime.view()
    while time.monotonic() - started < CONVERGE_TIMEOUT_S:
        view = runtime.view()
        sampler.observe(view)
        exact = all(len(view.running(uid)) == 1 and len(view.ready_sandboxes(uid)) == 1 for uid in wanted)
        if exact and not view.live_uids() - wanted:
            break
        time.sleep(0.2)
    took = time.monotonic() - started
    agent.kill9()
    lost = sorted(uid for uid in wanted if not view.running(uid))
    orphans = sum(len(view.ready_sandboxes(uid)) + sum(1 for c in view.containers.get(uid, ()) if c.state == 1)
                  for uid in view.live_uids() - wanted)
    return lost, orphans, took


def _troubles(agent: ChaosAgent, last: int = 40) -> str:
    """The agent's last warnings and errors across all rounds, for a failure to explain itself."""
    lines = [line for line in agent.log_text().splitlines() if " WARNING " in line or " ERROR " in line]
    return "the agent's last warnings and errors:\n" + "\n".join(lines[-last:])


@pytest.mark.timeout(1500)
def test_kill9_during_churn(tmp_path, containerd, runtime, scale, figures):
    rng = random.Random(SEED)
    agent = ChaosAgent(tmp_path, containerd.endpoint, figures)
    churn = Churn(agent, rng)
    for _ in range(5):
        churn.add()
    sampler = Sampler(runtime, churn)
    sampler.start()
    orphans = skipped_batches = 0
    lost_uids: list[str] = []
    converge_times: list[float] = []
    try:
        for round_number in range(1, scale.kill9_rounds + 1):
            started = time.monotonic()
            agent.start()
            kill_at = started + rng.uniform(0.1, 4.0)
            apply_at = started + rng.uniform(0.0, kill_at - started)
            batch = churn.plan()
            applied = False
            while (now := time.monotonic()) < kill_at:
                if not applied and now >= apply_at and sampler.stale_now == 0:
                    churn.apply(batch)
                    applied = True
                time.sleep(0.02)
            agent.kill9()
            skipped_batches += not applied
            if round_number % scale.kill9_check_every == 0 or round_number == scale.kill9_rounds:
                round_lost, round_orphans, took = converge(agent, runtime, churn, sampler)
                lost_uids += round_lost
                orphans += round_orphans
                converge_times.append(took)
    finally:
        agent.close()
        sampler.stop()

    # A pod uid stands for one unchanged manifest: its container never exits, so a second one is needless.
    lost = len(lost_uids)
    kept = {uid: ids - sampler.container_ids[uid] for uid, ids in sampler.kept_never_ran.items()}
    extra = {uid: max(len(sampler.container_ids[uid]), attempt + 1 - len(kept.get(uid, ()))) - 1
             for uid, attempt in sampler.max_attempt.items()}
    needless = sum(extra.values())
    duplicates = len(sampler.duplicate_keys)
    figures.add("kill9_rounds", scale.kill9_rounds)
    figures.add("duplicates", duplicates)
    figures.add("lost", lost)
    figures.add("orphans", orphans)
    figures.add("needless_restarts", needless)
    figures.peak("stale_peak", sampler.stale_peak)
    figures.note(f"kill9: seed={SEED} rounds={scale.kill9_rounds} batches_held_back={skipped_batches} "
                 f"duplicates={duplicates} lost={lost} orphans={orphans} needless_restarts={needless} "
                 f"stale_peak={sampler.stale_peak} (batch <= {MAX_BATCH}) "
                 f"kept_by_runtime={sum(map(len, kept.values()))} "
                 f"converge_p95_s={percentile(converge_times, 0.95):.1f}")
    assert duplicates == 0, f"two running containers for one pod container: {sorted(sampler.duplicate_keys)}"
    assert lost == 0, f"wanted pods not running after convergence: {lost_uids}; {_troubles(agent)}"
    assert orphans == 0, "sandboxes or containers of no wanted pod still running after convergence"
    again = {uid: sorted(sampler.container_ids[uid]) for uid, count in extra.items() if count > 0}
    assert needless == 0, f"containers of unchanged pods were created again (pod uid: container ids): {again}"
    assert sampler.stale_peak <= MAX_BATCH, f"stale containers piled up to {sampler.stale_peak}"
