"""What every chaos experiment shares: the scale of the run, the figures it reports, an agent whose peak memory is
recorded, and a synchronous view of the runtime (what CRI says runs, by pod uid).
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from edgelet.container import labels
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.cri import runtime_v1_pb2_grpc as pb_grpc
from edgelet.util import checkpoint
from tests.integration.agent_harness import AgentProcess, free_port
from tests.runtime_cleanup import empty_runtime_at

FIGURES_ENV = "CHAOS_FIGURES"
FIGURE_NAMES = ("kill9_rounds", "duplicates", "lost", "orphans", "needless_restarts", "stale_peak",
                "runtime_losses", "recover_p95_s", "damage_cases", "damage_failures", "fuzz_cases",
                "fuzz_failures", "peak_rss_mb")


@dataclass(frozen=True)
class Scale:
    """How much of each experiment a run does: `full` is `make chaos`, `small` the fast slice for CI."""

    name: str
    kill9_rounds: int
    kill9_check_every: int
    runtime_losses: int
    fuzz_cases: int
    config_fuzz_cases: int
    api_fuzz_cases: int
    clock_window_s: float
    damage_modes: tuple[str, ...]

    @staticmethod
    def from_env() -> Scale:
        name = os.environ.get("CHAOS_SCALE", "full")
        if name == "small":
            return Scale(name, kill9_rounds=10, kill9_check_every=5, runtime_losses=2, fuzz_cases=120,
                         config_fuzz_cases=40, api_fuzz_cases=40, clock_window_s=8.0,
                         damage_modes=("garble", "wrong-content"))
        if name == "full":
            return Scale(name, kill9_rounds=100, kill9_check_every=10, runtime_losses=10, fuzz_cases=800,
                         config_fuzz_cases=250, api_fuzz_cases=250, clock_window_s=16.0,
                         damage_modes=("truncate", "garble", "empty", "delete", "wrong-content"))
        raise ValueError(f"CHAOS_SCALE must be small or full, not {name!r}")


@dataclass
class Figures:
    """The run's figures; experiments add to them, the session writes them out and prints the CHAOS line."""

    values: dict[str, float | int] = field(default_factory=lambda: dict.fromkeys(FIGURE_NAMES, 0))
    measured: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        """One experiment's own figures, printed above the CHAOS line."""
        self.notes.append(text)

    def add(self, name: str, amount: float | int = 1) -> None:
        self.values[name] += amount
        self.measured.add(name)

    def peak(self, name: str, value: float | int) -> None:
        self.values[name] = max(self.values[name], value)
        self.measured.add(name)

    def set(self, name: str, value: float | int) -> None:
        self.values[name] = value
        self.measured.add(name)

    def line(self) -> str:
        def text(name: str) -> str:
            if name not in self.measured:
                return "-"
            value = self.values[name]
            return f"{value:.1f}" if isinstance(value, float) else str(value)

        return "CHAOS " + " ".join(f"{name}={text(name)}" for name in FIGURE_NAMES)

    def dump(self, path: str) -> None:
        Path(path).write_text(json.dumps({"values": self.values, "measured": sorted(self.measured),
                                          "notes": self.notes}))

    @staticmethod
    def load(path: str) -> Figures:
        data = json.loads(Path(path).read_text())
        return Figures(values=data["values"], measured=set(data["measured"]), notes=data["notes"])


class ChaosAgent(AgentProcess):
    """The real agent as a subprocess; every stop or kill records its peak RSS (VmHWM) into the figures first."""

    def __init__(self, workdir: Path, endpoint: str, figures: Figures, *, healthz: bool = False, **kwargs):
        self.port = free_port() if healthz else 0
        if healthz:
            kwargs["server_address"] = f"127.0.0.1:{self.port}"
        super().__init__(workdir, endpoint, **kwargs)
        self.figures = figures
        self.peak_rss_mb = 0.0

    def set_backoff(self, initial: str, maximum: str) -> None:
        text = self.config_path.read_text()
        text = text.replace('crashloop_initial = "1s"', f'crashloop_initial = "{initial}"')
        self.config_path.write_text(text.replace('crashloop_max = "4s"', f'crashloop_max = "{maximum}"'))

    def rss_mb(self) -> float:
        """The agent's peak resident memory so far (0 once it is gone)."""
        if self.proc is None:
            return 0.0
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return 0.0
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def record_rss(self) -> None:
        self.peak_rss_mb = max(self.peak_rss_mb, self.rss_mb())
        self.figures.peak("peak_rss_mb", round(self.peak_rss_mb, 1))

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, *args, **kwargs) -> int:
        self.record_rss()
        return super().stop(*args, **kwargs)

    def healthz(self) -> tuple[int, str]:
        """(HTTP status, body) of /healthz?verbose; (0, reason) when nothing answers."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz?verbose", timeout=3) as answer:
                return answer.status, answer.read().decode(errors="replace")
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode(errors="replace")
        except OSError as err:
            return 0, str(err)

    def log_since(self, offset: int) -> str:
        with open(self.log_path, "rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0


@dataclass(frozen=True, slots=True)
class Seen:
    """One container as CRI lists it."""

    id: str
    uid: str
    name: str
    state: int
    attempt: int


@dataclass
class RuntimeView:
    """What CRI has, grouped by pod uid (one List call each for sandboxes and containers)."""

    sandboxes: dict[str, list[pb.PodSandbox]] = field(default_factory=lambda: defaultdict(list))
    containers: dict[str, list[Seen]] = field(default_factory=lambda: defaultdict(list))

    def running(self, uid: str, name: str = "main") -> list[Seen]:
        return [c for c in self.containers.get(uid, ()) if c.name == name and c.state == pb.CONTAINER_RUNNING]

    def ready_sandboxes(self, uid: str) -> list[pb.PodSandbox]:
        return [s for s in self.sandboxes.get(uid, ()) if s.state == pb.SANDBOX_READY]

    def uids(self) -> set[str]:
        return set(self.sandboxes) | set(self.containers)

    def all_running(self, uids: set[str]) -> bool:
        return all(self.running(uid) and self.ready_sandboxes(uid) for uid in uids)

    def live_uids(self) -> set[str]:
        """Pods with a ready sandbox or a running container."""
        live = {uid for uid, boxes in self.sandboxes.items() if any(s.state == pb.SANDBOX_READY for s in boxes)}
        return live | {uid for uid,
                       seen in self.containers.items() if any(c.state == pb.CONTAINER_RUNNING for c in seen)}


class Runtime:
    """A blocking CRI connection for the test's own bookkeeping (the agent has its own)."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self._channel = grpc.insecure_channel(endpoint)
        self._stub = pb_grpc.RuntimeServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def view(self) -> RuntimeView:
        view = RuntimeView()
        for sandbox in self._stub.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10).items:
            view.sandboxes[sandbox.labels.get(labels.POD_UID, "")].append(sandbox)
        for container in self._stub.ListContainers(pb.ListContainersRequest(), timeout=10).containers:
            view.containers[container.labels.get(labels.POD_UID, "")].append(Seen(
                container.id, container.labels.get(labels.POD_UID, ""), container.metadata.name,
                container.state, container.metadata.attempt))
        return view

    def try_view(self) -> RuntimeView | None:
        try:
            return self.view()
        except grpc.RpcError:
            return None

    def remove_everything(self) -> None:
        """Empties the runtime (a killed agent can leave a StartContainer running on in containerd: see
        tests.runtime_cleanup)."""
        empty_runtime_at(self.endpoint)


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile: the smallest value with at least `fraction` of the values at or below it."""
    ordered = sorted(values)
    rank = max(1, -(-int(fraction * 100) * len(ordered) // 100))
    return ordered[rank - 1]


def checkpoint_kind(data: bytes) -> str | None:
    """The kind a checkpoint's header names, or None when the bytes do not start like a checkpoint."""
    header = re.match(rb"EDGELET-CHECKPOINT 1 ([a-z0-9.-]+) ", data)
    return header.group(1).decode() if header else None


def checkpoint_problem(path: Path) -> str | None:
    """What is wrong with a checkpoint file, read as the kind its header names; None when it is intact."""
    data = path.read_bytes()
    try:
        checkpoint.decode(data, checkpoint_kind(data) or "?")
    except checkpoint.CorruptCheckpoint as problem:
        return str(problem)
    return None
