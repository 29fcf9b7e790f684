"""StartLog: creates and starts under way until the runtime shows their end, refused creates held back for a while."""

import random

from edgelet.container.runtime import ContainerState, ContainerStatus, PodRuntimeStatus
from edgelet.kuberuntime.startlog import CREATE_RETRY_SECONDS, IN_FLIGHT_PATIENCE_SECONDS, StartLog


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def status(*containers):
    return PodRuntimeStatus(uid="uid-1", containers=list(containers))


def container(id, state):
    return ContainerStatus(id=id, name="app", sandbox_id="sb1", state=state, created_at=0)


def test_a_start_under_way_is_pending_until_the_container_leaves_the_created_state():
    clock = Clock()
    log = StartLog(clock=clock)
    log.under_way("uid-1", "app", 0, "c1")
    assert [op.container_id for op in log.pending(status(container("c1", ContainerState.CREATED)))] == ["c1"]
    assert log.pending(status(container("c1", ContainerState.RUNNING))) == []
    assert log.pending(status(container("c1", ContainerState.CREATED))) == []  # forgotten once it ended


def test_a_create_that_shows_nothing_is_tried_again_after_the_patience():
    clock = Clock()
    log = StartLog(clock=clock)
    log.under_way("uid-1", "app", 0)
    clock.now += IN_FLIGHT_PATIENCE_SECONDS - 0.1
    assert [op.name for op in log.pending(status())] == ["app"]
    clock.now += 0.1
    assert log.pending(status()) == []


def test_a_refused_create_is_held_back_for_the_kubelets_back_off_then_let_go():
    clock = Clock()
    log = StartLog(clock=clock, rng=random.Random(7))
    delay = log.refused("uid-1", "app", "not a shared or slave mount")
    assert CREATE_RETRY_SECONDS <= delay <= 1.5 * CREATE_RETRY_SECONDS
    clock.now += delay - 1
    assert log.held_back("uid-1", "app") == (1.0, "not a shared or slave mount")
    assert log.held_back("uid-1", "other") is None
    clock.now += 1
    assert log.held_back("uid-1", "app") is None


def test_a_create_that_succeeds_and_a_pod_that_goes_are_forgotten():
    log = StartLog(clock=Clock())
    log.refused("uid-1", "app", "no")
    log.created("uid-1", "app")
    assert log.held_back("uid-1", "app") is None
    log.refused("uid-1", "app", "no")
    log.under_way("uid-1", "side", 0)
    log.forget("uid-1")
    assert log.held_back("uid-1", "app") is None and log.pending(status()) == []


def test_a_new_sandbox_drops_what_was_under_way_in_the_old_one():
    log = StartLog(clock=Clock())
    log.under_way("uid-1", "app", 0, "c1")
    log.new_sandbox("uid-1")
    assert log.pending(status(container("c1", ContainerState.CREATED))) == []
