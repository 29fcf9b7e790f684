"""The agent: wires the managers together and runs the sync loop over config updates, PLEG events and ticks.

Like the kubelet's syncLoop, one loop selects over four channels — pod config updates, pod lifecycle
events, the sync tick and housekeeping — and hands the work to per-pod workers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import Any, Callable

from . import metrics, podutil
from .backoff import Backoff
from .config import Config
from .containerlogs import LogRotator
from .cri.client import RuntimeClient
from .errors import EdgeletError
from .images.airgap import AirgapImages
from .images.gc import ImageGC
from .images.manager import ImageManager
from .kuberuntime.gc import ContainerGC, GCPolicy
from .objectstore import ObjectStore
from .volumes import VolumeManager
from .kuberuntime.manager import Collaborators, RuntimeManager
from .nodestatus.facts import default_ipv4_address, read_meminfo
from .kuberuntime.types import ContainerState, PodRuntimeStatus
from .pleg import GenericPLEG, PodLifecycleEvent
from .prober import HookRunner, ProbeManager
from .podconfig.config import Op, PodConfig, PodUpdate
from .podutil import Pod
from .podworkers import PodWorkers, SyncOutcome, WorkType
from .sdnotify import Notifier
from .server import OpsServer
from .status.generate import generate_pod_status
from .status.manager import StatusManager, status_dir
from .tasks import TaskGroup

log = logging.getLogger(__name__)

SYNC_TICK = 1.0
SHUTDOWN_GRACE = 5.0
LOG_ROTATION_INTERVAL = 10.0


def node_ip_address() -> str:
    """The node's primary IPv4 address (the default route's interface), else loopback."""
    return default_ipv4_address() or "127.0.0.1"


class Agent:
    def __init__(self, config: Config):
        self.config = config
        self.node_name = config.node_name
        self.runtime = RuntimeClient(
            config.runtime.endpoint,
            timeout=config.runtime.request_timeout,
            pull_timeout=config.runtime.image_pull_timeout,
        )
        self.pleg = GenericPLEG(
            self.runtime,
            relist_period=config.pleg.relist_period,
            relist_threshold=config.pleg.relist_threshold,
        )
        self.pod_config = PodConfig()
        self.status = StatusManager(status_dir(config))
        self.notifier = Notifier.from_env()
        self._node_ip = node_ip_address()
        memory_total, _ = read_meminfo()
        self.node_allocatable = {"cpu": str(os.cpu_count() or 1), "memory": str(memory_total)}
        self.store, self.images, self.volumes = self._make_workload_managers()
        self.pods: dict[str, Pod] = {}  # the desired pods by uid (the kubelet's pod manager)
        self.hooks = HookRunner(self.runtime, pod_ip=self._pod_address)
        self.runtime_manager = RuntimeManager(
            self.runtime,
            Collaborators(images=self.images, volumes=self.volumes, store=self.store, hooks=self.hooks),
            logs_root=config.logs_dir,
            crash_backoff=Backoff(config.backoff.crashloop_initial, config.backoff.crashloop_max),
            cluster_dns=list(config.pods.cluster_dns),
            cluster_domain=config.pods.cluster_domain,
            runtime_handler=config.runtime.runtime_handler,
            node_ip=lambda: self._node_ip,
            node_allocatable=self.node_allocatable,
        )
        self.log_rotator = LogRotator(self.runtime, max_size=config.logs.container_log_max_size,
                                      max_files=config.logs.container_log_max_files)
        self._next_log_rotation = 0.0
        self.prober = ProbeManager(
            self.runtime, on_change=self._sync_if_known,
            container_lookup=lambda uid, name: self.pleg.get_status(uid).latest_container(name),
            pod_ip=self._pod_address,
        )
        self.workers = PodWorkers(self._sync_pod, self._terminate_pod, self._on_terminated)
        self._waiting: dict[str, dict[str, tuple[str, str]]] = {}
        self._first_seen: dict[str, float] = {}
        self._rejected: set[str] = set()
        self._runtime_health = (False, f"waiting for the container runtime at {self.runtime.endpoint}")
        self._loop_alive = time.monotonic()
        self._stopping = asyncio.Event()
        self._tasks = TaskGroup()

    def _pod_address(self, uid: str) -> str:
        """Where probes and hooks reach a pod: the node for host-network pods, else the sandbox IP."""
        pod = self.pods.get(uid)
        if pod is not None and podutil.host_network(pod):
            return self._node_ip
        return self.pleg.get_status(uid).ip

    def _make_workload_managers(self):
        config = self.config
        store = ObjectStore()
        self.airgap = AirgapImages(self.runtime, config.images_dir, os.path.join(config.state_dir, "airgap"))
        images = ImageManager(
            self.runtime,
            pull_backoff=Backoff(config.backoff.image_pull_initial, config.backoff.image_pull_max),
            pull_timeout=config.runtime.image_pull_timeout,
            airgap=self.airgap,
        )
        self.image_gc = ImageGC(
            self.runtime,
            high=config.images.gc_high_threshold_percent,
            low=config.images.gc_low_threshold_percent,
            min_age=config.images.minimum_gc_age,
            pinned_images=self.airgap.image_ids,
        )
        self.container_gc = ContainerGC(
            self.runtime, lambda: set(self.pods),
            logs_dir=config.logs_dir,
            policy=GCPolicy(config.gc.container_min_age, config.gc.max_per_pod_container,
                            config.gc.max_containers),
            sources_ready=self.pod_config.all_sources_ready,
        )
        volumes = VolumeManager(self.config.pods_dir, store=store, node_name=self.node_name,
                                node_allocatable=self.node_allocatable,
                                cluster_domain=self.config.pods.cluster_domain)
        return store, images, volumes

    # -- lifecycle ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Runs until SIGTERM/SIGINT; containers keep running after the agent stops."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        os.makedirs(self.config.root_dir, mode=0o755, exist_ok=True)
        self.status.load()
        log.info("edgelet starting: node %s, runtime %s", self.node_name, self.runtime.endpoint)
        self.notifier.status(f"waiting for the container runtime at {self.runtime.endpoint}")
        self._tasks.start("pleg", self.pleg.run())
        self._start_sources()
        self._tasks.start("sync-loop", self._sync_loop())
        self._tasks.start("watchdog", self._watchdog())
        if self.config.server.address:
            server = OpsServer(self.config.server.address, health_checks=self.health_checks(),
                               pods_json=self.status.pod_list_json, registry=metrics.REGISTRY)
            self._tasks.start("ops-server", server.run())
        try:
            await self._stopping.wait()
        finally:
            await self._shutdown()

    def request_stop(self) -> None:
        if not self._stopping.is_set():
            log.info("stop requested: shutting down (containers keep running)")
            self._stopping.set()

    async def _shutdown(self) -> None:
        self.notifier.stopping()
        await self._tasks.cancel_all(grace=SHUTDOWN_GRACE)
        await self.workers.stop()
        await self.prober.close()
        await self.hooks.close()
        await self.airgap.close()
        await self.runtime.close()
        log.info("edgelet stopped")

    def _start_sources(self) -> None:
        pods = self.config.pods
        if pods.manifest_dir:
            from .podconfig.file import FileSource

            source = FileSource(
                pods.manifest_dir, self.node_name, self.pod_config.source("file"),
                check_frequency=pods.file_check_frequency,
                on_objects=self._on_local_objects,
            )
            self._tasks.start("source:file", source.run())
        if pods.http_url:
            from .podconfig.http import HTTPSource

            source = HTTPSource(pods.http_url, self.node_name, self.pod_config.source("http"),
                                check_frequency=pods.http_check_frequency)
            self._tasks.start("source:http", source.run())

    def health_checks(self) -> dict[str, Callable[[], tuple[bool, str]]]:
        """What /healthz reports, by check name (the kubelet's runtime and PLEG checks)."""
        return {"runtime": lambda: self._runtime_health, "pleg": self.pleg.healthy,
                "syncloop": self._loop_health}

    def _loop_health(self) -> tuple[bool, str]:
        stalled = time.monotonic() - self._loop_alive
        limit = max(self.config.sync.housekeeping_interval * 10, 60.0)
        if stalled > limit:
            return False, f"sync loop has not turned for {stalled:.0f}s"
        return True, "ok"

    async def _check_runtime(self) -> None:
        """The kubelet's runtime health: the CRI Status call, RuntimeReady and NetworkReady."""
        try:
            reply = await self.runtime.status()
        except EdgeletError as exc:
            self._runtime_health = (False, f"container runtime is down: {exc}")
            return
        failing = [f"{c.type}={c.status} ({c.reason}: {c.message})"
                   for c in reply.status.conditions if not c.status and c.type == "RuntimeReady"]
        self._runtime_health = (False, "container runtime not ready: " + "; ".join(failing)) if failing \
            else (True, "ok")

    def _on_local_objects(self, objects: list[dict]) -> None:
        """ConfigMaps and Secrets from the manifest directory (standalone nodes)."""
        self.store.replace_all("file", objects)

    async def _watchdog(self) -> None:
        interval = self.notifier.watchdog_interval()
        if interval is None:
            return
        # The loop itself records liveness; a hung loop stops the pings and systemd restarts us.
        while True:
            await asyncio.sleep(interval)
            if time.monotonic() - self._loop_alive < max(interval * 2, 10.0):
                self.notifier.watchdog()

    # -- the sync loop -----------------------------------------------------------------------------

    async def _sync_loop(self) -> None:
        await self._wait_for_runtime()
        config_get: asyncio.Task | None = None
        pleg_get: asyncio.Task | None = None
        next_housekeeping = time.monotonic() + self.config.sync.housekeeping_interval
        next_resync = time.monotonic() + self.config.sync.sync_frequency
        try:
            while True:
                config_get = config_get or asyncio.create_task(self.pod_config.updates.get())
                pleg_get = pleg_get or asyncio.create_task(self.pleg.events.get())
                done, _ = await asyncio.wait({config_get, pleg_get}, timeout=SYNC_TICK,
                                             return_when=asyncio.FIRST_COMPLETED)
                now = time.monotonic()
                self._loop_alive = now
                if config_get in done:
                    self._handle_config(config_get.result())
                    config_get = None
                if pleg_get in done:
                    self._handle_pleg(pleg_get.result())
                    pleg_get = None
                for uid in self.workers.due():
                    self._sync_if_known(uid)
                if now >= next_resync:
                    next_resync = now + self.config.sync.sync_frequency
                    for uid in list(self.pods):
                        self._sync_if_known(uid)
                if now >= next_housekeeping:
                    next_housekeeping = now + self.config.sync.housekeeping_interval
                    await self._housekeeping()
        finally:
            for task in (config_get, pleg_get):
                if task is not None:
                    task.cancel()

    async def _wait_for_runtime(self) -> None:
        """No sync before the first relist: adopting running containers needs to see them first."""
        while not self.pleg.has_relisted:
            self._loop_alive = time.monotonic()
            try:
                await asyncio.wait_for(self.pleg.wait_first_relist(), timeout=SYNC_TICK)
            except asyncio.TimeoutError:
                continue
        await self._check_runtime()
        version = await self._runtime_version()
        log.info("container runtime ready: %s", version)
        await self._start_image_managers()
        self.notifier.ready()
        self._update_status_line()

    async def _start_image_managers(self) -> None:
        """Air-gap archives are imported before the first pod sync, so pods that need them find them."""
        try:
            await self.airgap.start()
            await self.airgap.scan()
        except (EdgeletError, OSError) as exc:
            log.error("air-gap images in %s: %s", self.config.images_dir, exc)
        self._tasks.start("airgap-images", self.airgap.run())
        self._tasks.start("image-gc", self.image_gc.run())
        self._tasks.start("container-gc", self.container_gc.run())

    async def _runtime_version(self) -> str:
        try:
            reply = await self.runtime.version()
            return f"{reply.runtime_name} {reply.runtime_version}"
        except EdgeletError as exc:
            return f"unknown ({exc})"

    def _handle_config(self, update: PodUpdate) -> None:
        for pod in update.pods:
            uid = podutil.uid(pod)
            if update.op in (Op.ADD, Op.UPDATE):
                if update.op is Op.ADD and not self._admit(pod):
                    continue
                self.pods[uid] = pod
                self._first_seen.setdefault(uid, time.monotonic())
                self.workers.update(pod)
                self.prober.update_pod(pod)
            elif update.op is Op.DELETE:
                self.pods[uid] = pod
                self.workers.update(pod, WorkType.TERMINATE, podutil.grace_period_seconds(pod))
                self.prober.update_pod(pod)
            elif update.op is Op.REMOVE:
                self.pods.pop(uid, None)
                self.workers.update(pod, WorkType.TERMINATE)
            elif update.op is Op.RECONCILE and uid in self.pods:
                self.pods[uid] = pod
        self._update_status_line()

    def _admit(self, pod: Pod) -> bool:
        """The kubelet's admission, reduced to what a node agent can check: room for one more pod."""
        active = sum(1 for uid in self.pods if not self.workers.is_terminating(uid))
        if active < self.config.max_pods:
            return True
        uid = podutil.uid(pod)
        if uid not in self._rejected:
            self._rejected.add(uid)
            log.warning("pod %s rejected: node has reached max_pods (%d)", podutil.full_name(pod),
                        self.config.max_pods)
            self.status.set_pod_status(pod, {
                "phase": "Failed", "reason": "OutOfpods",
                "message": f"Node didn't have enough resource: pods, limit: {self.config.max_pods}",
            })
        return False

    def _handle_pleg(self, event: PodLifecycleEvent) -> None:
        if not event.is_sync_worthy():
            return
        self._sync_if_known(event.pod_uid)

    def _sync_if_known(self, uid: str) -> None:
        pod = self.pods.get(uid)
        if pod is not None:
            self.workers.update(pod)

    # -- housekeeping -------------------------------------------------------------------------------

    async def _housekeeping(self) -> None:
        """Kills runtime pods that no source knows, once every source has reported at least once."""
        await self._check_runtime()
        if not self.pod_config.all_sources_ready():
            return
        for uid in self.pleg.runtime_pod_uids() - set(self.pods):
            if self.workers.is_terminating(uid) or self.workers.known(uid):
                continue
            status = self.pleg.get_status(uid)
            orphan = {"metadata": {"uid": uid, "name": status.name, "namespace": status.namespace}}
            log.info("housekeeping: removing pod %s_%s (%s) that no source knows",
                     status.name, status.namespace, uid)
            self.workers.update(orphan, WorkType.TERMINATE)
        await self._remove_orphaned_volumes()
        await self._rotate_logs()
        self._update_metrics()

    async def _rotate_logs(self) -> None:
        """The kubelet's container log manager: every 10 s, rotate live logs past the size limit."""
        now = time.monotonic()
        if now < self._next_log_rotation:
            return
        self._next_log_rotation = now + LOG_ROTATION_INTERVAL
        running = [(c.id, c.log_path) for uid in self.pleg.runtime_pod_uids()
                   for c in self.pleg.get_status(uid).running_containers() if c.log_path]
        try:
            await self.log_rotator.rotate(running)
        except OSError as exc:
            log.warning("log rotation failed: %s", exc)

    async def _remove_orphaned_volumes(self) -> None:
        """Volume directories of pods that are gone (say, removed while the agent was down)."""
        active = set(self.pods) | self.pleg.runtime_pod_uids()
        for uid in self.volumes.pods_on_disk():
            if uid in active or self.workers.known(uid):
                continue
            try:
                await self.volumes.teardown_pod(uid)
            except EdgeletError as exc:
                log.warning("housekeeping: volumes of pod %s not removed yet: %s", uid, exc)

    def _update_metrics(self) -> None:
        running_pods = 0
        running = 0
        for uid in self.pleg.runtime_pod_uids():
            status = self.pleg.get_status(uid)
            if status.sandboxes and status.sandboxes[0].state == 0:
                running_pods += 1
            running += len(status.running_containers())
        metrics.running_pods.set(running_pods)
        metrics.running_containers.labels("running").set(running)

    def _update_status_line(self) -> None:
        self.notifier.status(f"running {len(self.pods)} pods")

    # -- per-pod work (called by the workers) -------------------------------------------------------------

    async def _sync_pod(self, pod: Pod) -> SyncOutcome:
        uid = podutil.uid(pod)
        runtime_status = self.pleg.get_status(uid)
        result = await self.runtime_manager.sync_pod(
            pod, runtime_status,
            liveness_failed=self.prober.liveness_failed(uid),
            startup_failed=self.prober.startup_failed(uid),
        )
        if result.started or result.waiting_reasons != self._waiting.get(uid) or not runtime_status.sandboxes:
            runtime_status = await self.pleg.inspect_now(uid)
        self._waiting[uid] = result.waiting_reasons
        self._publish_status(pod, runtime_status, result.waiting_reasons)
        return SyncOutcome(requeue_after=result.requeue_after)

    def _publish_status(self, pod: Pod, runtime_status: PodRuntimeStatus,
                        waiting: dict[str, tuple[str, str]]) -> dict[str, Any]:
        uid = podutil.uid(pod)
        status = generate_pod_status(
            pod, runtime_status,
            old_status=self.status.get_status(uid),
            now=time.time(),
            waiting_reasons=waiting,
            readiness=self.prober.readiness(uid),
            started=self.prober.started(uid),
            host_ip=self._node_ip,
        )
        self.status.set_pod_status(pod, status)
        self._observe_start(uid, runtime_status)
        return status

    def _observe_start(self, uid: str, runtime_status: PodRuntimeStatus) -> None:
        first_seen = self._first_seen.get(uid)
        if first_seen is None:
            return
        pod = self.pods.get(uid)
        wanted = {c["name"] for c in podutil.containers(pod)} if pod else set()
        running = {c.name for c in runtime_status.containers if c.state == ContainerState.RUNNING}
        if wanted and wanted <= running:
            metrics.pod_start_sli_duration_seconds.observe(time.monotonic() - first_seen)
            del self._first_seen[uid]

    async def _terminate_pod(self, pod: Pod, grace: int | None) -> None:
        uid = podutil.uid(pod)
        self.prober.stop_liveness_and_startup(uid)
        runtime_status = await self.pleg.inspect_now(uid)
        await self.runtime_manager.kill_pod(pod, runtime_status, grace)
        if uid in self.pods:
            runtime_status = await self.pleg.inspect_now(uid)
            self._publish_status(pod, runtime_status, {})

    async def _on_terminated(self, pod: Pod) -> None:
        uid = podutil.uid(pod)
        if uid in self.pods and not podutil.deletion_requested(pod):
            return
        runtime_status = await self.pleg.inspect_now(uid)
        await self.runtime_manager.remove_pod(runtime_status)
        try:
            await self.volumes.teardown_pod(uid)
        except EdgeletError as exc:
            # Housekeeping retries: the pod directory stays until it can go.
            log.warning("pod %s: volumes not removed yet: %s", podutil.full_name(pod), exc)
        self.pods.pop(uid, None)
        self.status.remove(uid)
        self.prober.remove_pod(uid)
        self.workers.forget(uid)
        self._waiting.pop(uid, None)
        self._first_seen.pop(uid, None)
        log.info("pod %s removed", podutil.full_name(pod))
        self._update_status_line()
