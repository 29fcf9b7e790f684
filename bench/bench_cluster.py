"""The benchmark in the mode devices run: a node joined with a bootstrap token to the API server double over TLS
(cluster-info discovery with the CA pin, a CSR signed for its client certificate, rotated once), the kubelet API
on, 110 pods from the API; RSS and PSS over idle windows, then restarts to healthy and every pod adopted."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import bench_agent as agent_bench
from bench import procstat
from edgelet.cri.client import RuntimeClient
from tests.kubeapi_double import ApiServerDouble
from tests.kubeapi_double.joining import CLIENT_SIGNER, ClusterPKI, cluster_info, crypto_mapped, join_toml
from tests.runtime_cleanup import empty_runtime, remove_pod_cgroups

ROTATION_TIMEOUT = 90.0
SETTLE_S = 5.0


@dataclass
class ClusterResults:
    join_s: float = float("nan")  # exec -> /healthz ok on a fresh root_dir (discovery, CSR, signed)
    rotated_s: float = float("nan")  # exec -> the second client certificate issued
    idle: list[agent_bench.Usage] = field(default_factory=list)
    pss_mb: list[float] = field(default_factory=list)  # one per idle window, read at its end
    restart_healthy_ms: list[float] = field(default_factory=list)
    restart_ms: list[float] = field(default_factory=list)
    restart_started_containers: float = 0.0
    crypto_in_agent: bool = False  # whether any `cryptography` library is mapped into the agent after it all


def api_pod(name: str) -> dict[str, Any]:
    """The benchmark's workload (bench_agent.pod_manifest) as the API server holds it, bound to the node."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": agent_bench.NODE_NAME, "hostNetwork": True, "terminationGracePeriodSeconds": 0,
                     "restartPolicy": "Always", "containers": [{
                         "name": "main", "image": agent_bench.IMAGE, "imagePullPolicy": "IfNotPresent",
                         "command": ["sleep", "3600"]}]}}


async def bench_cluster(endpoint: str, client: RuntimeClient, workdir: Path, pods: int, *, windows: int,
                        window_s: float, restarts: int) -> ClusterResults:
    results = ClusterResults()
    pki = ClusterPKI(workdir / "pki")
    with ApiServerDouble(ssl_context=pki.server_context(), node_name=agent_bench.NODE_NAME) as api:
        api.csr_signer = pki.sign
        api.create("configmaps", cluster_info(api.url, pki.ca_pem), "kube-public")
        agent = agent_bench.AgentProcess(workdir / "agent", endpoint,
                                         extra_toml=join_toml(api.url, pki.ca_cert_hash(),
                                                              agent_bench._free_loopback_port()))
        started = time.monotonic()
        agent.start()
        try:
            await agent.wait_ready(120.0)
            results.join_s = agent.ready_at - started
            deadline = time.monotonic() + ROTATION_TIMEOUT
            while pki.issued.count(CLIENT_SIGNER) < 2:
                agent.check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no certificate rotation within {ROTATION_TIMEOUT:.0f}s")
                await asyncio.sleep(0.2)
            results.rotated_s = time.monotonic() - started
            await asyncio.sleep(SETTLE_S)  # the new certificate in use, the old connections gone
            for i in range(pods):
                api.create("pods", api_pod(f"cluster-{i:03d}"))
            await agent_bench.wait_running(client, pods, timeout=300, interval=agent_bench.POLL_INTERVAL)
            await asyncio.sleep(SETTLE_S * 2)
            for _ in range(windows):
                results.idle.append(await agent_bench.measure_usage(agent, window_s))
                results.pss_mb.append(procstat.pss_mb(agent.pid) or float("nan"))
            results.crypto_in_agent = crypto_mapped(agent.pid)
            for _ in range(restarts):
                healthy, adopted, started_containers = await agent_bench.agent_restart(agent, pods)
                results.restart_healthy_ms.append(healthy * 1e3)
                results.restart_ms.append(adopted * 1e3)
                results.restart_started_containers += started_containers
                await asyncio.sleep(SETTLE_S)
            agent.check_alive()
        finally:
            agent.stop()
    await empty_runtime(client)
    await remove_pod_cgroups()
    return results
