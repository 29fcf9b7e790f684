"""What the kubelet API adds to an idle agent's memory: the same cluster-mode agent (joined to the API
server double, no pods) with the API off and on, alternating, RSS read after the agent settled."""

from __future__ import annotations

import asyncio
import statistics
import textwrap
from pathlib import Path

from bench import bench_agent as agent_bench
from tests.kubeapi_double import ApiServerDouble

ROUNDS = 2
SETTLE_S = 5.0


def _cluster_toml(kubeconfig: str, address: str) -> str:
    return textwrap.dedent(f"""
        [cluster]
        kubeconfig = "{kubeconfig}"

        [kubelet_api]
        address = "{address}"
        """)


async def idle_rss_mb(workdir: Path, endpoint: str, api: ApiServerDouble, address: str) -> float:
    workdir.mkdir(parents=True, exist_ok=True)
    kubeconfig = api.write_kubeconfig(str(workdir / "kubeconfig"))
    agent = agent_bench.AgentProcess(workdir, endpoint, extra_toml=_cluster_toml(kubeconfig, address)).start()
    try:
        await agent.wait_ready()
        await asyncio.sleep(SETTLE_S)
        agent.check_alive()
        return agent.rss_mb()
    finally:
        agent.stop()


async def kubelet_api_rss(workdir: Path, endpoint: str) -> tuple[float, float]:
    """(median RSS MiB with the kubelet API off, with it on) over ROUNDS alternating starts."""
    off: list[float] = []
    on: list[float] = []
    with ApiServerDouble() as api:
        for i in range(ROUNDS):
            off.append(await idle_rss_mb(workdir / f"kubelet-api-off-{i}", endpoint, api, ""))
            port = agent_bench._free_loopback_port()
            on.append(await idle_rss_mb(workdir / f"kubelet-api-on-{i}", endpoint, api, f"127.0.0.1:{port}"))
    return statistics.median(off), statistics.median(on)
