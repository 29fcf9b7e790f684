"""What the konnectivity tunnel adds to a cluster node's memory, idle: `python -m bench.bench_tunnel`.

Two child processes side by side, each with the modules a joined cluster node imports (`edgelet run`'s, the
API client, node status): one also opens the tunnel (edgelet/tunnel) to a real konnectivity-server on loopback
and holds its stream; the other does not import it. The difference of their VmRSS (and of their private
memory, which leaves out the shared library pages both could share) is the tunnel's cost. konnectivity-server
is the one `make e2e-deps` builds (hack/konnectivity.sh); the PKI is made here with the openssl command.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KONNECTIVITY_SERVER = Path(os.environ.get("EDGELET_CACHE", "/var/cache/edgelet")) / "konnectivity" / "bin" / \
    "konnectivity-server"

CHILD = textwrap.dedent("""\
    import asyncio, json, os, sys, time
    import edgelet.agent, edgelet.cli, edgelet.kubeapi.client, edgelet.nodestatus.manager  # a cluster node's set

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

    async def main(with_tunnel, address, pki, settle):
        # Both hold what a joined node's API client holds: a context with the node's client certificate and one
        # TLS connection (here to the same server), so only the tunnel's own cost is left in the difference.
        from edgelet.kubeapi.kubeconfig import KubeConfig, ssl_context
        context = ssl_context(KubeConfig(path="bench", context="bench", server="https://" + address, ca_file=f"{pki}/ca.crt",
                                         client_cert_file=f"{pki}/node.crt", client_key_file=f"{pki}/node.key"))
        host, port = address.rsplit(":", 1)
        api = await asyncio.open_connection(host, int(port), ssl=context, server_hostname=host)
        if with_tunnel:
            from edgelet.config import TunnelConfig
            from edgelet.tunnel.agent import Tunnel
            from edgelet.tunnel.policy import Destinations, agent_identifiers
            read = lambda name: open(f"{pki}/{name}", "rb").read()
            tunnel = Tunnel(TunnelConfig(servers=(address,)), node_name="bench", identifiers=agent_identifiers("bench", []),
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
        os._exit(0)  # the reading is taken: no orderly shutdown of the stream to wait for

    asyncio.run(main(sys.argv[1] == "1", sys.argv[2], sys.argv[3], float(sys.argv[4])))
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=10.0, help="idle seconds before each reading")
    opts = parser.parse_args()
    if not KONNECTIVITY_SERVER.exists():
        print(f"{KONNECTIVITY_SERVER} is missing: `make e2e-deps` builds it", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="edgelet-bench-tunnel-") as tmp:
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
            env = {**os.environ, "PYTHONPATH": str(REPO), "MALLOC_ARENA_MAX": "2", "GRPC_VERBOSITY": "NONE"}
            rows = []
            for _ in range(opts.rounds):
                children = [subprocess.Popen([sys.executable, "-c", CHILD, flag, f"127.0.0.1:{agent_port}", str(pki),
                                              str(opts.settle)], env=env, stdout=subprocess.PIPE, text=True)
                            for flag in ("0", "1")]
                (rss_off, private_off), (rss_on, private_on) = (json.loads(child.communicate()[0]) for child in children)
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
