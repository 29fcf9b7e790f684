"""CSI volumes of pods, the kubelet's csi_attacher and csi_mounter: wait for the VolumeAttachment where the CSIDriver
requires attaching, NodeStageVolume once per volume and node at the global staging path, NodePublishVolume per pod at
`<pod>/volumes/kubernetes.io~csi/<name>/mount`; `vol_data.json` beside each, so that unpublishing and unstaging need
neither the API objects nor memory of this process: after a restart they are done from what is on disk.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import os
from typing import Any

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.csi import paths
from edgelet.csi.client import NodeClient, volume_capability
from edgelet.csi.drivers import DriverRegistry
from edgelet.csi.errors import CsiError
from edgelet.kubeapi.errors import ApiError, NotFound

from .claims import CsiSource
from .errors import VolumeError
from .mountutil import is_mount_point
from .plugins import apply_fs_group, fs_group

log = logging.getLogger(__name__)

_POD_INFO = "csi.storage.k8s.io/"


def _write_record(directory: str, record: paths.VolumeRecord) -> None:
    os.makedirs(directory, mode=0o750, exist_ok=True)
    temporary = os.path.join(directory, paths.VOL_DATA + ".tmp")
    with open(temporary, "w") as stream:
        json.dump(record.as_json(), stream)
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(temporary, os.path.join(directory, paths.VOL_DATA))


def read_record(directory: str) -> paths.VolumeRecord | None:
    try:
        with open(os.path.join(directory, paths.VOL_DATA)) as stream:
            return paths.VolumeRecord.from_json(json.load(stream))
    except (OSError, ValueError):
        return None


def _remove_empty(directory: str, *names: str) -> None:
    """Removes the named entries (empty directories or files, never a mount point) and then `directory`."""
    for name in names:
        path = os.path.join(directory, name)
        try:
            (os.rmdir if os.path.isdir(path) and not os.path.islink(path) else os.unlink)(path)
        except FileNotFoundError:
            pass
    try:
        os.rmdir(directory)
    except OSError:
        pass


def _records(root: str, inner: str) -> list[tuple[str, paths.VolumeRecord]]:
    """(directory, record) of each `root/*/inner/*` directory holding a vol_data.json."""
    found = []
    try:
        parents = list(os.scandir(root))
    except OSError:
        return []
    for parent in parents:
        try:
            volumes = list(os.scandir(os.path.join(parent.path, inner)))
        except OSError:
            continue
        found += [(volume.path, record) for volume in volumes if (record := read_record(volume.path)) is not None]
    return found


def published_records(pods_dir: str) -> list[tuple[str, paths.VolumeRecord]]:
    """(publish directory, record) of every CSI volume published to any pod on this node."""
    return _records(pods_dir, os.path.join("volumes", paths.PLUGIN_DIR))


def staged_records(plugins_dir: str) -> list[tuple[str, paths.VolumeRecord]]:
    """(staging directory, record) of every volume staged on this node."""
    return _records(os.path.join(plugins_dir, paths.PLUGIN_NAME), "")


def applies_fs_group(policy: str | None, source: CsiSource) -> bool:
    """Whether the pod's fsGroup is given to a published volume (the kubelet's csiMountMgr.supportsFSGroup): always
    with fsGroupPolicy File, never with None; with the default ReadWriteOnceWithFSType only for a volume with an
    fsType that is used ReadWriteOnce (an inline volume always is)."""
    policy = policy or "ReadWriteOnceWithFSType"
    if policy in ("File", "None"):
        return policy == "File"
    if not source.fs_type:
        return False
    return source.ephemeral or tuple(source.access_modes) == ("ReadWriteOnce",)


class CsiVolumes:
    def __init__(self, drivers: DriverRegistry, *, plugins_dir: str, pods_dir: str, node_name: str,
                 api: Any = None):
        self.drivers = drivers
        self.plugins_dir = plugins_dir
        self.pods_dir = pods_dir
        self.node_name = node_name
        self.api = api  # the cluster's ApiClient: CSIDriver, VolumeAttachment and secrets (None standalone)
        self._published: set[str] = set()  # publish paths done by this process
        self._lock = asyncio.Lock()  # staging and unstaging decide from what all pods have: one at a time

    def _client(self, name: str) -> NodeClient:
        driver = self.drivers.get(name)
        if driver is None or driver.client is None:
            raise VolumeError(f"kubernetes.io/csi: driver name {name} not found in the list of registered CSI "
                              "drivers")
        return driver.client

    # -- set up ---------------------------------------------------------------------------------------------

    async def publish(self, pod: Pod, pod_dir: str, spec_name: str, source: CsiSource) -> str:
        """Stages (once) and publishes the volume for the pod; returns the target path. Raises VolumeError."""
        target = paths.publish_path(pod_dir, spec_name)
        if target in self._published and os.path.isdir(target):
            return target
        client = self._client(source.driver)
        uid = podutil.uid(pod)
        handle = paths.ephemeral_handle(uid, spec_name) if source.ephemeral else source.volume_handle
        if await asyncio.to_thread(is_mount_point, target):
            self._published.add(target)
            return target
        csi_driver = await self._csi_driver(source.driver)
        spec = (csi_driver or {}).get("spec") or {}
        modes = spec.get("volumeLifecycleModes") or [paths.PERSISTENT]
        mode = paths.EPHEMERAL if source.ephemeral else paths.PERSISTENT
        if self.api is not None and mode not in modes:
            raise VolumeError(f'volume mode "{mode}" not supported by driver {source.driver} (only supports '
                              f'{json.dumps(modes)})')
        publish_context: dict[str, str] = {}
        attachment = ""
        if not source.ephemeral and spec.get("attachRequired", True):
            attachment = paths.attachment_name(handle, source.driver, self.node_name)
            publish_context = await self._attached(attachment, handle)
        capability = volume_capability(list(source.access_modes), source.fs_type, list(source.mount_options))
        context = dict(source.attributes)
        if spec.get("podInfoOnMount") or source.ephemeral:
            context.update({_POD_INFO + "pod.name": podutil.name(pod),
                            _POD_INFO + "pod.namespace": podutil.namespace(pod) or "default",
                            _POD_INFO + "pod.uid": uid,
                            _POD_INFO + "serviceAccount.name": podutil.spec(pod).get("serviceAccountName") or "",
                            _POD_INFO + "ephemeral": "true" if source.ephemeral else "false"})
        record = paths.VolumeRecord(spec_name, handle, source.driver, self.node_name, attachment,
                                    paths.EPHEMERAL if source.ephemeral else paths.PERSISTENT)
        staging = ""
        async with self._lock:
            # The pod's record first: a publish cut short by a crash is still undone, and an unstage pass running
            # meanwhile sees the volume in use.
            await asyncio.to_thread(_write_record, paths.publish_dir(pod_dir, spec_name), record)
            if not source.ephemeral and await client.stages():
                staging = await self._stage(client, source, spec_name, handle, capability, publish_context,
                                            attachment)
        await client.publish(handle, target, capability, staging_path=staging, read_only=source.read_only,
                             publish_context=publish_context, volume_context=context,
                             secrets=await self._secret(source.publish_secret))
        group = fs_group(pod)
        if group is not None and applies_fs_group(spec.get("fsGroupPolicy"), source):
            try:
                await asyncio.to_thread(apply_fs_group, target, group, readonly=source.read_only)
            except OSError as e:
                raise VolumeError(f"applyFSGroup failed for vol {handle}: {e.strerror or e}") from None
        self._published.add(target)
        return target

    async def _stage(self, client: NodeClient, source: CsiSource, spec_name: str, handle: str, capability: Any,
                     publish_context: dict[str, str], attachment: str) -> str:
        directory = paths.staging_dir(self.plugins_dir, source.driver, handle)
        staging = os.path.join(directory, paths.GLOBAL_MOUNT)
        if read_record(directory) is not None:
            return staging  # staged once for this node: every pod publishes from it
        await asyncio.to_thread(os.makedirs, staging, 0o750, True)
        await client.stage(handle, staging, capability, publish_context=publish_context,
                           volume_context=dict(source.attributes), secrets=await self._secret(source.stage_secret))
        await asyncio.to_thread(_write_record, directory,
                                paths.VolumeRecord(spec_name, handle, source.driver, self.node_name, attachment))
        return staging

    async def _csi_driver(self, name: str) -> dict[str, Any] | None:
        if self.api is None:
            return None
        try:
            return await self.api.get(f"/apis/storage.k8s.io/v1/csidrivers/{name}")
        except NotFound:
            return None  # no CSIDriver object: attaching is required, as the API's default says
        except ApiError as e:
            raise VolumeError(f"kubernetes.io/csi: failed to read CSIDriver {name}: {e}") from None

    async def _attached(self, name: str, handle: str) -> dict[str, str]:
        if self.api is None:
            raise VolumeError(f"volume {handle} needs attaching (VolumeAttachment {name}): a node without a cluster "
                              "cannot wait for it")
        try:
            attachment = await self.api.get(f"/apis/storage.k8s.io/v1/volumeattachments/{name}")
        except ApiError as e:
            raise VolumeError(f"volume {handle} has GET error for volume attachment {name}: {e}") from None
        status = attachment.get("status") or {}
        if not status.get("attached"):
            raise VolumeError(f"volume {handle} is not attached yet (VolumeAttachment {name})")
        return {str(k): str(v) for k, v in (status.get("attachmentMetadata") or {}).items()}

    async def _secret(self, ref: tuple[str, str] | None) -> dict[str, str]:
        if ref is None:
            return {}
        if self.api is None:
            raise VolumeError(f"secret {ref[0]}/{ref[1]} of a CSI volume cannot be read without a cluster")
        try:
            secret = await self.api.get(f"/api/v1/namespaces/{ref[0]}/secrets/{ref[1]}")
            return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
        except (ApiError, binascii.Error, UnicodeDecodeError) as e:
            raise VolumeError(f"cannot read secret {ref[0]}/{ref[1]} for a CSI volume: {e}") from None

    # -- tear down ------------------------------------------------------------------------------------------

    async def teardown(self, pod_dir: str) -> None:
        """Unpublishes every CSI volume of the pod (from its records), then unstages volumes no pod uses."""
        base = os.path.join(pod_dir, "volumes", paths.PLUGIN_DIR)
        try:
            names = sorted(os.listdir(base))
        except OSError:
            names = []
        for name in names:
            directory = os.path.join(base, name)
            record = read_record(directory)
            if record is None:
                continue
            target = os.path.join(directory, "mount")
            driver = self.drivers.get(record.driverName)  # not yet registered after a restart: housekeeping retries
            if driver is None or driver.client is None:
                raise VolumeError(f"cannot unpublish CSI volume {record.specVolID}: driver {record.driverName} is "
                                  "not registered")
            await driver.client.unpublish(record.volumeHandle, target)
            self._published.discard(target)
            await asyncio.to_thread(_remove_empty, directory, "mount", paths.VOL_DATA)
        await self.unstage_unused()

    async def unstage_unused(self, driver_name: str = "") -> None:
        """NodeUnstageVolume for each staged volume (of one driver, if named) that no pod on this node publishes."""
        async with self._lock:
            in_use = {(record.driverName, record.volumeHandle)
                      for _, record in await asyncio.to_thread(published_records, self.pods_dir)}
            for directory, record in await asyncio.to_thread(staged_records, self.plugins_dir):
                if (record.driverName, record.volumeHandle) in in_use or driver_name not in ("", record.driverName):
                    continue
                driver = self.drivers.get(record.driverName)
                if driver is None or driver.client is None:
                    raise VolumeError(f"cannot unstage CSI volume {record.volumeHandle}: driver "
                                      f"{record.driverName} is not registered")
                await driver.client.unstage(record.volumeHandle, os.path.join(directory, paths.GLOBAL_MOUNT))
                await asyncio.to_thread(_remove_empty, directory, paths.GLOBAL_MOUNT, paths.VOL_DATA)

    # -- stats ------------------------------------------------------------------------------------------------

    async def volume_stats(self, target: str) -> dict[str, int] | None:
        """NodeGetVolumeStats for a published volume whose driver reports stats; None otherwise."""
        record = await asyncio.to_thread(read_record, os.path.dirname(target))
        driver = self.drivers.get(record.driverName) if record is not None else None
        if record is None or driver is None or driver.client is None:
            return None
        try:
            if not await driver.client.reports_stats():
                return None
            staged = paths.staging_path(self.plugins_dir, record.driverName, record.volumeHandle)
            return await driver.client.volume_stats(record.volumeHandle, target,
                                                    staged if os.path.isdir(staged) else "")
        except CsiError as e:
            log.debug("CSI volume %s: no stats: %s", record.specVolID, e)
            return None
