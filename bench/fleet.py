"""`make fleet`: `edgelet simulate` with N hollow nodes against the real control plane of the e2e suite, measured
in one run (steady state, pod starts, an apiserver outage); prints a FLEET line last. See docs/fleet.md.

Run it as root from the repository: `python -m bench.fleet [--nodes N] [--steady S] [--outage S]`. The control
plane (hack/control-plane.sh) and the simulator run in a temporary directory, removed at the end unless --keep.
API figures come from the apiserver's audit log, which records every request with its user and verb.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import procstat  # noqa: E402
from edgelet.kubeapi.client import ApiClient  # noqa: E402
from edgelet.kubeapi.errors import ApiError  # noqa: E402
from edgelet.simulate.fleet import FleetOptions, node_names  # noqa: E402

CONTROL_PLANE = REPO / "hack" / "control-plane.sh"
SIMULATOR_USER = "edgelet-simulator"
CONTROLLER_USER = "system:kube-controller-manager"
DEFAULT_PREFIX = FleetOptions(nodes=1).name_prefix
READ_VERBS = frozenset({"get", "list", "watch"})
POD_LABEL = {"edgelet.io/fleet": "pod-start"}
_NODE_SELECTOR = re.compile(r"fieldSelector=spec\.nodeName%3D([^&]+)")


# -- the audit log, reduced to what the figures need ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    at: float  # requestReceivedTimestamp, seconds since the epoch
    user: str
    verb: str
    resource: str
    subresource: str
    name: str
    code: int
    node: str  # the node a pod list/watch selects, from its fieldSelector


def parse_audit_line(line: bytes) -> Request | None:
    """A completed request from one audit log line (None for other stages and unreadable lines)."""
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(event, dict) or event.get("stage") != "ResponseComplete":
        return None
    ref = event.get("objectRef") or {}
    match = _NODE_SELECTOR.search(event.get("requestURI") or "")
    return Request(
        at=datetime.fromisoformat(event.get("requestReceivedTimestamp", "").replace("Z", "+00:00")).timestamp(),
        user=(event.get("user") or {}).get("username", ""),
        verb=event.get("verb", ""),
        resource=ref.get("resource", ""),
        subresource=ref.get("subresource", ""),
        name=ref.get("name", ""),
        code=int((event.get("responseStatus") or {}).get("code") or 0),
        node=match.group(1) if match else "",
    )


class AuditLog:
    """Reads the audit log incrementally; `requests` grows with every `read()`."""

    def __init__(self, path: Path):
        self.path = path
        self.requests: list[Request] = []
        self._offset = 0
        self._partial = b""

    def read(self) -> list[Request]:
        if not self.path.exists():
            return self.requests
        with open(self.path, "rb") as log:
            log.seek(self._offset)
            data = self._partial + log.read()
            self._offset = log.tell()
        *lines, self._partial = data.split(b"\n")
        self.requests.extend(r for r in map(parse_audit_line, lines) if r is not None)
        return self.requests


def node_writes(requests: Iterable[Request], since: float, until: float) -> int:
    """Requests that change something, made by the hollow nodes in [since, until)."""
    return sum(1 for r in requests if r.user == SIMULATOR_USER and r.verb not in READ_VERBS and since <= r.at < until
               and not (r.verb == "create" and r.resource == "pods"))


def marked_not_ready(requests: Iterable[Request], since: float, until: float) -> set[str]:
    """Nodes whose status the node-lifecycle controller wrote: it does so only to mark a node Unknown."""
    return {r.name for r in requests if r.user == CONTROLLER_USER and r.resource == "nodes"
            and r.subresource == "status" and r.verb in ("update", "patch") and since <= r.at < until}


def first_served(requests: Iterable[Request], since: float) -> float | None:
    """When the restarted apiserver answered its first request."""
    return min((r.at for r in requests if r.at >= since and 0 < r.code < 400), default=None)


def reconnects(requests: Iterable[Request], since: float) -> tuple[dict[str, float], dict[str, float]]:
    """Per node, the first successful Lease renewal and pod re-list (the watch follows at once) at or after
    `since`. The re-list marks the watch: a watch's own audit entry is written only when the watch ends."""
    leases: dict[str, float] = {}
    lists: dict[str, float] = {}
    for r in sorted((r for r in requests if r.at >= since and r.user == SIMULATOR_USER and r.code == 200),
                    key=lambda r: r.at):
        if r.resource == "leases" and r.verb == "update":
            leases.setdefault(r.name, r.at)
        elif r.resource == "pods" and r.verb == "list" and r.node:
            lists.setdefault(r.node, r.at)
    return leases, lists


def pod_start_phases(requests: Iterable[Request], created: dict[str, float],
                     running: dict[str, float]) -> dict[str, list[float]]:
    """Where each pod's start went, per pod that reached Running: created -> the node's first request about
    it (the watch delivering it, the node taking it up), -> the node's status PATCH received (the node's
    status path), -> Running seen by our watch (the write and its watch event)."""
    first: dict[str, float] = {}
    patched: dict[str, float] = {}
    for r in requests:
        if r.user == SIMULATOR_USER and r.resource == "pods" and r.name in created:
            first[r.name] = min(first.get(r.name, r.at), r.at)
            if r.subresource == "status" and r.verb == "patch":
                patched[r.name] = min(patched.get(r.name, r.at), r.at)
    phases: dict[str, list[float]] = {"to the node": [], "node status write": [], "to the watch": []}
    for name in created.keys() & running.keys() & patched.keys():
        phases["to the node"].append(first[name] - created[name])
        phases["node status write"].append(patched[name] - first[name])
        phases["to the watch"].append(running[name] - patched[name])
    return phases


def lease_bunching(requests: Iterable[Request], since: float, until: float, period: int = 10) -> float:
    """How bunched the nodes' Lease renewals are: the mean share of a `period`-second cycle's renewals that
    fall in its densest half (about 0.5 when spread evenly, 1.0 when all come within half the period)."""
    counts = Counter(int(r.at - since) for r in requests if r.user == SIMULATOR_USER and r.resource == "leases"
                     and r.verb == "update" and since <= r.at < until)
    half = period // 2
    shares = []
    for start in range(0, int(until - since) - period + 1, period):
        cycle = [counts.get(start + offset, 0) for offset in range(period)]
        if sum(cycle):
            densest = max(sum(cycle[(first + i) % period] for i in range(half)) for first in range(period))
            shares.append(densest / sum(cycle))
    return sum(shares) / len(shares) if shares else math.nan


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile; nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


def peak_per_second(instants: Iterable[float]) -> int:
    return max(Counter(int(t) for t in instants).values(), default=0)


# -- the simulator process ----------------------------------------------------------------------------------


def _rss_or_nan(pid: int) -> float:
    rss = procstat.rss_mb(pid)
    return math.nan if rss is None else rss


@dataclass
class Figures:
    nodes: int
    rss_mb: float = math.nan
    cpu_pct: float = math.nan
    api_writes_per_s: float = math.nan
    notready_steady: int = -1
    pod_start_p50_s: float = math.nan
    pod_start_p99_s: float = math.nan
    reconnect_p10_s: float = math.nan
    reconnect_p90_s: float = math.nan
    reconnect_peak_per_s: int = -1
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"FLEET nodes={self.nodes} rss_mb={self.rss_mb:.0f} cpu_pct={self.cpu_pct:.1f} "
                f"api_writes_per_s={self.api_writes_per_s:.1f} notready_steady={self.notready_steady} "
                f"pod_start_p50_s={self.pod_start_p50_s:.2f} pod_start_p99_s={self.pod_start_p99_s:.2f} "
                f"reconnect_p10_s={self.reconnect_p10_s:.1f} reconnect_p90_s={self.reconnect_p90_s:.1f} "
                f"reconnect_peak_per_s={self.reconnect_peak_per_s}")


def say(message: str) -> None:
    print(f"fleet: {message}", flush=True)


class Run:
    def __init__(self, args: argparse.Namespace, workdir: Path):
        self.args = args
        self.cp = workdir / "control-plane"
        self.workdir = workdir
        self.figures = Figures(nodes=args.nodes)
        self.audit = AuditLog(self.cp / "audit.log")
        self.simulator: subprocess.Popen | None = None
        self.admin: ApiClient | None = None
        self.rss_samples: list[float] = []
        self.busy_samples: list[tuple[float, float]] = []  # (time, machine busy CPU seconds)
        self.not_ready_after_outage = ""

    def script(self, *args: str) -> str:
        result = subprocess.run(["bash", str(CONTROL_PLANE), *args], capture_output=True, text=True, timeout=1800)
        if result.returncode != 0:
            raise RuntimeError(f"control-plane.sh {args[0]} failed:\n{result.stderr[-3000:]}")
        return result.stdout.strip()

    def start(self) -> None:
        say(f"starting the control plane in {self.cp}")
        self.script("start", str(self.cp))
        kubeconfig = self.script("kubeconfig", str(self.cp), "simulator", SIMULATOR_USER, "system:masters")
        say(f"starting edgelet simulate --nodes {self.args.nodes}")
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.simulator = subprocess.Popen(
            [sys.executable, "-m", "edgelet", "simulate", "--nodes", str(self.args.nodes), "--kubeconfig", kubeconfig,
             "--start-rate", str(self.args.start_rate), "--report-interval", "30"],
            stdout=open(self.workdir / "simulate.out", "wb"), stderr=open(self.workdir / "simulate.err", "wb"),
            env=env, cwd=REPO)

    async def measure(self) -> None:
        self.admin = ApiClient.from_kubeconfig(str(self.cp / "admin.kubeconfig"), timeout=30.0)
        sampler = asyncio.create_task(self._sample())
        try:
            await self._wait_ready()
            await asyncio.sleep(self.args.settle)
            await self._steady()
            await self._pod_starts()
            await self._outage()
        finally:
            sampler.cancel()
            await self.admin.aclose()

    async def _sample(self) -> None:
        """The simulator's RSS and the machine's busy CPU seconds, every second."""
        while True:
            with contextlib.suppress(OSError):
                self.rss_samples.append(_rss_or_nan(self.simulator.pid))
            self.busy_samples.append((time.time(), procstat.machine_busy_seconds()))
            await asyncio.sleep(1.0)

    def _saturated_seconds(self, since: float, until: float) -> tuple[int, int]:
        """(seconds in which every core was at least 95 % busy, seconds sampled) between since and until."""
        samples = [sample for sample in self.busy_samples if since <= sample[0] <= until]
        cores = os.cpu_count() or 1
        saturated = sum(1 for (t0, b0), (t1, b1) in zip(samples, samples[1:]) if b1 - b0 >= 0.95 * cores * (t1 - t0))
        return saturated, max(0, len(samples) - 1)

    def _cpu_seconds(self) -> dict[str, float]:
        """CPU seconds so far of the simulator, etcd, the apiserver, the controller-manager and the machine."""
        used = {"at": time.time()}
        with contextlib.suppress(OSError):
            used["simulator"] = procstat.cpu_seconds(self.simulator.pid)
        for name in ("etcd", "apiserver", "controller-manager"):
            with contextlib.suppress(OSError, ValueError):
                used[name] = procstat.cpu_seconds(int((self.cp / f"{name}.pid").read_text()))
        used["machine"] = procstat.machine_busy_seconds()
        return used

    def _note_cpu(self, phase: str, before: dict[str, float]) -> None:
        """Who used the machine's cores in a phase: on a shared machine the rest is other work."""
        after = self._cpu_seconds()
        seconds = after["at"] - before["at"]
        # A process started again in the phase (the apiserver after the outage) counts from zero.
        shares = {name: 100 * (used if (used := after[name] - before.get(name, 0.0)) >= 0 else after[name]) / seconds
                  for name in after if name != "at"}
        machine = shares.pop("machine")
        saturated, sampled = self._saturated_seconds(before["at"], after["at"])
        self.figures.notes.append(
            f"{phase} CPU (% of one core): " + ", ".join(f"{name} {pct:.0f}" for name, pct in shares.items())
            + f"; whole machine {machine:.0f} of {100 * (os.cpu_count() or 1)}, of which other work "
            f"{max(0.0, machine - sum(shares.values())):.0f}; every core busy in {saturated} of {sampled}s; "
            f"load average {os.getloadavg()[0]:.1f}")

    def _check_simulator(self) -> None:
        if self.simulator.poll() is not None:
            raise RuntimeError(f"edgelet simulate exited with {self.simulator.returncode}; see "
                               f"{self.workdir / 'simulate.err'}")

    async def _ready_nodes(self) -> int:
        nodes = await self.admin.list("/api/v1/nodes")
        return sum(1 for node in nodes["items"] if any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in node.get("status", {}).get("conditions",
                                                                                                       [])))

    async def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.args.nodes / self.args.start_rate + 300
        began = time.monotonic()
        ready = 0
        while True:
            self._check_simulator()
            with contextlib.suppress(ApiError):
                ready = await self._ready_nodes()
                if ready >= self.args.nodes:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {ready} of {self.args.nodes} nodes became Ready")
            await asyncio.sleep(2.0)
        self.ready_at = time.time()
        say(f"all {self.args.nodes} nodes Ready after {time.monotonic() - began:.0f}s; "
            f"settling {self.args.settle:.0f}s")

    async def _steady(self) -> None:
        pid = self.simulator.pid
        say(f"steady state for {self.args.steady:.0f}s")
        rss_from = len(self.rss_samples)
        since, cpu_before = time.time(), procstat.cpu_seconds(pid)
        cpu = self._cpu_seconds()
        await asyncio.sleep(self.args.steady)
        self._check_simulator()
        until, cpu_after = time.time(), procstat.cpu_seconds(pid)
        self._note_cpu("steady-state", cpu)
        requests = self.audit.read()
        figures = self.figures
        figures.rss_mb = max(self.rss_samples[rss_from:] or [_rss_or_nan(pid)])
        figures.cpu_pct = 100 * (cpu_after - cpu_before) / (until - since)
        figures.api_writes_per_s = node_writes(requests, since, until) / (until - since)
        figures.notes.append(f"steady-state Lease renewals in the densest half of each 10 s: "
                             f"{lease_bunching(requests, since, since + 60):.2f} in the first minute, "
                             f"{lease_bunching(requests, until - 60, until):.2f} in the last (0.5 is even)")
        not_ready = marked_not_ready(requests, self.ready_at, until)
        figures.notready_steady = len(not_ready)
        if not_ready:
            figures.notes.append(f"marked NotReady in steady state: {', '.join(sorted(not_ready)[:10])}")
        self.steady_until = until

    async def _pod_starts(self) -> None:
        names = node_names(DEFAULT_PREFIX, self.args.nodes)
        path = "/api/v1/namespaces/default/pods"
        listed = await self.admin.list(path, {"labelSelector": "edgelet.io/fleet=pod-start"})
        created: dict[str, float] = {}
        running: dict[str, float] = {}
        watcher = asyncio.create_task(self._watch_running(path, listed["metadata"]["resourceVersion"], running))
        say(f"creating {len(names)} pods at {self.args.pod_rate:g}/s")
        cpu = self._cpu_seconds()
        began = time.monotonic()
        for index, node in enumerate(names):
            delay = began + index / self.args.pod_rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            name = f"start-{node}"
            created[name] = time.time()
            await self.admin.create(path, pod_manifest(name, node))
        deadline = time.monotonic() + 120
        while len(running) < len(created) and time.monotonic() < deadline:
            await asyncio.sleep(1.0)
        watcher.cancel()
        self._note_cpu("pod-start", cpu)
        latencies = [running[name] - created[name] for name in created if name in running]
        if len(latencies) < len(created):
            self.figures.notes.append(f"{len(created) - len(latencies)} pods not Running within 120 s")
        self.figures.pod_start_p50_s = percentile(latencies, 0.50)
        self.figures.pod_start_p99_s = percentile(latencies, 0.99)
        requests = self.audit.read()
        phases = pod_start_phases(requests, created, running)
        self.figures.notes.append("pod start split p50/p99: " + ", ".join(
            f"{phase} {percentile(values, .5):.2f}/{percentile(values, .99):.2f}s" for phase, values in phases.items()))
        not_ready = marked_not_ready(requests, self.steady_until, time.time())
        if not_ready:
            self.figures.notes.append(f"{len(not_ready)} nodes marked NotReady while pods started")

    async def _watch_running(self, path: str, resource_version: str, running: dict[str, float]) -> None:
        params = {"labelSelector": "edgelet.io/fleet=pod-start", "resourceVersion": resource_version,
                  "timeoutSeconds": "3600"}
        while True:
            try:
                async with contextlib.aclosing(self.admin.watch(path, params)) as events:
                    async for _kind, pod in events:
                        params["resourceVersion"] = pod["metadata"].get("resourceVersion", params["resourceVersion"])
                        if pod.get("status", {}).get("phase") == "Running":
                            running.setdefault(pod["metadata"]["name"], time.time())
            except ApiError as e:
                say(f"pod watch: {e}; watching again")
                await asyncio.sleep(0.5)

    async def _outage(self) -> None:
        say(f"stopping the apiserver for {self.args.outage:.0f}s")
        stopped = time.time()
        cpu = self._cpu_seconds()
        await asyncio.to_thread(self.script, "stop-apiserver", str(self.cp))
        await asyncio.sleep(max(0.0, stopped + self.args.outage - time.time()))
        starting = time.time()
        await asyncio.to_thread(self.script, "start-apiserver", str(self.cp))
        say("apiserver back; waiting for every node's Lease and pod watch")
        deadline = time.monotonic() + self.args.reconnect_wait
        while True:
            await asyncio.sleep(5.0)
            requests = self.audit.read()
            leases, lists = reconnects(requests, starting)
            if (len(leases) >= self.args.nodes and len(lists) >= self.args.nodes) or time.monotonic() > deadline:
                break
        self._check_simulator()
        self._note_cpu("reconnect", cpu)
        await self._wait_ready_again(starting, time.monotonic() + self.args.reconnect_wait)
        requests = self.audit.read()
        up = first_served(requests, starting) or starting
        back = {node: max(leases[node], lists[node]) - up for node in leases.keys() & lists.keys()}
        figures = self.figures
        figures.reconnect_p10_s = percentile(list(back.values()), 0.10)
        figures.reconnect_p90_s = percentile(list(back.values()), 0.90)
        figures.reconnect_peak_per_s = peak_per_second(lists.values())
        if len(back) < self.args.nodes:
            figures.notes.append(f"{self.args.nodes - len(back)} nodes not reconnected within "
                                 f"{self.args.reconnect_wait:.0f}s")
        lease_back = [t - up for t in leases.values()]
        figures.notes.append(
            f"after the outage: Lease p10/p50/p90 {percentile(lease_back, .1):.1f}/{percentile(lease_back, .5):.1f}/"
            f"{percentile(lease_back, .9):.1f}s, lease renewals peak {peak_per_second(leases.values())}/s, "
            f"{len(marked_not_ready(requests, stopped, time.time()))} nodes marked NotReady around the outage")

    async def _wait_ready_again(self, starting: float, deadline: float) -> None:
        """Every node should be Ready again soon after its Lease is renewed, although the node-lifecycle
        controller marked it Unknown while the apiserver was away: counts those still not Ready at the deadline."""
        ready = -1
        while True:
            with contextlib.suppress(ApiError):
                ready = await self._ready_nodes()
            if ready >= self.args.nodes or time.monotonic() > deadline:
                break
            await asyncio.sleep(2.0)
        waited = f"{time.time() - starting:.0f}s after the apiserver was started again"
        self.not_ready_after_outage = (f"not_ready_after_outage={self.args.nodes - ready} of {self.args.nodes}, "
                                       f"{waited}"
                                       if ready >= 0 else f"not_ready_after_outage unknown: no node list {waited}")

    def stop(self) -> None:
        if self.simulator is not None and self.simulator.poll() is None:
            self.simulator.send_signal(signal.SIGTERM)
            try:
                self.simulator.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.simulator.kill()
        with contextlib.suppress(Exception):
            self.script("stop", str(self.cp))


def pod_manifest(name: str, node: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": dict(POD_LABEL)},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.local/hollow:1"}]}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=int(os.environ.get("FLEET_NODES", 1000)))
    parser.add_argument("--steady", type=float, default=float(os.environ.get("FLEET_STEADY_SECONDS", 300)),
                        help="seconds of steady state measured (default 300)")
    parser.add_argument("--outage", type=float, default=float(os.environ.get("FLEET_OUTAGE_SECONDS", 60)))
    parser.add_argument("--settle", type=float, default=30.0, help="seconds between all-Ready and the steady state")
    parser.add_argument("--start-rate", type=float, default=20.0, help="hollow nodes started per second")
    parser.add_argument("--pod-rate", type=float, default=20.0, help="pods created per second")
    parser.add_argument("--reconnect-wait", type=float, default=180.0)
    parser.add_argument("--keep", action="store_true", help="keep the working directory (logs, audit log)")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="edgelet-fleet-"))
    run = Run(args, workdir)
    status = 0
    try:
        run.start()
        asyncio.run(run.measure())
    except (RuntimeError, ApiError, OSError) as e:
        say(f"FAILED: {e}")
        status = 1
    finally:
        run.stop()
        out = workdir / "simulate.out"
        tail = out.read_text().strip().splitlines()[-1:] if out.exists() else []
        for line in tail:
            say(f"simulator: {line}")
        if args.keep:
            say(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    for note in run.figures.notes:
        say(note)
    if run.not_ready_after_outage:
        say(run.not_ready_after_outage)
    print(run.figures.line(), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
