"""The retry helper: its delay ceilings (the 401 rule among them), what it logs once and when it starts over."""

from __future__ import annotations

import logging
import random

import pytest

from edgelet.kubeapi.errors import Forbidden, ServerError, Unauthorized
from edgelet.util.backoff import JitteredBackoff
from edgelet.util.retry import Retrier

UNAVAILABLE = ServerError(503, "ServiceUnavailable", "etcd is down", method="GET", path="/api/v1/pods")
REFUSED = Unauthorized(401, "Unauthorized", "Unauthorized", method="GET", path="/api/v1/pods")
FORBIDDEN = Forbidden(403, "Forbidden", "no path found to object", method="GET", path="/api/v1/secrets/x")


class Ceiling(random.Random):
    """Draws the top of every range, so a delay shows the ceiling it was drawn under."""

    def uniform(self, a: float, b: float) -> float:
        return b


@pytest.mark.parametrize(("initial", "maximum", "errors", "ceilings"), [
    (0.8, 30, [UNAVAILABLE] * 7, [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30]),
    (0.8, 30, [REFUSED] * 4, [8, 16, 30, 30]),
    # A 401 mid-streak lifts the ceiling; doubling goes on from there, also for other errors.
    (0.8, 30, [UNAVAILABLE, UNAVAILABLE, REFUSED, UNAVAILABLE], [0.8, 1.6, 8, 16]),
    # Already above 10 x initial: a 401 changes nothing.
    (0.5, 30, [UNAVAILABLE] * 5 + [REFUSED], [0.5, 1, 2, 4, 8, 16]),
    (5, 30, [REFUSED, REFUSED], [30, 30]),  # never above the maximum
    (0.8, 30, [FORBIDDEN] * 3, [0.8, 1.6, 3.2]),  # 403 is no credential problem
    (0.2, 7, ["watch closed", UNAVAILABLE], [0.2, 0.4]),
    (0.8, 0.5, [UNAVAILABLE] * 3, [0.8, 0.8, 0.8]),  # a cap below initial (a short period) means initial
])
def test_ceilings(initial, maximum, errors, ceilings):
    retry = Retrier("test", initial=initial, maximum=maximum, rng=Ceiling())
    assert [retry.failed(error) for error in errors] == pytest.approx(ceilings)


def test_without_refusals_the_delays_are_the_full_jitter_schedule():
    retry = Retrier("test", rng=random.Random(5))
    schedule = JitteredBackoff(0.8, 30.0, rng=random.Random(5))
    expected = [schedule.next() for _ in range(12)]
    assert [retry.failed(UNAVAILABLE) for _ in range(12)] == expected


def test_a_success_starts_the_schedule_over():
    retry = Retrier("test", rng=Ceiling())
    for _ in range(5):
        retry.failed(REFUSED)
    assert retry.succeeded() is True
    assert retry.failed(UNAVAILABLE) == 0.8


def test_succeeded_without_failures_is_quiet(caplog):
    caplog.set_level(logging.DEBUG)
    retry = Retrier("test")
    assert retry.succeeded() is False and retry.failures == 0
    assert caplog.records == []


def records(caplog):
    return [(r.levelname, r.getMessage()) for r in caplog.records]


def test_a_streak_is_logged_once_and_its_end_once(caplog):
    caplog.set_level(logging.DEBUG)
    retry = Retrier("pod status sync", rng=Ceiling())
    retry.failed(UNAVAILABLE, "3 updates wait for the API server")
    retry.failed(UNAVAILABLE, "3 updates wait for the API server")
    retry.failed(UNAVAILABLE)
    assert retry.failures == 3
    retry.succeeded()
    assert records(caplog) == [
        ("WARNING", "pod status sync: GET /api/v1/pods: 503 ServiceUnavailable: etcd is down; "
                    "3 updates wait for the API server, retrying in 0.8s"),
        ("DEBUG", "pod status sync: still failing (GET /api/v1/pods: 503 ServiceUnavailable: etcd is down); "
                  "next try in 1.6s"),
        ("DEBUG", "pod status sync: still failing (GET /api/v1/pods: 503 ServiceUnavailable: etcd is down); "
                  "next try in 3.2s"),
        ("INFO", "pod status sync: working again after 3 failed attempts"),
    ]
    assert retry.failures == 0


def test_refused_credentials_are_an_error_once_per_streak_even_after_other_failures(caplog):
    caplog.set_level(logging.DEBUG)
    retry = Retrier("API pod source", rng=Ceiling())
    for error in (UNAVAILABLE, REFUSED, REFUSED):
        retry.failed(error)
    retry.succeeded()
    retry.failed(REFUSED)
    levels = [level for level, _ in records(caplog)]
    assert levels == ["WARNING", "ERROR", "DEBUG", "INFO", "ERROR"]
    error = [message for level, message in records(caplog) if level == "ERROR"][0]
    assert error.startswith("API pod source: the API server refused edgelet's credentials (401 Unauthorized: ")
    assert error.endswith("retrying in 8.0s")


def test_the_first_line_takes_the_loops_logger_and_level(caplog):
    caplog.set_level(logging.DEBUG)
    logger = logging.getLogger("edgelet.events.apisink")
    retry = Retrier("events", logger=logger, level=logging.INFO, rng=Ceiling())
    retry.failed(UNAVAILABLE)
    assert [(r.name, r.levelname) for r in caplog.records] == [("edgelet.events.apisink", "INFO")]


def test_a_failure_may_say_its_streak_at_another_level(caplog):
    caplog.set_level(logging.DEBUG)
    retry = Retrier("logind", rng=Ceiling())
    retry.failed(UNAVAILABLE, level=logging.INFO)  # say, expected while the machine powers off
    retry.failed(UNAVAILABLE, level=logging.INFO)
    retry.succeeded()
    retry.failed(UNAVAILABLE)
    assert [level for level, _ in records(caplog)] == ["INFO", "DEBUG", "INFO", "WARNING"]


@pytest.mark.parametrize(("initial", "maximum"), [(0, 10), (-1, 10)])
def test_invalid_initial(initial, maximum):
    with pytest.raises(ValueError):
        Retrier("test", initial=initial, maximum=maximum)


def test_a_diagnosis_gets_one_line_of_its_own_in_a_streak(caplog):
    caplog.set_level(logging.DEBUG)
    retry = Retrier("konnectivity tunnel to a:8091", rng=Ceiling())
    kinds = [None, "client certificate", None, "client certificate", "server certificate"]
    for number, kind in enumerate(kinds):
        retry.failed(f"failure {number}", kind=kind)
    retry.succeeded()
    retry.failed("failure 5", kind="client certificate")  # a new streak: said again
    assert [(level, message.split(": ", 1)[1].split(";")[0]) for level, message in records(caplog)] == [
        ("WARNING", "failure 0"), ("WARNING", "failure 1"), ("DEBUG", "still failing (failure 2)"),
        ("DEBUG", "still failing (failure 3)"), ("WARNING", "failure 4"),
        ("INFO", "working again after 5 failed attempts"), ("WARNING", "failure 5")]
