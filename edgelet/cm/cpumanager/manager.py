"""The CPU manager: admits pods by allocating their exclusive CPUs, tells the runtime manager each
container's cpuset, checkpoints every change, and keeps running containers on the right CPUs.

As in the kubelet, the cpuset is set when a container is created (`cpuset_for`) and corrected by a
reconcile pass every 10 s (`run`), which also moves shared containers off CPUs that became exclusive
and frees the CPUs of pods that are no longer active. A pass also follows every allocation and release.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.cm.cpumanager.policy import (
    POLICIES,
    POLICY_STATIC,
    CPUAllocationError,
    CPUState,
    CPUStateError,
    StaticPolicy,
    check_policy,
    initial_state,
    validate_state,
)
from edgelet.cm.cpumanager.state import CPUStateStore
from edgelet.container.runtime import PodRuntimeStatus
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.util.cpuset import format_cpuset
from edgelet.util.errors import EdgeletError
from edgelet.util.tasks import wait_set

if TYPE_CHECKING:
    from edgelet.cm.topology import CPUTopology

log = logging.getLogger(__name__)

DEFAULT_RECONCILE_PERIOD = 10.0  # the kubelet's cpuManagerReconcilePeriod
ADMISSION_REASON = "UnexpectedAdmissionError"


@dataclass(slots=True)
class ReconcileResult:
    updated: list[str]  # container ids whose cpuset was changed
    failed: list[str]
    released: list[str]  # pod uids whose CPUs went back to the shared pool


class CPUManager:
    """`policy` is "none" or "static"; `active_pods` are the pods admitted and not terminated,
    `runtime_status(uid)` what the runtime runs for a pod (the PLEG cache), `sources_ready()` whether
    every pod source has reported (before that, a pod missing from `active_pods` may only be late)."""

    def __init__(
        self,
        policy: str,
        store: CPUStateStore,
        runtime,
        *,
        active_pods: Callable[[], Iterable[Pod]],
        runtime_status: Callable[[str], PodRuntimeStatus],
        sources_ready: Callable[[], bool] = lambda: True,
        topology: CPUTopology | None = None,
        reserved: frozenset[int] = frozenset(),
        reconcile_period: float = DEFAULT_RECONCILE_PERIOD,
    ):
        if policy not in POLICIES:
            raise ValueError(f"unknown CPU manager policy {policy!r}; known: {', '.join(POLICIES)}")
        self.policy_name = policy
        self._store = store
        self._runtime = runtime
        self._active_pods = active_pods
        self._runtime_status = runtime_status
        self._sources_ready = sources_ready
        self._topology = topology
        self._reserved = reserved
        self.reconcile_period = reconcile_period
        self._policy: StaticPolicy | None = None
        self._state: CPUState | None = None
        self._unsaved = False
        self._applied: dict[str, str] = {}  # container id -> cpuset last set through CRI
        self._wake = asyncio.Event()

    @property
    def static(self) -> bool:
        return self.policy_name == POLICY_STATIC

    @property
    def state(self) -> CPUState | None:
        return self._state

    def start(self) -> None:
        """Loads and checks the recorded state. Raises CPUStateError when it cannot be used, as the kubelet
        refuses to start (the message names the file: drain the node and delete it), when the reserved CPUs
        are not this machine's, or when the topology cannot be read."""
        try:
            recorded = self._store.load()
            if recorded is not None and not self.static:
                check_policy(recorded, self.policy_name)
        except (CPUStateError, OSError) as exc:
            raise self._unusable(exc) from None
        if not self.static:
            return
        from edgelet.cm.topology import discover  # static policy only: the default "none" never reads it

        try:
            topology = self._topology = self._topology or discover()
        except (OSError, ValueError) as exc:
            raise CPUStateError(f"CPU manager: cannot read the CPU topology: {exc}") from None
        try:
            self._policy = StaticPolicy(topology, self._reserved)
        except CPUStateError as exc:
            raise CPUStateError(f"CPU manager: [cpu] reserved_cpus: {exc}") from None
        try:
            state = initial_state(self.policy_name, topology) if recorded is None else \
                validate_state(recorded, self.policy_name, topology, self._reserved)
        except CPUStateError as exc:
            raise self._unusable(exc) from None
        self._state = state
        if recorded != state:
            self._save_or_remember()
        log.info("CPU manager: static policy on %s, reserved CPUs %r, shared pool %s", topology.describe(),
                 format_cpuset(self._reserved), format_cpuset(state.default))

    def _unusable(self, problem: Exception) -> CPUStateError:
        return CPUStateError(f"CPU manager state {self._store.path}: {problem}; drain this node, delete the file "
                             f"and restart edgelet")

    # -- admission and container creation ------------------------------------------------------

    def allocate(self, pod: Pod) -> None:
        """Gives every container of `pod` the CPUs the policy grants it, and records them; raises
        CPUAllocationError with the kubelet's message when they cannot be given. Repeating it is harmless."""
        if not self.static:
            return
        state = self._require_state()
        if self._policy is None:
            raise CPUAllocationError("the CPU manager has not started")
        new_state = self._policy.allocate(state, pod)
        if new_state == state:
            return
        try:
            self._store.save(new_state)
        except OSError as exc:
            raise CPUAllocationError(f"cannot record the CPU assignment in {self._store.path}: {exc}") from None
        self._state = new_state
        for name, cpus in sorted((new_state.assignments.get(podutil.uid(pod)) or {}).items()):
            log.info("CPU manager: pod %s container %s gets exclusive CPUs %s", podutil.full_name(pod), name,
                     format_cpuset(cpus))
        self._wake.set()

    def admit(self, pod: Pod) -> tuple[bool, str, str]:
        """(admitted, reason, message) as the kubelet's resource allocation admit handler answers."""
        try:
            self.allocate(pod)
        except CPUAllocationError as exc:
            return False, ADMISSION_REASON, f"Allocate failed due to {exc}, which is unexpected"
        return True, "", ""

    def cpuset_for(self, pod: Pod, container: dict) -> str:
        """The cpuset_cpus for the container's LinuxContainerResources; "" leaves the runtime's default."""
        if not self.static or self._state is None or self._policy is None:
            return ""
        return format_cpuset(self._policy.cpuset(self._state, podutil.uid(pod), container.get("name", "")))

    def exclusive_cpus(self, uid: str, container: str) -> frozenset[int]:
        """The container's exclusive CPUs (none under the "none" policy): the pod resources API's cpu_ids."""
        if self._state is None:
            return frozenset()
        return (self._state.assignments.get(uid) or {}).get(container, frozenset())

    def allocatable_cpus(self) -> frozenset[int]:
        """The CPUs the static policy may give pods, the reserved ones left out (none under the "none" policy, as
        the kubelet answers GetAllocatableResources)."""
        if self._state is None:
            return frozenset()
        assigned = frozenset().union(*(cpus for containers in self._state.assignments.values()
                                       for cpus in containers.values()))
        return (self._state.default | assigned) - self._reserved

    def remove(self, uid: str) -> None:
        """Returns the pod's exclusive CPUs to the shared pool (call it once the pod is terminated)."""
        if not self.static or self._state is None or uid not in self._state.assignments:
            return
        freed = format_cpuset(self._state.without_pod(uid).default - self._state.default)
        self._state = self._state.without_pod(uid)
        log.info("CPU manager: pod %s released CPUs %s to the shared pool", uid, freed)
        self._save_or_remember()
        self._wake.set()

    def _require_state(self) -> CPUState:
        if self._state is None:
            raise CPUAllocationError("the CPU manager has not started")
        return self._state

    def _save_or_remember(self) -> None:
        if self._state is None:
            return
        try:
            self._store.save(self._state)
            self._unsaved = False
        except OSError as exc:
            # The assignment stands in memory; the next reconcile pass writes it again.
            self._unsaved = True
            log.warning("CPU manager: cannot write %s: %s; will retry", self._store.path, exc)

    # -- reconcile ---------------------------------------------------------------------------------

    async def reconcile(self) -> ReconcileResult:
        """Frees CPUs of pods no longer active (once sources are ready) and sets, over CRI, the cpuset of
        each running container of an active pod that differs from what this manager last set."""
        result = ReconcileResult([], [], [])
        if not self.static or self._state is None or self._policy is None:
            return result
        active = {podutil.uid(pod): pod for pod in self._active_pods()}
        if self._sources_ready():
            for uid in sorted(set(self._state.assignments) - set(active)):
                self.remove(uid)
                result.released.append(uid)
        if self._unsaved:
            self._save_or_remember()
        running: set[str] = set()
        for uid in active:
            for container in self._runtime_status(uid).running_containers():
                running.add(container.id)
                cpus = format_cpuset(self._policy.cpuset(self._state, uid, container.name))
                if not cpus or self._applied.get(container.id) == cpus:
                    continue
                try:
                    await self._runtime.update_container_resources(
                        container.id, pb.LinuxContainerResources(cpuset_cpus=cpus))
                except EdgeletError as exc:
                    result.failed.append(container.id)
                    log.warning("CPU manager: cannot set cpuset %s of container %s (%s): %s", cpus,
                                container.name, container.id[:13], exc)
                    continue
                self._applied[container.id] = cpus
                result.updated.append(container.id)
                log.debug("CPU manager: container %s (%s) now on CPUs %s", container.name, container.id[:13], cpus)
        for gone in set(self._applied) - running:
            del self._applied[gone]
        return result

    async def run(self) -> None:
        """Reconciles every `reconcile_period`, and at once after an allocation or a release."""
        if not self.static:
            return
        while True:
            self._wake.clear()
            try:
                await self.reconcile()
            except EdgeletError as exc:
                log.warning("CPU manager: reconcile failed: %s", exc)
            except Exception:  # a bug here must not stop reconciling for good, but must be seen
                log.exception("CPU manager: reconcile failed")
            await wait_set(self._wake, self.reconcile_period)
