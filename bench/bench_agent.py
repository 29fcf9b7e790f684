"""Agent benchmarks: the real `edgelet run` starting pods from manifests, beside the raw CRI floor
(the same calls made directly with edgelet's own CRI client), plus the agent's idle costs.

Every time comes from one clock: the wall clock of this machine. A pod's start ends at the
container's `started_at` as the runtime records it (ContainerStatus), so how often we poll for it
does not change the figure; the raw floor also records when StartContainer returned.
"""

from __future__ import annotations

import asyncio
import collections
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench import procstat
from edgelet.container import labels
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.cri.client import RuntimeClient
from edgelet.podconfig import inotify

REPO = Path(__file__).resolve().parent.parent
SERVICE_UNIT = REPO / "packaging" / "edgelet.service"
# The bytecode optimization level the shipped bundle is built and run with (packaging/edgelet.spec): the
# agent runs with it here too, so that its RSS and start are the package's (docstrings and asserts gone).
OPTIMIZE = 2
# Where the agents' bytecode is kept (stale files are recompiled by their source's mtime, as always). The
# bundle's bytecode has no column positions either (-X no_debug_ranges, packaging/edgelet.spec); a .pyc's
# name does not say so, hence a directory of its own.
PYCACHE = REPO / "build" / f"bench-pycache-opt{OPTIMIZE}-nocolumns"
IMAGE = "docker.io/library/busybox:local"
NODE_NAME = "benchnode"
RAW_NAMESPACE = "bench-raw"
# runtime.v1.NamespaceMode
_POD, _CONTAINER, _NODE = 0, 1, 2
# How the benchmark asks the runtime whether the agent's containers run yet (ListContainers). The figures come
# from the runtime's started_at, so polling only sets when the benchmark moves on, but every poll made while the
# agent's pods start loads their containerd, and nothing polls the raw floor's: a lone start is first looked at
# after FIRST_POLL_AFTER, longer than a start takes here (polled at once and every 100 ms, two or three times a
# start, the paired ratio read 1.09-1.11 against 1.03-1.05 on alternate rounds), and a burst every
# BURST_POLL_INTERVAL.
POLL_INTERVAL = 0.1
FIRST_POLL_AFTER = 0.3
BURST_POLL_INTERVAL = 1.0


def pod_manifest(name: str) -> str:
    """The workload of every agent phase: one busybox `sleep` on the host network, killed at once on delete."""
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Pod
        metadata:
          name: {name}
        spec:
          hostNetwork: true
          terminationGracePeriodSeconds: 0
          containers:
            - name: main
              image: {IMAGE}
              imagePullPolicy: IfNotPresent
              command: ["sleep", "3600"]
        """)


def unit_environment(unit_text: str) -> dict[str, str]:
    """The variables the systemd unit's `Environment=` lines set (KEY=VALUE words; quotes not used there)."""
    env = {}
    for line in unit_text.splitlines():
        key, _, value = line.strip().partition("=")
        if key == "Environment":
            env.update(word.split("=", 1) for word in value.split() if "=" in word)
    return env


def agent_environment() -> dict[str, str]:
    """The environment of every agent the benchmark starts: the service unit's (MALLOC_ARENA_MAX), bytecode
    kept under PYCACHE as the package's is made (optimization level, no column positions) and written as an
    install would have written it (PYTHONDONTWRITEBYTECODE, which a test shell may set, does not apply to an
    installed service)."""
    env = {**os.environ, **unit_environment(SERVICE_UNIT.read_text())}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    env["PYTHONOPTIMIZE"] = str(OPTIMIZE)
    env["PYTHONNODEBUGRANGES"] = "1"
    return env


def compile_bytecode() -> None:
    """Writes the bytecode of everything `edgelet run` imports, as installing the package does (the bundle
    carries it), so that no measured start compiles modules from source."""
    subprocess.run([sys.executable, "-c",
                    "import edgelet.cli.main, edgelet.kubelet.agent; edgelet.cli.main.build_parser()"],
                   env=agent_environment(), cwd=REPO, check=True)


# -- the raw CRI floor ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RawStart:
    """One pod started with bare CRI calls: wall-clock nanoseconds of each mark."""

    first_call_ns: int
    returned_ns: int  # StartContainer returned
    running_ns: int  # the container's started_at, as the runtime recorded it
    call_ns: tuple[int, int, int] = (0, 0, 0)  # RunPodSandbox, CreateContainer, StartContainer durations

    @property
    def returned_s(self) -> float:
        return (self.returned_ns - self.first_call_ns) / 1e9

    @property
    def running_s(self) -> float:
        return (self.running_ns - self.first_call_ns) / 1e9


def _raw_configs(name: str, log_root: str) -> tuple[pb.PodSandboxConfig, pb.ContainerConfig]:
    """What the kubelet would send for the benchmark pod, minus everything optional. The sandbox's RuntimeDefault
    seccomp profile is not optional: the kubelet sends it for every pod (kuberuntime's sandbox config), and
    containerd spends about 15 ms of RunPodSandbox loading the filter into the pause process."""
    uid = str(uuid.uuid4())
    pod_labels = {labels.POD_NAME: name, labels.POD_NAMESPACE: RAW_NAMESPACE, labels.POD_UID: uid}
    namespaces = pb.NamespaceOption(network=_NODE, pid=_CONTAINER, ipc=_POD)
    sandbox = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=RAW_NAMESPACE, attempt=0),
        log_directory=os.path.join(log_root, f"{RAW_NAMESPACE}_{name}_{uid}"),
        labels=pod_labels,
        linux=pb.LinuxPodSandboxConfig(
            security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=namespaces,
                seccomp=pb.SecurityProfile(profile_type=pb.SecurityProfile.RuntimeDefault))),
    )
    container = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="main", attempt=0),
        image=pb.ImageSpec(image=IMAGE),
        command=["sleep", "3600"],
        log_path="main/0.log",
        labels={**pod_labels, labels.CONTAINER_NAME: "main"},
        linux=pb.LinuxContainerConfig(
            security_context=pb.LinuxContainerSecurityContext(namespace_options=namespaces)),
    )
    return sandbox, container


async def raw_start(client: RuntimeClient, name: str, log_root: str) -> RawStart:
    """RunPodSandbox + CreateContainer + StartContainer for one pod, timed from the first call."""
    sandbox, container = _raw_configs(name, log_root)
    first_call = time.time_ns()
    os.makedirs(os.path.join(sandbox.log_directory, "main"), exist_ok=True)
    before_sandbox = time.time_ns()
    sandbox_id = await client.run_pod_sandbox(sandbox)
    before_create = time.time_ns()
    container_id = await client.create_container(sandbox_id, container, sandbox)
    before_start = time.time_ns()
    await client.start_container(container_id)
    returned = time.time_ns()
    running = (await client.container_status(container_id)).started_at
    calls = (before_create - before_sandbox, before_start - before_create, returned - before_start)
    return RawStart(first_call, returned, running, calls)


async def raw_burst(client: RuntimeClient, count: int, log_root: str, *, parallel: int) -> RawStart:
    """`count` pods, `parallel` at a time; the marks span from the first call to the last pod."""
    gate = asyncio.Semaphore(parallel)

    async def one(i: int) -> RawStart:
        async with gate:
            return await raw_start(client, f"raw-burst-{i:03d}", log_root)

    first_call = time.time_ns()
    starts = await asyncio.gather(*(one(i) for i in range(count)))
    return RawStart(first_call, max(s.returned_ns for s in starts), max(s.running_ns for s in starts))


# -- the runtime, observed ------------------------------------------------------------------------


def running_filter(selector: dict[str, str] | None = None) -> pb.ContainerFilter:
    """Running containers, optionally only those carrying every label of `selector`."""
    return pb.ContainerFilter(state=pb.ContainerStateValue(state=pb.CONTAINER_RUNNING),
                              label_selector=selector or {})


async def wait_running(client: RuntimeClient, count: int, selector: dict[str, str] | None = None, *,
                       timeout: float, interval: float) -> list[pb.Container]:
    """Polls ListContainers (filtered by the runtime) until `count` matching containers run."""
    deadline = time.monotonic() + timeout
    flt = running_filter(selector)
    while True:
        running = await client.list_containers(flt)
        if len(running) >= count:
            return running
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(running)} of {count} containers running after {timeout:.0f}s")
        await asyncio.sleep(interval)


async def started_at(client: RuntimeClient, containers: list[pb.Container]) -> list[int]:
    """Each container's start as the runtime recorded it (wall-clock nanoseconds)."""
    return [(await client.container_status(c.id)).started_at for c in containers]


# -- the agent process ----------------------------------------------------------------------------


def _free_loopback_port() -> int:
    """A port nothing listens on now (tests and other agents may run beside the benchmark)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class NodeProcess:
    """A node agent run as a subprocess that starts pods from the manifests renamed into its directory, and
    answers /healthz over HTTP on a loopback port: edgelet (AgentProcess), or the kubelet beside it
    (bench_kubelet.py). Subclasses say how it is started."""

    name = "agent"

    def __init__(self, workdir: Path, *, log_name: str):
        self.workdir = workdir
        self.root_dir = workdir / "root"
        self.manifest_dir = workdir / "manifests"
        self.staging_dir = workdir / "staging"  # same file system, so a rename is atomic
        self.http_port = _free_loopback_port()  # where /healthz answers
        self.log_path = workdir / log_name
        for directory in (self.manifest_dir, self.staging_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None
        self.ready_at = 0.0  # monotonic time /healthz first answered 200

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} not started"
        return self.proc.pid

    def _spawn(self, argv: list[str], env: dict[str, str]) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace").splitlines()[-20:]
            raise RuntimeError(f"{self.name} exited; last log lines:\n" + "\n".join(tail))

    async def http_get(self, path: str) -> tuple[int, bytes]:
        """One request to the process's HTTP endpoint on loopback."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.http_port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: edgelet\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            reply = await reader.read()
        finally:
            writer.close()
        head, _, body = reply.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), body

    async def wait_ready(self, timeout: float = 60.0, *, interval: float = 0.05) -> None:
        """Until /healthz answers 200 (edgelet: the runtime answered and the first relist is done)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                status, _ = await self.http_get("/healthz")
                if status == 200:
                    self.ready_at = time.monotonic()
                    return
            except (OSError, ValueError, IndexError):
                pass
            await asyncio.sleep(interval)
        raise TimeoutError(f"{self.name} not healthy within {timeout:.0f}s (log: {self.log_path})")

    def drop_manifests(self, names: list[str]) -> int:
        """Writes each pod's manifest in staging, then renames them all into the manifest directory.

        Returns the wall-clock nanoseconds just before the first rename: the start of the measurement.
        """
        staged = []
        for name in names:
            path = self.staging_dir / f"{name}.yaml"
            path.write_text(pod_manifest(name))
            staged.append(path)
        started = time.time_ns()
        for path in staged:
            os.rename(path, self.manifest_dir / path.name)
        return started

    def rss_mb(self) -> float:
        """VmRSS from /proc/<pid>/status, in MiB."""
        if (rss := procstat.rss_mb(self.pid)) is None:
            raise RuntimeError(f"no VmRSS for pid {self.pid}")
        return rss

    def cpu_seconds(self) -> float:
        """CPU time of every thread of the agent so far (procstat.cpu_seconds)."""
        return procstat.cpu_seconds(self.pid)


class AgentProcess(NodeProcess):
    """One `edgelet run` with its own root_dir, manifest directory and ops port, as a user starts it."""

    name = "edgelet"

    def __init__(self, workdir: Path, endpoint: str, *, extra_toml: str = ""):
        super().__init__(workdir, log_name="agent.log")
        self.ops_port = self.http_port
        self.config_path = workdir / "edgelet.toml"
        # Defaults everywhere except the paths: relist 1 s, sync 1 m, housekeeping 2 s, 110 pods.
        self.config_path.write_text(textwrap.dedent(f"""\
            node_name = "{NODE_NAME}"
            root_dir = "{self.root_dir}"
            pod_logs_dir = "{workdir / "log" / "pods"}"
            container_logs_dir = "{workdir / "log" / "containers"}"

            [runtime]
            endpoint = "{endpoint}"

            [pods]
            manifest_dir = "{self.manifest_dir}"

            [server]
            address = "127.0.0.1:{self.ops_port}"
            """) + extra_toml)

    @property
    def status_dir(self) -> Path:
        """Where the StatusManager keeps one checkpoint per pod (root_dir/state/pods)."""
        return self.root_dir / "state" / "pods"

    def start(self) -> AgentProcess:
        """Starts the agent as the service unit does: with the unit's environment and the package's bytecode."""
        self._spawn([sys.executable, "-m", "edgelet", "run", "--config", str(self.config_path)], agent_environment())
        return self


# -- the agent's own metrics ----------------------------------------------------------------------

CRI_STEPS = ("run_podsandbox", "create_container", "start_container")
# The relist's own calls and the periodic ones (runtime Status every 5 s, the eviction manager's
# ImageFsInfo, image GC's ListImages): what is left of a phase's calls is what its pods caused.
RELIST_CALLS = ("list_podsandbox", "list_containers")
PERIODIC_CALLS = ("status", "version", "image_fs_info", "list_images")
_SAMPLE = re.compile(r'^(kubelet_runtime_operations_duration_seconds|kubelet_pleg_relist_duration_seconds'
                     r'|kubelet_pod_worker_duration_seconds)_(sum|count)(?:\{operation_type="([a-z_]+)"\})? (\S+)$',
                     re.M)
_PLEG_EVENTED = re.compile(r"^edgelet_pleg_evented (\S+)$", re.M)


@dataclass(frozen=True, slots=True)
class Scrape:
    """What the benchmark reads from the agent's /metrics: CRI operations (seconds, calls) by type, relists
    done, pod-worker syncs done (all work types)."""

    operations: dict[str, tuple[float, float]]
    relists: float
    syncs: float
    pleg_evented: bool = False  # container events drive the relists (else: every relist_period)

    def calls(self) -> float:
        return sum(calls for _, calls in self.operations.values())


def parse_scrape(metrics_text: str) -> Scrape:
    operations: dict[str, list[float]] = {}
    relists = syncs = 0.0
    for metric, kind, operation, value in _SAMPLE.findall(metrics_text):
        if metric == "kubelet_runtime_operations_duration_seconds":
            operations.setdefault(operation, [0.0, 0.0])[0 if kind == "sum" else 1] = float(value)
        elif kind == "count" and metric == "kubelet_pleg_relist_duration_seconds":
            relists = float(value)
        elif kind == "count":
            syncs += float(value)
    evented = _PLEG_EVENTED.search(metrics_text)
    return Scrape({op: (seconds, calls) for op, (seconds, calls) in operations.items()}, relists, syncs,
                  pleg_evented=bool(evented and float(evented.group(1))))


async def scrape(agent: AgentProcess) -> Scrape:
    status, body = await agent.http_get("/metrics")
    if status != 200:
        raise RuntimeError(f"GET /metrics answered {status}")
    return parse_scrape(body.decode())


def mean_step_ms(before: Scrape, after: Scrape) -> dict[str, float]:
    """Mean milliseconds per call of each pod-start CRI step between two scrapes."""
    means = {}
    for step in CRI_STEPS:
        seconds = after.operations.get(step, (0.0, 0.0))[0] - before.operations.get(step, (0.0, 0.0))[0]
        calls = after.operations.get(step, (0.0, 0.0))[1] - before.operations.get(step, (0.0, 0.0))[1]
        means[step] = 1e3 * seconds / calls if calls else float("nan")
    return means


def calls_between(before: Scrape, after: Scrape) -> dict[str, float]:
    """CRI calls by operation type made between two scrapes (types with none left out)."""
    delta = {op: calls - before.operations.get(op, (0.0, 0.0))[1] for op, (_, calls) in after.operations.items()}
    return {op: n for op, n in delta.items() if n}


def calls_per_pod_start(before: Scrape, after: Scrape, pods: int) -> dict[str, float]:
    """CRI calls by type per pod started between two scrapes, without each relist's two lists and the
    periodic calls (which run whether pods start or not)."""
    calls = calls_between(before, after)
    relists = after.relists - before.relists
    for op in RELIST_CALLS:
        calls[op] = calls.get(op, 0.0) - relists
    return {op: n / pods for op, n in calls.items() if op not in PERIODIC_CALLS and n > 0}


# -- idle costs -----------------------------------------------------------------------------------


class WriteCounter:
    """Counts checkpoint writes into a directory with inotify: each write is a rename onto its file
    (temp file + rename), each removal an unlink; temp files (dot-names) are not counted. Note that inotify
    folds identical events queued back to back: poll often to count rewrites of one file."""

    def __init__(self, directory: Path):
        self._inotify = inotify.Inotify()
        self._inotify.add_watch(str(directory), inotify.IN_MOVED_TO | inotify.IN_DELETE | inotify.IN_ONLYDIR)
        self.total = 0
        self.names: collections.Counter[str] = collections.Counter()  # what was written, for the report
        self.overflowed = False

    def poll(self) -> int:
        """Counts what happened since the last poll; returns that count."""
        new = 0
        for event in self._inotify.read():
            if event.mask & inotify.IN_Q_OVERFLOW:
                self.overflowed = True
            elif event.name and not event.name.startswith("."):
                self.names[event.name] += 1
                new += 1
        self.total += new
        return new

    async def wait_quiet(self, quiet: float, timeout: float) -> bool:
        """Until no write for `quiet` seconds (True), or `timeout` passed (False)."""
        deadline = time.monotonic() + timeout
        last_write = time.monotonic()
        while time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            if self.poll():
                last_write = time.monotonic()
            elif time.monotonic() - last_write >= quiet:
                return True
        return False

    def close(self) -> None:
        self._inotify.close()


@dataclass(frozen=True, slots=True)
class Usage:
    cpu_pct: float  # % of one core over the window
    rss_mb: float  # at the end of the window
    window_s: float


async def measure_usage(agent: NodeProcess, seconds: float) -> Usage:
    """CPU of the agent over `seconds` of doing nothing but its own periodic work, and its RSS after."""
    cpu_before, started = agent.cpu_seconds(), time.monotonic()
    await asyncio.sleep(seconds)
    agent.check_alive()
    cpu_after, elapsed = agent.cpu_seconds(), time.monotonic() - started
    return Usage(100.0 * (cpu_after - cpu_before) / elapsed, agent.rss_mb(), elapsed)


# -- agent phases ---------------------------------------------------------------------------------


def pod_label(name: str) -> dict[str, str]:
    """The selector of a static pod's containers: the agent names it <name>-<node>."""
    return {labels.POD_NAME: f"{name}-{NODE_NAME}"}


async def agent_start(client: RuntimeClient, agent: NodeProcess, name: str) -> float:
    """Seconds from renaming one pod's manifest into the manifest directory to its container running."""
    dropped = agent.drop_manifests([name])
    await asyncio.sleep(FIRST_POLL_AFTER)
    running = await wait_running(client, 1, pod_label(name), timeout=60, interval=POLL_INTERVAL)
    seen = time.time_ns()
    (started,) = await started_at(client, running)
    if not dropped <= started <= seen:
        raise RuntimeError(f"{name}: started_at {started} outside [{dropped}, {seen}]: clocks disagree")
    agent.check_alive()
    return (started - dropped) / 1e9


async def agent_restart(agent: AgentProcess, pods: int, *, interval: float = 0.01,
                        timeout: float = 60.0) -> tuple[float, float, float]:
    """Restarts `agent` (SIGTERM, then `edgelet run` again on the same root_dir and manifests) with `pods`
    running pods. Returns seconds from the exec to /healthz ok, to every pod synced once by its worker
    (adopted), and the StartContainer calls the new agent made (0 when it adopted rather than restarted)."""
    agent.stop()
    started = time.monotonic()
    agent.start()
    await agent.wait_ready(timeout, interval=interval)
    healthy = agent.ready_at - started
    deadline = started + timeout
    while True:
        figures = await scrape(agent)
        if figures.syncs >= pods:
            adopted = time.monotonic() - started
            return healthy, adopted, figures.operations.get("start_container", (0.0, 0.0))[1]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{figures.syncs:.0f} of {pods} pods synced {timeout:.0f}s after the restart")
        await asyncio.sleep(interval)


async def agent_burst(client: RuntimeClient, agent: NodeProcess, count: int) -> float:
    """Seconds from the first of `count` manifest renames to the last of their containers running."""
    names = [f"burst-{i:03d}" for i in range(count)]
    dropped = agent.drop_manifests(names)
    running = await wait_running(client, count, timeout=300, interval=BURST_POLL_INTERVAL)
    return (max(await started_at(client, running)) - dropped) / 1e9
