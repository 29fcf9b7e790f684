"""The API pod source against the API server double: list, watch, re-list, outages and backoff."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import statistics
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from edgelet.kubeapi import ApiClient
from edgelet.podconfig.apiserver import ApiServerSource
from edgelet.podconfig.config import Op, PodConfig
from tests.helpers import eventually
from tests.kubeapi_double import ApiServerDouble

NODE = "edge-1"
TOKEN = "token-that-must-never-be-logged"


def pod(name: str, node: str = NODE, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}, **extra}


@pytest.fixture
def api() -> Iterator[ApiServerDouble]:
    with ApiServerDouble(token=TOKEN, bookmark_interval=0.05) as double:
        yield double


@pytest.fixture
async def client(api: ApiServerDouble) -> AsyncIterator[ApiClient]:
    async with ApiClient(api.url, token=TOKEN, timeout=2.0) as c:
        yield c


class Running:
    """A source running as a task, its merger, and what the test needs to look at."""

    def __init__(self, source: ApiServerSource, config: PodConfig):
        self.source = source
        self.config = config
        self.task = asyncio.create_task(source.run())

    def names(self) -> list[str]:
        return sorted(p["metadata"]["name"] for p in self.config.get_pods())

    def ops(self) -> list[tuple[Op, list[str]]]:
        seen = []
        while not self.config.updates.empty():
            update = self.config.updates.get_nowait()
            seen.append((update.op, sorted(p["metadata"]["name"] for p in update.pods)))
        return seen

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@pytest.fixture
async def start(client: ApiClient) -> AsyncIterator[Any]:
    running: list[Running] = []

    def make(*, seed: int = 0, **options: Any) -> Running:
        config = PodConfig()
        options = {"backoff_initial": 0.01, "backoff_max": 0.05, "debounce": 0.01, **options}
        source = ApiServerSource(client, NODE, config.source("api"), rng=random.Random(seed), **options)
        running.append(Running(source, config))
        return running[-1]

    yield make
    for r in running:
        await r.stop()


@contextlib.asynccontextmanager
async def running_source(client: ApiClient, config: PodConfig, **options: Any) -> AsyncIterator[ApiServerSource]:
    """An ApiServerSource for NODE feeding `config`, running for the block and cancelled after it."""
    source = ApiServerSource(client, NODE, config.source("api"), **options)
    task = asyncio.create_task(source.run())
    try:
        yield source
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def list_requests(api: ApiServerDouble) -> int:
    return sum(1 for r in api.requests if r.path == "/api/v1/pods" and r.method == "GET" and "watch" not in r.query)


def watch_requests(api: ApiServerDouble) -> list[dict[str, str]]:
    return [r.query for r in api.requests if r.path == "/api/v1/pods" and r.query.get("watch") == "true"]


async def test_initial_list_delivers_this_nodes_pods_and_marks_ready(api: ApiServerDouble, start: Any) -> None:
    api.create("pods", pod("a"))
    api.create("pods", pod("b"))
    api.create("pods", pod("elsewhere", node="edge-2"))
    listed_at = api.resource_version
    r = start()
    await eventually(lambda: r.config.all_sources_ready())
    assert r.names() == ["a", "b"]
    assert r.source.connected and r.source.last_sync > 0
    await eventually(lambda: watch_requests(api))
    query = watch_requests(api)[0]
    assert query["fieldSelector"] == f"spec.nodeName={NODE}"
    assert query["allowWatchBookmarks"] == "true"
    assert 300 <= int(query["timeoutSeconds"]) <= 600
    assert query["resourceVersion"] == str(listed_at)  # the watch starts where the list ended


async def test_watch_adds_modifies_and_deletes(api: ApiServerDouble, start: Any) -> None:
    r = start()
    await eventually(lambda: r.config.all_sources_ready() and api.active_watches == 1)
    api.create("pods", pod("a"))
    await eventually(lambda: r.names() == ["a"])
    api.patch("pods", "a", {"metadata": {"labels": {"version": "2"}}})
    await eventually(lambda: (r.config.get_pods()[0]["metadata"].get("labels") or {}).get("version") == "2")
    api.delete("pods", "a")  # graceful: deletionTimestamp first
    await eventually(lambda: bool(r.config.get_pods()[0]["metadata"].get("deletionTimestamp")))
    api.delete("pods", "a", grace_period=0)
    await eventually(lambda: r.names() == [])
    assert [op for op, _ in r.ops()] == [Op.ADD, Op.UPDATE, Op.DELETE, Op.REMOVE]


async def test_a_burst_of_events_becomes_few_sets(api: ApiServerDouble, start: Any) -> None:
    r = start(debounce=0.2)
    await eventually(lambda: r.config.all_sources_ready() and api.active_watches == 1)
    r.ops()
    for i in range(20):
        api.create("pods", pod(f"p{i:02}"))
    await eventually(lambda: len(r.names()) == 20)
    adds = [names for op, names in r.ops() if op is Op.ADD]
    assert sum(len(n) for n in adds) == 20 and len(adds) < 20


async def test_lists_ask_for_the_watch_cache_as_the_kubelets_reflector_does(api: ApiServerDouble, start: Any) -> None:
    r = start()
    await eventually(lambda: r.config.all_sources_ready() and api.active_watches == 1)
    api.create("pods", pod("a"))
    await eventually(lambda: r.names() == ["a"])
    seen = r.source.resource_version
    api.expire_watches()
    await eventually(lambda: list_requests(api) == 2)
    lists = [q.query for q in api.requests if q.path == "/api/v1/pods" and "watch" not in q.query]
    assert [q.get("resourceVersion") for q in lists] == ["0", seen]  # any version first, then not older than seen


@pytest.mark.parametrize("break_watch", ["expire", "compact_and_drop", "garbage", "truncate"])
async def test_broken_or_expired_watch_relists_without_losing_pods(api: ApiServerDouble, start: Any,
                                                                   break_watch: str) -> None:
    api.create("pods", pod("kept"))
    api.create("pods", pod("removed-meanwhile"))
    r = start()
    await eventually(lambda: r.names() == ["kept", "removed-meanwhile"] and api.active_watches == 1)
    r.ops()
    if break_watch == "expire":
        api.expire_watches()
    elif break_watch == "compact_and_drop":
        api.go_down()  # the watch dies, changes happen that it does not see ...
        api.delete("pods", "removed-meanwhile", grace_period=0)
        api.create("pods", pod("added-meanwhile"))
        api.compact()  # ... and the history it would resume from is gone
        api.come_up()
    elif break_watch == "garbage":
        api.inject_watch_garbage()
    else:
        api.truncate_watches()
    await eventually(lambda: list_requests(api) == 2 and api.active_watches == 1)
    if break_watch != "compact_and_drop":
        api.delete("pods", "removed-meanwhile", grace_period=0)
        api.create("pods", pod("added-meanwhile"))
    await eventually(lambda: r.names() == ["added-meanwhile", "kept"])
    ops = r.ops()
    assert (Op.REMOVE, ["removed-meanwhile"]) in ops
    assert all("kept" not in names for _, names in ops), ops  # never dropped and re-added


async def test_a_stream_break_resumes_the_watch_from_the_last_resource_version(api: ApiServerDouble,
                                                                               start: Any) -> None:
    api.create("pods", pod("a"))
    r = start()
    await eventually(lambda: r.names() == ["a"] and api.active_watches == 1)
    api.go_down()
    await eventually(lambda: not r.source.connected)
    api.create("pods", pod("b"))  # happens during the outage
    await asyncio.sleep(0.1)
    assert r.names() == ["a"]  # known pods are kept while the API is away
    api.come_up()
    await eventually(lambda: r.names() == ["a", "b"])
    assert list_requests(api) == 1  # resumed, not re-listed
    last_watch = watch_requests(api)[-1]
    assert int(last_watch["resourceVersion"]) < api.resource_version
    assert r.source.connected


async def test_bookmarks_and_server_timeouts_keep_the_resource_version_fresh(api: ApiServerDouble, start: Any) -> None:
    r = start(watch_timeout=(1, 1))
    await eventually(lambda: r.config.all_sources_ready())
    api.create("pods", pod("other-node", node="edge-2"))  # moves the global resourceVersion only
    await eventually(lambda: r.source.resource_version == str(api.resource_version))
    await eventually(lambda: len(watch_requests(api)) >= 2, timeout=5)  # the server ended the first watch
    assert list_requests(api) == 1


async def test_refused_credentials_are_logged_once_and_recover(api: ApiServerDouble, start: Any,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    api.create("pods", pod("a"))
    api.fail_next(4, 401, path_prefix="/api/v1/pods")
    caplog.set_level(logging.DEBUG)
    r = start(backoff_initial=0.001)
    await eventually(lambda: r.names() == ["a"])
    refusals = [rec for rec in caplog.records if rec.levelno >= logging.ERROR and "credentials" in rec.getMessage()]
    assert len(refusals) == 1
    assert TOKEN not in caplog.text
    assert r.source.connected


async def test_wrong_token_keeps_retrying_slowly_without_leaking_it(api: ApiServerDouble,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    delays: list[float] = []

    async def no_wait(delay: float) -> None:
        delays.append(delay)
        await asyncio.sleep(0)

    async with ApiClient(api.url, token="wrong-secret-value") as wrong:
        config = PodConfig()
        async with running_source(wrong, config, rng=random.Random(1), sleep=no_wait) as source:
            await eventually(lambda: len(delays) >= 5)
    assert not config.all_sources_ready() and not source.connected
    assert "wrong-secret-value" not in caplog.text
    assert sum(1 for rec in caplog.records if rec.levelno >= logging.ERROR) == 1
    assert max(delays) <= 60 and min(delays) >= 8  # the auth schedule starts at 10 x 0.8 s (AUTH_SLOWDOWN)


async def test_malformed_pods_are_skipped_with_their_name(api: ApiServerDouble, start: Any,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    api.create("pods", pod("good", spec_extra="ignored"))
    api.create("pods", {"metadata": {"name": "no-containers"}, "spec": {"nodeName": NODE}})
    api.create("pods", {"metadata": {"name": "bad-container"}, "spec": {"nodeName": NODE, "containers": "nginx"}})
    r = start()
    await eventually(lambda: r.config.all_sources_ready() and api.active_watches == 1)
    assert r.names() == ["good"]
    assert "default/no-containers" in caplog.text and "default/bad-container" in caplog.text
    # A bad update keeps the last good version running.
    api.patch("pods", "good", {"spec": {"containers": [{"$patch": "replace"}]}})
    api.create("pods", pod("later"))
    await eventually(lambda: r.names() == ["good", "later"])
    assert not r.task.done()


async def test_reconnect_delays_are_the_reflectors(api: ApiServerDouble, client: ApiClient) -> None:
    """Each seed's schedule waits between its doubling step and twice it, the step capped at 30 s (client-go's
    reflector); across seeds the first delay spreads over the whole [initial, 2 x initial] range."""
    initial, cap, attempts = 0.8, 30.0, 8
    api.go_down()
    schedules = []
    for seed in range(40):
        delays: list[float] = []

        async def record(delay: float, delays: list[float] = delays) -> None:
            delays.append(delay)
            await asyncio.sleep(0)

        async with running_source(client, PodConfig(), rng=random.Random(seed), sleep=record):
            await eventually(lambda delays=delays: len(delays) >= attempts)
        schedules.append(delays[:attempts])
    for delays in schedules:
        for n, delay in enumerate(delays):
            step = min(cap, initial * 2**n)
            assert step <= delay <= 2 * step
    firsts = [d[0] for d in schedules]
    assert min(firsts) < initial * 1.25 and max(firsts) > initial * 1.75
    assert len(set(firsts)) == len(firsts)
    assert statistics.pstdev(firsts) > initial * 0.15
    assert max(d[-1] for d in schedules) > initial * 2 ** 5  # the step really grows


async def test_the_waits_are_real(api: ApiServerDouble, client: ApiClient) -> None:
    """The server sees the retries no sooner than the chosen delays (a lower bound, never a deadline)."""
    api.fail_next(5, 503, path_prefix="/api/v1/pods")
    delays: list[float] = []

    async def record(delay: float) -> None:
        delays.append(delay)
        await asyncio.sleep(delay)

    config = PodConfig()
    async with running_source(client, config, rng=random.Random(7), backoff_initial=0.02, backoff_max=0.08,
                              sleep=record):
        await eventually(lambda: config.all_sources_ready())
    arrivals = [r.time for r in api.requests if r.path == "/api/v1/pods" and "watch" not in r.query][:6]
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert len(delays) >= 5 and len(gaps) == 5
    for gap, delay in zip(gaps, delays):
        assert gap >= delay - 0.002


async def test_a_lease_renewed_after_an_outage_ends_the_backoff_wait(api: ApiServerDouble, client: ApiClient) -> None:
    """The reflector's wait at its cap (30-60 s) is cut to a random point within the given spread once the Lease
    proves the API server answers again; without reconnect_soon the source would still be waiting."""
    config = PodConfig()
    api.create("pods", pod("made-during-the-outage"))
    api.go_down()
    async with running_source(client, config, rng=random.Random(3), backoff_initial=30.0, backoff_max=60.0) as source:
        await eventually(lambda: source._retry.failures >= 1)
        api.come_up()
        source.reconnect_soon(0.2)
        await eventually(lambda: config.all_sources_ready(), timeout=10.0)
        assert [p["metadata"]["name"] for p in config.get_pods()] == ["made-during-the-outage"]
        assert source.connected
        source.reconnect_soon(0.2)  # connected: nothing to cut, nothing scheduled
        assert source._wake_timer is None


async def test_a_spread_re_list_waits_for_its_random_point_even_when_its_backoff_ends_first(
        api: ApiServerDouble, client: ApiClient) -> None:
    """A fleet's re-lists are spread by reconnect_soon; a node whose own (short) backoff would end before its
    random point keeps to the point, or it would re-list with the crowd."""
    config = PodConfig()
    api.go_down()
    async with running_source(client, config, rng=random.Random(5), backoff_initial=0.05, backoff_max=0.05) as source:
        await eventually(lambda: source._retry.failures >= 2)
        source.reconnect_soon(1.0)
        point = source._cut_next_pause_until
        up_at = time.monotonic()
        api.come_up()
        await eventually(lambda: config.all_sources_ready(), timeout=10.0)
        lists = [r.time for r in api.requests if r.path == "/api/v1/pods" and "watch" not in r.query
                 and r.time >= up_at]
        assert point - up_at > 0.2  # the point is well after the 50 ms backoff (this seed)
        assert lists and lists[0] >= point - 0.01, (lists[0] - up_at, point - up_at)
