"""/proc files the stats read (pure parsers): network counters, mounts."""

from __future__ import annotations

from collections.abc import Mapping


def parse_net_dev(text: str) -> dict[str, tuple[int, int, int, int]]:
    """(rx bytes, rx errors, tx bytes, tx errors) by interface from /proc/net/dev, loopback left out."""
    interfaces = {}
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(":")
        fields = rest.split()
        name = name.strip()
        if name and name != "lo" and len(fields) >= 11:
            interfaces[name] = (int(fields[0]), int(fields[2]), int(fields[8]), int(fields[10]))
    return interfaces


def mount_sources(mountinfo: str) -> dict[str, str]:
    """mount point -> source device, from /proc/self/mountinfo."""
    sources = {}
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) >= 5 and len(tail) >= 2:
            sources[fields[4]] = tail[1]
    return sources


def device_of(path: str, sources: Mapping[str, str]) -> str:
    """The device of the mount holding `path` (the longest mount point that is a prefix of it)."""
    best = ""
    for point in sources:
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
            best = point
    return sources.get(best, path)
