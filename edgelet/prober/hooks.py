"""Container lifecycle hooks: postStart right after a container starts, preStop before it is stopped.

The kubelet's rules: a failed postStart hook gets the container killed (FailedPostStartHook; the runtime
manager stops it, as any container, preStop hook included); a preStop hook runs within the grace period,
and what it leaves of it goes to StopContainer, never less than two seconds. Hooks are exec (CRI ExecSync, no
timeout), httpGet or sleep.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from edgelet.api import podutil
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.events import NO_EVENTS, WARNING, Recorder, pod_ref
from edgelet.kuberuntime.manager import MINIMUM_GRACE_SECONDS
from edgelet.util.errors import ConfigError, EdgeletError

from .probes import (
    HOOK_HANDLERS,
    HttpGetError,
    HttpGetter,
    describe,
    http_headers,
    http_url,
    parse_handler,
    truncate,
)
from .results import ProbeError

log = logging.getLogger(__name__)

REASON_FAILED_POST_START = "FailedPostStartHook"
REASON_POST_START_ERROR = "PostStartHookError"  # the container's waiting reason afterwards


class HookError(Exception):
    """A hook that failed; the message says which hook, of which container, and why."""


def remaining_grace(grace: int, elapsed: float) -> int:
    """Seconds left for StopContainer after a preStop hook used `elapsed` of `grace`.

    Whole seconds spent count (the kubelet truncates); the container always keeps a short window
    to shut down, so a hook that used up the grace period does not turn the stop into a SIGKILL.
    """
    return max(grace - int(elapsed), MINIMUM_GRACE_SECONDS)


def find_container(pod: podutil.Pod, name: str) -> Mapping[str, Any] | None:
    for container in podutil.all_containers(pod):
        if container.get("name") == name:
            return container
    return None


class HookRunner:
    """Runs a pod's lifecycle hooks. `pod_ip(pod_uid)` gives the address of httpGet hooks without a
    host (for host-network pods: the node's); when it does not know yet, the sandbox is asked."""

    def __init__(self, runtime: Any, pod_ip: Callable[[str], str], *, http: HttpGetter | None = None,
                 clock: Callable[[], float] = time.monotonic, recorder: Recorder = NO_EVENTS):
        self._runtime = runtime
        self._recorder = recorder
        self._pod_ip = pod_ip
        self._http = http or HttpGetter()
        self._clock = clock

    async def post_start(self, pod: podutil.Pod, container: Mapping[str, Any], container_id: str) -> str | None:
        """Runs the container's postStart hook, if any. On failure the message is returned: the caller
        stops the container and shows the message as its PostStartHookError."""
        handler = (container.get("lifecycle") or {}).get("postStart")
        if handler is None:
            return None
        try:
            await self._run(pod, container, container_id, handler, "postStart")
        except HookError as exc:
            message = str(exc)
            log.warning("pod %s: container %s (%s): %s: killing it (%s)", podutil.full_name(pod),
                        container["name"], container_id[:13], message, REASON_FAILED_POST_START)
            self._recorder.event(pod_ref(pod, container["name"]), WARNING, REASON_FAILED_POST_START, message)
            return message
        return None

    async def pre_stop(self, pod: podutil.Pod, name: str, container_id: str, grace: int) -> int:
        """Runs the container's preStop hook within `grace` seconds; returns the seconds StopContainer
        gets (at least MINIMUM_GRACE_SECONDS). A grace of 0 (a forced stop) skips the hook and stays 0.
        A failed or unfinished hook is logged; the stop goes on regardless."""
        container = find_container(pod, name)
        handler = ((container or {}).get("lifecycle") or {}).get("preStop")
        if container is None or handler is None or grace <= 0:
            return grace
        started = self._clock()
        try:
            async with asyncio.timeout(grace):
                await self._run(pod, container, container_id, handler, "preStop")
        except TimeoutError:
            log.info("pod %s: container %s (%s): PreStop hook not completed in the %ds grace period",
                     podutil.full_name(pod), name, container_id[:13], grace)
        except HookError as exc:
            log.warning("pod %s: container %s (%s): %s (FailedPreStopHook)", podutil.full_name(pod), name,
                        container_id[:13], exc)
            self._recorder.event(pod_ref(pod, name), WARNING, "FailedPreStopHook", str(exc))
        except Exception:  # a bug here must not keep the container from being stopped
            log.exception("pod %s: container %s: PreStop hook crashed", podutil.full_name(pod), name)
        return remaining_grace(grace, self._clock() - started)

    async def close(self) -> None:
        await self._http.close()

    async def _run(self, pod: podutil.Pod, container: Mapping[str, Any], container_id: str,
                   handler: Any, hook: str) -> None:
        name = container.get("name", "")
        where = f"pod {podutil.full_name(pod)}"
        try:
            kind, action = parse_handler(handler if isinstance(handler, Mapping) else {}, where,
                                         f"spec.containers[{name}].lifecycle.{hook}", HOOK_HANDLERS)
        except ConfigError as exc:
            raise HookError(f"cannot run {hook} hook: {exc}") from None
        if kind == "exec":
            await self._exec(container_id, action["command"], hook)
        elif kind == "httpGet":
            await self._http_get(pod, container, container_id, action, hook)
        else:
            await asyncio.sleep(action["seconds"])

    async def _exec(self, container_id: str, command: list[str], hook: str) -> None:
        label = f"Exec lifecycle hook ({command}) of {hook}"
        try:
            # No timeout: the kubelet lets an exec hook run as long as it takes.
            exit_code, stdout, stderr = await self._runtime.exec_sync(container_id, command, 0)
        except EdgeletError as exc:
            raise HookError(f"{label} failed: {exc}") from None
        if exit_code != 0:
            raise HookError(f"{label} failed: exited with {exit_code}: {truncate(stdout + stderr)!r}")

    async def _http_get(self, pod: podutil.Pod, container: Mapping[str, Any], container_id: str,
                        action: Mapping[str, Any], hook: str) -> None:
        label = f"HTTP lifecycle hook ({action.get('path') or '/'}) of {hook}"
        try:
            pod_ip = "" if action.get("host") else await self._address(pod, container_id)
            url = http_url(action, container, pod_ip)
        except (ProbeError, EdgeletError) as exc:
            raise HookError(f"{label} failed: {exc}") from None
        try:
            # The kubelet only asks that the request goes through: any HTTP status will do.
            await self._http.get(url, http_headers(action.get("httpHeaders"), "lifecycle"), None)
        except (HttpGetError, OSError) as exc:
            raise HookError(f"{label} failed: GET {url}: {describe(exc)}") from None

    async def _address(self, pod: podutil.Pod, container_id: str) -> str:
        """The pod's IP; a sandbox started moments ago may not be in the agent's cache yet."""
        ip = self._pod_ip(podutil.uid(pod))
        if ip:
            return ip
        found = await self._runtime.list_containers(pb.ContainerFilter(id=container_id))
        if found:
            status = await self._runtime.pod_sandbox_status(found[0].pod_sandbox_id)
            ip = status.status.network.ip
        if not ip:
            raise ProbeError("failed to find the pod's network address")
        return ip
