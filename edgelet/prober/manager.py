"""The probe manager: one worker per (pod, container, probe type), and the results the sync reads.

Like the kubelet's prober manager, it starts and stops workers as pods come and go, answers what
the status needs (started, ready) and what the sync needs (containers that failed liveness or
startup probes), and asks for a re-sync of a pod when one of its results changes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from edgelet.api import podutil
from edgelet.container.runtime import ContainerState, ContainerStatus
from edgelet.events import NO_EVENTS, Recorder
from edgelet.util.errors import ConfigError

from .probes import Prober, ProbeSpec, parse_probe
from .results import Outcome, ProbeType, Result, ResultsCache
from .worker import ContainerLookup, ProbeWorker

log = logging.getLogger(__name__)

WorkerKey = tuple[str, str, ProbeType]  # (pod uid, container name, probe type)


def _probed_containers(pod: podutil.Pod) -> list[tuple[str, Mapping]]:
    """(spec field, container) of every container that is probed: the app containers and the sidecars
    (plain init and ephemeral containers have no probes)."""
    return [("spec.containers", c) for c in podutil.containers(pod)] + [
        ("spec.initContainers", c) for c in podutil.init_containers(pod) if podutil.is_sidecar(c)]


def _names_with(pod: podutil.Pod, probe_type: ProbeType) -> list[str]:
    """The names of the pod's probed containers that have a probe of that type."""
    return [c.get("name", "") for _, c in _probed_containers(pod) if c.get(probe_type.field) is not None]


class ProbeManager:
    """Probes the app containers and sidecars of the pods it is given.

    `on_change(pod_uid)` is called when a result the pod's sync or status depends on changes (a
    liveness failure, any readiness or startup change): the kubelet's probe result channel.
    `container_lookup(pod_uid, name)` gives the newest instance of a container from the runtime
    cache; `pod_ip(pod_uid)` the address httpGet, tcpSocket and grpc probes go to. `clock` is
    monotonic (start-up jitter); `wall_clock` is compared with CRI start times (initial delay).
    """

    def __init__(
        self,
        runtime: Any,
        *,
        on_change: Callable[[str], None],
        container_lookup: ContainerLookup,
        pod_ip: Callable[[str], str],
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        prober: Prober | None = None,
        recorder: Recorder = NO_EVENTS,
    ):
        self._prober = prober or Prober(runtime)
        self._recorder = recorder
        self._on_change = on_change
        self._lookup = container_lookup
        self._pod_ip = pod_ip
        self._clock = clock
        self._wall_clock = wall_clock
        self._started_at = clock()
        self._results = {t: ResultsCache(t, functools.partial(self._result_changed, t)) for t in ProbeType}
        self._workers: dict[WorkerKey, ProbeWorker] = {}
        self._tasks: dict[WorkerKey, asyncio.Task] = {}
        self._invalid: set[WorkerKey] = set()  # probes whose spec is broken: they never pass

    # -- pods -----------------------------------------------------------------------------------

    def add_pod(self, pod: podutil.Pod) -> None:
        """Starts a worker for every probe of the pod's containers. Must run inside the event loop."""
        self.update_pod(pod)

    def update_pod(self, pod: podutil.Pod) -> None:
        """Brings the pod's workers in line with its spec: new probes start, changed ones restart (their
        results start over), removed ones stop. Unchanged workers see the new pod (e.g. its deletion)."""
        uid = podutil.uid(pod)
        wanted, invalid = self._wanted_probes(pod)
        for key in [k for k in self._workers if k[0] == uid]:
            if key not in wanted or wanted[key][1] != self._workers[key].spec:
                self._stop(key)
        self._invalid = {k for k in self._invalid if k[0] != uid} | invalid
        for key, (container, spec) in wanted.items():
            worker = self._workers.get(key)
            if worker is None:
                self._start(key, pod, container, spec)
            else:
                worker.pod, worker.container = pod, container

    def remove_pod(self, pod_uid: str) -> None:
        """Stops the pod's workers and forgets its results."""
        for key in [k for k in self._workers if k[0] == pod_uid]:
            self._stop(key)
        for cache in self._results.values():
            cache.remove_pod(pod_uid)
        self._invalid = {k for k in self._invalid if k[0] != pod_uid}

    def stop_liveness_and_startup(self, pod_uid: str) -> None:
        """For a pod being terminated: nothing may restart its containers any more."""
        for key in [k for k in self._workers if k[0] == pod_uid and k[2] is not ProbeType.READINESS]:
            self._stop(key)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for key in list(self._workers):
            self._stop(key)
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._prober.close()

    def _wanted_probes(self, pod: podutil.Pod) -> tuple[dict[WorkerKey, tuple[Mapping, ProbeSpec]], set[WorkerKey]]:
        uid = podutil.uid(pod)
        wanted: dict[WorkerKey, tuple[Mapping, ProbeSpec]] = {}
        invalid: set[WorkerKey] = set()
        for field, container in _probed_containers(pod):
            name = container.get("name", "")
            for probe_type in ProbeType:
                probe = container.get(probe_type.field)
                if probe is None:
                    continue
                key = (uid, name, probe_type)
                try:
                    spec = parse_probe(probe, f"pod {podutil.full_name(pod)}",
                                       f"{field}[{name}].{probe_type.field}", probe_type)
                except ConfigError as exc:
                    if key not in self._invalid:
                        log.error("%s (the probe never passes until the pod is fixed)", exc)
                    invalid.add(key)
                    continue
                wanted[key] = (container, spec)
        return wanted, invalid

    def _start(self, key: WorkerKey, pod: podutil.Pod, container: Mapping, spec: ProbeSpec) -> None:
        uid, name, probe_type = key

        async def check(probe: ProbeSpec, container_spec: Mapping, container_id: str) -> Outcome:
            return await self._prober.probe(probe, container_spec, container_id, self._pod_ip(uid))

        worker = ProbeWorker(
            probe_type, pod, container, spec,
            results=self._results[probe_type],
            check=check,
            container_lookup=self._lookup,
            is_started=functools.partial(self._is_started, uid, name),
            wall_clock=self._wall_clock,
            recorder=self._recorder,
        )
        # Right after an agent start every worker starts at once: spread their first probes over a
        # period, as the kubelet does, instead of probing every container in the same instant.
        first_delay = random.random() * spec.period if self._clock() - self._started_at < spec.period else 0.0
        self._workers[key] = worker
        self._tasks[key] = asyncio.get_running_loop().create_task(
            self._run(key, worker, first_delay),
            name=f"probe:{probe_type.value.lower()}:{podutil.full_name(pod)}/{name}",
        )

    async def _run(self, key: WorkerKey, worker: ProbeWorker, first_delay: float) -> None:
        try:
            await worker.run(first_delay)
        except Exception:
            log.exception("%r crashed", worker)
        # It ended by itself (the container is gone for good): forget it like a stopped one.
        if self._workers.get(key) is worker:
            del self._workers[key]
            del self._tasks[key]
            worker.forget()

    def _stop(self, key: WorkerKey) -> None:
        worker = self._workers.pop(key)
        self._tasks.pop(key).cancel()
        # Forget now, not when the task winds down: a replacement may already store results.
        worker.forget()

    # -- results --------------------------------------------------------------------------------

    def _result_changed(self, probe_type: ProbeType, pod_uid: str, container_id: str, result: Result) -> None:
        # A container that stays alive needs no sync; every other change shows in the pod's status.
        if probe_type is ProbeType.LIVENESS and result is not Result.FAILURE:
            return
        try:
            self._on_change(pod_uid)
        except Exception:
            log.exception("probe result handler failed for pod %s", pod_uid)

    def liveness_failed(self, pod_uid: str) -> set[str]:
        """Ids of the pod's containers that failed their liveness probe (to be restarted)."""
        return self._results[ProbeType.LIVENESS].container_ids(pod_uid, Result.FAILURE)

    def startup_failed(self, pod_uid: str) -> set[str]:
        """Ids of the pod's containers that failed their startup probe (to be restarted)."""
        return self._results[ProbeType.STARTUP].container_ids(pod_uid, Result.FAILURE)

    def startup_succeeded(self, pod_uid: str) -> set[str]:
        """Ids of the pod's containers whose startup probe passed (a sidecar's next init container may start)."""
        return self._results[ProbeType.STARTUP].container_ids(pod_uid, Result.SUCCESS)

    def started(self, pod: podutil.Pod) -> dict[str, bool]:
        """Whether each of the pod's containers with a startup probe has started (its probe passed)."""
        pod_uid = podutil.uid(pod)
        return {name: self._passed(pod_uid, name, ProbeType.STARTUP)
                for name in _names_with(pod, ProbeType.STARTUP)}

    def readiness(self, pod: podutil.Pod) -> dict[str, bool]:
        """Whether each of the pod's containers with a readiness probe is ready (the kubelet's UpdatePodStatus,
        which is handed the pod too).

        As in the kubelet, asking also probes now a started container that is not ready yet,
        so a container becomes ready right after it starts instead of a period later.
        """
        pod_uid = podutil.uid(pod)
        ready = {}
        for name in _names_with(pod, ProbeType.READINESS):
            ready[name] = self._passed(pod_uid, name, ProbeType.READINESS)
            worker = self._workers.get((pod_uid, name, ProbeType.READINESS))
            if not ready[name] and worker is not None:
                container = self._running(pod_uid, name)
                if container is not None and self._is_started(pod_uid, name, container.id):
                    worker.trigger()
        return ready

    def _passed(self, pod_uid: str, name: str, probe_type: ProbeType) -> bool:
        key = (pod_uid, name, probe_type)
        if key in self._invalid:
            return False
        if key not in self._workers:
            return True  # its worker finished (pod ending, container gone for good): nothing holds it back
        container = self._running(pod_uid, name)
        return container is not None and self._results[probe_type].get(container.id) is Result.SUCCESS

    def _is_started(self, pod_uid: str, name: str, container_id: str) -> bool:
        key = (pod_uid, name, ProbeType.STARTUP)
        if key in self._invalid:
            return False
        if key not in self._workers:
            return True
        return self._results[ProbeType.STARTUP].get(container_id) is Result.SUCCESS

    def _running(self, pod_uid: str, name: str) -> ContainerStatus | None:
        container = self._lookup(pod_uid, name)
        return container if container is not None and container.state == ContainerState.RUNNING else None

    def worker(self, pod_uid: str, name: str, probe_type: ProbeType) -> ProbeWorker | None:
        """The worker of one probe, if it runs (for inspection: its state is the probe's state)."""
        return self._workers.get((pod_uid, name, probe_type))

    def worker_count(self) -> int:
        return len(self._workers)
