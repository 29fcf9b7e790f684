"""The CPU manager's checkpoint: the shared pool and the exclusive assignments, in the kubelet's JSON shape
(policyName, defaultCpuSet, entries) inside a crash-safe, checksummed `CheckpointStore` file.
"""

from __future__ import annotations

import os
from typing import Any

import orjson

from edgelet.cm.cpumanager.policy import CPUState
from edgelet.util.checkpoint import CheckpointStore
from edgelet.util.cpuset import format_cpuset, parse_cpuset

CHECKPOINT_KIND = "cpu-manager"
CHECKPOINT_KEY = "cpu_manager_state"
STATE_DIR = "cpumanager"


def encode_state(state: CPUState) -> bytes:
    entries = {uid: {name: format_cpuset(cpus) for name, cpus in sorted(containers.items())}
               for uid, containers in sorted(state.assignments.items())}
    return orjson.dumps({"policyName": state.policy, "defaultCpuSet": format_cpuset(state.default),
                         "entries": entries}, option=orjson.OPT_INDENT_2)


def _cpus(value: Any, where: str) -> frozenset[int]:
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a CPU list string, got {value!r}")
    try:
        return parse_cpuset(value)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def decode_state(payload: bytes) -> CPUState:
    """The state a checkpoint payload holds; ValueError names the field that is wrong."""
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    policy = data.get("policyName")
    if not isinstance(policy, str) or not policy:
        raise ValueError(f"policyName: expected a policy name, got {policy!r}")
    default = _cpus(data.get("defaultCpuSet", ""), "defaultCpuSet")
    raw_entries = data.get("entries") or {}
    if not isinstance(raw_entries, dict):
        raise ValueError("entries: expected an object of pods")
    entries: dict[str, dict[str, frozenset[int]]] = {}
    for uid, containers in raw_entries.items():
        if not isinstance(containers, dict):
            raise ValueError(f"entries.{uid}: expected an object of containers")
        entries[uid] = {name: _cpus(cpus, f"entries.{uid}.{name}") for name, cpus in containers.items()}
    return CPUState(policy, default, entries)


class CPUStateStore:
    """Reads and writes the state under `state_dir`/cpumanager. Blocking, small and rare (one write per
    exclusive allocation or release), so callers on the event loop call it directly."""

    def __init__(self, state_dir: str):
        self._store = CheckpointStore(os.path.join(state_dir, STATE_DIR), kind=CHECKPOINT_KIND)

    @property
    def path(self) -> str:
        return str(self._store.directory / f"{CHECKPOINT_KEY}.ckpt")

    def load(self) -> CPUState | None:
        """The recorded state; None when there is none or it was damaged (the store sets damaged files
        aside and warns). A well-formed file with impossible content raises CPUStateError, an unreadable
        one OSError."""
        payload = self._store.read(CHECKPOINT_KEY)
        if payload is None:
            return None
        try:
            return decode_state(payload)
        except ValueError as exc:
            # Valid checksum, content of no known shape (say `null`): damage like a flipped bit, set aside.
            self._store.set_aside(CHECKPOINT_KEY, f"content is not a CPU manager state: {exc}")
            return None

    def save(self, state: CPUState) -> None:
        """Raises OSError when the state could not be persisted."""
        self._store.write(CHECKPOINT_KEY, encode_state(state))
