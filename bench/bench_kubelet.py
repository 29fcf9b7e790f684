"""The upstream kubelet beside edgelet in `make bench`: the same static pods, started one at a time and 110 at once,
then RSS and idle CPU at 110 pods, with the kubelet running standalone (static pods from its staticPodPath, no API
server) on a private containerd of its own. See docs/benchmarks.md ("Beside the kubelet")."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench import bench_agent as agent_bench
from edgelet.cri.client import RuntimeClient
from tests.integration.agent_harness import unmount_under
from tests.runtime_cleanup import empty_runtime

K8S_BINARIES = agent_bench.REPO / "hack" / "k8s-binaries.sh"
CGROUP_MOUNT = Path("/sys/fs/cgroup")
# The kubelet links every container's log here whatever its podLogsDir (a fixed path in the kubelet).
CONTAINER_LOG_LINKS = Path("/var/log/containers")
# What the kubelet sets at start (protectKernelDefaults false: it modifies them, true: it refuses to start unless
# they already have its values). The benchmark puts back what it found.
KERNEL_TUNABLES = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
                   "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")
_VERSION = re.compile(r"\bv(\d+\.\d+\.\d+\S*)")


@dataclass
class KubeletResults:
    version: str = ""  # "1.36.2": empty when the kubelet was not measured
    seq_ms: list[float] = field(default_factory=list)  # manifest renamed -> container started_at
    burst_s: list[float] = field(default_factory=list)  # one per burst, each a fresh kubelet's first
    burst_cpu_s: list[float] = field(default_factory=list)  # the kubelet's CPU time during each burst
    idle: list[agent_bench.Usage] = field(default_factory=list)  # consecutive windows at 110 pods


def parse_version(text: str) -> str:
    """"1.36.2" from `kubelet --version` ("Kubernetes v1.36.2")."""
    found = _VERSION.search(text)
    if not found:
        raise ValueError(f"kubelet --version: no version in {text.strip()!r}")
    return found.group(1)


def kubelet_config(*, endpoint: str, static_pod_path: Path, pod_logs_dir: Path, volume_plugin_dir: Path,
                   cgroup_root: str, port: int, healthz_port: int) -> dict:
    """The KubeletConfiguration of a standalone kubelet on its own containerd, defaults everywhere else (sync every
    1 m, PLEG relist every 1 s, 110 pods), as the benchmark runs edgelet."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # Since 1.35 the kubelet refuses a cgroup v1 host unless told otherwise; it takes the cgroup driver from
        # the runtime where the runtime says (containerd >= 2.0), else from here.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        # A QoS tree of its own: under "/" it would share /kubepods with edgelet and the tests, and kill the
        # processes of every pod cgroup there it did not make.
        "cgroupRoot": cgroup_root,
        "containerRuntimeEndpoint": endpoint,
        "staticPodPath": str(static_pod_path),
        "podLogsDir": str(pod_logs_dir),
        "volumePluginDir": str(volume_plugin_dir),
        # Only loopback, nothing anonymous and no webhook (there is no API server to ask), no read-only port.
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        # A busy shared disk must not make it evict the benchmark's pods.
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%",
                         "imagefs.available": "1%"},
        "failSwapOn": False,
        "makeIPTablesUtilChains": False,
    }


def fetch_kubelet() -> Path:
    """The kubelet binary, decompressed once into the cache and checked (hack/k8s-binaries.sh fetch)."""
    fetched = subprocess.run(["bash", str(K8S_BINARIES), "fetch"], capture_output=True, text=True, timeout=900)
    if fetched.returncode != 0:
        raise RuntimeError(f"hack/k8s-binaries.sh fetch failed (EDGELET_K8S_DIR names the shared binaries; "
                           f"--skip-kubelet leaves the kubelet out):\n{fetched.stderr.strip()}")
    binary = Path(fetched.stdout.strip().splitlines()[-1]) / "kubelet"
    if not os.access(binary, os.X_OK):
        raise RuntimeError(f"{binary}: not an executable kubelet")
    return binary


def kubelet_version(binary: Path) -> str:
    return parse_version(subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30,
                                        check=True).stdout)


class KubeletProcess(agent_bench.NodeProcess):
    """One standalone kubelet: its own root, certificate and plugin directories, /healthz on a free loopback port,
    and the benchmark's node name so that its static pods carry the names edgelet gives them."""

    name = "kubelet"

    def __init__(self, binary: Path, workdir: Path, endpoint: str, cgroup_root: str):
        super().__init__(workdir, log_name="kubelet.log")
        self.binary = binary
        self.pod_logs_dir = workdir / "pod-logs"
        self.config_path = workdir / "kubelet.json"
        config = kubelet_config(endpoint=endpoint, static_pod_path=self.manifest_dir, pod_logs_dir=self.pod_logs_dir,
                                volume_plugin_dir=workdir / "volume-plugins", cgroup_root=cgroup_root,
                                port=agent_bench._free_loopback_port(), healthz_port=self.http_port)
        self.config_path.write_text(json.dumps(config, indent=1) + "\n")

    def start(self) -> KubeletProcess:
        self._spawn([str(self.binary), f"--config={self.config_path}", f"--root-dir={self.root_dir}",
                     f"--cert-dir={self.workdir / 'pki'}", f"--hostname-override={agent_bench.NODE_NAME}"],
                    dict(os.environ))
        return self


# -- what the kubelet changes on the machine, put back -------------------------------------------------------------


@contextlib.contextmanager
def kept_kernel_tunables(root: Path = Path("/proc/sys")) -> Iterator[dict[str, str]]:
    """Reads KERNEL_TUNABLES, and writes back on exit those that changed meanwhile."""
    found = {name: (root / name).read_text().strip() for name in KERNEL_TUNABLES if (root / name).exists()}
    try:
        yield found
    finally:
        for name, value in found.items():
            if (root / name).read_text().strip() != value:
                (root / name).write_text(value + "\n")


def cgroup_hierarchies(mount: Path = CGROUP_MOUNT) -> list[Path]:
    """Where a cgroup lives: the one hierarchy on cgroup v2, else each v1 hierarchy once (a joined one such as
    cpu,cpuacct is reached by several names), and the hybrid layout's `unified`, where runc makes it too."""
    if (mount / "cgroup.controllers").exists():
        return [mount]
    hierarchies: list[Path] = []
    for entry in sorted(mount.iterdir()):
        real = entry.resolve()
        if real.is_dir() and real not in hierarchies:
            hierarchies.append(real)
    return hierarchies


def make_cgroup(name: str, mount: Path = CGROUP_MOUNT) -> None:
    """The kubelet checks that its cgroupRoot exists in every hierarchy; it fills in cpuset's cpus and mems."""
    for hierarchy in cgroup_hierarchies(mount):
        (hierarchy / name.strip("/")).mkdir(exist_ok=True)


def remove_cgroup_tree(name: str, mount: Path = CGROUP_MOUNT) -> list[str]:
    """Removes the cgroup and everything under it, deepest first (they must hold no process); returns those that
    could not be removed."""
    left = []
    for hierarchy in cgroup_hierarchies(mount):
        top = hierarchy / name.strip("/")
        if not top.is_dir():
            continue
        for directory, _, _ in sorted(os.walk(top), key=lambda walked: -len(walked[0])):
            try:
                os.rmdir(directory)
            except OSError as err:
                left.append(f"{directory}: {err.strerror}")
    return left


def remove_log_links(pod_logs_dir: Path, links_dir: Path = CONTAINER_LOG_LINKS) -> None:
    """The links the kubelet made in /var/log/containers to the logs under `pod_logs_dir`."""
    prefix = str(pod_logs_dir) + "/"
    with contextlib.suppress(FileNotFoundError):
        for link in links_dir.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(prefix):
                    link.unlink()


# -- the phases ----------------------------------------------------------------------------------------------------


@dataclass
class KubeletBench:
    """The kubelet's phases, with the settings the benchmark runs edgelet's with."""

    binary: Path
    endpoint: str
    client: RuntimeClient
    workdir: Path
    settle_s: float  # after /healthz first answers
    pause_s: float  # between two sequential starts
    idle_after_s: float  # the idle windows start this long after /healthz first answered
    log: Callable[[str], None]
    cgroup_root: str = field(default_factory=lambda: f"/edgelet-bench-kubelet-{os.getpid()}")

    @contextlib.asynccontextmanager
    async def kubelet(self, name: str) -> AsyncIterator[KubeletProcess]:
        """A fresh kubelet on an empty runtime and cgroup tree; on exit it is stopped and what it left removed."""
        make_cgroup(self.cgroup_root)
        kubelet = KubeletProcess(self.binary, self.workdir / name, self.endpoint, self.cgroup_root).start()
        try:
            await kubelet.wait_ready()
            await asyncio.sleep(self.settle_s)
            yield kubelet
            kubelet.check_alive()
        finally:
            kubelet.stop()
            await empty_runtime(self.client)
            unmount_under(kubelet.workdir)  # it makes its root directory a mount point of its own
            remove_log_links(kubelet.pod_logs_dir)
            if left := remove_cgroup_tree(self.cgroup_root):
                self.log("kubelet: cgroups left behind: " + ", ".join(left))

    async def sequential(self, results: KubeletResults, pods: int) -> None:
        self.log(f"kubelet: {pods} pods one at a time")
        async with self.kubelet("kubelet-seq") as kubelet:
            for i in range(pods):
                results.seq_ms.append(1e3 * await agent_bench.agent_start(self.client, kubelet, f"seq-{i:02d}"))
                await asyncio.sleep(self.pause_s)

    async def bursts(self, results: KubeletResults, rounds: int, pods: int, *, windows: int, window_s: float) -> None:
        """`rounds` bursts, each a fresh kubelet's first; the last kubelet stays up for the idle windows."""
        for round_ in range(rounds):
            self.log(f"kubelet: {pods} manifests at once ({round_ + 1} of {rounds})")
            async with self.kubelet(f"kubelet-burst-{round_}") as kubelet:
                cpu_before = kubelet.cpu_seconds()
                results.burst_s.append(await agent_bench.agent_burst(self.client, kubelet, pods))
                results.burst_cpu_s.append(kubelet.cpu_seconds() - cpu_before)
                if round_ == rounds - 1:
                    await asyncio.sleep(max(kubelet.ready_at + self.idle_after_s - time.monotonic(), 0.0))
                    self.log(f"kubelet, {pods} pods: CPU and RSS over {windows} windows of {window_s:.0f}s")
                    for _ in range(windows):
                        results.idle.append(await agent_bench.measure_usage(kubelet, window_s))


async def bench_kubelet(bench: KubeletBench, *, seq_pods: int, bursts: int, burst_pods: int, windows: int,
                        window_s: float) -> KubeletResults:
    results = KubeletResults(version=kubelet_version(bench.binary))
    with kept_kernel_tunables():
        try:
            if seq_pods:
                await bench.sequential(results, seq_pods)
            if bursts:
                await bench.bursts(results, bursts, burst_pods, windows=windows, window_s=window_s)
        finally:
            remove_cgroup_tree(bench.cgroup_root)
    return results
