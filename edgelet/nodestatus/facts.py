"""Reads the machine facts a Node reports (memory, disk, kernel, OS, IDs, addresses) into a `NodeInfo`.

Only local reads: /proc, /sys, /etc and an interface-address ioctl; nothing goes on the network.
"""

from __future__ import annotations

import fcntl
import os
import platform
import socket
import struct
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgelet.nodestatus.setters import NodeInfo

# platform.machine() -> the GOARCH names Kubernetes uses in kubernetes.io/arch.
_GOARCH = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "armv7l": "arm",
    "armv6l": "arm",
    "i386": "386",
    "i686": "386",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
}
_SIOCGIFADDR = 0x8915


def gather_node_info(root_dir: str, *, hostname: str | None = None, node_ip: str | None = None) -> NodeInfo:
    """Facts for the status of this node; `root_dir` is the filesystem whose space pods use.
    Raises OSError naming the file when memory or disk cannot be read at all, ValueError when /proc/meminfo says no
    size."""
    from edgelet.nodestatus.setters import NodeInfo  # the Node status: cluster mode only

    hostname = (hostname or socket.gethostname()).lower()
    mem_total, mem_available = read_meminfo()
    fs = os.statvfs(_existing_parent(root_dir))
    addresses: list[tuple[str, str]] = []
    ip = node_ip or default_ipv4_address()
    if ip:
        addresses.append(("InternalIP", ip))
    addresses.append(("Hostname", hostname))
    return NodeInfo(
        hostname=hostname,
        operating_system=platform.system().lower(),
        architecture=goarch(platform.machine()),
        kernel_version=platform.release(),
        os_image=read_os_image(),
        cpu_count=os.cpu_count() or 1,
        memory_bytes=mem_total,
        memory_available_bytes=mem_available,
        fs_capacity_bytes=fs.f_blocks * fs.f_frsize,
        fs_available_bytes=fs.f_bavail * fs.f_frsize,
        pid_max=_read_int("/proc/sys/kernel/pid_max"),
        pids_in_use=_threads_in_use(),
        boot_id=_read_text("/proc/sys/kernel/random/boot_id"),
        machine_id=_read_text("/etc/machine-id") or _read_text("/var/lib/dbus/machine-id"),
        system_uuid=_read_text("/sys/class/dmi/id/product_uuid").lower(),
        addresses=tuple(addresses),
    )


def goarch(machine: str) -> str:
    return _GOARCH.get(machine.lower(), machine.lower())


MEMINFO = "/proc/meminfo"


def read_meminfo(path: str = MEMINFO) -> tuple[int, int]:
    """(MemTotal, MemAvailable) in bytes. OSError when the file cannot be read, ValueError naming it when it has no
    MemTotal or a value that is not a number."""
    values: dict[str, int] = {}
    with open(path) as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if key in ("MemTotal", "MemAvailable") and parts:
                if not parts[0].isdigit():
                    raise ValueError(f"{path}: {key} is not a number: {parts[0]!r}")
                values[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    if "MemTotal" not in values:
        raise ValueError(f"{path}: no MemTotal line")
    return values["MemTotal"], values.get("MemAvailable", 0)


def read_os_image(path: str = "/etc/os-release") -> str:
    """PRETTY_NAME of os-release, e.g. "Debian GNU/Linux 12 (bookworm)"."""
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.strip().partition("=")
                if key == "PRETTY_NAME":
                    return value.strip().strip("\"'")
    except OSError:
        pass
    return platform.system()


def default_ipv4_address() -> str | None:
    """The IPv4 address of the interface holding the default route (else of the first non-loopback
    interface), read with an ioctl: no packet is sent."""
    names = []
    try:
        with open("/proc/net/route") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if len(fields) > 3 and fields[1] == "00000000" and int(fields[3], 16) & 1:
                    names.append(fields[0])
    except (OSError, ValueError):
        pass
    names += [name for _, name in socket.if_nameindex() if name != "lo" and name not in names]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name in names:
            try:
                packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
            address = socket.inet_ntoa(packed[20:24])
            if not address.startswith("127."):
                return address
    return None


def _existing_parent(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    return path


def _threads_in_use() -> int:
    """Scheduling entities in use, the 4th field of /proc/loadavg ("running/total")."""
    try:
        return int(_read_text("/proc/loadavg").split()[3].split("/")[1])
    except (IndexError, ValueError):
        return 0


def _read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _read_int(path: str) -> int:
    try:
        return int(_read_text(path))
    except ValueError:
        return 0
