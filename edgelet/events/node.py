"""Node events as the kubelet records them: Starting, Rebooted (the boot id changed), and one event per
node condition transition (NodeReady, NodeHasSufficientMemory, ...). The decisions are pure."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any

from .model import NORMAL, WARNING

log = logging.getLogger(__name__)

BOOT_ID_FILE = "boot_id"
# What the kernel writes (a UUID); anything else in the stored file is damage.
BOOT_ID_SHAPE = re.compile(rb"[0-9A-Za-z-]{1,64}")
BOOT_ID_MAX_BYTES = 128
KERNEL_BOOT_ID = "/proc/sys/kernel/random/boot_id"

# Condition type -> (reason when True, reason otherwise), the kubelet's setters.
_CONDITION_REASONS = {
    "Ready": ("NodeReady", "NodeNotReady"),
    "MemoryPressure": ("NodeHasInsufficientMemory", "NodeHasSufficientMemory"),
    "DiskPressure": ("NodeHasDiskPressure", "NodeHasNoDiskPressure"),
    "PIDPressure": ("NodeHasInsufficientPID", "NodeHasSufficientPID"),
}


def condition_events(node_name: str, previous: Mapping[str, str],
                     current: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(type, reason, message) for each condition whose status changed (or appeared), from the maps
    condition type -> status."""
    events = []
    for kind, (when_true, otherwise) in _CONDITION_REASONS.items():
        status = current.get(kind)
        if status is None or previous.get(kind) == status:
            continue
        reason = when_true if status == "True" else otherwise
        events.append((NORMAL, reason, f"Node {node_name} status is now: {reason}"))
    return events


def condition_statuses(node_status: Mapping[str, Any] | None) -> dict[str, str]:
    return {c.get("type") or "": c.get("status") or ""
            for c in (node_status or {}).get("conditions") or [] if isinstance(c, dict)}


def reboot_event(node_name: str, last_boot_id: str, boot_id: str) -> tuple[str, str, str] | None:
    if not last_boot_id or not boot_id or last_boot_id == boot_id:
        return None
    return WARNING, "Rebooted", f"Node {node_name} has been rebooted, boot id: {boot_id}"


def exchange_boot_id(state_dir: str, boot_id: str) -> str:
    """Stores this boot's id under state_dir and returns the one stored before ("" if none)."""
    path = os.path.join(state_dir, BOOT_ID_FILE)
    try:
        with open(path, "rb") as handle:
            stored = handle.read(BOOT_ID_MAX_BYTES).strip()
    except OSError:
        stored = b""
    last = stored.decode("ascii") if BOOT_ID_SHAPE.fullmatch(stored) else ""
    if stored and not last:
        # A damaged file must not stop the agent: the boot it names is unknown, so no Rebooted event.
        log.warning("%s is damaged (not a boot id); storing this boot's id afresh", path)
    if boot_id and boot_id != last:
        try:
            os.makedirs(state_dir, mode=0o755, exist_ok=True)
            with open(path + ".tmp", "w") as handle:
                handle.write(boot_id + "\n")
            os.replace(path + ".tmp", path)
        except OSError as exc:
            log.warning("cannot store the boot id in %s: %s", path, exc)
    return last


def start_events(node_name: str, state_dir: str, boot_id_path: str = KERNEL_BOOT_ID) -> list[tuple[str, str, str]]:
    """The kubelet's node events at start: Starting, and Rebooted when the boot id changed since the last run."""
    events = [(NORMAL, "Starting", "Starting kubelet.")]
    try:
        with open(boot_id_path) as handle:
            boot_id = handle.read().strip()
    except OSError:
        return events
    rebooted = reboot_event(node_name, exchange_boot_id(state_dir, boot_id), boot_id)
    return events + [rebooted] if rebooted is not None else events
