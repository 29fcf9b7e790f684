"""What the konnectivity tunnel adds to a cluster node's memory, idle: `python -m bench.bench_tunnel`.

Two child processes side by side, each with the modules a joined cluster node imports (`edgelet run`'s, the
API client, node status) and the connections every such node holds: its CRI channel to a real private
containerd, relisting every second as the PLEG does, and a TLS connection to the API server. One also opens the
tunnel (edgelet/tunnel) to a real konnectivity-server on loopback and holds its stream; the other does not
import it. The difference of their VmRSS (and of their private memory, which leaves out the shared library
pages both could share) is the tunnel's cost. Both children run as `make bench` runs its agents (the service
unit's environment, bytecode optimization level 2, compiled bytecode). Without the CRI channel on both sides the
difference would also hold gRPC's threads and the code pages of its C core that the first channel of a process
brings in, which an agent has from its start (about 3.5 MiB). konnectivity-server is the one `make e2e-deps` builds
(hack/konnectivity.sh); containerd the one `hack/local-containerd.sh` starts; the PKI is made here with the
openssl command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

from bench.bench_agent import agent_environment, compile_bytecode
from bench.run import start_containerd, stop_containerd

REPO = Path(__file__).resolve().parent.parent
KONNECTIVITY_SERVER = Path(os.environ.get("EDGELET_CACHE", "/var/cache/edgelet")) / "konnectivity" / "bin" / \
    "konnectivity-server"

CHILD = textwrap.dedent("""\
    import asyncio, json, os, sys, time
    # a cluster node's set
    import edgelet.kubelet.agent, edgelet.cli.main, edgelet.kubeapi.client, edgelet.nodestatus.manager

    def memory():
        rss = private = 0
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                key, value = line.split(":", 1)
                if key == "Rss":
                    rss = int(value.split()[0])
                elif key in ("Private_Clean", "Private_Dirty"):
                    private += int(value.split()[0])
        return rss, private

    async def relist(runtime):
        while True:
            await runtime.list_pod_sandbox_raw()
            await runtime.list_containers_raw()
            await asyncio.sleep(1)

    async def main(with_tunnel, address, pki, settle, cri):
        # Both hold what every joined node holds: the CRI channel, and the API client's context with the node's
        # client certificate and one TLS connection (here to the same server), so that only the tunnel's own
        # cost is left in the difference.
        from edgelet.cri.client import RuntimeClient
        runtime = RuntimeClient(cri)  # connects at its first call; the child exits without closing it
        await runtime.version()
        relisting = asyncio.create_task(relist(runtime))  # held: the loop keeps only a weak reference
        from edgelet.kubeapi.kubeconfig import KubeConfig, ssl_context
        context = ssl_context(KubeConfig(path="bench", context="bench", server="https://" + address,
                                         ca_file=f"{pki}/ca.crt", client_cert_file=f"{pki}/node.crt",
                                         client_key_file=f"{pki}/node.key"))
        host, port = address.rsplit(":", 1)
        api = await asyncio.open_connection(host, int(port), ssl=context, server_hostname=host)
        if with_tunnel:
            from edgelet.config import TunnelConfig
            from edgelet.tunnel.agent import Tunnel
            from edgelet.tunnel.policy import Destinations, agent_identifiers
            read = lambda name: open(f"{pki}/{name}", "rb").read()
            tunnel = Tunnel(TunnelConfig(servers=(address,)), node_name="bench",
                            identifiers=agent_identifiers("bench", []),
                            destinations=Destinations.build("bench", [], "127.0.0.1:10250"),
                            credentials=lambda: (read("ca.crt"), read("node.key"), read("node.crt")))
            task = asyncio.create_task(tunnel.run())
            deadline = time.monotonic() + 30
            while not tunnel.health()[1].startswith("1/1 konnectivity streams"):
                if time.monotonic() > deadline:
                    raise SystemExit("no stream: " + tunnel.health()[1])
                await asyncio.sleep(0.1)
        await asyncio.sleep(settle)
        print(json.dumps(memory()), flush=True)
        # Both stay until both have read: pages the two share would count as private to the one left alone.
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        os._exit(0)  # no orderly shutdown of the stream to wait for

    asyncio.run(main(sys.argv[1] == "1", sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]))
""")


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(directory: Path) -> None:
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-days", "1", "-subj", "/CN=bench-ca", "-keyout", str(directory / "ca.key"),
            "-out", str(directory / "ca.crt"))
    for name, subject, ext in [("server", "/CN=konnectivity", "subjectAltName=IP:127.0.0.1\n"),
                               ("node", "/O=system:nodes/CN=system:node:bench", "extendedKeyUsage=clientAuth\n")]:
        (directory / f"{name}.ext").write_text(ext)
        openssl("req", "-new", *ec, "-subj", subject, "-keyout", str(directory / f"{name}.key"),
                "-out", str(directory / f"{name}.csr"))
        openssl("x509", "-req", "-in", str(directory / f"{name}.csr"), "-CA", str(directory / "ca.crt"),
                "-CAkey", str(directory / "ca.key"), "-CAcreateserial", "-days", "1",
                "-extfile", str(directory / f"{name}.ext"), "-out", str(directory / f"{name}.crt"))


def free_low_ports(count: int) -> list[int]:
    """Free loopback ports below the ephemeral range, which konnectivity-server refuses for its listeners."""
    ports: list[int] = []
    for port in range(20000 + os.getpid() % 5000, 32000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError("no free ports below the ephemeral range")


@contextlib.contextmanager
def private_containerd(workdir: Path) -> Iterator[str]:
    """A containerd of the runtime the knob names (CONTAINERD), as the agent's CRI peer; yields its endpoint."""
    state = workdir / "containerd"
    try:
        yield start_containerd(state)
    finally:
        stop_containerd(state)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=10.0, help="idle seconds before each reading")
    opts = parser.parse_args()
    if not KONNECTIVITY_SERVER.exists():
        print(f"{KONNECTIVITY_SERVER} is missing: `make e2e-deps` builds it", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("bench-tunnel: needs root to start the private containerd", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="edgelet-bench-tunnel-") as tmp, private_containerd(Path(tmp)) as cri:
        pki = Path(tmp)
        make_pki(pki)
        agent_port, health_port, admin_port = free_low_ports(3)
        server = subprocess.Popen(
            [str(KONNECTIVITY_SERVER), "--mode=grpc", f"--uds-name={pki / 'k.sock'}", "--delete-existing-uds-file",
             "--server-port=0", f"--agent-port={agent_port}", "--agent-bind-address=127.0.0.1",
             f"--health-port={health_port}", "--health-bind-address=127.0.0.1", f"--admin-port={admin_port}",
             "--admin-bind-address=127.0.0.1", f"--cluster-cert={pki / 'server.crt'}",
             f"--cluster-key={pki / 'server.key'}", f"--cluster-ca-cert={pki / 'ca.crt'}", "--server-count=1",
             "--server-id=bench", "--enable-profiling=false"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(2)
            # As `make bench` runs its agents: the service unit's environment, the package's optimization level and
            # compiled bytecode (the tunnel's modules included, or the first round would compile them).
            env = {**agent_environment(), "GRPC_VERBOSITY": "NONE"}
            compile_bytecode()
            subprocess.run([sys.executable, "-c", "import edgelet.tunnel.agent, edgelet.tunnel.wiring"], env=env,
                           cwd=REPO, check=True)
            rows = []
            for _ in range(opts.rounds):
                args = [f"127.0.0.1:{agent_port}", str(pki), str(opts.settle), cri]
                children = [subprocess.Popen([sys.executable, "-c", CHILD, flag, *args], env=env, text=True,
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                            for flag in ("0", "1")]
                readings = [json.loads(child.stdout.readline()) for child in children]
                for child in children:
                    child.communicate("")  # end of input: both have read, both may go
                (rss_off, private_off), (rss_on, private_on) = readings
                rows.append((rss_on - rss_off, private_on - private_off, rss_off, rss_on))
        finally:
            server.terminate()
            server.wait()
    for added_rss, added_private, off, on in rows:
        print(f"tunnel off {off / 1024:.1f} MiB, on {on / 1024:.1f} MiB: adds {added_rss / 1024:.2f} MiB RSS, "
              f"{added_private / 1024:.2f} MiB private")
    median = sorted(r[0] for r in rows)[len(rows) // 2] / 1024
    median_private = sorted(r[1] for r in rows)[len(rows) // 2] / 1024
    print(f"TUNNEL rss_added_mb={median:.2f} private_added_mb={median_private:.2f} rounds={len(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
