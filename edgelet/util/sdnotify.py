"""Tells systemd about the agent's state through $NOTIFY_SOCKET (the sd_notify datagram protocol),
without libsystemd; every call is a cheap no-op when the agent was not started by systemd."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping, MutableMapping

log = logging.getLogger(__name__)

_NOTIFY_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def parse_socket_address(value: str) -> str | None:
    """The AF_UNIX address for a $NOTIFY_SOCKET value, or None if we cannot speak to it.

    systemd hands out an absolute path or, for the abstract namespace, a name starting with '@'
    (sent with a leading NUL byte). Other forms (vsock:, relative paths) are not supported.
    """
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    return None


def watchdog_timeout(environ: Mapping[str, str], pid: int) -> float | None:
    """Seconds systemd waits between WATCHDOG=1 pings before it kills us, or None if it does not.

    WATCHDOG_PID, when present, names the process the watchdog is meant for; a child that merely
    inherited the environment must not ping on its parent's behalf.
    """
    usec = environ.get("WATCHDOG_USEC", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    watched_pid = environ.get("WATCHDOG_PID")
    if watched_pid is not None and (not watched_pid.isdigit() or int(watched_pid) != pid):
        return None
    return int(usec) / 1_000_000


def _one_line(text: str) -> str:
    # A newline would start a new VAR=VALUE assignment inside the datagram.
    return " ".join(text.splitlines())


class Notifier:
    """Sends sd_notify messages to one socket; never raises, so a missing systemd is never fatal."""

    def __init__(self, address: str | None, *, watchdog_timeout: float | None = None) -> None:
        self._address = address
        self._watchdog_timeout = watchdog_timeout
        self._socket: socket.socket | None = None
        self._warned = False

    @classmethod
    def from_env(
        cls, environ: MutableMapping[str, str] | None = None, *, unset_environment: bool = False
    ) -> Notifier:
        """A notifier for the socket systemd passed us; a disabled one when there is none.

        unset_environment removes NOTIFY_SOCKET and the watchdog variables afterwards, so
        processes we spawn do not talk to systemd in our name.
        """
        env = os.environ if environ is None else environ
        raw = env.get("NOTIFY_SOCKET", "")
        address = parse_socket_address(raw) if raw else None
        if raw and address is None:
            log.warning("NOTIFY_SOCKET=%r is not a unix socket address edgelet understands; not notifying systemd", raw)
        timeout = watchdog_timeout(env, os.getpid()) if address else None
        if unset_environment:
            for name in _NOTIFY_VARS:
                env.pop(name, None)
        return cls(address, watchdog_timeout=timeout)

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def watchdog_interval(self) -> float | None:
        """How often to send WATCHDOG=1: half the watchdog timeout, as sd_watchdog_enabled advises.

        None when the service has no watchdog (or we are not its main process)."""
        if self._watchdog_timeout is None:
            return None
        return self._watchdog_timeout / 2

    def ready(self, status: str | None = None) -> bool:
        """Start-up finished: for Type=notify units, systemd now considers the service started."""
        return self.notify("READY=1", *(() if status is None else (f"STATUS={_one_line(status)}",)))

    def status(self, text: str) -> bool:
        """A one-line, human-readable state shown by `systemctl status`."""
        return self.notify(f"STATUS={_one_line(text)}")

    def stopping(self) -> bool:
        """Shutdown began; systemd stops expecting watchdog pings."""
        return self.notify("STOPPING=1")

    def reloading(self) -> bool:
        """Configuration reload began; send ready() once it is done."""
        # MONOTONIC_USEC lets Type=notify-reload units tell this reload from an earlier one.
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")

    def watchdog(self) -> bool:
        """Proof of life: systemd restarts the service if these stop for WatchdogSec."""
        return self.notify("WATCHDOG=1")

    def notify(self, *assignments: str) -> bool:
        """Sends VAR=VALUE assignments as one datagram; True if it was handed to the socket."""
        if self._address is None or not assignments:
            return False
        message = "\n".join(assignments).encode()
        try:
            if self._socket is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                # A full queue in a stuck systemd must not stall the event loop: drop the message.
                sock.setblocking(False)
                self._socket = sock
            self._socket.sendto(message, self._address)
        except OSError as err:
            # Warn once: a vanished socket would otherwise log on every watchdog ping.
            if not self._warned:
                self._warned = True
                log.warning("cannot notify systemd at %r: %s", self._display_address(), err)
            return False
        return True

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def _display_address(self) -> str:
        address = self._address or ""
        return "@" + address[1:] if address.startswith("\0") else address
