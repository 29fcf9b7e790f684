"""The cost of one /metrics/cadvisor scrape at N pods, on a private containerd (not part of `make bench`).

Starts hack/local-containerd.sh and a standalone agent with N busybox pods (one container each, on the host's
network), then, in this process, runs the collector of /metrics/cadvisor against that runtime and the pods'
cgroups as the kubelet API would: a warm-up scrape, then `--scrapes` timed ones. Prints wall and CPU
milliseconds per scrape (the CPU of every thread of this process: the cgroup reads run in one), the peak of
Python allocations during a scrape, the size of the text and its series.

    python -m bench.cadvisor_scrape --pods 20 --pods 110
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from bench.procstat import rss_mb
from edgelet.cadvisor.collector import CadvisorCollector
from edgelet.cri.client import RuntimeClient
from tests.helpers import busybox_manifest, wait_for
from tests.integration.agent_harness import REPO, AgentProcess


def start_containerd(state: Path) -> str:
    started = subprocess.run(["bash", str(REPO / "hack" / "local-containerd.sh"), "start", str(state)],
                             capture_output=True, text=True, timeout=300, check=True)
    return started.stdout.strip().splitlines()[-1]


def running_pods(agent: AgentProcess) -> int:
    return sum(1 for pod in agent.pods().values() if pod["status"].get("phase") == "Running")


async def measure(endpoint: str, scrapes: int) -> dict[str, float]:
    async with RuntimeClient(endpoint, timeout=60.0) as runtime:
        collector = CadvisorCollector(runtime, container_facts=dict)
        text = await collector.scrape()  # warm-up: imports, the machine's facts
        walls, cpus, peaks = [], [], []
        for _ in range(scrapes):
            tracemalloc.start()
            wall, cpu = time.perf_counter(), time.process_time()
            text = await collector.scrape()
            cpus.append(time.process_time() - cpu)
            walls.append(time.perf_counter() - wall)
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
        series = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
        return {"wall_ms": statistics.median(walls) * 1e3, "cpu_ms": statistics.median(cpus) * 1e3,
                "peak_mib": max(peaks) / 2**20, "text_kib": len(text) / 1024, "series": series}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, action="append", required=True)
    parser.add_argument("--scrapes", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cadvisor-scrape-") as tmp:
        workdir = Path(tmp)
        endpoint = start_containerd(workdir / "containerd")
        agent = AgentProcess(workdir / "agent", endpoint).start()
        try:
            started = 0
            for count in sorted(args.pods):
                for index in range(started, count):
                    agent.write_manifest(f"p{index}.yaml", busybox_manifest(f"p{index}", "exec sleep 36000"))
                started = count
                wait_for(lambda count=count: running_pods(agent) >= count, 600, interval=2,
                         what=f"{count} pods running")
                time.sleep(5)
                figures = asyncio.run(measure(endpoint, args.scrapes))
                print(f"{count} pods: one scrape {figures['wall_ms']:.1f} ms wall, {figures['cpu_ms']:.1f} ms CPU, "
                      f"peak {figures['peak_mib']:.2f} MiB allocated, {figures['text_kib']:.0f} KiB, "
                      f"{figures['series']:.0f} series (this process: {rss_mb(os.getpid()):.1f} MiB RSS)",
                      flush=True)
        finally:
            agent.close()
            subprocess.run(["bash", str(REPO / "hack" / "local-containerd.sh"), "stop", str(workdir / "containerd")],
                           capture_output=True, timeout=300)
    return 0


if __name__ == "__main__":
    sys.exit(main())
