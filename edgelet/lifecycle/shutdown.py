"""Graceful node shutdown, as the kubelet does it: a systemd-logind "delay" inhibitor holds the power-off
while the node reports NotReady and stops regular pods, then critical pods, each group within its budget.

The order and budgets are pure (`plan_shutdown`); `ShutdownManager.shutdown` carries them out through the
agent; `LogindInhibitor` speaks D-Bus (jeepney, imported only when a grace period is configured).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.config import ShutdownConfig
from edgelet.lifecycle.admission import Verdict
from edgelet.util.retry import Retrier

log = logging.getLogger(__name__)

# The kubelet's words, so tools and people that know them recognise them.
REASON = "Terminated"
MESSAGE = "Pod was terminated in response to imminent node shutdown."
NOT_READY_MESSAGE = "node is shutting down"
ADMIT_REASON = "Shutdown"
ADMIT_MESSAGE = "Pod was rejected as the node is shutting down."
INHIBIT_WHY = "edgelet needs time to stop pods in order before the node shuts down"
# How often stopped pods are checked while a group's budget runs.
_POLL = 0.2


@dataclass(frozen=True, slots=True)
class Stage:
    """Pods stopped together, each with its grace period; the stage ends when all stopped or `budget` is spent."""

    name: str
    budget: float
    pods: tuple[tuple[Pod, int], ...] = field(default=())


def plan_shutdown(pods: Iterable[Pod], grace: float, critical_grace: float,
                  is_critical: Callable[[Pod], bool]) -> list[Stage]:
    """Regular pods first with `grace - critical_grace`, then critical pods with `critical_grace`; a pod's own
    terminationGracePeriodSeconds wins when it is shorter (kubelet 1.20's nodeshutdown manager)."""
    regular_budget = max(grace - critical_grace, 0.0)
    stages = [Stage("regular", regular_budget), Stage("critical", critical_grace)]
    groups: tuple[list, list] = ([], [])
    for pod in pods:
        critical = is_critical(pod)
        budget = critical_grace if critical else regular_budget
        own = podutil.spec(pod).get("terminationGracePeriodSeconds")
        pod_grace = int(budget) if not isinstance(own, int) or isinstance(own, bool) else min(own, int(budget))
        groups[critical].append((pod, max(pod_grace, 0)))
    return [Stage(stage.name, stage.budget, tuple(group)) for stage, group in zip(stages, groups)]


class ShutdownManager:
    """Runs the node's shutdown once logind announces it; the agent hands in what it needs."""

    def __init__(self, config: ShutdownConfig, *, active_pods: Callable[[], list[Pod]],
                 is_critical: Callable[[Pod], bool], stop_pod: Callable[[Pod, int], None],
                 pod_stopped: Callable[[str], bool], report_not_ready: Callable[[], Awaitable[None]],
                 flush_statuses: Callable[[float], Awaitable[None]],
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 inhibitor: Callable[[], LogindInhibitor] = lambda: LogindInhibitor(INHIBIT_WHY)):
        self.config = config
        self._active_pods = active_pods
        self._is_critical = is_critical
        self._stop_pod = stop_pod
        self._pod_stopped = pod_stopped
        self._report_not_ready = report_not_ready
        self._flush_statuses = flush_statuses
        self._clock = clock
        self._sleep = sleep
        self._new_inhibitor = inhibitor
        self.shutting_down = False

    def health(self) -> tuple[bool, str]:
        """For the node's Ready condition: NotReady with the kubelet's message once shutdown started."""
        return (False, NOT_READY_MESSAGE) if self.shutting_down else (True, "ok")

    def admit(self, pod: Pod) -> Verdict:
        if self.shutting_down:
            return Verdict(False, ADMIT_REASON, ADMIT_MESSAGE)
        return Verdict(True)

    async def run(self) -> None:
        """Holds the logind inhibitor and runs `shutdown` on PrepareForShutdown(true). Without a system bus or
        logind (yet) it says so once and tries again: pods run on either way, only unprotected from power-off."""
        from jeepney.wrappers import DBusErrorResponse

        retry = Retrier("graceful node shutdown (system bus / systemd-logind)", initial=1.0, maximum=60.0, logger=log)
        while True:
            inhibitor = self._new_inhibitor()
            try:
                await self._arm(inhibitor)
                retry.succeeded()
                await self._watch(inhibitor)  # returns only by raising
            except (OSError, EOFError, RuntimeError, ValueError, DBusErrorResponse) as exc:  # no bus/logind, refused
                reason = str(exc) or type(exc).__name__
            finally:
                inhibitor.close()
            if self.shutting_down:  # after our shutdown ran, the bus going away is just the machine powering off
                delay = retry.failed(f"unavailable ({reason})", level=logging.INFO)
            else:
                delay = retry.failed(f"unavailable ({reason})", "pods run on, unprotected from power-off")
            await self._sleep(delay)

    async def _arm(self, inhibitor: LogindInhibitor) -> None:
        await inhibitor.start(asyncio.get_running_loop())
        delay_max = await asyncio.to_thread(inhibitor.delay_max_seconds)
        if delay_max < self.config.grace_period:
            log.warning("logind's InhibitDelayMaxSec is %.0fs, shorter than [shutdown] grace_period %.0fs: "
                        "the machine powers off before pods are stopped; raise it (see the README)",
                        delay_max, self.config.grace_period)
        log.info("graceful node shutdown armed: %.0fs for pods (%.0fs of it for critical pods)",
                 self.config.grace_period, self.config.critical_pods_grace_period)

    async def _watch(self, inhibitor: LogindInhibitor) -> None:
        while True:
            active = await inhibitor.next_prepare_for_shutdown()
            if active and not self.shutting_down:
                await self.shutdown()
                inhibitor.release()
            elif not active and self.shutting_down:
                # A cancelled shutdown: the kubelet re-arms; pods already stopped stay stopped.
                log.info("node shutdown cancelled; taking the inhibitor again")
                self.shutting_down = False
                await asyncio.to_thread(inhibitor.take)

    async def shutdown(self) -> None:
        """NotReady, regular pods, critical pods, final statuses; each group bounded by its budget."""
        self.shutting_down = True
        started = self._clock()
        log.warning("node is shutting down: stopping pods within %.0fs", self.config.grace_period)
        try:
            async with asyncio.timeout(min(2.0, self.config.grace_period)):
                await self._report_not_ready()
        except Exception as exc:  # noqa: BLE001 - best effort: the API server may be unreachable
            log.info("node shutdown: NotReady not reported to the API server: %s", str(exc) or type(exc).__name__)
        stages = plan_shutdown(self._active_pods(), self.config.grace_period, self.config.critical_pods_grace_period,
                               self._is_critical)
        for stage in stages:
            await self._run_stage(stage)
        remaining = self.config.grace_period - (self._clock() - started)
        await self._flush_statuses(max(remaining, 1.0))
        log.warning("node shutdown: pods stopped in %.1fs; releasing the inhibitor", self._clock() - started)

    async def _run_stage(self, stage: Stage) -> None:
        if not stage.pods:
            return
        deadline = self._clock() + stage.budget
        for pod, grace in stage.pods:
            log.info("node shutdown: stopping %s pod %s with a grace period of %ds", stage.name,
                     podutil.full_name(pod), grace)
            self._stop_pod(pod, grace)
        waiting = [podutil.uid(pod) for pod, _ in stage.pods]
        while waiting and self._clock() < deadline:
            await self._sleep(min(_POLL, max(deadline - self._clock(), 0.0)))
            waiting = [uid for uid in waiting if not self._pod_stopped(uid)]
        if waiting:
            log.warning("node shutdown: %d %s pods still running after their %.0fs budget", len(waiting), stage.name,
                        stage.budget)


class LogindInhibitor:
    """A logind delay inhibitor for "shutdown" and the PrepareForShutdown signal, over the system bus.

    jeepney's asyncio connection cannot receive file descriptors (the inhibitor *is* one), so calls use short
    blocking connections in a worker thread (the lock outlives them: it is the fd), and a daemon thread owns
    the connection that receives the signal and hands it to the event loop.
    """

    def __init__(self, why: str):
        self._why = why
        self._signal_conn: Any = None  # jeepney's blocking connection (untyped), made by start()
        self._lock_fd: int | None = None
        self._signals: asyncio.Queue[bool | None] = asyncio.Queue()  # None: the receiver ended

    async def start(self, loop: asyncio.AbstractEventLoop) -> None:
        from jeepney import message_bus
        from jeepney.io.blocking import open_dbus_connection

        self._signal_conn = await asyncio.to_thread(open_dbus_connection, "SYSTEM")
        await asyncio.to_thread(self._signal_conn.send_and_get_reply, message_bus.AddMatch(_prepare_rule(on_bus=True)),
                                timeout=10)
        await asyncio.to_thread(self.take)
        threading.Thread(target=self._receive, args=(self._signal_conn, loop), name="logind-signals",
                         daemon=True).start()

    def take(self) -> None:
        from jeepney import new_method_call

        (fd,) = _login1_call(new_method_call(_login1(), "Inhibit", "ssss", ("shutdown", "edgelet", self._why, "delay")))
        self._lock_fd = fd.to_raw_fd()
        log.info("took the logind shutdown inhibitor (delay)")

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
            log.info("released the logind shutdown inhibitor")

    def delay_max_seconds(self) -> float:
        from jeepney import Properties

        ((_, usec),) = _login1_call(Properties(_login1()).get("InhibitDelayMaxUSec"))
        return usec / 1e6

    async def next_prepare_for_shutdown(self) -> bool:
        active = await self._signals.get()
        if active is None:
            raise ConnectionError("the system bus connection was lost")
        return active

    def _receive(self, conn, loop: asyncio.AbstractEventLoop) -> None:
        try:
            with conn.filter(_prepare_rule()) as queue:
                while True:
                    message = conn.recv_until_filtered(queue)
                    loop.call_soon_threadsafe(self._signals.put_nowait, bool(message.body[0]))
        except Exception as exc:  # noqa: BLE001 - the connection closed (agent stopping) or the bus went away
            log.debug("logind signal receiver ended: %s", exc)
            with contextlib.suppress(RuntimeError):  # the loop is already closed when the agent stopped
                loop.call_soon_threadsafe(self._signals.put_nowait, None)

    def close(self) -> None:
        self.release()
        if self._signal_conn is not None:
            self._signal_conn.close()
            self._signal_conn = None


def _login1():
    from jeepney import DBusAddress

    return DBusAddress("/org/freedesktop/login1", bus_name="org.freedesktop.login1",
                       interface="org.freedesktop.login1.Manager")


def _login1_call(message) -> tuple:
    """One method call on a short system bus connection that can receive file descriptors."""
    from jeepney.io.blocking import open_dbus_connection
    from jeepney.wrappers import unwrap_msg

    with open_dbus_connection("SYSTEM", enable_fds=True) as conn:
        return unwrap_msg(conn.send_and_get_reply(message, timeout=10))


def _prepare_rule(*, on_bus: bool = False):
    """The PrepareForShutdown signal. The bus resolves the sender's well-known name; messages carry the unique
    name, so the rule that filters received messages leaves the sender out."""
    from jeepney import MatchRule

    sender = {"sender": "org.freedesktop.login1"} if on_bus else {}
    return MatchRule(type="signal", interface="org.freedesktop.login1.Manager", member="PrepareForShutdown",
                     path="/org/freedesktop/login1", **sender)
