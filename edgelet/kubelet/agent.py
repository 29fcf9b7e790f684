"""The agent: builds every manager from the config, starts them as named tasks, and shuts them down in stages.

This is the composition root; the loop itself is `edgelet.kubelet.syncloop`, the per-pod work
`edgelet.kubelet.podsync`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import orjson

from edgelet.api import podutil
from edgelet.api.objectstore import ObjectStore, referenced_objects, with_bound_volumes
from edgelet.api.podutil import Pod
from edgelet.api.quantity import cpu_quantity
from edgelet.cm.cgroups import node_allocatable
from edgelet.cm.cpumanager.manager import CPUManager
from edgelet.cm.cpumanager.state import CPUStateStore
from edgelet.cm.podcgroups import PodCgroups
from edgelet.config import ClusterConfig, Config
from edgelet.cri.client import RuntimeClient
from edgelet.events import WARNING, EventRecorder, node_ref, pod_ref
from edgelet.events.locallog import EventLog, event_log_dir
from edgelet.events.node import start_events
from edgelet.eviction import EvictionManager, NodeSignals, PodUsageReader, image_fs_mountpoint
from edgelet.eviction.manager import Collaborators as EvictionCollaborators
from edgelet.images.airgap import AirgapImages
from edgelet.images.gc import ImageGC
from edgelet.images.manager import ImageManager
from edgelet.images.nodeauth import node_keyring
from edgelet.kubelet.podsync import PodSyncer
from edgelet.kubelet.runtimestate import RuntimeState
from edgelet.kubelet.syncloop import Collaborators as LoopCollaborators
from edgelet.kubelet.syncloop import SyncLoop
from edgelet.kuberuntime.gc import ContainerGC, GCPolicy
from edgelet.kuberuntime.logmigration import migrate_pod_logs
from edgelet.kuberuntime.manager import Collaborators, RuntimeManager
from edgelet.kuberuntime.resizer import Resizer
from edgelet.kuberuntime.security import SECCOMP_DIR, SecuritySettings
from edgelet.lifecycle.admission import ADMIT, Verdict, apparmor_check, supplemental_groups_check, sysctl_check
from edgelet.logs.rotation import LogRotator
from edgelet.metrics import registry as metrics
from edgelet.nodestatus.facts import MEMINFO, default_ipv4_address, read_meminfo
from edgelet.nodestatus.health import NodeHealth
from edgelet.pleg.generic import GenericPLEG
from edgelet.pod.manager import PodManager
from edgelet.pod.workers import PodRecords, PodWorkers
from edgelet.podconfig.config import PodConfig
from edgelet.prober import HookRunner, ProbeManager
from edgelet.server.http import Listener, OpsServer, bind_all
from edgelet.status.manager import StatusManager, pod_list, status_dir
from edgelet.status.view import Heartbeat, present_pods
from edgelet.util.backoff import Backoff
from edgelet.util.errors import EdgeletError
from edgelet.util.rootlock import RootLock
from edgelet.util.sdnotify import Notifier
from edgelet.util.tasks import TaskGroup, wait_set
from edgelet.volumes import VolumeManager
from edgelet.volumes.claims import node_labels

if TYPE_CHECKING:  # imported when devices are configured
    from edgelet.cm.devicemanager.manager import DeviceManager

log = logging.getLogger(__name__)

SHUTDOWN_GRACE = 5.0
PLUGINS_FIRST_SCAN = 3.0  # seconds the first pod sync waits for CSI plugins already installed to register
# Threads for blocking file I/O: two keep a burst's writes from queueing behind one slow write on a 2-core device.
IO_THREADS = 2


def node_ip_address() -> str:
    """The node's primary IPv4 address (the default route's interface), else loopback."""
    return default_ipv4_address() or "127.0.0.1"


def host_apparmor_enabled() -> bool:
    """Whether the kernel enforces AppArmor, as runc (and so the kubelet) decides it: securityfs shows it and the
    module says Y."""
    if not os.path.isdir("/sys/kernel/security/apparmor"):
        return False
    try:
        with open("/sys/module/apparmor/parameters/enabled", "rb") as flag:
            return flag.read(1) == b"Y"
    except OSError:
        return False


class Agent:
    """One node agent; `await Agent(config).run()` runs it until SIGTERM or SIGINT."""

    def __init__(self, config: Config, config_path: str = ""):
        """Builds every manager in dependency order: each gets only what was built before it. `config_path`, the
        file `config` was read from, is read again for a new bootstrap token."""
        self.config = config
        self.config_path = config_path
        # First of all: a second agent on this root_dir must stop before it touches a single file there.
        self._root_lock = RootLock(config.root_dir)
        self._root_lock.acquire()
        self.node_name = config.node_name
        self.node_ip = node_ip_address()
        try:
            memory_total, _ = read_meminfo()
        except OSError as exc:  # no /proc (a bare chroot): the node has no capacity to report or divide
            raise EdgeletError(f"cannot read the node's memory size: {MEMINFO}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise EdgeletError(f"cannot read the node's memory size: {exc}") from None
        # Capacity less kube_reserved and system_reserved: the kubepods cgroup's limits, and what the downward API
        # reports for a container without limits.
        allocatable = node_allocatable(os.cpu_count() or 1, memory_total,
                                       config.cgroups.kube_reserved, config.cgroups.system_reserved)
        self.node_allocatable = {"cpu": cpu_quantity(allocatable.cpu_millis), "memory": str(allocatable.memory_bytes)}
        self.notifier = Notifier.from_env()
        self.recorder = EventRecorder(self.node_name, EventLog(event_log_dir(config.root_dir)))
        self._tasks = TaskGroup(on_crash=self._on_task_crash)
        self._stopping = asyncio.Event()
        self._fatal: str | None = None  # why the agent stops on its own (a crashed task)

        # The runtime and what the node knows of pods.
        self.runtime = RuntimeClient(
            config.runtime.endpoint,
            timeout=config.runtime.request_timeout,
        )
        self.pleg = GenericPLEG(
            self.runtime,
            relist_period=config.pleg.relist_period,
            relist_threshold=config.pleg.relist_threshold,
            evented=config.pleg.evented,
            evented_relist_period=config.pleg.evented_relist_period,
        )
        self.pod_config = PodConfig()
        self.pod_manager = PodManager()
        self.pod_records = PodRecords()  # where each pod is in its life: the pod workers write it
        self.status = StatusManager(status_dir(config))
        self.store = ObjectStore()

        # Images, volumes and the garbage collectors.
        self.airgap = AirgapImages(self.runtime, config.images_dir, os.path.join(config.state_dir, "airgap"))
        self.images = ImageManager(
            self.runtime,
            pull_backoff=Backoff(config.backoff.image_pull_initial, config.backoff.image_pull_max),
            airgap=self.airgap,
            max_parallel_pulls=config.images.parallel_pulls,
            progress_timeout=config.images.pull_progress_timeout,
            node_keyring=node_keyring(root_dir=config.root_dir, docker_config=config.images.docker_config,
                                      provider_config=config.images.credential_provider_config,
                                      provider_bin_dir=config.images.credential_provider_bin_dir),
            recorder=self.recorder,
        )
        self.image_gc = ImageGC(
            self.runtime,
            high=config.images.gc_high_threshold_percent,
            low=config.images.gc_low_threshold_percent,
            min_age=config.images.minimum_gc_age,
            pinned_images=self.airgap.image_ids,
        )
        self.container_gc = ContainerGC(
            self.runtime, self.pod_manager.uid_set,
            logs_dir=config.logs_dir, container_logs_dir=config.container_logs_dir,
            policy=GCPolicy(config.gc.container_min_age, config.gc.max_per_pod_container, config.gc.max_containers),
            sources_ready=self.pod_config.all_sources_ready,
        )
        self.volumes = VolumeManager(config.pods_dir, store=self.store, node_name=self.node_name,
                                     node_labels=node_labels(self.node_name,
                                                             config.cluster.node_labels if config.cluster else {}),
                                     node_allocatable=self.node_allocatable,
                                     cluster_domain=config.pods.cluster_domain)
        self.plugin_watcher, self.csi_plugins = self._make_plugin_watcher()
        self._csinode: Any = None  # the CSINode object's writer (cluster mode with a plugin registry)
        self.log_rotator = LogRotator(self.runtime, max_size=config.logs.container_log_max_size,
                                      max_files=config.logs.container_log_max_files)

        # Containers: hooks, CPUs, the runtime manager, probes.
        self.hooks = HookRunner(self.runtime, pod_ip=self._pod_address, recorder=self.recorder)
        self.cpu_manager = CPUManager(
            config.cpu.policy, CPUStateStore(config.state_dir), self.runtime,
            active_pods=self.active_pods, runtime_status=self.pleg.get_status,
            sources_ready=self.pod_config.all_sources_ready, reserved=config.cpu.reserved,
            reconcile_period=config.cpu.reconcile_period,
        )
        # Device plugins (imported only with [devices] plugin_dir set, the default: the kubelet's path).
        self.device_manager = self._make_device_manager() if config.devices.plugin_dir else None
        self.pod_cgroups = PodCgroups(config.cgroups, self.runtime, allocatable, active_pods=self.active_pods)
        self.resizer = Resizer(self.runtime, node_allocatable=self.node_allocatable, active_pods=self.active_pods,
                               recorder=self.recorder, pod_cgroup_limits=self.pod_cgroups.set_limits,
                               static_cpu_policy=self.cpu_manager.static)
        self.runtime_manager = RuntimeManager(
            self.runtime,
            Collaborators(images=self.images, volumes=self.volumes, store=self.store, hooks=self.hooks,
                          recorder=self.recorder, resizer=self.resizer, devices=self.device_manager),
            logs_root=config.logs_dir,
            container_logs_dir=config.container_logs_dir,
            crash_backoff=Backoff(config.backoff.crashloop_initial, config.backoff.crashloop_max),
            cluster_dns=list(config.pods.cluster_dns),
            cluster_domain=config.pods.cluster_domain,
            runtime_handler=config.runtime.runtime_handler,
            node_ip=self._node_ip,
            node_allocatable=self.node_allocatable,
            cpuset_for=self.cpu_manager.cpuset_for,
            cgroup_parent=self.pod_cgroups.parent_for,
            security=SecuritySettings(config.security.seccomp_default, os.path.join(config.root_dir, SECCOMP_DIR)),
        )
        # The kubelet's probe result channel: the sync loop reads it and syncs the pod.
        self.probe_results: asyncio.Queue[str] = asyncio.Queue()
        self.prober = ProbeManager(
            self.runtime, on_change=self.probe_results.put_nowait,
            container_lookup=self._latest_container, pod_ip=self._pod_address, recorder=self.recorder,
        )
        self.runtime_state = RuntimeState(self.runtime, forget_crash_backoff=self.runtime_manager.forget_crash_backoff)
        self.heartbeat = Heartbeat(status_dir(config), runtime_health=self.runtime_state.health)
        self.runtime_state.subscribe(self.heartbeat.beat_now)  # a readiness flip is written at once

        # The pods' lifecycle: their syncer and workers.
        self.syncer = PodSyncer(
            pod_manager=self.pod_manager, pleg=self.pleg, runtime_manager=self.runtime_manager, prober=self.prober,
            status=self.status, volumes=self.volumes, node_ip=self.node_ip, recorder=self.recorder,
            release_resources=self._release_resources, network=self.runtime_state.network,
        )
        self.syncer.when_removed(lambda pod: self.update_status_line())
        self.workers = PodWorkers(self.pod_records, self.syncer, resync_interval=config.sync.sync_frequency)

        # Node pressure, node shutdown, the control plane.
        self.eviction = EvictionManager(
            config.eviction.thresholds(),
            EvictionCollaborators(
                signals=NodeSignals(config.root_dir,
                                    image_fs_mountpoint=functools.partial(image_fs_mountpoint, self.runtime)),
                usage=PodUsageReader(runtime_status=self.pleg.get_status, pods_dir=config.pods_dir,
                                     logs_dir=config.logs_dir),
                active_pods=self.active_pods, evict=self._evict_pod, pod_cleaned_up=self._pod_stopped,
                reclaim_images=self.image_gc.free_space, reclaim_containers=self.container_gc.collect),
            pressure_transition_period=config.eviction.pressure_transition_period,
        )
        # What the node's Ready condition reports: runtime, its pod network and PLEG, and a node shutdown in progress.
        self.node_health = NodeHealth(
            {"runtime": self.runtime_state.health, "network": self.runtime_state.network, "pleg": self.pleg.healthy},
            settled=lambda: self.runtime_state.checked)
        self.cluster = self._make_cluster() if config.cluster is not None else None
        if self.cluster is not None and config.cluster is not None:
            self._serve_cluster_identity(self.cluster, config.cluster)
            self.syncer.when_removed(self.cluster.pod_terminated)  # an API pod's final delete
        self.shutdown = self._make_shutdown() if config.shutdown.enabled else None
        # The kubelet's order: node pressure first, so no CPUs are taken for a pod then refused.
        self.admit_checks = [lambda pod: Verdict(*self.eviction.admit(pod)),
                             sysctl_check(config.security.allowed_unsafe_sysctls, os.uname().release),
                             *([self._admit_devices] if self.device_manager is not None else []),
                             lambda pod: Verdict(*self.cpu_manager.admit(pod)),
                             self._admit_supplemental_groups,
                             apparmor_check(host_apparmor_enabled())]
        if self.shutdown is not None:
            self.admit_checks.append(self.shutdown.admit)

        self.loop = SyncLoop(
            config.sync,
            LoopCollaborators(pod_config=self.pod_config, pod_manager=self.pod_manager, pleg=self.pleg,
                              records=self.pod_records, workers=self.workers, syncer=self.syncer, prober=self.prober,
                              probe_results=self.probe_results, status=self.status, runtime_state=self.runtime_state,
                              volumes=self.volumes, log_rotator=self.log_rotator, recorder=self.recorder),
            max_pods=config.max_pods, admit_checks=tuple(self.admit_checks),
            on_runtime_ready=self._on_runtime_ready, on_pods_changed=self.update_status_line,
        )
        self.store.on_change = self._on_object_changed
        # The kubelet API (:10250, cluster mode only) and its certificate from the cluster, with
        # [kubelet_api] serving_cert = "csr".
        self.kubelet_api: Any = None  # its classes load only here, in cluster mode
        self.serving_certificate: Any = None
        if self.cluster is not None and config.kubelet_api.address:
            self.kubelet_api, self.serving_certificate = self._make_kubelet_api(self.cluster)

    def _make_plugin_watcher(self):
        """CSI node plugins registering through [csi] plugins_registry (the watcher and the registry are small; gRPC
        and the volume code load with the first plugin or CSI volume)."""
        if not self.config.csi.plugins_registry:
            return None, None
        from edgelet.csi.drivers import DriverRegistry
        from edgelet.csi.registration import CSI_PLUGIN, CsiPluginHandler
        from edgelet.csi.watcher import PluginWatcher

        drivers = DriverRegistry()
        self.volumes.use_csi(drivers, self.config.plugins_dir)
        handler = CsiPluginHandler(drivers, on_registered=self.volumes.unstage_unused_csi)
        return PluginWatcher(self.config.csi.plugins_registry, {CSI_PLUGIN: handler}), handler

    def _make_cluster(self):
        """The control-plane side (imported only when a cluster is configured: it costs memory)."""
        from edgelet.cluster.connection import ClusterConnection, NodeSide

        node = NodeSide(
            pod_config=self.pod_config, pod_manager=self.pod_manager, status_manager=self.status,
            object_store=self.store, node_health=self.node_health, runtime_version=self._node_runtime_version,
            runtime_features=lambda: self.runtime_state.features, pressure=self.eviction.pressure,
            extended_resources=self._extended_resources, pod_cidr_handler=self.runtime.update_pod_cidr,
            could_have_running_containers=self.pod_records.could_have_running_containers, recorder=self.recorder,
        )
        return ClusterConnection(self.config, node, node_ip=self.node_ip, config_path=self.config_path)

    def _make_device_manager(self):
        from edgelet.cm.devicemanager.manager import DeviceManager

        return DeviceManager(self.config.devices.plugin_dir, state_dir=self.config.state_dir,
                             active_pods=self.active_pods, sources_ready=self.pod_config.all_sources_ready)

    def _device_server(self, devices: DeviceManager):
        """The registration socket and the pod resources API (one gRPC server)."""
        from edgelet.cm.devicemanager.server import DeviceServer
        from edgelet.podresources.server import ResourceSources, add_to_server

        sources = ResourceSources(
            active_pods=self.active_pods, container_devices=devices.container_devices,
            container_cpus=self.cpu_manager.exclusive_cpus, allocatable_devices=devices.healthy_devices,
            allocatable_cpus=self.cpu_manager.allocatable_cpus, topology=devices.topology)
        return DeviceServer(devices, pod_resources_socket=self.config.devices.pod_resources_socket,
                            add_pod_resources=functools.partial(add_to_server, sources=sources))

    def _admit_devices(self, pod: Pod) -> Verdict:
        return Verdict(*self.device_manager.admit(pod)) if self.device_manager is not None else ADMIT

    def _extended_resources(self) -> dict[str, tuple[int, int]]:
        return self.device_manager.node_resources() if self.device_manager is not None else {}

    def _release_resources(self, uid: str) -> None:
        """A terminated pod's exclusive CPUs and devices go back."""
        self.cpu_manager.remove(uid)
        if self.device_manager is not None:
            self.device_manager.remove(uid)

    def _serve_cluster_identity(self, cluster, settings: ClusterConfig) -> None:
        """What pods of a cluster node get from it: service-account tokens (TokenRequest as the node), the Services'
        variables (the `kubernetes` one pointing at the API server this agent uses), and the ConfigMaps and Secrets
        they reference read when missing."""
        from edgelet.volumes.tokens import TokenManager

        self.volumes.use_tokens(TokenManager(cluster.client, recorder=self.recorder,
                                             max_age=settings.service_account_token_max_age))
        self.runtime_manager.use_service_env(cluster.services.env_for)
        self.runtime_manager.fetch_objects_with(cluster.objects.fetch_missing)
        if self.csi_plugins is not None:
            from edgelet.csi.csinode import CsiNodeUpdater

            self.volumes.use_csi_api(cluster.client)
            csinode = CsiNodeUpdater(cluster.client, self.node_name, lambda: cluster.node_status.node_uid)
            self.csi_plugins.use_csinode(csinode)
            self._csinode = csinode  # started with the plugin watcher

    def _admit_supplemental_groups(self, pod: Pod) -> Verdict:
        features = self.runtime_state.features  # None: the runtime has not said, so it cannot be relied on
        return supplemental_groups_check(pod, features is not None and features.supplemental_groups_policy)

    def _make_shutdown(self):
        """Graceful node shutdown (imported only when configured: it brings the D-Bus client); after the
        cluster connection, which it asks to report the node NotReady."""
        from edgelet.eviction.policy import is_critical
        from edgelet.lifecycle.shutdown import MESSAGE, REASON, ShutdownManager

        def stop_pod(pod: Pod, grace: int) -> None:
            self.workers.evict(pod, REASON, MESSAGE, grace)

        async def report_not_ready() -> None:
            if self.cluster is not None:
                await self.cluster.node_status.sync_once()

        async def flush_statuses(timeout: float) -> None:
            self.status.flush()
            if self.cluster is not None:
                await self.cluster.flush_statuses(timeout)

        manager = ShutdownManager(
            self.config.shutdown, active_pods=self.active_pods, is_critical=is_critical, stop_pod=stop_pod,
            pod_stopped=self._pod_stopped,
            report_not_ready=report_not_ready, flush_statuses=flush_statuses,
        )
        self.node_health.add("shutdown", manager.health)
        return manager

    async def _node_runtime_version(self) -> str:
        """The Node's containerRuntimeVersion, e.g. containerd://1.6.20."""
        reply = await self.runtime.version()
        return f"{reply.runtime_name}://{reply.runtime_version}"

    def active_pods(self) -> list[Pod]:
        """Pods that hold resources: neither evicted nor terminating (the kubelet's GetActivePods)."""
        return self.pod_manager.active_pods(self.pod_records.is_active)

    async def _evict_pod(self, pod: Pod, reason: str, message: str, grace: int) -> None:
        log.warning("evicting pod %s: %s", podutil.full_name(pod), message)
        self.recorder.event(pod_ref(pod), WARNING, reason, message)
        self.workers.evict(pod, reason, message, grace)

    def _pod_address(self, uid: str) -> str:
        """Where probes and hooks reach a pod: the node for host-network pods, else the sandbox IP."""
        pod = self.pod_manager.get(uid)
        if pod is not None and podutil.host_network(pod):
            return self.node_ip
        return self.pleg.get_status(uid).ip

    def _node_ip(self) -> str:
        return self.node_ip

    def _latest_container(self, uid: str, name: str):
        """The newest instance of a pod's container in the pod cache (what probes look at)."""
        return self.pleg.get_status(uid).latest_container(name)

    def _pod_stopped(self, uid: str) -> bool:
        """No container of the pod runs any more (eviction and node shutdown wait for it)."""
        return not self.pleg.get_status(uid).running_containers()

    # -- lifecycle ------------------------------------------------------------------------------

    def listeners(self) -> list[Listener]:
        """Every endpoint the agent serves: all are bound before anything starts, or the agent does not run."""
        listeners: list[Listener] = []
        if self.config.server.address:
            listeners.append(OpsServer(self.config.server.address, health_checks=self.health_checks(),
                                       pods_json=self._pods_json, registry=metrics.REGISTRY))
        if self.kubelet_api is not None:
            listeners.append(self.kubelet_api)
        if self.device_manager is not None:
            listeners.append(self._device_server(self.device_manager))
        return listeners

    def _pods_json(self) -> bytes:
        """The ops /pods: the stored statuses as `edgelet pods` shows them (Unknown while the runtime is down)."""
        ready, message = self.runtime_state.health()
        return orjson.dumps(pod_list(present_pods(self.status.pods(), runtime_ready=ready, runtime_message=message)))

    async def run(self) -> None:
        """Runs until SIGTERM/SIGINT; containers keep running after the agent stops."""
        listeners = self.listeners()
        try:
            if self.device_manager is not None:
                self.device_manager.start()  # its checkpoint before any plugin can register
            await bind_all(listeners)  # a taken port stops us here, before any pod is touched
        except EdgeletError:
            await self.runtime.close()
            self._root_lock.release()
            raise
        loop = asyncio.get_running_loop()
        # asyncio.to_thread's pool: short blocking file I/O (checkpoints, volumes, log directories). asyncio's
        # default of CPUs + 4 threads only costs memory here (about 200 KiB a thread once a burst woke it).
        loop.set_default_executor(ThreadPoolExecutor(max_workers=IO_THREADS, thread_name_prefix="edgelet-io"))
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        self.runtime.connect()  # the connection is made while the checkpoints below are read
        os.makedirs(self.config.root_dir, mode=0o755, exist_ok=True)
        self.cpu_manager.start()  # a CPU state that does not fit this machine stops us here, kubelet-style
        self.status.load()
        self._tasks.start("heartbeat", self.heartbeat.run())
        log.info("edgelet starting: node %s, runtime %s", self.node_name, self.runtime.endpoint)
        for notice in self.config.ignored():
            log.warning("config: %s", notice)
        self.notifier.status(f"waiting for the container runtime at {self.runtime.endpoint}")
        self._tasks.start("status-writer", self.status.run())
        self._tasks.start("events", self.recorder.run())
        for event in start_events(self.node_name, self.config.state_dir):
            self.recorder.event(node_ref(self.node_name), *event)
        self._tasks.start("pleg", self.pleg.run())
        self._start_sources()
        if self.cluster is not None:
            self.cluster.start(self._tasks)
        self._tasks.start("sync-loop", self.loop.run())
        self._tasks.start("watchdog", self._watchdog())
        for listener in listeners:
            self._tasks.start(f"listener {listener.address}", listener.run())
        if self.shutdown is not None:
            self._tasks.start("node-shutdown", self.shutdown.run())
        cluster, server = self.cluster, self.kubelet_api
        if (server is not None and cluster is not None and cluster.cluster_ca is None
                and cluster.certificates is not None):
            # A token join with ca_cert_hash learns the cluster CA (the kubelet API's client CA) when it joins.
            cluster.when_joined(lambda: server.trust_client_ca(cluster.cluster_ca))
        if self.serving_certificate is not None and cluster is not None:  # asked for with the node's own credentials
            serving = self.serving_certificate
            cluster.when_joined(lambda: self._tasks.start(
                "kubelet-api:serving-cert", serving.run(lambda: server.reload_certificate(serving.path, serving.path))))
        try:
            await self._stopping.wait()
        finally:
            await self._shutdown()
        if self._fatal is not None:
            raise EdgeletError(self._fatal)

    def _on_task_crash(self, name: str, exc: BaseException) -> None:
        """A dead task would leave a half-working agent: stop, exit non-zero, let systemd start us again."""
        if self._stopping.is_set():
            return
        self._fatal = f"task {name} crashed: {exc!r}"[:500]
        self.notifier.status(f"stopping: {self._fatal}")
        self._stopping.set()

    def _make_kubelet_api(self, cluster):
        """The kubelet API server and its serving-certificate manager (cluster mode only: its TLS and review code
        load here); a bad certificate setting is logged and leaves the rest of the agent running (a port it cannot
        bind does not)."""
        from edgelet.kubeletapi import PodLookup, build_server

        serving = None
        if self.config.kubelet_api.serving_cert == "csr":
            from edgelet.bootstrap.manager import ServingCertificateManager

            serving = ServingCertificateManager(self.config.pki_dir, self.node_name, (self.node_ip, "127.0.0.1"),
                                                cluster.client)
        try:
            server = build_server(
                self.config, runtime=self.runtime, review=cluster.client.create,
                lookup=PodLookup(self.node_name, self.pod_manager, self.pleg.get_status),
                pods_json=self.status.pod_list_json, health_checks=self.health_checks(), node_ip=self.node_ip,
                cluster_ca=cluster.cluster_ca, serving_cert=serving.path if serving and serving.valid() else None,
                claimed_volumes=self.volumes.claimed_volumes, csi_volume_stats=self.volumes.csi_volume_stats,
            )
        except (EdgeletError, OSError) as exc:
            log.error("kubelet API not started: %s", exc)
            return None, None
        return server, serving

    def request_stop(self) -> None:
        if not self._stopping.is_set():
            log.info("stop requested: shutting down (containers keep running)")
            self._stopping.set()

    async def _shutdown(self) -> None:
        self.notifier.stopping()
        await self._tasks.cancel_all(grace=SHUTDOWN_GRACE)
        if self.cluster is not None:
            await self.cluster.close()
        await self.workers.stop()
        if self.device_manager is not None:
            await self.device_manager.close()
        await self.prober.close()
        await self.hooks.close()
        await self.airgap.close()
        await self.runtime.close()
        self.heartbeat.write_stopped()  # while the lock is held: a next agent's record is never overwritten
        self._root_lock.release()
        log.info("edgelet stopped")

    def _start_sources(self) -> None:
        pods = self.config.pods
        if pods.manifest_dir:
            from edgelet.podconfig.file import FileSource

            source = FileSource(
                pods.manifest_dir, self.node_name, self.pod_config.source("file"),
                check_frequency=pods.file_check_frequency,
                on_objects=self._on_local_objects,
                incumbent_uids=self.status.known_uids,
                parsed_dir=os.path.join(self.config.state_dir, "manifests"),
            )
            self._tasks.start("source:file", source.run())
        if pods.http_url:
            from edgelet.podconfig.http import HTTPSource

            http_source = HTTPSource(pods.http_url, self.node_name, self.pod_config.source("http"),
                                     check_frequency=pods.http_check_frequency)
            self._tasks.start("source:http", http_source.run())

    def health_checks(self) -> dict[str, Callable[[], tuple[bool, str]]]:
        """What /healthz reports, by check name (the kubelet's runtime and PLEG checks)."""
        checks = {"runtime": self.runtime_state.health, "pleg": self.pleg.healthy,
                  "syncloop": self._loop_health, "tasks": self._tasks.health}
        if self.cluster is not None:
            checks["apisync"] = self.cluster.health
            if self.cluster.tunnel is not None:
                checks["tunnel"] = self.cluster.tunnel.health
        return checks

    def _loop_health(self) -> tuple[bool, str]:
        stalled = time.monotonic() - self.loop.alive_at
        limit = max(self.config.sync.housekeeping_interval * 10, 60.0)
        if stalled > limit:
            return False, f"sync loop has not turned for {stalled:.0f}s"
        return True, "ok"

    def _on_local_objects(self, objects: list[dict]) -> None:
        """ConfigMaps and Secrets from the manifest directory (standalone nodes)."""
        self.store.replace_all("file", objects)

    async def _watchdog(self) -> None:
        interval = self.notifier.watchdog_interval()
        if interval is None:
            return
        # The loop itself records liveness; a hung loop or a crashed task stops the pings and systemd
        # restarts us.
        while True:
            await asyncio.sleep(interval)
            if time.monotonic() - self.loop.alive_at < max(interval * 2, 10.0) and self._tasks.health()[0]:
                self.notifier.watchdog()

    async def _on_runtime_ready(self) -> None:
        """After the first relist, before the first pod sync: the managers that need the runtime start, and
        air-gap archives are imported first so that pods that need them find them; logs a node kept under root_dir
        move to pod_logs_dir before any container is started."""
        config = self.config
        try:
            copy = await migrate_pod_logs(config.legacy_logs_dir, config.pod_logs_dir, config.container_logs_dir,
                                          self.runtime)
            if copy is not None:
                self._tasks.start("logs:copy-from-root-dir", copy)
        except (EdgeletError, OSError) as exc:
            log.error("moving container logs from %s to %s: %s", config.legacy_logs_dir, config.pod_logs_dir, exc)
        try:
            await self.airgap.start()
            await self.airgap.scan()
        except (EdgeletError, OSError) as exc:
            log.error("air-gap images in %s: %s", self.config.images_dir, exc)
        if self.plugin_watcher is not None:
            self._tasks.start("plugin-watcher", self.plugin_watcher.run())
            if self._csinode is not None:
                self._tasks.start("csinode", self._csinode.run())
            # Drivers already installed register before the first pod sync needs them (bounded: a plugin that
            # does not answer must not hold the pods up).
            await wait_set(self.plugin_watcher.scanned, PLUGINS_FIRST_SCAN)
        self._tasks.start("airgap-images", self.airgap.run())
        self._tasks.start("image-gc", self.image_gc.run())
        self._tasks.start("container-gc", self.container_gc.run())
        self._tasks.start("eviction", self.eviction.run())
        self._tasks.start("cpu-manager", self.cpu_manager.run())
        if self.device_manager is not None:
            self._tasks.start("device-manager", self.device_manager.run())
        self._tasks.start("pod-cgroups", self.pod_cgroups.run(
            lambda: set(self.pod_manager.uid_set()) | self.pleg.runtime_pod_uids()))
        self.notifier.ready()
        self.update_status_line()

    def _on_object_changed(self, kind: str, namespace: str, name: str, obj: dict | None) -> None:
        """An object changed (a refresh from the API, a local manifest): the pods that read it sync now, so their
        volumes follow it at once rather than at each pod's periodic resync (and a claim bound at last starts them)."""
        key = (kind, namespace, name)
        for uid, pod in self.pod_manager.pods().items():
            if key in with_bound_volumes(referenced_objects(pod), lambda claim: self.store.get(*claim)):
                self.loop.sync_if_known(uid)

    def update_status_line(self) -> None:
        self.notifier.status(f"running {len(self.pod_manager)} pods")
