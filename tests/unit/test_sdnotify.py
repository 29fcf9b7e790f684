"""sd_notify client: address and watchdog parsing as tables, messages received on a real datagram socket."""

import os
import socket
import uuid

import pytest

from edgelet.util.sdnotify import Notifier, parse_socket_address, watchdog_timeout


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/run/systemd/notify", "/run/systemd/notify"),
        ("@edgelet/notify", "\0edgelet/notify"),
        ("@", None),
        ("run/systemd/notify", None),
        ("vsock:2:1234", None),
    ],
)
def test_parse_socket_address(value, expected):
    assert parse_socket_address(value) == expected


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4242"}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "self"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "-5"}, None),
        ({"WATCHDOG_USEC": "30s"}, None),
    ],
)
def test_watchdog_timeout(environ, expected):
    assert watchdog_timeout(environ, pid=4242) == expected


@pytest.fixture
def listener(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify"
    sock.bind(str(path))
    sock.settimeout(5)
    yield str(path), sock
    sock.close()


def _received(sock) -> list[str]:
    return sock.recv(4096).decode().split("\n")


def test_messages_reach_the_socket(listener):
    path, sock = listener
    notifier = Notifier.from_env({"NOTIFY_SOCKET": path})
    assert notifier.enabled

    assert notifier.ready(status="running 0 pods")
    assert _received(sock) == ["READY=1", "STATUS=running 0 pods"]
    assert notifier.status("waiting for the runtime\nat unix:///run/containerd/containerd.sock")
    assert _received(sock) == ["STATUS=waiting for the runtime at unix:///run/containerd/containerd.sock"]
    assert notifier.watchdog()
    assert _received(sock) == ["WATCHDOG=1"]
    assert notifier.stopping()
    assert _received(sock) == ["STOPPING=1"]

    assert notifier.reloading()
    reloading, monotonic = _received(sock)
    assert reloading == "RELOADING=1"
    assert monotonic.startswith("MONOTONIC_USEC=") and int(monotonic.split("=")[1]) > 0
    notifier.close()


def test_abstract_namespace_socket():
    name = f"edgelet-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        notifier = Notifier.from_env({"NOTIFY_SOCKET": "@" + name})
        assert notifier.ready()
        assert sock.recv(4096) == b"READY=1"
        notifier.close()


def test_not_under_systemd_is_a_no_op():
    notifier = Notifier.from_env({})
    assert not notifier.enabled
    assert notifier.watchdog_interval() is None
    assert not notifier.ready()
    assert not notifier.watchdog()


def test_vanished_socket_is_reported_not_raised(tmp_path, caplog):
    notifier = Notifier.from_env({"NOTIFY_SOCKET": str(tmp_path / "gone")})
    assert notifier.enabled
    assert not notifier.watchdog()
    assert not notifier.watchdog()
    warnings = [r for r in caplog.records if "cannot notify systemd" in r.getMessage()]
    assert len(warnings) == 1


def test_watchdog_interval_is_half_the_timeout(listener):
    path, _ = listener
    environ = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}
    assert Notifier.from_env(environ).watchdog_interval() == 15.0
    # Without a socket there is no one to ping, whatever the environment says.
    assert Notifier.from_env({"WATCHDOG_USEC": "30000000"}).watchdog_interval() is None


def test_unset_environment_hides_systemd_from_children(listener):
    path, sock = listener
    environ = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid()), "PATH": "/bin"}
    notifier = Notifier.from_env(environ, unset_environment=True)
    assert environ == {"PATH": "/bin"}
    assert notifier.watchdog_interval() == 15.0
    assert notifier.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"
