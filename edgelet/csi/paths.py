"""Where the kubelet keeps a CSI volume on the node, and the record beside it (pure): the staging path per driver
and volume handle, the publish path per pod and volume, `vol_data.json`, the VolumeAttachment's name and the
handle of an inline (ephemeral) volume."""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass
from typing import Any

PLUGIN_DIR = "kubernetes.io~csi"  # under <pod>/volumes/
PLUGIN_NAME = "kubernetes.io/csi"  # under <root>/plugins/
GLOBAL_MOUNT = "globalmount"
VOL_DATA = "vol_data.json"
PERSISTENT = "Persistent"
EPHEMERAL = "Ephemeral"


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def staging_dir(plugins_dir: str, driver: str, volume_handle: str) -> str:
    """<root>/plugins/kubernetes.io/csi/<driver>/<sha256 of the handle>: holds globalmount and vol_data.json."""
    return os.path.join(plugins_dir, PLUGIN_NAME, driver, _sha256(volume_handle))


def staging_path(plugins_dir: str, driver: str, volume_handle: str) -> str:
    return os.path.join(staging_dir(plugins_dir, driver, volume_handle), GLOBAL_MOUNT)


def publish_dir(pod_dir: str, spec_name: str) -> str:
    """<pod>/volumes/kubernetes.io~csi/<PV name, or the inline volume's name>: holds mount and vol_data.json."""
    return os.path.join(pod_dir, "volumes", PLUGIN_DIR, spec_name)


def publish_path(pod_dir: str, spec_name: str) -> str:
    return os.path.join(publish_dir(pod_dir, spec_name), "mount")


def attachment_name(volume_handle: str, driver: str, node_name: str) -> str:
    """The VolumeAttachment the attach/detach controller makes for this volume on this node."""
    return "csi-" + _sha256(volume_handle + driver + node_name)


def ephemeral_handle(pod_uid: str, volume_name: str) -> str:
    """The volume handle of an inline CSI volume: unique per pod and volume."""
    return "csi-" + _sha256(pod_uid + volume_name)


@dataclass(frozen=True, slots=True)
class VolumeRecord:
    """vol_data.json, with the kubelet's keys: what is needed to unpublish and unstage without the API objects."""

    specVolID: str
    volumeHandle: str
    driverName: str
    nodeName: str
    attachmentID: str = ""
    volumeLifecycleMode: str = PERSISTENT

    def as_json(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> VolumeRecord | None:
        if not isinstance(data, dict):
            return None
        try:
            record = cls(**{key: data[key] for key in ("specVolID", "volumeHandle", "driverName", "nodeName")},
                         attachmentID=data.get("attachmentID") or "",
                         volumeLifecycleMode=data.get("volumeLifecycleMode") or PERSISTENT)
        except (KeyError, TypeError):
            return None
        fields = (record.specVolID, record.volumeHandle, record.driverName)
        return record if all(isinstance(value, str) and value for value in fields) else None
