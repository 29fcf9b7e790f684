"""The device manager's checkpoint: every container's devices with the plugin's Allocate answer for them, and the
devices each plugin last reported, in the kubelet's JSON shape (PodDeviceEntries, RegisteredDevices) inside a
crash-safe, checksummed `CheckpointStore` file named as the kubelet's, `kubelet_internal_checkpoint`, in the plugin
directory. With it, a restarted agent (or a rebooted node) gives each pod the same devices and the same mounts,
device nodes and variables without asking the plugins again.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

import orjson

from edgelet.cm.devicemanager.allocation import Assignment, PodDevices
from edgelet.util.checkpoint import CheckpointStore

CHECKPOINT_KIND = "device-manager"
CHECKPOINT_KEY = "kubelet_internal_checkpoint"


@dataclass(slots=True)
class DeviceState:
    pod_devices: PodDevices = field(default_factory=dict)
    registered: dict[str, list[str]] = field(default_factory=dict)  # resource -> every device its plugin reported


def encode_state(state: DeviceState) -> bytes:
    entries = [{"PodUID": uid, "ContainerName": container, "ResourceName": resource,
                "DeviceIDs": list(assignment.device_ids),
                "AllocResp": base64.b64encode(assignment.response).decode()}
               for uid, containers in sorted(state.pod_devices.items())
               for container, resources in sorted(containers.items())
               for resource, assignment in sorted(resources.items())]
    registered = {name: sorted(ids) for name, ids in sorted(state.registered.items())}
    return orjson.dumps({"Data": {"PodDeviceEntries": entries, "RegisteredDevices": registered}})


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{where}: expected a list of strings")
    return value


def decode_state(payload: bytes) -> DeviceState:
    """The state a payload holds; ValueError names the field that is wrong."""
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    body = data.get("Data") if isinstance(data, dict) else None
    if not isinstance(body, dict):
        raise ValueError("Data: expected an object")
    entries = body.get("PodDeviceEntries")
    entries = [] if entries is None else entries
    if not isinstance(entries, list):
        raise ValueError("Data.PodDeviceEntries: expected a list")
    state = DeviceState()
    for index, entry in enumerate(entries):
        where = f"Data.PodDeviceEntries[{index}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected an object")
        names = [entry.get(key) for key in ("PodUID", "ContainerName", "ResourceName")]
        if not all(isinstance(name, str) and name for name in names):
            raise ValueError(f"{where}: PodUID, ContainerName and ResourceName must be non-empty strings")
        devices = _strings(entry.get("DeviceIDs"), f"{where}.DeviceIDs")
        try:
            response = base64.b64decode(entry.get("AllocResp") or "", validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise ValueError(f"{where}.AllocResp: not base64") from None
        uid, container, resource = (str(name) for name in names)
        state.pod_devices.setdefault(uid, {}).setdefault(container, {})[resource] = Assignment(tuple(devices),
                                                                                               response)
    registered = body.get("RegisteredDevices")
    registered = {} if registered is None else registered
    if not isinstance(registered, dict):
        raise ValueError("Data.RegisteredDevices: expected an object")
    for name, ids in registered.items():
        state.registered[name] = list(_strings(ids, f"Data.RegisteredDevices.{name}"))
    return state


class DeviceCheckpoint:
    """Reads and writes the state in `directory` (the plugin directory). Small and rare writes (one per admitted
    pod with devices, per Allocate answer and per release), made directly on the event loop as the CPU manager's."""

    def __init__(self, directory: str):
        self._store = CheckpointStore(directory, kind=CHECKPOINT_KIND)

    @property
    def path(self) -> str:
        return str(self._store.directory / f"{CHECKPOINT_KEY}.ckpt")

    def load(self) -> DeviceState:
        """The recorded state, empty when there is none or it was damaged (set aside with a warning)."""
        payload = self._store.read(CHECKPOINT_KEY)
        if payload is None:
            return DeviceState()
        try:
            return decode_state(payload)
        except ValueError as exc:
            self._store.set_aside(CHECKPOINT_KEY, f"content is not a device manager state: {exc}")
            return DeviceState()

    def save(self, state: DeviceState) -> None:
        """Raises OSError when the state could not be persisted."""
        self._store.write(CHECKPOINT_KEY, encode_state(state))
