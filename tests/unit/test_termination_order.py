"""The order a pod's containers stop in: sidecars after the app containers, in reverse spec order."""

import asyncio

import pytest

from edgelet.kuberuntime.termination import TerminationOrdering, termination_dependencies


def pod(init=(), sidecars=(), containers=("a", "b")):
    init_specs = [{"name": n, **({"restartPolicy": "Always"} if n in sidecars else {})} for n in init]
    return {"metadata": {"name": "p"}, "spec": {"initContainers": init_specs,
                                                "containers": [{"name": n} for n in containers]}}


@pytest.mark.parametrize(
    ("running", "expected"),
    [
        ({"a", "b", "s1", "s2"}, {"s2": {"a", "b"}, "s1": {"a", "b", "s2"}}),
        ({"b", "s1", "s2"}, {"s2": {"b"}, "s1": {"b", "s2"}}),  # only running containers are waited for
        ({"s1"}, {"s1": set()}),
        ({"a", "s2", "debug"}, {"s2": {"a"}}),  # ephemeral and unknown containers wait for nothing
        ({"a", "b"}, {}),
    ],
)
def test_termination_dependencies(running, expected):
    assert termination_dependencies(pod(("i1", "s1", "i2", "s2"), ("s1", "s2")), running) == expected


def test_sidecars_wait_their_turn():
    async def scenario():
        ordering = TerminationOrdering(pod(("s1", "s2"), ("s1", "s2"), containers=("a",)), {"a", "s1", "s2"})
        order = []

        async def stop(name):
            await ordering.wait_for_turn(name, 5)
            order.append(name)
            ordering.stopped(name)

        await asyncio.gather(stop("s1"), stop("s2"), stop("a"))
        return order

    assert asyncio.run(scenario()) == ["a", "s2", "s1"]


def test_wait_ends_with_the_grace_period():
    async def scenario():
        ordering = TerminationOrdering(pod(("s",), ("s",), containers=("a",)), {"a", "s"})
        waited = await ordering.wait_for_turn("s", 0.05)  # "a" never stops
        return waited

    assert asyncio.run(scenario()) > 0
