"""One probe of one container, run every period: the kubelet's prober worker and its state machine.

`do_probe` is one tick (look at the container, maybe probe it, count the run of equal results,
store a verdict once a threshold is reached); `run` repeats it on the probe's period until stopped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from edgelet.api import podutil
from edgelet.container.runtime import ContainerState, ContainerStatus
from edgelet.events import NO_EVENTS, WARNING, Recorder, pod_ref
from edgelet.metrics import registry as metrics
from edgelet.util.tasks import wait_set

from .probes import ProbeSpec
from .results import INITIAL_RESULT, Outcome, ProbeError, ProbeType, Result, ResultsCache

log = logging.getLogger(__name__)

Check = Callable[[ProbeSpec, Mapping[str, Any], str], Awaitable[Outcome]]
ContainerLookup = Callable[[str, str], ContainerStatus | None]


class ProbeWorker:
    """Probes container `container["name"]` of `pod` with `spec`.

    `check(spec, container, container_id)` runs the probe once (ProbeError: it could not run);
    `container_lookup(pod_uid, name)` gives the newest instance of the container as the runtime
    last reported it; `is_started(container_id)` says whether the startup probe let it start;
    `wall_clock()` is compared with CRI start times for the initial delay; every failed probe is an
    Unhealthy event on `recorder`, as the kubelet records it.
    """

    def __init__(
        self,
        probe_type: ProbeType,
        pod: podutil.Pod,
        container: Mapping[str, Any],
        spec: ProbeSpec,
        *,
        results: ResultsCache,
        check: Check,
        container_lookup: ContainerLookup,
        is_started: Callable[[str], bool],
        wall_clock: Callable[[], float],
        recorder: Recorder = NO_EVENTS,
    ):
        self.probe_type = probe_type
        self.pod = pod
        self.container = container
        self.spec = spec
        self.pod_uid = podutil.uid(pod)
        self.name = container["name"]
        self._results = results
        self._check = check
        self._lookup = container_lookup
        self._is_started = is_started
        self._wall_clock = wall_clock
        self._recorder = recorder
        self._wake = asyncio.Event()
        # The probe state of the container instance being probed.
        self.container_id = ""
        self.last_result: Result | None = None
        self.result_run = 0
        self.on_hold = False
        # prober_probe_total's labels around `result`: (probe_type,) and (container, pod, namespace, pod_uid)
        self._metric_labels = ((probe_type.value,), (self.name, podutil.name(pod), podutil.namespace(pod),
                                                     podutil.uid(pod)))

    def __repr__(self) -> str:
        return f"<ProbeWorker {self.probe_type.value} {podutil.full_name(self.pod)}/{self.name}>"

    # -- one tick -------------------------------------------------------------------------------

    async def do_probe(self) -> bool:
        """Looks at the container and probes it if it should; returns whether the worker keeps going."""
        container = self._lookup(self.pod_uid, self.name)
        if container is None:
            return True  # not created yet, or removed: wait for news
        if container.id != self.container_id:
            # A new instance starts from the initial verdict; the old one's result goes with it.
            if self.container_id:
                self._results.remove(self.container_id)
            self.container_id = container.id
            self.last_result, self.result_run, self.on_hold = None, 0, False
            self._set(INITIAL_RESULT[self.probe_type])
        if self.on_hold:
            return True  # it failed for good; nothing to learn until a new instance runs
        if container.state == ContainerState.CREATED:
            # Created, not started yet (the runtime manager starts it, or starts it again when its start failed
            # half-way): it has failed no probe. A FAILURE stored here would stay with this instance once it
            # runs, and a sidecar's failed startup probe kills it: the evented PLEG sees a container between
            # CreateContainer and StartContainer, and a sidecar was stopped 5 ms after its start that way.
            return True

        if container.state != ContainerState.RUNNING:
            self._set(Result.FAILURE)
            # A container that ended under restartPolicy Never will not come back, unless it is a sidecar:
            # those restart whatever the pod's policy, and the new instance is probed from the start.
            return (container.state != ContainerState.EXITED or podutil.restart_policy(self.pod) != "Never"
                    or podutil.is_sidecar(self.container))

        if podutil.deletion_requested(self.pod) and self.probe_type is not ProbeType.READINESS:
            # A pod shutting down is not restarted for failing a probe on its way out.
            self._set(Result.SUCCESS)
            return False

        if container.started_at and int(self._wall_clock() - container.started_at / 1e9) < self.spec.initial_delay:
            return True

        started = self._is_started(container.id)
        if (self.probe_type is ProbeType.STARTUP) == started:
            # Startup probes stop once the container started; the others wait until it has.
            return True

        try:
            outcome = await self._check(self.spec, self.container, container.id)
        except ProbeError as exc:
            log.debug("%r: probe errored, result discarded: %s", self, exc)
            return True
        self._record(outcome)
        return True

    def _record(self, outcome: Outcome) -> None:
        result = outcome.result
        before, after = self._metric_labels
        metrics.prober_probe.labels(*before, result.value, *after).inc()
        if result is Result.FAILURE:
            log.debug("%r: probe failed: %s", self, outcome.output)
            self._recorder.event(pod_ref(self.pod, self.name), WARNING, "Unhealthy",
                                 f"{self.probe_type.value} probe failed: {outcome.output}")
        elif outcome.warning:
            self._recorder.event(pod_ref(self.pod, self.name), WARNING, "ProbeWarning",
                                 f"{self.probe_type.value} probe warning: {outcome.output}")
        if result is self.last_result:
            self.result_run += 1
        else:
            self.last_result, self.result_run = result, 1
        threshold = self.spec.failure_threshold if result is Result.FAILURE else self.spec.success_threshold
        if result in (Result.FAILURE, Result.SUCCESS) and self.result_run < threshold:
            return  # not enough in a row to change the verdict
        if self._set(result):
            self._log_change(result, outcome.output)
        if result is Result.FAILURE and self.probe_type is not ProbeType.READINESS:
            # The container will be killed; probing it while it stops only races the kill.
            self.on_hold = True
            self.result_run = 0

    def _set(self, result: Result) -> bool:
        return self._results.set(self.container_id, self.pod_uid, self.name, result)

    def _log_change(self, result: Result, output: str) -> None:
        where = f"pod {podutil.full_name(self.pod)} container {self.name} ({self.container_id[:13]})"
        kind = self.probe_type.value.lower()
        if result is Result.SUCCESS:
            log.info("%s: %s probe succeeded", where, kind)
        elif self.probe_type is ProbeType.READINESS:
            log.info("%s: readiness probe failed %d times: %s", where, self.spec.failure_threshold, output)
        else:
            log.warning("%s: %s probe failed %d times, the container will be restarted: %s",
                        where, kind, self.spec.failure_threshold, output)

    # -- the loop -------------------------------------------------------------------------------

    def trigger(self) -> None:
        """Probe now instead of at the next period (the kubelet's manual trigger)."""
        self._wake.set()

    async def run(self, first_delay: float = 0.0) -> None:
        """Probes every period until cancelled or the container is gone for good (then it returns).

        `first_delay` spreads the first probes of many workers over a period after an agent start.
        A probe that outlasts the period delays the next one; missed ticks are not made up.
        """
        loop = asyncio.get_running_loop()
        if first_delay > 0:
            await self._wait(first_delay)
        next_tick = loop.time() + self.spec.period
        while await self._tick():
            await self._wait(next_tick - loop.time())
            now = loop.time()
            if now >= next_tick:  # a trigger leaves the period's own schedule alone
                next_tick = max(next_tick + self.spec.period, now)

    async def _tick(self) -> bool:
        try:
            return await self.do_probe()
        except Exception:  # a bug in one probe must not end the probing of the container
            log.exception("%r: probe crashed", self)
            return True

    async def _wait(self, delay: float) -> None:
        if delay > 0:
            await wait_set(self._wake, delay)
        self._wake.clear()

    def forget(self) -> None:
        """Drops this worker's result and metric series; its owner calls it once the worker stopped."""
        if self.container_id:
            self._results.remove(self.container_id)
        for result in Result:
            try:
                metrics.prober_probe.remove(*self._metric_labels[0], result.value, *self._metric_labels[1])
            except KeyError:
                pass
