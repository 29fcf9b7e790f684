"""The eviction manager: every 10 s it observes the node's signals, reports pressure conditions, reclaims
node-level resources (dead containers, unused images) and, when that is not enough, evicts one pod.

The kubelet's synchronize loop: hard thresholds only (they act at once, and the evicted pod gets the
kubelet's 1 s grace period); at most one eviction per pass, after which the manager waits (up to 30 s)
for the pod to be cleaned up before observing again. Critical pods (static, mirror, system priority)
are never evicted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.config import Threshold
from edgelet.eviction import policy
from edgelet.eviction import signals as sig
from edgelet.eviction.usage import PodUsage
from edgelet.metrics import registry as metrics
from edgelet.util.errors import EdgeletError

log = logging.getLogger(__name__)

MONITORING_INTERVAL = 10.0  # the kubelet's evictionMonitoringPeriod
CLEANUP_TIMEOUT = 30.0  # the kubelet's podCleanupTimeout
CLEANUP_POLL = 1.0
# imagefs and containerfs pressure is relieved by image GC; nodefs too when images live on it.
_IMAGE_SIGNALS = (sig.IMAGEFS_AVAILABLE, sig.IMAGEFS_INODES_FREE, sig.CONTAINERFS_AVAILABLE,
                  sig.CONTAINERFS_INODES_FREE)
_NODEFS_SIGNALS = (sig.NODEFS_AVAILABLE, sig.NODEFS_INODES_FREE)
RECLAIM_ALL = 1 << 62  # asked of reclaim_images for inode pressure: every unused image


class Signals(Protocol):
    dedicated_image_fs: bool

    async def observe(self) -> Mapping[str, sig.Observation]: ...


class Usage(Protocol):
    async def usage(self, pods: Sequence[Pod]) -> Mapping[str, PodUsage]: ...


EvictFn = Callable[[Pod, str, str, int], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Collaborators:
    """What the eviction manager observes, asks and tells (the kubelet's eviction manager takes the same)."""

    signals: Signals  # a NodeSignals
    usage: Usage  # a PodUsageReader
    active_pods: Callable[[], Sequence[Pod]]  # the admitted pods not yet terminating
    evict: EvictFn  # evict(pod, reason, message, grace_seconds): kills the pod, its final status Failed/Evicted
    pod_cleaned_up: Callable[[str], bool] | None = None  # whether an evicted pod's containers are gone
    reclaim_images: Callable[[int], Awaitable[int]] | None = None  # bytes asked -> bytes freed (image GC)
    reclaim_containers: Callable[[], Awaitable[Any]] | None = None  # dead containers removed (container GC)


class EvictionManager:
    """Observes the node's signals against `thresholds` and reclaims or evicts through its `collaborators`;
    `is_critical(pod)` tells which pods are never evicted and always admitted (the kubelet's rule: static,
    mirror and system-critical pods)."""

    def __init__(
        self,
        thresholds: Mapping[str, Threshold],
        collaborators: Collaborators,
        *,
        pressure_transition_period: float = 300.0,
        monitoring_interval: float = MONITORING_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        is_critical: Callable[[Pod], bool] = policy.is_critical,
    ):
        self.thresholds = dict(thresholds)
        self._signals = collaborators.signals
        self._usage = collaborators.usage
        self._active_pods = collaborators.active_pods
        self._evict = collaborators.evict
        self._reclaim_images = collaborators.reclaim_images
        self._reclaim_containers = collaborators.reclaim_containers
        self._pod_cleaned_up = collaborators.pod_cleaned_up
        self.pressure_transition_period = pressure_transition_period
        self.monitoring_interval = monitoring_interval
        self._clock = clock
        self._sleep = sleep
        self._is_critical = is_critical
        self._last_observed: dict[str, float] = {}
        self._conditions: set[str] = set()
        self._last_signal: str | None = None
        self.last_observations: Mapping[str, sig.Observation] = {}
        for signal in sorted(set(self.thresholds) - set(sig.OBSERVED_SIGNALS)):
            log.warning("eviction: signal %s is not observed by edgelet; its threshold is ignored", signal)

    # -- what others ask ------------------------------------------------------------------------

    @property
    def conditions(self) -> frozenset[str]:
        return frozenset(self._conditions)

    def pressure(self) -> dict[str, bool]:
        """The node report's pressure (NodeReport.pressure): {"memory": .., "disk": .., "pid": ..}."""
        return policy.pressure_flags(self._conditions)

    def admit(self, pod: Pod) -> tuple[bool, str, str]:
        """(admitted, reason, message) under the current pressure conditions, with the kubelet's rules."""
        return policy.admit(self._conditions, pod, is_critical=self._is_critical)

    # -- the loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            evicted = None
            try:
                evicted = await self.synchronize()
            except (EdgeletError, OSError) as exc:
                log.warning("eviction: pass failed: %s", exc)
            except Exception:  # a bug here must not end eviction for good, but must be seen
                log.exception("eviction: pass failed")
            if evicted is not None:
                await self._wait_for_cleanup(evicted)
            else:
                await self._sleep(self.monitoring_interval)

    async def synchronize(self) -> Pod | None:
        """One pass; returns the pod it evicted, if any."""
        if not self.thresholds:
            return None
        observations = await self._signals.observe()
        self.last_observations = observations
        met = policy.thresholds_met(self.thresholds, observations)
        self._update_conditions(met)
        signal = policy.signal_to_reclaim(met)
        # Under lasting pressure the same lines would repeat every pass: say them once, then at debug level.
        level = logging.INFO if signal != self._last_signal else logging.DEBUG
        self._last_signal = signal
        if signal is None:
            return None
        resource = policy.SIGNAL_RESOURCE[signal]
        log.log(level, "eviction: threshold %s<%s met (available %s); attempting to reclaim %s", signal,
                policy.threshold_text(signal, self.thresholds[signal]), observations[signal].available, resource)
        if await self._reclaim_node_level(signal, observations):
            log.info("eviction: reduced %s pressure without evicting pods", resource)
            return None
        pods = list(self._active_pods())
        if not pods:
            log.log(level, "eviction: thresholds are met, but no pods are active to evict")
            return None
        usage = await self._usage.usage(pods)
        for pod in policy.rank_pods(signal, pods, usage):
            if self._is_critical(pod):
                log.debug("eviction: cannot evict critical pod %s", podutil.full_name(pod))
                continue
            message = policy.eviction_message(signal, pod, usage.get(podutil.uid(pod)), self.thresholds[signal],
                                              observations.get(signal))
            log.warning("eviction: evicting pod %s: %s", podutil.full_name(pod), message.strip())
            try:
                await self._evict(pod, policy.REASON, message, policy.HARD_EVICTION_GRACE_SECONDS)
            except EdgeletError as exc:  # as the kubelet: the attempt counts, the next pass looks again
                log.error("eviction: pod %s failed to evict: %s", podutil.full_name(pod), exc)
            metrics.evictions.labels(signal).inc()
            return pod
        log.log(logging.WARNING if level == logging.INFO else logging.DEBUG,
                "eviction: unable to evict any pod to reclaim %s (only critical pods run)", resource)
        return None

    def _update_conditions(self, met: list[str]) -> None:
        now = self._clock()
        self._last_observed = policy.conditions_last_observed(self._last_observed, policy.node_conditions(met), now)
        conditions = policy.conditions_in_effect(self._last_observed, self.pressure_transition_period, now)
        for condition in sorted(conditions - self._conditions):
            log.warning("eviction: node has condition %s", condition)
        for condition in sorted(self._conditions - conditions):
            log.info("eviction: node no longer has condition %s", condition)
        self._conditions = conditions

    async def _reclaim_node_level(self, signal: str, observations: Mapping[str, sig.Observation]) -> bool:
        """Frees dead containers and unused images for disk pressure; True when no threshold is met after."""
        steps: list[tuple[str, Callable[[], Awaitable[Any]]]] = []
        if signal in _IMAGE_SIGNALS or signal in _NODEFS_SIGNALS:
            if self._reclaim_containers is not None:
                steps.append(("dead containers", self._reclaim_containers))
            images_here = signal in _IMAGE_SIGNALS or not self._signals.dedicated_image_fs
            if images_here and (reclaim_images := self._reclaim_images) is not None:
                amount = RECLAIM_ALL if policy.SIGNAL_RESOURCE[signal] == policy.INODES else \
                    max(policy.shortfall(self.thresholds[signal], observations[signal]), 1)
                steps.append(("unused images", lambda: reclaim_images(amount)))
        if not steps:
            return False
        for what, step in steps:
            try:
                await step()
            except (EdgeletError, OSError) as exc:
                log.warning("eviction: reclaiming %s failed: %s", what, exc)
        after = await self._signals.observe()
        self.last_observations = after
        return not policy.thresholds_met(self.thresholds, after)

    async def _wait_for_cleanup(self, pod: Pod) -> None:
        if self._pod_cleaned_up is None:
            await self._sleep(self.monitoring_interval)
            return
        uid = podutil.uid(pod)
        waited = 0.0
        while waited < CLEANUP_TIMEOUT:
            await self._sleep(CLEANUP_POLL)
            waited += CLEANUP_POLL
            if self._pod_cleaned_up(uid):
                log.info("eviction: pod %s cleaned up", podutil.full_name(pod))
                return
        log.warning("eviction: timed out waiting for pod %s to be cleaned up", podutil.full_name(pod))
