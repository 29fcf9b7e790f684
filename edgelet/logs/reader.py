"""Container logs: the runtime writes CRI-format files in the kubelet's layout; we read them.

Layout: `<pod_logs_dir>/<namespace>_<name>_<uid>/<container>/<restart>.log`, rotated to
`<restart>.log.<UTC timestamp>`, gzipped when older (edgelet.logs.rotation). Reading works from the files alone, so
`edgelet logs` answers when the agent is down; the agent itself does not load this module.
"""

from __future__ import annotations

import collections
import itertools
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO

from edgelet.api.kubetime import parse_rfc3339_ns
from edgelet.logs.rotation import open_log_file, rotated_files
from edgelet.util.errors import EdgeletError


class LogsError(EdgeletError):
    pass


# -- lines, messages, selection (pure; `edgelet logs` and the kubelet API's /containerLogs both use them) -----

# One whole message: (time stamp of its first piece, text with its newline). Plain tuples of bytes: a 10 MiB
# log is 80,000 of them, and every object layer shows in `kubectl logs` time.
Entry = tuple[bytes, bytes]


def split_line(raw: bytes) -> tuple[bytes, bytes, bool, bytes] | None:
    """(time stamp, stream, partial, text) of a CRI log line `<time> <stream> <F|P>[:tags] <text>`; None if not one."""
    parts = raw.rstrip(b"\n").split(b" ", 3)
    if len(parts) < 3 or parts[1] not in (b"stdout", b"stderr") or parts[2][:1] not in (b"F", b"P"):
        return None
    return parts[0], parts[1], parts[2][:1] == b"P", parts[3] if len(parts) > 3 else b""


class LineJoiner:
    """Joins P (partial) lines with the F line ending them, per stream, across reads and files; a message
    keeps its first piece's time stamp."""

    def __init__(self) -> None:
        self._pending: dict[bytes, tuple[bytes, bytes]] = {}

    def feed(self, raws: Iterable[bytes]) -> Iterator[Entry]:
        pending = self._pending
        for raw in raws:
            line = split_line(raw)
            if line is None:
                continue
            stamp, stream, partial, text = line
            if pending and stream in pending:
                stamp, before = pending.pop(stream)
                text = before + text
            if partial:
                pending[stream] = (stamp, text)
            else:
                yield stamp, text + b"\n"

    def flush(self) -> Iterator[Entry]:
        """What a log ends with that no F line finished (a process whose last write had no newline, say
        `printf done`), as it is, without a newline: the kubelet prints a P line's text that way too."""
        pending, self._pending = self._pending, {}
        yield from pending.values()

    def read_all(self, raws: Iterable[bytes]) -> Iterator[Entry]:
        """Every message of a log read to its end: `feed`, then `flush`."""
        yield from self.feed(raws)
        yield from self.flush()


def since_filter(entries: Iterable[Entry], since_ns: int | None) -> Iterator[Entry]:
    """Entries stamped at or after since_ns. The runtime writes in time order, so checking stops at
    the first entry that passes."""
    iterator = iter(entries)
    if since_ns is not None:
        for entry in iterator:
            try:
                if parse_rfc3339_ns(entry[0].decode()) >= since_ns:
                    yield entry
                    break
            except ValueError:
                continue
    yield from iterator


def select(entries: Iterable[Entry], *, since_ns: int | None = None, tail: int | None = None) -> Iterable[Entry]:
    """The entries a read returns: those since `since_ns`, then the last `tail` of them (None: all)."""
    chosen = since_filter(entries, since_ns)
    if tail is not None:
        return collections.deque(chosen, maxlen=tail)
    return chosen


def render(entry: Entry, timestamps: bool) -> bytes:
    return entry[0] + b" " + entry[1] if timestamps else entry[1]


# -- reading (edgelet logs) -------------------------------------------------------------------

DEFAULT_CONTAINER_ANNOTATION = "kubectl.kubernetes.io/default-container"
FOLLOW_POLL = 0.2
# How long `-f` waits for the status of a pod it found logs for before taking the pod as gone.
STATUS_GRACE = 2.0


@dataclass(frozen=True, slots=True)
class LogOptions:
    follow: bool = False
    previous: bool = False
    tail: int = -1  # the last N lines; -1: all
    since_ns: int | None = None  # only lines written at or after this time (nanoseconds since the epoch)
    timestamps: bool = False


def find_pod_dir(logs_dir: str, namespace: str | None, pod_name: str, node_name: str) -> str:
    """The log directory of a pod by name; a static pod may be named with or without its node suffix."""
    candidates = []
    for entry in os.listdir(logs_dir) if os.path.isdir(logs_dir) else []:
        parts = entry.split("_")
        if len(parts) != 3:
            continue
        ns, name, _uid = parts
        if namespace is not None and ns != namespace:
            continue
        if name in (pod_name, f"{pod_name}-{node_name}"):
            candidates.append(os.path.join(logs_dir, entry))
    if not candidates:
        where = f" in namespace {namespace}" if namespace else ""
        raise LogsError(f"pod {pod_name!r} not found{where} (no logs under {logs_dir})")
    return max(candidates, key=os.path.getmtime)


def all_container_names(pod: dict) -> list[tuple[str, str]]:
    """(name, kind) of every container in the spec: containers first, then init and ephemeral containers, as
    kubectl lists them."""
    spec = pod.get("spec") or {}
    return ([(c.get("name", ""), "") for c in spec.get("containers") or []]
            + [(c.get("name", ""), "init") for c in spec.get("initContainers") or []]
            + [(c.get("name", ""), "ephem") for c in spec.get("ephemeralContainers") or []])


def choose_containers(pod: dict | None, on_disk: list[str], container: str | None, *,
                      all_containers: bool) -> tuple[list[str], str]:
    """Which containers to print and what to say about the choice on stderr (kubectl's defaulting).

    Without -c: the `kubectl.kubernetes.io/default-container` annotation when it names a container,
    else the first container. Without the pod's spec (its status is gone), only the log directories tell.
    """
    known = all_container_names(pod) if pod is not None else [(name, "") for name in sorted(on_disk)]
    names = [name for name, _ in known]
    if container is not None:
        if container not in names and container not in on_disk:
            raise LogsError(f"container {container!r} not found, one of: {' '.join(names)}")
        return [container], ""
    if all_containers:
        order = ([name for name, kind in known if kind == "init"] + [name for name, kind in known if not kind]
                 + [name for name, kind in known if kind == "ephem"])
        return [name for name in order if name in on_disk], ""
    if pod is None and len(names) != 1:
        raise LogsError(f"a container name must be given with -c, one of: {' '.join(names)}")
    annotated = ((pod or {}).get("metadata") or {}).get("annotations", {}).get(DEFAULT_CONTAINER_ANNOTATION)
    regular = [name for name, kind in known if not kind]
    chosen = annotated if annotated in regular else regular[0] if regular else names[0]
    note = ""
    if len(known) > 1:
        listing = ", ".join(f"{name} ({kind})" if kind else name for name, kind in known)
        note = f'Defaulted container "{chosen}" out of: {listing}'
    return [chosen], note


def container_log_files(pod_dir: str, container: str, previous: bool) -> list[str]:
    """The files of one container instance, oldest first: the current one, or with `previous` the one before."""
    directory = os.path.join(pod_dir, container)
    if not os.path.isdir(directory):
        containers = sorted(d for d in os.listdir(pod_dir) if os.path.isdir(os.path.join(pod_dir, d)))
        raise LogsError(f"container {container!r} has no logs yet (containers with logs: {' '.join(containers)})")
    restarts = _restarts(directory)
    if previous:
        if len(restarts) < 2:
            raise LogsError(f"previous terminated container {container!r} not found")
        chosen = restarts[-2]
    elif restarts:
        chosen = restarts[-1]
    else:
        raise LogsError(f"no logs for container {container!r} yet")
    live = os.path.join(directory, f"{chosen}.log")
    return rotated_files(live) + [live]


def _restarts(directory: str) -> list[int]:
    return sorted(int(name[:-4]) for name in os.listdir(directory) if name.endswith(".log") and name[:-4].isdigit())


def _read_file(path: str) -> Iterator[bytes]:
    try:
        with open_log_file(path) as handle:
            yield from handle
    except FileNotFoundError:
        pass  # deleted by rotation since it was listed


def print_logs(config, *, namespace: str | None, pod_name: str, container: str | None, all_containers: bool,
               options: LogOptions, out: IO[str], err: IO[str]) -> int:
    from edgelet.status.manager import read_pod, status_dir

    pod_dir = find_pod_dir(config.logs_dir, namespace, pod_name, config.node_name)
    uid = os.path.basename(pod_dir).rsplit("_", 1)[-1]
    statuses = status_dir(config)
    pod = read_pod(statuses, uid)
    on_disk = [d for d in os.listdir(pod_dir) if os.path.isdir(os.path.join(pod_dir, d))]
    containers, note = choose_containers(pod, on_disk, container, all_containers=all_containers)
    if note:
        print(note, file=err, flush=True)
    followers = []
    tail = options.tail if options.tail >= 0 else None
    for name in containers:
        files = container_log_files(pod_dir, name, options.previous)
        rotated = itertools.chain.from_iterable(_read_file(path) for path in files[:-1])
        live = open(files[-1], "rb")
        joiner = LineJoiner()  # one per container: a message split across files, or across the read and -f
        following = options.follow and not options.previous
        read = joiner.feed if following else joiner.read_all
        entries = read(itertools.chain(rotated, live))
        _write(out, select(entries, since_ns=options.since_ns, tail=tail), options.timestamps)
        if following:
            restart = int(os.path.basename(files[-1])[:-4])
            followers.append(_Follower(files[-1], live, name, restart, joiner=joiner))
        else:
            live.close()
    if followers:
        watch = _InstanceWatch(pod_dir, uid, statuses, read_pod, seen=pod is not None)
        _follow(followers, out, options, watch)
    return 0


@dataclass(slots=True)
class _Follower:
    path: str
    handle: IO[bytes]
    container: str
    restart: int
    joiner: LineJoiner = field(default_factory=LineJoiner)
    buffer: bytes = b""

    def read(self) -> list[Entry]:
        chunk = self.handle.read()
        if not chunk:
            return []
        self.buffer += chunk
        *complete, self.buffer = self.buffer.split(b"\n")
        return list(self.joiner.feed(complete))

    def reopen_if_rotated(self) -> None:
        try:
            if os.stat(self.path).st_ino != os.fstat(self.handle.fileno()).st_ino:
                self.handle.close()
                self.handle = open(self.path, "rb")
        except FileNotFoundError:
            pass


class _InstanceWatch:
    """Whether a followed container instance has ended, or its pod is gone: then `-f` ends, as kubectl's does."""

    def __init__(self, pod_dir: str, uid: str, status_directory: str, read_pod, *, seen: bool, clock=time.monotonic):
        self._pod_dir = pod_dir
        self._uid = uid
        self._status_directory = status_directory
        self._read_pod = read_pod
        self._seen = seen
        self._clock = clock
        self._started = clock()

    def ended(self, follower: _Follower) -> bool:
        directory = os.path.join(self._pod_dir, follower.container)
        if not os.path.isdir(directory) or any(r > follower.restart for r in _restarts(directory)):
            return True  # the pod's logs were removed, or the container has restarted since
        pod = self._read_pod(self._status_directory, self._uid)
        if pod is None:
            # Gone once seen; never seen: the agent may not have written it yet, so give it a moment.
            return self._seen or self._clock() - self._started > STATUS_GRACE
        self._seen = True
        return instance_ended(pod, follower.container, follower.restart)


def instance_ended(pod: dict, container: str, restart: int) -> bool:
    """From the pod's status: the container instance `restart` has terminated (or a later one exists)."""
    status = pod.get("status") or {}
    keys = ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses")
    for cs in [cs for key in keys for cs in status.get(key) or []]:
        if cs.get("name") != container:
            continue
        count, state = int(cs.get("restartCount") or 0), cs.get("state") or {}
        # In a back-off the state is waiting, the terminated instance being the one with this count.
        crashed = (state.get("waiting") or {}).get("reason") == "CrashLoopBackOff"
        return count > restart or (count == restart and ("terminated" in state or crashed))
    return False


def _follow(followers: list[_Follower], out: IO[str], options: LogOptions, watch: _InstanceWatch) -> None:
    """Tails the live files (reopening one that rotation replaced) until every followed instance has ended."""
    while followers:
        wrote = False
        for follower in followers:
            messages = follower.read()
            if messages:
                _write(out, messages, options.timestamps)
                wrote = True
        if wrote:
            continue
        time.sleep(FOLLOW_POLL)
        for follower in list(followers):
            if watch.ended(follower):
                # What it wrote before it ended, its last unfinished line included.
                _write(out, [*follower.read(), *follower.joiner.flush()], options.timestamps)
                follower.handle.close()
                followers.remove(follower)
            else:
                follower.reopen_if_rotated()


_WRITE_BATCH = 64 * 1024


def _write(out: IO[str], entries: Iterable[Entry], timestamps: bool) -> None:
    """Writes whole messages in batches (a batch never splits a message, so never a UTF-8 character)."""
    batch = bytearray()
    for entry in entries:
        batch += render(entry, timestamps)
        if len(batch) >= _WRITE_BATCH:
            out.write(batch.decode("utf-8", "replace"))
            batch.clear()
    out.write(batch.decode("utf-8", "replace"))
    out.flush()
