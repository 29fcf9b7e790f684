"""Emptying a private containerd between tests and benchmark rounds: every sandbox and container (or one pod's)
stopped, removed, and checked gone; and the pod cgroups a stopped agent leaves behind.

The integration and e2e fixtures, the chaos harness and `make bench` all use this one helper, so the runtime's
refusals are handled in one place:
- containerd 2.x does not remove a container whose task still runs ("cannot delete running task"), where 1.6
  stopped it first: each container is stopped before it is removed;
- a container whose StartContainer is still under way cannot be removed until that start ends. An agent stopped
  or killed mid-start leaves one behind: containerd 2.1 held it "in starting state" for about 6 s under load.
  Such failures, and a runtime that is restarting, are retried until the deadline;
- a start cancelled while containerd 2.x made the task leaves a container it never removes, and whose sandbox it
  cannot stop (its task is deleted with `ctr` first, see _delete_kept_task).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from edgelet.cm import cgroups
from edgelet.cm.podcgroups import PodCgroups
from edgelet.config import CgroupsConfig
from edgelet.cri import CRIError, RuntimeCallError
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.cri.client import RuntimeClient

# How long a start left running in the runtime, or a runtime coming back, may keep the runtime from being emptied.
EMPTY_WAIT = 60.0
RETRY_DELAY = 0.2


async def empty_runtime(client: RuntimeClient, *, selector: dict[str, str] | None = None, parallel: int = 8,
                        timeout: float = EMPTY_WAIT) -> None:
    """Stops and removes every sandbox and container the runtime has (with `selector`, those whose labels match
    it), `parallel` calls at a time, until a listing shows none; raises the last failure once `timeout` is over."""
    gate = asyncio.Semaphore(parallel)
    sandbox_filter = pb.PodSandboxFilter(label_selector=selector) if selector else None
    container_filter = pb.ContainerFilter(label_selector=selector) if selector else None

    async def each(call, ids) -> list[BaseException]:
        """`call(id)` for every id, `parallel` at a time; the failures, once every call has ended (so a retry never
        runs beside calls of the pass before)."""
        async def one(item: str) -> None:
            async with gate:
                await call(item)

        results = await asyncio.gather(*map(one, ids), return_exceptions=True)
        return [result for result in results if isinstance(result, BaseException)]

    async def remove_container(container_id: str) -> None:
        await client.stop_container(container_id, 0)
        try:
            await client.remove_container(container_id)
        except CRIError as err:
            if "cannot delete running task" not in err.details or not await _delete_kept_task(client.endpoint,
                                                                                               container_id):
                raise
            await client.remove_container(container_id)

    deadline = time.monotonic() + timeout
    refused: RuntimeCallError | None = None
    while True:
        try:
            sandboxes = await client.list_pod_sandbox(sandbox_filter)
            containers = await client.list_containers(container_filter)
            if not sandboxes and not containers:
                return
            if time.monotonic() > deadline:  # say, an agent still running that starts them again
                raise TimeoutError(f"{len(sandboxes)} sandboxes and {len(containers)} containers still there "
                                   f"after {timeout:.0f}s: {_describe(sandboxes, containers)}"
                                   + (f"; the last refusal: {refused}" if refused else "")
                                   + _shim_processes({c.pod_sandbox_id for c in containers})) from refused
            # Exited containers go first: one containerd kept after a cancelled start (see _delete_kept_task) holds
            # up its sandbox's StopPodSandbox until its task is gone. Then the sandboxes are stopped: their other
            # containers stop with them, and nothing restarts meanwhile. One refusal holds back no other removal:
            # what is left at the deadline is what the runtime keeps.
            exited = {c.id for c in containers if c.state == pb.CONTAINER_EXITED}
            failures = await each(remove_container, exited)
            failures += await each(client.stop_pod_sandbox, [s.id for s in sandboxes])
            failures += await each(remove_container, [c.id for c in containers if c.id not in exited])
            failures += await each(client.remove_pod_sandbox, [s.id for s in sandboxes])
            if failures:
                raise failures[0]
        except RuntimeCallError as err:
            if time.monotonic() > deadline:
                raise
            refused = err
            await asyncio.sleep(RETRY_DELAY)


def recorded(state_dir: Path, key: str) -> str:
    """A value hack/local-containerd.sh recorded for the instance in STATE_DIR/instance.env."""
    for line in (state_dir / "instance.env").read_text().splitlines():
        name, _, value = line.partition("=")
        if name == key:
            return value
    raise LookupError(f"{state_dir / 'instance.env'}: no {key}")


def run_ctr(socket: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Runs a private instance's own `ctr` against it in the CRI namespace (k8s.io); the instance's state
    directory is its socket's."""
    ctr = Path(recorded(Path(socket).parent, "BIN")) / "ctr"
    return subprocess.run([str(ctr), "--address", socket, "--namespace", "k8s.io", *args], check=check,
                          capture_output=True, text=True, timeout=60)


async def _delete_kept_task(endpoint: str, container_id: str) -> bool:
    """Deletes, with the runtime's own `ctr`, the task containerd 2.x keeps for a container whose start was
    cancelled while it made the task (containerd issue 11037): CRI reports the container exited, StopContainer does
    nothing and RemoveContainer is refused until containerd restarts. The agent never makes such a start any more
    (its client lets StartContainer end), but a SIGKILL in the chaos suite can; this clean-up between tests only
    works on a private instance of hack/local-containerd.sh. True when the task is gone."""
    try:
        deleting = await asyncio.to_thread(run_ctr, endpoint.removeprefix("unix://"), "task", "delete", "-f",
                                           container_id, check=False)
    except (OSError, LookupError):  # no instance of hack/local-containerd.sh
        return False
    print(f"runtime clean-up: deleting the task containerd kept for never-run container {container_id[:13]}: "
          f"ctr exit status {deleting.returncode} {deleting.stderr.strip()}", file=sys.stderr)
    return deleting.returncode == 0


def _describe(sandboxes, containers) -> str:
    """What is left, as `crictl pods` and `crictl ps -a` would name it: enough to tell a runtime that keeps
    them from an agent that makes them again (new ids, fresh creation times)."""
    now = time.time_ns()
    pods = [f"pod {s.metadata.namespace}/{s.metadata.name} {s.id[:13]} {pb.PodSandboxState.Name(s.state)} "
            f"created {(now - s.created_at) / 1e9:.0f}s ago" for s in sandboxes]
    ctrs = [f"container {c.metadata.name} {c.id[:13]} of {c.pod_sandbox_id[:13]} {pb.ContainerState.Name(c.state)} "
            f"created {(now - c.created_at) / 1e9:.0f}s ago" for c in containers]
    return ", ".join(pods + ctrs)


def _shim_processes(sandbox_ids: set[str]) -> str:
    """The shims of the sandboxes whose containers could not be removed, and every process under them, each with
    its state and the kernel function it waits in: a start the runtime never ends shows where it hangs."""
    children: dict[int, list[int]] = {}
    lines: dict[int, str] = {}
    roots: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                argv = cmdline.read().split(b"\0")
            with open(f"/proc/{entry}/wchan") as wchan:
                waits_in = wchan.read() or "-"
        except OSError:  # gone meanwhile
            continue
        pid = int(entry)
        children.setdefault(int(fields[1]), []).append(pid)
        lines[pid] = f"{pid} {fields[0]} {waits_in} {b' '.join(argv).decode(errors='replace').strip()[:120]}"
        if b"-id" in argv and any(arg.decode(errors="replace") in sandbox_ids for arg in argv):
            roots.append(pid)
    shown: list[str] = []
    todo = list(roots)
    while todo:
        pid = todo.pop()
        shown.append(lines[pid])
        todo += children.get(pid, ())
    return "; their shims' processes (pid state wchan argv): " + " | ".join(shown) if shown else ""


def empty_runtime_at(endpoint: str, **options) -> None:
    """empty_runtime() for callers without an event loop of their own: one client to `endpoint`, closed after."""

    async def empty() -> None:
        async with RuntimeClient(endpoint, timeout=60.0) as client:
            await empty_runtime(client, **options)

    asyncio.run(empty())


async def remove_pod_cgroups(cgroup_root: str = "/") -> list[str]:
    """Removes the pod cgroups under `cgroup_root`'s QoS tree that hold no container any more, as an agent's
    housekeeping removes those of pods gone (cgroupfs driver). For pods emptied from the runtime behind a stopped
    agent's back: the next agent on the machine would otherwise remove them as orphans in its first housekeeping,
    in the middle of whatever it is measured on. Returns the uids removed."""
    pod_cgroups = PodCgroups(CgroupsConfig(root=cgroup_root), runtime=None, allocatable=None)
    pod_cgroups.driver = cgroups.CGROUPFS
    return await pod_cgroups.remove_orphans(keep=set())
