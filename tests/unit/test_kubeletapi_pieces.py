"""The kubelet API's pure pieces: the log reader's byte limit and files (lines and their selection are
tests/unit/test_containerlogs.py's), the streaming proxy's request and checks, stats parsing and rates, the
Prometheus text, certificate names."""

from __future__ import annotations

import asyncio

import pytest

from edgelet.kubeletapi.certs import subject_alt_names
from edgelet.kubeletapi.logs import ByteLimit, read_logs
from edgelet.kubeletapi.paths import LogOptions, parse_rfc3339_ns
from edgelet.kubeletapi.stats import (
    CpuRates,
    default_route_interface,
    network_stats,
    parse_net_dev,
    parse_proc_stat,
    resource_metrics,
)
from edgelet.kubeletapi.streaming import StreamingError, loopback_target, request_head, response_status

# -- logs ------------------------------------------------------------------------------------------

def test_byte_limit():
    limit = ByteLimit(5)
    assert limit.take(b"abc") == b"abc" and not limit.exhausted
    assert limit.take(b"defg") == b"de" and limit.exhausted
    assert ByteLimit(None).take(b"x" * 100) == b"x" * 100


async def _read_all(files, options, running=lambda: False) -> bytes:
    return b"".join([chunk async for chunk in read_logs(files, options, still_running=running, batch_bytes=10)])


def _write_cri(path, lines):
    with open(path, "wb") as file:
        for ts, stream, tag, text in lines:
            file.write(f"{ts} {stream} {tag} {text}\n".encode())


async def test_read_logs_reads_rotated_files_first_and_honours_the_options(tmp_path):
    old, live = tmp_path / "0.log.20260101-000000", tmp_path / "0.log"
    _write_cri(old, [("2026-01-01T00:00:01Z", "stdout", "F", "one"), ("2026-01-01T00:00:02Z", "stdout", "P", "tw")])
    _write_cri(live, [("2026-01-01T00:00:03Z", "stdout", "F", "o"), ("2026-01-01T00:00:04Z", "stderr", "F", "three")])
    files = [str(old), str(live)]
    assert await _read_all(files, LogOptions()) == b"one\ntwo\nthree\n"
    assert await _read_all(files, LogOptions(tail_lines=1, timestamps=True)) == b"2026-01-01T00:00:04Z three\n"
    assert await _read_all(files, LogOptions(limit_bytes=6)) == b"one\ntw"
    since = parse_rfc3339_ns("2026-01-01T00:00:02Z")
    assert await _read_all(files, LogOptions(since_ns=since)) == b"two\nthree\n"


async def test_follow_returns_new_lines_then_ends_when_the_container_stops(tmp_path):
    live = tmp_path / "0.log"
    _write_cri(live, [("2026-01-01T00:00:01Z", "stdout", "F", "first")])
    running = True
    got = []

    async def consume():
        async for chunk in read_logs([str(live)], LogOptions(follow=True), still_running=lambda: running):
            got.append(chunk)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.3)
    with open(live, "ab") as file:
        file.write(b"2026-01-01T00:00:02Z stdout F second\n")
    await asyncio.sleep(0.5)
    assert b"".join(got) == b"first\nsecond\n"
    assert not task.done()
    running = False
    await asyncio.wait_for(task, 2)


# -- streaming proxy -------------------------------------------------------------------------------

def test_loopback_target():
    assert loopback_target("http://127.0.0.1:4321/exec/tok?x=1") == ("127.0.0.1", 4321, "/exec/tok?x=1")
    assert loopback_target("http://[::1]:4321/attach/tok") == ("::1", 4321, "/attach/tok")
    for bad in ("http://10.0.0.1:4321/exec/t", "https://127.0.0.1:4321/exec/t", "http://127.0.0.1/exec/t",
                "http://example.org:80/x"):
        with pytest.raises(StreamingError):
            loopback_target(bad)


def test_request_head_keeps_upgrade_headers_and_drops_credentials():
    head = request_head("POST", "/exec/tok", "127.0.0.1:4321", [
        (b"Host", b"node:10250"), (b"Authorization", b"Bearer secret"), (b"Connection", b"Upgrade"),
        (b"Upgrade", b"SPDY/3.1"), (b"X-Stream-Protocol-Version", b"v4.channel.k8s.io"),
        (b"X-Stream-Protocol-Version", b"channel.k8s.io"), (b"Content-Length", b"0"),
        (b"Impersonate-User", b"admin"), (b"Impersonate-Group", b"system:masters"),
        (b"Impersonate-Uid", b"1"), (b"Impersonate-Extra-Scopes", b"all"), (b"Cookie", b"session=1"),
        (b"X-Remote-User", b"admin"), (b"Proxy-Authorization", b"Basic eA=="),
    ])
    assert head == (b"POST /exec/tok HTTP/1.1\r\nHost: 127.0.0.1:4321\r\nConnection: Upgrade\r\n"
                    b"Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n"
                    b"X-Stream-Protocol-Version: channel.k8s.io\r\n\r\n")


def test_request_head_keeps_the_websocket_handshake():
    handshake = [(b"Upgrade", b"websocket"), (b"Connection", b"Upgrade"), (b"Sec-WebSocket-Key", b"dGhlIHNhbXBsZQ=="),
                 (b"Sec-WebSocket-Version", b"13"), (b"Sec-WebSocket-Protocol", b"v5.channel.k8s.io")]
    head = request_head("GET", "/attach/tok", "127.0.0.1:4321", [(b"User-Agent", b"kubectl"), *handshake])
    assert head.split(b"\r\n")[2:-2] == [name + b": " + value for name, value in handshake]


def test_response_status():
    assert response_status(b"HTTP/1.1 101 Switching Protocols\r\n\r\n") == 101
    assert response_status(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n") == 400
    with pytest.raises(StreamingError):
        response_status(b"SSH-2.0-OpenSSH\r\n\r\n")


# -- stats -----------------------------------------------------------------------------------------

def test_parse_proc_stat():
    text = "cpu  100 20 30 1000 50 5 5 10 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\nbtime 1700000000\n"
    # user+nice+system+irq+softirq+steal = 170 ticks at 100 Hz
    assert parse_proc_stat(text, 100) == (1_700_000_000, 1_700_000_000)


def test_parse_net_dev_and_network_stats():
    text = ("Inter-|   Receive                            |  Transmit\n"
            " face |bytes    packets errs drop fifo frame compressed multicast|"
            "bytes packets errs drop fifo colls carrier compressed\n"
            "    lo: 500 5 0 0 0 0 0 0 500 5 0 0 0 0 0 0\n"
            "  eth0: 1000 10 1 0 0 0 0 0 2000 20 2 0 0 0 0 0\n"
            "  wlan0: 7 1 0 0 0 0 0 0 9 1 0 0 0 0 0 0\n")
    interfaces = parse_net_dev(text)
    assert interfaces == {"eth0": (1000, 1, 2000, 2), "wlan0": (7, 0, 9, 0)}
    stats = network_stats(0, interfaces, "wlan0")
    assert (stats["name"], stats["rxBytes"], stats["txBytes"]) == ("wlan0", 7, 9)
    assert [i["name"] for i in stats["interfaces"]] == ["eth0", "wlan0"]


def test_cpu_rates_need_two_samples_and_a_forward_clock():
    rates = CpuRates()
    assert rates.rate("c", 1_000_000_000, 0) is None
    assert rates.rate("c", 2_000_000_000, 500_000_000) == 500_000_000  # half a core
    assert rates.rate("c", 2_000_000_000, 600_000_000) is None  # same timestamp
    assert rates.rate("c", 3_000_000_000, 100) is None  # counter reset (a restart)
    rates.forget_except([])
    assert rates.rate("c", 4_000_000_000, 200) is None


def test_resource_metrics_text():
    summary = {
        "node": {"cpu": {"usageCoreNanoSeconds": 2_500_000_000}, "memory": {"workingSetBytes": 1024}},
        "pods": [{"podRef": {"name": "web", "namespace": "default", "uid": "u"},
                  "cpu": {"usageCoreNanoSeconds": 1_000_000_000}, "memory": {"workingSetBytes": 10},
                  "containers": [{"name": "app", "startTime": "2026-01-01T00:00:00Z",
                                  "cpu": {"usageCoreNanoSeconds": 500_000_000}, "memory": {"workingSetBytes": 7}}]}],
    }
    text = resource_metrics(summary)
    assert "node_cpu_usage_seconds_total 2.5\n" in text
    assert "node_memory_working_set_bytes 1024\n" in text
    assert 'container_cpu_usage_seconds_total{container="app",namespace="default",pod="web"} 0.5\n' in text
    assert 'container_memory_working_set_bytes{container="app",namespace="default",pod="web"} 7\n' in text
    assert 'pod_memory_working_set_bytes{namespace="default",pod="web"} 10\n' in text
    assert 'container_start_time_seconds{container="app",namespace="default",pod="web"} 1767225600.0\n' in text
    assert "scrape_error 0\n" in text
    assert "# TYPE container_cpu_usage_seconds_total counter" in text


def test_subject_alt_names():
    assert subject_alt_names(["node-1", "localhost", "192.168.1.5", "127.0.0.1", "", "node-1", "::1", "::0:1"]) == \
        (["node-1", "localhost"], ["192.168.1.5", "127.0.0.1", "::1"])


def test_default_route_interface():
    text = ("Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n"
            "br0\t0001A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\n"
            "eth0\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\n")
    assert default_route_interface(text) == "eth0"
    assert default_route_interface(text.replace("0003", "0002")) == ""  # a route that is down
