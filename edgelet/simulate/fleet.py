"""The fleet: N hollow nodes on one event loop, started at a steady rate, all sharing one TLS context.

Each node has its own API client (connection pool) because its pod watch holds an HTTP/1.1 connection
for minutes, as a real node's does; the TLS context (CA and client certificate) is parsed once for all.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import re
import time
from dataclasses import dataclass, field

from edgelet.kubeapi.client import ApiClient
from edgelet.kubeapi.kubeconfig import KubeConfig, ssl_context
from edgelet.simulate.node import HollowNode, Timings
from edgelet.util.tasks import TaskGroup, wait_set

log = logging.getLogger(__name__)

SHUTDOWN_GRACE = 5.0
# How often the loop's lateness is sampled: a starved loop delays every node's Lease alike.
_LAG_PROBE = 0.25
# A node name is a DNS-1123 subdomain; the prefix plus a number must stay one.
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


@dataclass(frozen=True, slots=True)
class FleetOptions:
    nodes: int
    pods_per_node: int = 0
    name_prefix: str = "hollow-"
    namespace: str = "default"
    start_rate: float = 25.0  # nodes started per second
    report_interval: float = 30.0
    timings: Timings = field(default_factory=Timings)


def node_names(prefix: str, count: int) -> list[str]:
    """hollow-0000, hollow-0001, ...: zero-padded so that names sort in start order."""
    width = max(4, len(str(count - 1)))
    return [f"{prefix}{index:0{width}d}" for index in range(count)]


def options_problem(options: FleetOptions) -> str | None:
    """Why these options cannot run (None: they can), naming the command-line flag."""
    if options.nodes < 1:
        return "--nodes must be at least 1"
    if options.pods_per_node < 0:
        return "--pods-per-node must not be negative"
    if options.start_rate <= 0:
        return "--start-rate must be positive"
    last = node_names(options.name_prefix, options.nodes)[-1]
    if len(last) > 253 or not _NAME.fullmatch(last):
        return (f"--name-prefix {options.name_prefix!r} does not make valid node names (e.g. {last!r}): "
                "use lower-case letters, digits, '-' and '.'")
    return None


class Fleet:
    def __init__(self, options: FleetOptions, kubeconfig: KubeConfig, *, state_dir: str):
        """Raises KubeconfigError for an unusable kubeconfig (its TLS material is loaded here, once)."""
        self.options = options
        self.server = kubeconfig.server
        tls = ssl_context(kubeconfig)
        rng = random.Random()  # one generator for every node's jitter: 1,000 Mersenne states are 2.5 MB
        self.nodes = [
            HollowNode(name, ApiClient(kubeconfig.server, token=kubeconfig.token, token_file=kubeconfig.token_file,
                                       tls=tls, kubeconfig_path=kubeconfig.path),
                       state_dir=state_dir, timings=options.timings, rng=rng)
            for name in node_names(options.name_prefix, options.nodes)
        ]
        self.tasks = TaskGroup()
        self.started = 0
        self.loop_lag_max = 0.0  # the worst lateness of the event loop since the last summary line
        self.gc_pause_max = 0.0  # the longest garbage collection since the last summary line
        self.gc_total = 0.0  # seconds spent in garbage collection since the start
        self._gc_started = 0.0
        self._began = time.monotonic()

    async def run(self, stop: asyncio.Event) -> None:
        """Starts the nodes at `start_rate` per second and runs them until `stop` is set."""
        self._began = time.monotonic()
        gc.callbacks.append(self._time_gc)
        self.tasks.start("fleet:report", self._report())
        self.tasks.start("fleet:loop-lag", self._probe_loop_lag())
        try:
            for index, node in enumerate(self.nodes):
                delay = self._began + index / self.options.start_rate - time.monotonic()
                if delay > 0:
                    await wait_set(stop, delay)
                if stop.is_set():
                    break
                node.start(self.tasks, pods=self.options.pods_per_node, namespace=self.options.namespace)
                self.started += 1
            # The nodes' long-lived objects would otherwise be scanned by every full collection, stalling all
            # nodes at once for as long as the scan takes.
            gc.collect()
            gc.freeze()
            await stop.wait()
        finally:
            gc.callbacks.remove(self._time_gc)
            await self.tasks.cancel_all(grace=SHUTDOWN_GRACE)
            await asyncio.gather(*(node.client.aclose() for node in self.nodes), return_exceptions=True)
            print(self.summary(), flush=True)

    def summary(self) -> str:
        """One line of counters over the whole fleet."""
        nodes = self.nodes[: self.started]
        crashed = len(self.tasks.crashed)
        return (
            f"fleet: t={time.monotonic() - self._began:.0f}s started={self.started}/{len(self.nodes)} "
            f"registered={sum(n.node_status.registered.is_set() for n in nodes)} "
            f"watching={sum(n.source.connected for n in nodes)} "
            f"lease_renewals={sum(n.lease.renewals for n in nodes)} "
            f"node_status_writes={sum(n.node_status.status_writes for n in nodes)} "
            f"pod_status_writes={sum(n.syncer.api_writes for n in nodes)} "
            f"pods_running={sum(len(n.runtime.pods) for n in nodes)} "
            f"pod_starts={sum(n.runtime.starts for n in nodes)} loop_lag_max_s={self.loop_lag_max:.2f} "
            f"gc_pause_max_s={self.gc_pause_max:.2f} gc_total_s={self.gc_total:.1f} "
            f"crashed_tasks={crashed}"
        )

    async def _report(self) -> None:
        while True:
            await asyncio.sleep(self.options.report_interval)
            print(self.summary(), flush=True)
            self.loop_lag_max = self.gc_pause_max = 0.0

    def _time_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            pause = time.perf_counter() - self._gc_started
            self.gc_pause_max = max(self.gc_pause_max, pause)
            self.gc_total += pause

    async def _probe_loop_lag(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(_LAG_PROBE)
            self.loop_lag_max = max(self.loop_lag_max, loop.time() - before - _LAG_PROBE)
