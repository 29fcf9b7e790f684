"""Backoff: kubelet-style per-key doubling with a fake clock, and full-jitter reconnect schedules."""

from __future__ import annotations

import random

import pytest

from edgelet.util.backoff import Backoff, JitteredBackoff


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_delays_double_up_to_the_maximum(clock):
    backoff = Backoff(10, 300, clock=clock)
    delays = []
    for _ in range(8):
        delays.append(backoff.next("pod/app"))
        clock.now += 1
    assert delays == [10, 20, 40, 80, 160, 300, 300, 300]


def test_keys_are_independent(clock):
    backoff = Backoff(10, 300, clock=clock)
    backoff.next("a")
    backoff.next("a")
    assert backoff.next("b") == 10
    assert (backoff.delay("a"), backoff.delay("b"), backoff.delay("c")) == (20, 10, 0)


@pytest.mark.parametrize(
    ("elapsed", "in_backoff", "remaining"),
    [(0, True, 10), (4, True, 6), (9.9, True, 0.1), (10, False, 0), (11, False, 0), (700, False, 0)],
)
def test_in_backoff_until_the_delay_has_passed(clock, elapsed, in_backoff, remaining):
    backoff = Backoff(10, 300, clock=clock)
    backoff.next("k")
    clock.now += elapsed
    assert backoff.in_backoff("k") is in_backoff
    assert backoff.remaining("k") == pytest.approx(remaining)


def test_in_backoff_since_an_event_time(clock):
    backoff = Backoff(10, 300, clock=clock)
    backoff.next("k")
    clock.now += 60  # a slow sync: the container died 3 s after the backoff started
    assert backoff.in_backoff("k", since=clock.now - 57)
    assert not backoff.in_backoff("k")


def test_unknown_key_is_not_in_backoff(clock):
    backoff = Backoff(10, 300, clock=clock)
    assert not backoff.in_backoff("nope") and backoff.remaining("nope") == 0


def test_starts_over_after_twice_the_maximum_without_failures(clock):
    backoff = Backoff(10, 300, clock=clock)
    for _ in range(4):
        backoff.next("k")
    assert backoff.delay("k") == 80
    clock.now += 600  # exactly 2 x max: still remembered
    assert backoff.next("k") == 160
    clock.now += 600.5  # longer than 2 x max
    assert backoff.next("k") == 10


def test_reset_forgets_a_key(clock):
    backoff = Backoff(10, 300, clock=clock)
    backoff.next("k")
    backoff.next("k")
    backoff.reset("k")
    backoff.reset("never-seen")
    assert not backoff.in_backoff("k")
    assert backoff.next("k") == 10


def test_gc_drops_only_expired_keys(clock):
    backoff = Backoff(10, 300, clock=clock)
    backoff.next("old")
    clock.now += 500
    backoff.next("recent")
    clock.now += 200
    backoff.gc()
    assert len(backoff) == 1 and backoff.delay("recent") == 10 and backoff.delay("old") == 0


@pytest.mark.parametrize(("initial", "maximum"), [(0, 10), (-1, 10), (10, 5)])
def test_invalid_bounds(initial, maximum):
    with pytest.raises(ValueError):
        Backoff(initial, maximum)
    with pytest.raises(ValueError):
        JitteredBackoff(initial, maximum)


def jittered_delays(count: int, rng: random.Random, initial: float = 0.8, maximum: float = 30.0) -> list[float]:
    """The delays of one failure streak `count` failures long."""
    backoff = JitteredBackoff(initial, maximum, rng=rng)
    return [backoff.next() for _ in range(count)]


def test_jittered_delays_stay_under_the_growing_ceiling():
    delays = jittered_delays(200, random.Random(7))
    ceilings = [min(30, 0.8 * 2**n) for n in range(200)]
    assert all(0 <= delay <= ceiling for delay, ceiling in zip(delays, ceilings, strict=True))
    assert max(delays[10:]) > 20  # the ceiling does reach the maximum


def test_jittered_delays_are_spread_not_fixed():
    """Full jitter: once capped, delays cover the whole [0, max] range instead of clustering at max."""
    rng = random.Random(1)
    capped = jittered_delays(1000, rng)[10:]
    assert min(capped) < 3 and max(capped) > 27
    assert 12 < sum(capped) / len(capped) < 18


def test_jittered_delays_are_reproducible_with_a_seeded_rng():
    assert jittered_delays(20, random.Random(3)) == jittered_delays(20, random.Random(3))


def test_reflector_delays_wait_at_least_each_step_and_at_most_twice_it():
    """client-go's reflector: wait.Jitter(d, 1.0), d doubling from 0.8 s to 30 s."""
    backoff = JitteredBackoff(0.8, 30.0, rng=random.Random(5), spread="reflector")
    delays = [backoff.next() for _ in range(1000)]
    steps = [min(30, 0.8 * 2**n) for n in range(1000)]
    assert all(step <= delay <= 2 * step for delay, step in zip(delays, steps, strict=True))
    capped = delays[10:]
    assert min(capped) < 33 and max(capped) > 57
    assert 42 < sum(capped) / len(capped) < 48  # a third of full jitter's request rate at the cap


def test_an_unknown_spread_is_refused():
    with pytest.raises(ValueError, match="spread"):
        JitteredBackoff(1.0, 30.0, spread="half")


def test_reset_starts_the_streak_over():
    backoff = JitteredBackoff(1.0, 30.0, rng=random.Random(2))
    for _ in range(6):
        backoff.next()
    assert backoff.ceiling == 30.0
    backoff.reset()
    backoff.next()
    assert backoff.ceiling == 1.0
