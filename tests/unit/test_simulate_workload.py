"""The hollow node's workload loop: pods created in order, an API outage retried with the one retry helper
(its first failure and its recovery said once each), a refusal that no retry can fix ends the loop."""

from __future__ import annotations

import asyncio
import logging
import random

from edgelet.kubeapi.errors import AlreadyExists, ApiError, Forbidden
from edgelet.simulate.node import HollowNode, Timings


class NoWait(random.Random):
    """Every jittered delay is 0, so the test retries at once."""

    def uniform(self, a: float, b: float) -> float:
        return a


class PodsApi:
    """Answers pod creates from a script of errors (None: created)."""

    def __init__(self, answers: list[BaseException | None]):
        self.answers = answers
        self.created: list[str] = []

    async def create(self, path: str, body: dict) -> dict:
        answer = self.answers.pop(0) if self.answers else None
        if answer is not None:
            raise answer
        self.created.append(body["metadata"]["name"])
        return body


def run_workload(tmp_path, answers: list[BaseException | None], count: int) -> PodsApi:
    api = PodsApi(answers)
    node = HollowNode("hollow-0000", api, state_dir=str(tmp_path), timings=Timings(), rng=NoWait())

    async def scenario():
        node.node_status.registered.set()
        await asyncio.wait_for(node.create_workload(count, "default"), 10)

    asyncio.run(scenario())
    return api


def unavailable() -> ApiError:
    return ApiError(503, "ServiceUnavailable", "the server is shutting down")


def test_an_outage_is_retried_and_said_once_with_its_recovery(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="edgelet")
    api = run_workload(tmp_path, [None, unavailable(), unavailable(), unavailable(), None,
                                  AlreadyExists(409, "AlreadyExists", "exists")], 4)
    assert api.created == ["hollow-0000-0", "hollow-0000-1", "hollow-0000-3"]  # pod 2 was there already
    said = [(r.levelno, r.getMessage()) for r in caplog.records
            if r.levelno >= logging.INFO and "workload" in r.getMessage()]
    assert [level for level, _ in said] == [logging.WARNING, logging.INFO]
    assert "503 ServiceUnavailable" in said[0][1] and "pod 1 of 4 not created" in said[0][1]
    assert "after 3 failed attempts" in said[1][1]


def test_a_refusal_ends_the_loop_with_one_error(tmp_path, caplog):
    api = run_workload(tmp_path, [None, Forbidden(403, "Forbidden", "no")], 5)
    assert api.created == ["hollow-0000-0"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "refuses its workload pods" in errors[0]
