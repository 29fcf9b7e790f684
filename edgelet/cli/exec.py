"""`edgelet exec POD [-c CONTAINER] [-i] [-t] -- COMMAND...`: kubectl exec on the device, with no cluster and no
network: the pod from the agent's status files, the container from the runtime, the session at the runtime's
streaming URL (edgelet.cli.remotecommand); edgelet exits with the command's exit code, as kubectl does.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import IO, Any

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.cli.pods import select
from edgelet.util.errors import EdgeletError

EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130
DEFAULT_CONTAINER_ANNOTATION = "kubectl.kubernetes.io/default-container"
NO_TTY_WARNING = "Unable to use a TTY - input is not a terminal or the right kind of file"


class ExecError(EdgeletError):
    """Why there is no session; the message is the whole line kubectl would print."""


# -- decisions (pure) -----------------------------------------------------------------------------

def find_pod(pods: list[Pod], *, namespace: str | None, name: str, node_name: str) -> Pod:
    """The pod by name (a static pod also without its node suffix), in the namespace or, without one, in the only
    namespace that has it; of several records of one pod, one that has not completed."""
    found = select(pods, namespace=namespace, name=name, selector=None, node_name=node_name)
    exact = [pod for pod in found if podutil.name(pod) == name]
    found = exact or found
    if not found:
        raise ExecError(f'Error from server (NotFound): pods "{name}" not found')
    namespaces = sorted({podutil.namespace(pod) for pod in found})
    if len(namespaces) > 1:
        raise ExecError(f'error: pod "{name}" is in several namespaces ({", ".join(namespaces)}); choose one with -n')
    live = [pod for pod in found if _phase(pod) not in ("Succeeded", "Failed")]
    return (live or found)[-1]


def _phase(pod: Pod) -> str:
    return (pod.get("status") or {}).get("phase") or ""


def check_runnable(pod: Pod) -> None:
    if _phase(pod) in ("Succeeded", "Failed"):
        raise ExecError(f"error: cannot exec into a container in a completed pod; current phase is {_phase(pod)}")


def choose_container(pod: Pod, container: str | None) -> tuple[str, str]:
    """kubectl exec's choice and its note for stderr: -c as given (the runtime tells whether it runs), else the
    default-container annotation when it names a container of the pod (no note), else the first container,
    with "Defaulted container ..." when the pod has others."""
    if container:
        return container, ""
    spec = pod.get("spec") or {}
    kinds = (("containers", ""), ("initContainers", " (init)"), ("ephemeralContainers", " (ephem)"))
    every = [(c.get("name", ""), suffix) for key, suffix in kinds for c in spec.get(key) or []]
    regular = [c.get("name", "") for c in spec.get("containers") or []]
    if not regular:
        raise ExecError(f"error: pod {podutil.namespace(pod)}/{podutil.name(pod)} does not have any containers")
    annotated = (podutil.meta(pod).get("annotations") or {}).get(DEFAULT_CONTAINER_ANNOTATION)
    if annotated and annotated in {name for name, _ in every}:
        return annotated, ""
    note = ""
    if len(every) > 1:
        note = f'Defaulted container "{regular[0]}" out of: ' + ", ".join(name + suffix for name, suffix in every)
    return regular[0], note


def terminal_choice(stdin: bool, tty: bool, stdin_is_terminal: bool) -> tuple[bool, str]:
    """Whether the session gets a terminal, and the warning when -t cannot have one: as kubectl, only with -i,
    and only when stdin is a terminal."""
    if not (stdin and tty):
        return False, ""
    if not stdin_is_terminal:
        return False, NO_TTY_WARNING
    return True, ""


# -- the command ----------------------------------------------------------------------------------

def exec_command(config, args: argparse.Namespace, err: IO[str] = sys.stderr) -> int:
    if not args.cmd:
        print("error: you must specify at least one command for the container", file=err)
        return EXIT_FAILURE
    try:
        return _exec(config, args, err)
    except ExecError as exc:
        print(str(exc), file=err)
        return EXIT_FAILURE


def _exec(config, args: argparse.Namespace, err: IO[str]) -> int:
    from edgelet.cli.remotecommand import ExecSession, SessionError, exit_status, url_target
    from edgelet.status.manager import read_pod_list, status_dir

    pods = read_pod_list(status_dir(config))["items"]
    pod = find_pod(pods, namespace=args.namespace, name=args.pod, node_name=config.node_name)
    check_runnable(pod)
    container, note = choose_container(pod, args.container)
    if note:
        print(note, file=err, flush=True)
    stdin_fd = sys.stdin.fileno() if args.stdin else None
    tty, warning = terminal_choice(args.stdin, args.tty, stdin_fd is not None and os.isatty(stdin_fd))
    if warning:
        print(warning, file=err, flush=True)
    url = _exec_url(config, podutil.uid(pod), container, args.cmd, stdin=args.stdin, tty=tty)
    try:
        host, port, target = url_target(url)
        session = ExecSession.open(host, port, target, stdin=args.stdin, stderr=not tty, tty=tty)
    except SessionError as exc:
        raise ExecError(f"error: unable to upgrade connection: {exc}") from None
    sys.stdout.flush()
    err.flush()
    try:
        with _terminal(session, stdin_fd if tty else None):
            status = session.run(stdin_fd, sys.stdout.fileno(), sys.stderr.fileno())
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    code, message = exit_status(status)
    if message:
        print(message, file=err)
    return code


def _exec_url(config, pod_uid: str, container: str, cmd: list[str], *, stdin: bool, tty: bool) -> str:
    """The streaming URL for the command in the pod's running container (the newest, after restarts)."""
    import asyncio

    from edgelet.container.labels import CONTAINER_NAME, POD_UID
    from edgelet.cri import RuntimeCallError
    from edgelet.cri import runtime_v1_pb2 as pb
    from edgelet.cri.client import RuntimeClient

    async def ask() -> str:
        async with RuntimeClient(config.runtime.endpoint, timeout=config.runtime.request_timeout) as client:
            running = await client.list_containers(pb.ContainerFilter(
                state=pb.ContainerStateValue(state=pb.CONTAINER_RUNNING),
                label_selector={POD_UID: pod_uid, CONTAINER_NAME: container}))
            if not running:
                # The kubelet's answer: it only looks among running containers.
                raise ExecError(f'error: unable to upgrade connection: container not found ("{container}")')
            newest = max(running, key=lambda c: c.created_at)
            return await client.exec(pb.ExecRequest(container_id=newest.id, cmd=cmd, tty=tty, stdin=stdin,
                                                    stdout=True, stderr=not tty))

    try:
        return asyncio.run(ask())
    except RuntimeCallError as exc:
        raise ExecError(f"error: {exc}") from None


class _terminal:
    """With a terminal: stdin in raw mode for the session (restored after), its size sent now and on SIGWINCH."""

    def __init__(self, session, fd: int | None):
        self._session = session
        self._fd = fd
        self._saved: Any = None  # termios attributes, restored on exit
        self._previous_handler: Any = None

    def __enter__(self) -> None:
        if self._fd is None:
            return
        import termios
        import tty

        self._saved = termios.tcgetattr(self._fd)
        tty.setraw(self._fd)
        self._send_size()
        self._previous_handler = signal.signal(signal.SIGWINCH, lambda *_: self._send_size())

    def _send_size(self) -> None:
        for fd in (sys.stdout.fileno(), self._fd):
            if fd is None:
                continue
            try:
                size = os.get_terminal_size(fd)
            except OSError:
                continue
            self._session.resize(size.columns, size.lines)
            return

    def __exit__(self, *exc_info) -> None:
        if self._fd is None:
            return
        import termios

        signal.signal(signal.SIGWINCH, self._previous_handler)
        termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
