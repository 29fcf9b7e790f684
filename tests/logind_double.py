"""A stand-in for systemd-logind on a private D-Bus bus: enough of org.freedesktop.login1.Manager for graceful
node shutdown (Inhibit, the InhibitDelayMaxUSec property, the PrepareForShutdown signal).

Like logind, Inhibit hands out one end of a pipe and the lock lasts until every copy of it is closed; the
double notes when that happens. The real logind is exercised by the package tests under systemd-nspawn.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import threading
import time
from pathlib import Path

from jeepney import DBusAddress, HeaderFields, MessageType, new_error, new_method_return, new_signal
from jeepney.bus_messages import message_bus
from jeepney.io.blocking import open_dbus_connection

PATH = "/org/freedesktop/login1"
NAME = "org.freedesktop.login1"
MANAGER = "org.freedesktop.login1.Manager"

BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"""


class LogindDouble:
    """Runs a private bus (dbus-daemon) and the login1 manager on it; `address` goes in DBUS_SYSTEM_BUS_ADDRESS."""

    def __init__(self, directory: Path, *, inhibit_delay_max: float = 30.0):
        self.directory = directory
        self.socket = directory / "system_bus_socket"
        self.address = f"unix:path={self.socket}"
        self.inhibit_delay_max = inhibit_delay_max
        self.inhibitors: list[tuple[str, str, str, str]] = []  # (what, who, why, mode) per Inhibit call
        self.released_at: list[float] = []  # when each lock's last copy was closed
        self._daemon: subprocess.Popen | None = None
        self._conn = None
        self._stop = threading.Event()

    def __enter__(self) -> LogindDouble:
        config = self.directory / "bus.conf"
        config.write_text(BUS_CONFIG.format(socket=self.socket))
        self._daemon = subprocess.Popen([shutil.which("dbus-daemon") or "dbus-daemon", "--nofork",
                                         f"--config-file={config}"], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not self.socket.exists():
            if time.monotonic() > deadline:
                raise RuntimeError("dbus-daemon did not create its socket")
            time.sleep(0.02)
        self._conn = open_dbus_connection(self.address, enable_fds=True)
        self._conn.send_and_get_reply(message_bus.RequestName(NAME), timeout=5)
        threading.Thread(target=self._serve, name="logind-double", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._conn is not None:
            self._conn.close()
        if self._daemon is not None:
            self._daemon.terminate()
            self._daemon.wait(10)

    def prepare_for_shutdown(self, active: bool = True) -> None:
        signal = new_signal(DBusAddress(PATH, interface=MANAGER), "PrepareForShutdown", "b", (active,))
        self._conn.send(signal)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                message = self._conn.receive(timeout=0.5)
            except TimeoutError:
                continue
            except Exception:  # noqa: BLE001 - the bus went away or the test closed it: this reader's end
                return
            if message.header.message_type is not MessageType.method_call:
                continue
            fields = message.header.fields
            member = fields.get(HeaderFields.member)
            if member == "Inhibit":
                self.inhibitors.append(tuple(message.body))
                read_end, write_end = os.pipe()
                self._conn.send(new_method_return(message, "h", (write_end,)))
                os.close(write_end)  # the caller's copy is now the only one: the lock lasts while it is open
                threading.Thread(target=self._watch_release, args=(read_end,), daemon=True).start()
            elif member == "Get" and tuple(message.body) == (MANAGER, "InhibitDelayMaxUSec"):
                usec = int(self.inhibit_delay_max * 1e6)
                self._conn.send(new_method_return(message, "v", (("t", usec),)))
            else:
                self._conn.send(new_error(message, "org.freedesktop.DBus.Error.UnknownMethod", "s",
                                          (f"the logind double has no {member}",)))

    def _watch_release(self, read_end: int) -> None:
        select.select([read_end], [], [])
        self.released_at.append(time.time())
        os.close(read_end)
