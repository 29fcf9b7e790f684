"""The volume manager: sets up a pod's volumes under `<pods_dir>/<uid>/volumes/<plugin>/<name>` on every
sync (a claim's `local` volume bind-mounted there, a hostPath one used in place, a CSI one published there by its
driver), turns a container's volumeMounts into CRI mounts (with subPaths, /etc/hosts and the termination log), and
tears everything down without ever touching data outside the pod directory.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.api.quantity import parse_quantity, to_int_ceil
from edgelet.csi.errors import CsiError

from . import plugins
from .atomic_writer import FileProjection, path_error
from .claims import ClaimedVolume, CsiSource, inline_csi, resolve_claim
from .errors import VolumeError
from .hosts import TEMP_SUFFIX, pod_hosts_file, write_hosts_file
from .mountutil import MountInfo, read_mounts, remove_tree, unmount_all_under
from .projection import Store, token_sources, volume_payload
from .subpath import expand_subpath_expr, prepare_safe_subpath, subpath_error
from .tokens import NoTokens, TokenSource

log = logging.getLogger(__name__)

DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"
ETC_HOSTS = "/etc/hosts"
_CLAIM_KINDS = ("persistentVolumeClaim", "ephemeral")  # resolved through a claim to a hostPath or local volume
_KINDS = ("emptyDir", "hostPath") + plugins.WRITTEN_KINDS + _CLAIM_KINDS + ("csi",)
_CSI_DIR = "kubernetes.io~csi"  # under <pod>/volumes/: CSI volumes, published by their driver
_PROPAGATION = {None: 0, "None": 0, "HostToContainer": 1, "Bidirectional": 2}  # CRI MountPropagation
# What the volume manager creates in a pod directory; teardown removes exactly these.
_POD_ENTRIES = ("volume-subpaths", "volumes", "containers", "etc-hosts", "etc-hosts" + TEMP_SUFFIX, "plugins")


def _component(value: Any, what: str) -> str:
    """A name used as one path component; anything that could walk elsewhere is refused."""
    if not isinstance(value, str) or not value or value in (".", "..") or "/" in value or "\0" in value:
        raise VolumeError(f"{what} {value!r} cannot be used as a directory name")
    return value


def _volume_kind(volume: dict[str, Any]) -> str:
    for kind in _KINDS:
        if volume.get(kind) is not None:
            return kind
    others = [key for key in volume if key != "name"]
    if not others:
        return "emptyDir"  # the API's default for a volume without a source
    raise VolumeError(f"volume type {others[0]} is not supported on this node")


def _failed(name: str, message: str) -> str:
    return f'MountVolume.SetUp failed for volume "{name}" : {message}'


@dataclass(frozen=True, slots=True)
class ClaimedPath:
    """A pod's claim as /stats/summary reports it."""

    volume: str
    path: str
    namespace: str
    claim: str
    csi: bool = False


@dataclass(slots=True)
class _Plan:
    """One volume to set up: decided in the event loop, carried out in a worker thread."""

    name: str
    kind: str
    path: str
    source: dict[str, Any]
    payload: dict[str, FileProjection] = field(default_factory=dict)
    in_memory: bool = False  # a tmpfs: emptyDir with medium Memory, secret, downwardAPI, projected
    read_only: bool = False  # a claim's readOnly: a `local` volume is bind-mounted read-only
    csi: CsiSource | None = None  # published by its driver (edgelet.csi) before the other volumes are laid out
    size: int | None = None  # of the tmpfs; None leaves the kernel's default (half of RAM)


class VolumeManager:
    def __init__(
        self,
        pods_dir: str,
        *,
        store: Store | None = None,
        node_name: str = "",
        node_labels: Mapping[str, str] | None = None,
        node_allocatable: Mapping[str, Any] | None = None,
        cluster_domain: str = "cluster.local",
        node_hosts_file: str = ETC_HOSTS,
        tokens: TokenSource | None = None,
    ):
        # Resolved once: the mount table lists resolved paths, and teardown compares against it.
        self.pods_dir = os.path.realpath(pods_dir)
        self.store = store
        self.node_name = node_name  # a `local` PersistentVolume's nodeAffinity may name it (matchFields)
        self.node_labels = dict(node_labels or {})  # what a `local` PersistentVolume's nodeAffinity is matched with
        self.node_allocatable = dict(node_allocatable or {})
        self.cluster_domain = cluster_domain
        self.node_hosts_file = node_hosts_file
        # Service-account tokens: from the API server in cluster mode (`use_tokens`), refused standalone.
        self.tokens: TokenSource = tokens or NoTokens()
        self._locks: dict[str, asyncio.Lock] = {}
        # mounts_for runs in threads, several containers of a pod at once: their writes of the pod's one hosts
        # file (through one temp name) take turns.
        self._hosts_lock = threading.Lock()
        self._warned: dict[str, set[str]] = {}
        # Each pod's claims as first resolved: the kubelet resolves a claim once per pod, so a claim deleted (or a
        # volume changed) under a running pod leaves the pod's mount as it is.
        self._claims: dict[str, dict[str, ClaimedVolume]] = {}
        # CSI: the drivers the plugin watcher registers and where volumes stage (`use_csi`); the code that talks to
        # drivers loads with the first CSI volume.
        self._csi_drivers: Any = None
        self._plugins_dir = ""
        self._csi_api: Any = None
        self._csi_volumes: Any = None

    def use_tokens(self, tokens: TokenSource) -> None:
        """Serve serviceAccountToken sources from `tokens` (the cluster connection's token manager)."""
        self.tokens = tokens

    def use_csi(self, drivers: Any, plugins_dir: str) -> None:
        """Serve CSI volumes through the drivers of `drivers` (an edgelet.csi.drivers.DriverRegistry)."""
        self._csi_drivers = drivers
        self._plugins_dir = plugins_dir

    def use_csi_api(self, client: Any) -> None:
        """Cluster mode: CSIDriver objects, VolumeAttachments and CSI secrets are read with `client`."""
        self._csi_api = client
        if self._csi_volumes is not None:
            self._csi_volumes.api = client

    def _csi(self) -> Any:
        if self._csi_volumes is None:
            if self._csi_drivers is None:
                raise VolumeError("CSI volumes need CSI drivers: [csi] plugins_registry is empty")
            from .csi import CsiVolumes

            self._csi_volumes = CsiVolumes(self._csi_drivers, plugins_dir=self._plugins_dir, pods_dir=self.pods_dir,
                                           node_name=self.node_name, api=self._csi_api)
        return self._csi_volumes

    def pod_dir(self, pod_uid: str) -> str:
        return os.path.join(self.pods_dir, _component(pod_uid, "pod uid"))

    def volume_dir(self, pod_uid: str, kind: str, name: str) -> str:
        return os.path.join(self.pod_dir(pod_uid), "volumes", plugins.PLUGIN_DIRS[kind], name)

    def pods_on_disk(self) -> list[str]:
        """Uids that have a pod directory (to find orphans after a restart)."""
        try:
            return sorted(entry.name for entry in os.scandir(self.pods_dir) if entry.is_dir(follow_symlinks=False))
        except FileNotFoundError:
            return []

    def _lock(self, pod_uid: str) -> asyncio.Lock:
        lock = self._locks.get(pod_uid)
        if lock is None:
            lock = self._locks[pod_uid] = asyncio.Lock()
        return lock

    # -- set up -----------------------------------------------------------------------------------

    async def setup_pod(self, pod: Pod) -> dict[str, str]:
        """Makes every volume of the pod ready and current; returns volume name -> host path.

        Idempotent and cheap when nothing changed; ConfigMap/Secret/downward API contents are updated
        atomically. Raises VolumeError naming each volume that failed (the others are still set up).
        """
        uid = podutil.uid(pod)
        pod_dir = self.pod_dir(uid)
        tokens, errors = await self._service_account_tokens(pod)
        plans, plan_errors = self._plan(pod, tokens)
        errors += plan_errors
        published: dict[str, str] = {}
        if any(plan.csi for plan in plans):
            async with self._lock(uid):  # under the pod's lock, as teardown is
                published, csi_errors = await self._publish_csi(pod, pod_dir, [plan for plan in plans if plan.csi])
            errors += csi_errors
            plans = [plan for plan in plans if not plan.csi]
        if not plans:
            # Nothing to lay out, and nothing to wait for before the sandbox: no thread hop. The pod's directory
            # comes with the first file written in it (its hosts file, a container's termination log).
            paths: dict[str, str] = {}
            apply_errors: list[str] = []
        else:
            async with self._lock(uid):  # under the pod's lock, as teardown is
                paths, apply_errors = await asyncio.to_thread(self._apply, pod_dir, plans, plugins.fs_group(pod),
                                                              plugins.fs_group_change_policy(pod))
        errors += apply_errors
        if errors:
            raise VolumeError("; ".join(errors))
        return {**paths, **published}

    async def _publish_csi(self, pod: Pod, pod_dir: str, plans: list[_Plan]) -> tuple[dict[str, str], list[str]]:
        paths, errors = {}, []
        for plan in plans:
            spec_name = os.path.basename(os.path.dirname(plan.path))  # the PV's name, or the inline volume's
            try:
                paths[plan.name] = await self._csi().publish(pod, pod_dir, spec_name, plan.csi)
            except (VolumeError, CsiError) as exc:
                errors.append(_failed(plan.name, exc.message))
        return paths, errors

    async def _service_account_tokens(self, pod: Pod) -> tuple[dict[str, dict[str, bytes]], list[str]]:
        """Each projected volume's tokens by source path: the file in the volume while it is current, else a
        new one. A volume whose token cannot be had is left as it is, and named in the errors."""
        tokens: dict[str, dict[str, bytes]] = {}
        errors: list[str] = []
        for volume in podutil.spec(pod).get("volumes") or []:
            sources = token_sources(volume.get("projected") or {}) if isinstance(volume, dict) else []
            if not sources:
                continue
            name = volume.get("name")
            try:
                directory = self.volume_dir(podutil.uid(pod), "projected", _component(name, "volume name"))
                found: dict[str, bytes] = {}
                for source in sources:
                    path = source.get("path", "")
                    if (problem := path_error(path)) is not None:
                        raise VolumeError(problem)
                    current = await asyncio.to_thread(_read_current, directory, path)
                    found[path] = await self.tokens.token(pod, name, source, current)
                tokens[name] = found
            except VolumeError as exc:
                errors.append(_failed(str(name), exc.message))
        return tokens, errors

    def _plan(self, pod: Pod, tokens: Mapping[str, Mapping[str, bytes]]) -> tuple[list[_Plan], list[str]]:
        """The pure part of set-up: sources, payloads and sizes, read from the pod, the store and the tokens."""
        uid = podutil.uid(pod)
        plans: list[_Plan] = []
        errors: list[str] = []
        warnings: list[str] = []
        allocatable_memory = self._allocatable_memory()
        mounted: set[str] | None = None  # what the containers mount and map, read at the first claim
        devices: set[str] = set()
        for volume in podutil.spec(pod).get("volumes") or []:
            name = volume.get("name")
            try:
                _component(name, "volume name")
                if token_sources(volume.get("projected") or {}) and name not in tokens:
                    continue  # its token failed: reported, and the files in place stay as they are
                kind = _volume_kind(volume)
                source = volume.get(kind) or {}
                if kind == "csi":
                    plans.append(_Plan(name, "csi", self._csi_target(uid, name), source,
                                       csi=inline_csi(volume, podutil.namespace(pod) or "default")))
                    continue
                if kind in _CLAIM_KINDS:
                    if mounted is None:
                        mounted, devices = _mount_names(pod)
                    plans.append(self._claim_plan(pod, volume, mounted, devices))
                    continue
                if kind == "hostPath":
                    if (problem := plugins.host_path_error(source.get("path"))) is not None:
                        raise VolumeError(problem)
                    plans.append(_Plan(name, kind, source["path"], source))
                    continue
                plan = _Plan(name, kind, self.volume_dir(uid, kind, name), source)
                if kind in plugins.WRITTEN_KINDS:
                    plan.payload = volume_payload(pod, kind, source, self.store, self.node_allocatable, warnings,
                                                  tokens.get(name), plugins.fs_group(pod))
                plan.in_memory = kind in plugins.MEMORY_BACKED_KINDS or (
                    kind == "emptyDir" and source.get("medium") == "Memory")
                if plan.in_memory:
                    plan.size = plugins.memory_volume_size(
                        pod, source.get("sizeLimit") if kind == "emptyDir" else None, allocatable_memory)
                plans.append(plan)
            except VolumeError as exc:
                errors.append(_failed(str(name), exc.message))
            except (AttributeError, TypeError) as exc:  # a spec of the wrong shape reached us unvalidated
                errors.append(_failed(str(name), f"malformed volume spec ({exc})"))
        self._warn(uid, warnings)
        return plans, errors

    def _claim_plan(self, pod: Pod, volume: dict[str, Any], mounted: set[str], devices: set[str]) -> _Plan:
        uid, name = podutil.uid(pod), volume["name"]
        claimed = self._claims.get(uid, {}).get(name)
        if claimed is None:
            claimed = resolve_claim(podutil.name(pod), podutil.namespace(pod) or "default", uid, volume,
                                    self._lookup, node_name=self.node_name, node_labels=self.node_labels,
                                    mounted=mounted, devices=devices)
            self._claims.setdefault(uid, {})[name] = claimed
        if claimed.kind == "hostPath":
            return _Plan(name, "hostPath", claimed.path, {"path": claimed.path, "type": claimed.host_path_type},
                         read_only=claimed.read_only)
        if claimed.csi is not None:
            return _Plan(name, "csi", self._csi_target(uid, claimed.volume), {}, read_only=claimed.read_only,
                         csi=claimed.csi)
        return _Plan(name, "local", self.volume_dir(uid, "local", _component(claimed.volume, "volume name")),
                     {"path": claimed.path}, read_only=claimed.read_only)

    def _csi_target(self, uid: str, spec_name: str) -> str:
        """<pod>/volumes/kubernetes.io~csi/<PV or inline volume name>/mount: where the driver publishes."""
        return os.path.join(self.pod_dir(uid), "volumes", _CSI_DIR, _component(spec_name, "volume name"), "mount")

    def _lookup(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.store.get(kind, namespace, name) if self.store is not None else None

    def _allocatable_memory(self) -> int | None:
        value = self.node_allocatable.get("memory")
        return None if value is None else _memory_bytes(value)

    def _warn(self, uid: str, warnings: Iterable[str]) -> None:
        for message in warnings:
            # The set is made at the first warning: most pods never get one, and an empty set is 216 bytes.
            seen = self._warned.setdefault(uid, set())
            if message not in seen:
                seen.add(message)
                log.warning("pod %s: %s", uid, message)

    def _apply(self, pod_dir: str, plans: list[_Plan], fs_group: int | None,
               change_policy: str | None = None) -> tuple[dict[str, str], list[str]]:
        volumes_dir = os.path.join(pod_dir, "volumes")
        if not os.path.isdir(volumes_dir):  # one stat on every later sync (each pod's first after a restart too)
            for directory in (pod_dir, volumes_dir):
                os.makedirs(directory, mode=0o750, exist_ok=True)
        # The mount table is only needed to see which tmpfs and local volumes are already mounted.
        mounts = read_mounts() if any(plan.in_memory or plan.kind == "local" for plan in plans) else []
        paths: dict[str, str] = {}
        errors: list[str] = []
        for plan in plans:
            try:
                self._apply_one(plan, fs_group, change_policy, mounts)
                paths[plan.name] = plan.path
            except VolumeError as exc:
                errors.append(_failed(plan.name, exc.message))
            except OSError as exc:
                errors.append(_failed(plan.name, f"{exc.strerror or exc}"))
        return paths, errors

    @staticmethod
    def _apply_one(plan: _Plan, fs_group: int | None, change_policy: str | None, mounts: list[MountInfo]) -> None:
        if plan.kind == "hostPath":
            plugins.check_host_path(plan.path, plan.source.get("type"))
            return
        os.makedirs(os.path.dirname(plan.path), mode=0o750, exist_ok=True)
        if plan.kind == "local":
            plugins.setup_local_volume(plan.path, plan.source["path"], read_only=plan.read_only, fs_group=fs_group,
                                       change_policy=change_policy, mounts=mounts)
        elif plan.kind == "emptyDir":
            plugins.setup_empty_dir(plan.path, plan.source, plan.size, fs_group, mounts)
        else:
            plugins.setup_written_volume(plan.path, plan.payload, memory_backed=plan.in_memory, size=plan.size,
                                         fs_group=fs_group, mounts=mounts)

    def claimed_volumes(self, pod_uid: str) -> list[ClaimedPath]:
        """Each claim the pod has mounted, with its directory on the node (a CSI volume's publish path)."""
        found = []
        for name, claimed in sorted(self._claims.get(pod_uid, {}).items()):
            namespace, claim = claimed.claim.split("/", 1)
            path = self._csi_target(pod_uid, claimed.volume) if claimed.csi is not None else claimed.path
            found.append(ClaimedPath(name, path, namespace, claim, claimed.csi is not None))
        return found

    async def unstage_unused_csi(self, driver: str) -> None:
        """Unstages the volumes of `driver` staged on this node that no pod publishes (after the driver registers:
        what a crash left staged). Loads the CSI volume code only where something is staged."""
        if os.path.isdir(os.path.join(self._plugins_dir, "kubernetes.io", "csi", driver)):
            await self._csi().unstage_unused(driver)

    async def csi_volume_stats(self, target: str) -> dict[str, int] | None:
        """NodeGetVolumeStats of a published CSI volume (None when its driver does not report them)."""
        return await self._csi_volumes.volume_stats(target) if self._csi_volumes is not None else None

    # -- tear down --------------------------------------------------------------------------------

    async def teardown_pod(self, pod_uid: str) -> None:
        """Unmounts the pod's tmpfs and subPath mounts and removes what the volume manager created.

        hostPath data is never touched; nothing is deleted through a symlink or a leftover mount
        (VolumeError, and the rest stays for the next attempt).
        """
        pod_dir = self.pod_dir(pod_uid)
        async with self._lock(pod_uid):
            if os.path.isdir(os.path.join(pod_dir, "volumes", _CSI_DIR)):
                await self._csi().teardown(pod_dir)  # the driver unpublishes first: nothing of it is unmounted here
            await asyncio.to_thread(self._teardown, pod_dir)
        self._locks.pop(pod_uid, None)
        self._warned.pop(pod_uid, None)
        self._claims.pop(pod_uid, None)

    @staticmethod
    def _teardown(pod_dir: str) -> None:
        if not os.path.isdir(pod_dir) or os.path.islink(pod_dir):
            return
        unmount_all_under(pod_dir)
        for entry in _POD_ENTRIES:
            remove_tree(os.path.join(pod_dir, entry))
        try:
            os.rmdir(pod_dir)
        except OSError:
            pass  # something else keeps files here; it is theirs to remove

    # -- container mounts -------------------------------------------------------------------------

    def mounts_for(
        self,
        pod: Pod,
        container: dict[str, Any],
        volume_paths: Mapping[str, str],
        *,
        env: Iterable[tuple[str, str]] = (),
        pod_ips: Sequence[str] = (),
    ) -> list[dict[str, Any]]:
        """CRI Mount fields for the container: its volumeMounts, then /etc/hosts, then the termination log.

        `env` is the container's environment (for subPathExpr); `pod_ips` the sandbox's IPs: the managed
        /etc/hosts is mounted once they are known, or at once for host-network pods, unless the container
        mounts something on /etc/hosts itself. Writes the hosts file (replaced whole, not fsynced: see
        `write_hosts_file`) and a fresh termination-log file, and bind-mounts subPaths: blocking I/O, for a thread
        (calls for several containers may overlap).
        """
        container_name = _component(container.get("name"), "container name")
        pod_dir = self.pod_dir(podutil.uid(pod))
        kinds = {}
        read_only = set()  # volumes whose source says readOnly: every mount of them is
        for volume in podutil.spec(pod).get("volumes") or []:
            try:
                kinds[volume.get("name")] = _volume_kind(volume)
            except VolumeError:
                pass
            if (volume.get("persistentVolumeClaim") or {}).get("readOnly") is True:
                read_only.add(volume.get("name"))
        env_map = dict(env)
        mounts_table: list[MountInfo] | None = None
        mount_hosts = bool(pod_ips) or podutil.host_network(pod)
        result = []
        for index, volume_mount in enumerate(container.get("volumeMounts") or []):
            name = volume_mount.get("name")
            host_path = volume_paths.get(name)
            if host_path is None:
                raise VolumeError(f'cannot find volume "{name}" to mount into container "{container_name}"')
            container_path = volume_mount.get("mountPath") or ""
            if not container_path.startswith("/"):
                raise VolumeError(f'volumeMount "{name}": mountPath must be absolute, got {container_path!r}')
            if container_path == ETC_HOSTS:
                mount_hosts = False
            subpath = volume_mount.get("subPath") or ""
            if volume_mount.get("subPathExpr"):
                subpath = expand_subpath_expr(volume_mount["subPathExpr"], env_map)
            if subpath:
                if (problem := subpath_error(subpath)) is not None:
                    raise VolumeError(problem)
                mounts_table = read_mounts() if mounts_table is None else mounts_table
                target = os.path.join(pod_dir, "volume-subpaths", _component(name, "volume name"), container_name,
                                      str(index))
                host_path = prepare_safe_subpath(host_path, subpath, target, mounts_table)
            propagation = volume_mount.get("mountPropagation")
            if propagation not in _PROPAGATION:
                raise VolumeError(f"invalid MountPropagation mode: {propagation!r}")
            result.append(_mount(container_path, host_path, _PROPAGATION[propagation],
                                 readonly=bool(volume_mount.get("readOnly")) or name in read_only
                                 or kinds.get(name) in plugins.READ_ONLY_KINDS))
        message_path = container.get("terminationMessagePath") or DEFAULT_TERMINATION_MESSAGE_PATH
        try:
            if mount_hosts:
                result.append(_mount(ETC_HOSTS, self._write_hosts_file(pod, pod_dir, pod_ips)))
            result.append(_mount(message_path, self._new_termination_log(pod_dir, container_name)))
        except OSError as exc:
            raise VolumeError(f"cannot prepare {exc.filename or pod_dir}: {exc.strerror or exc}") from None
        return result

    def _write_hosts_file(self, pod: Pod, pod_dir: str, pod_ips: Sequence[str]) -> str:
        node_hosts = None
        if podutil.host_network(pod):
            try:
                with open(self.node_hosts_file, encoding="utf-8", errors="replace") as stream:
                    node_hosts = stream.read()
            except OSError as exc:
                raise VolumeError(f"cannot read the node's {self.node_hosts_file}: {exc.strerror}") from None
        content = pod_hosts_file(pod, pod_ips, self.cluster_domain, node_hosts).encode()
        path = os.path.join(pod_dir, "etc-hosts")
        os.makedirs(pod_dir, mode=0o750, exist_ok=True)
        with self._hosts_lock:
            write_hosts_file(path, content)
        return path

    @staticmethod
    def _new_termination_log(pod_dir: str, container_name: str) -> str:
        """A fresh empty file per container instance, so a restart never reads the previous message."""
        directory = os.path.join(pod_dir, "containers", container_name)
        os.makedirs(directory, mode=0o750, exist_ok=True)
        while True:
            path = os.path.join(directory, secrets.token_hex(4))
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
            except FileExistsError:
                continue
            os.fchmod(fd, 0o666)  # the container's user, whoever it is, must be able to write it
            os.close(fd)
            return path

    def prune_termination_logs(self, pod_uid: str, container_name: str, keep: Iterable[str]) -> None:
        """Removes a container's termination-log files except `keep` (those of containers still present)."""
        directory = os.path.join(self.pod_dir(pod_uid), "containers", _component(container_name, "container name"))
        keep = {os.path.basename(path) for path in keep}
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            return
        for entry in entries:
            if entry.name not in keep and entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)


def _mount_names(pod: Pod) -> tuple[set[str], set[str]]:
    """The volume names the pod's containers mount (volumeMounts) and map as devices (volumeDevices)."""
    mounted: set[str] = set()
    devices: set[str] = set()
    for container in podutil.all_containers(pod):
        mounted.update(m["name"] for m in container.get("volumeMounts") or []
                       if isinstance(m, dict) and isinstance(m.get("name"), str))
        devices.update(d["name"] for d in container.get("volumeDevices") or []
                       if isinstance(d, dict) and isinstance(d.get("name"), str))
    return mounted, devices


def _read_current(volume_dir: str, path: str) -> bytes | None:
    """The file a written volume shows at `path` now (through its `..data` link), or None."""
    try:
        with open(os.path.join(volume_dir, path), "rb") as stream:
            return stream.read()
    except (OSError, ValueError):
        return None


def _mount(container_path: str, host_path: str, propagation: int = 0, *, readonly: bool = False) -> dict[str, Any]:
    return {"container_path": container_path, "host_path": host_path, "readonly": readonly,
            "propagation": propagation, "selinux_relabel": False}


@functools.lru_cache(maxsize=4)  # the node's allocatable memory, asked at every sync of every pod
def _memory_bytes(value: Any) -> int | None:
    try:
        return to_int_ceil(parse_quantity(value))
    except ValueError:
        return None
