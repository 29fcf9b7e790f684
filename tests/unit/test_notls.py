"""edgelet.notls: a config with no TLS endpoint runs without OpenSSL, and still hashes and runs its loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from edgelet.config import parse_config
from edgelet.notls import config_needs_tls, without_openssl

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize(
    ("data", "needs"),
    [
        ({}, False),
        ({"pods": {"manifest_dir": "/etc/edgelet/manifests"}}, False),
        ({"kubelet_api": {"address": "0.0.0.0:10250"}}, False),  # served only with [cluster]
        ({"pods": {"http_url": "https://config.example/pods"}}, True),
        ({"pods": {"http_url": "http://127.0.0.1:8080/pods"}}, True),  # httpx builds a TLS context per client
        ({"cluster": {"kubeconfig": "/etc/edgelet/kubeconfig"}}, True),
    ],
)
def test_config_needs_tls(data, needs):
    assert config_needs_tls(parse_config({"node_name": "n", **data}, base_dir="/")) is needs


def test_changes_nothing_once_ssl_is_loaded():
    import ssl

    assert without_openssl() is False
    assert sys.modules["ssl"] is ssl and sys.modules.get("_hashlib") is not None


_WITHOUT_OPENSSL = textwrap.dedent("""
    import json, sys
    from edgelet.notls import TLSNotLoaded, without_openssl
    assert without_openssl()
    import asyncio, hashlib, secrets, ssl, uvloop

    refused = []
    for make in (ssl.create_default_context, ssl.SSLContext):
        try:
            make()
        except TLSNotLoaded as exc:
            refused.append(str(exc))

    async def echo_over_a_socketpair():
        reader, writer = await asyncio.open_connection(sock=sock_a)
        peer_reader, peer_writer = await asyncio.open_connection(sock=sock_b)
        writer.write(b"ping")
        data = await peer_reader.readexactly(4)
        writer.close()
        peer_writer.close()
        return data.decode()

    import socket
    sock_a, sock_b = socket.socketpair()
    uvloop.install()
    echoed = asyncio.run(echo_over_a_socketpair())
    with open("/proc/self/maps") as maps:
        libcrypto = "libcrypto" in maps.read()
    print(json.dumps({
        "sha256": hashlib.sha256(b"edgelet").hexdigest(),
        "md5": hashlib.md5(b"edgelet", usedforsecurity=False).hexdigest(),
        "blake2b": hashlib.blake2b(b"edgelet", digest_size=16).hexdigest(),
        "token": len(secrets.token_hex(8)),
        "refused": refused, "echoed": echoed, "libcrypto": libcrypto,
        "loaded": sorted(m for m in ("_ssl", "_hashlib") if sys.modules.get(m) is not None),
    }))
""")


def test_a_process_without_openssl_hashes_alike_and_runs_uvloop():
    import hashlib

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", _WITHOUT_OPENSSL], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["sha256"] == hashlib.sha256(b"edgelet").hexdigest()  # checkpoints stay readable across the two
    assert seen["md5"] == hashlib.md5(b"edgelet", usedforsecurity=False).hexdigest()
    assert seen["blake2b"] == hashlib.blake2b(b"edgelet", digest_size=16).hexdigest()
    assert seen["token"] == 16
    assert seen["echoed"] == "ping"
    assert seen["loaded"] == [] and seen["libcrypto"] is False
    assert len(seen["refused"]) == 2
    assert "[cluster]" in seen["refused"][0] and "http_url" in seen["refused"][0]
