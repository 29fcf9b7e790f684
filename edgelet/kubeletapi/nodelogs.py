"""/logs/: the node's own logs, as the kubelet's NodeLogQuery serves them (authorized as `nodes/log`).

Without a query, the files under the node log directory (`/var/log`): a directory as a listing, a file as it is.
With one (`query`, `sinceTime`, `untilTime`, `tailLines`, `pattern`, `boot`): each `query` naming a service is read
from the journal with journalctl when journald knows a `<service>.service` unit, else from the first of
`<dir>/<service>`, `<dir>/<service>.log`, `<dir>/<service>/<service>.log`; a `query` with a `/` names a file under
the directory, which takes no options. The journal is the system's, or the one in a configured directory
(`journalctl --directory`). The parsing and the journalctl arguments are pure; reading is at the edge.
"""

from __future__ import annotations

import asyncio
import html
import io
import os
import re
import subprocess
import urllib.parse
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

from .paths import BadRequest

NODE_LOG_DIR = "/var/log"
MAX_TAIL_LINES = 100_000
MAX_SERVICES = 4
MAX_SERVICE_LENGTH = 256
QUERY_DEADLINE = 30.0  # the kubelet's: a query's output stops after this long
_UNSAFE_SERVICE = re.compile(r"[^a-zA-Z\-_0-9@]+")
_QUERY_PARAMETERS = ("query", "sinceTime", "untilTime", "tailLines", "pattern", "boot")
_CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class NodeLogQuery:
    services: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    since: datetime | None = None
    until: datetime | None = None
    tail_lines: int | None = None
    boot: int | None = None
    pattern: str = ""

    @property
    def has_options(self) -> bool:
        return (self.since, self.until, self.tail_lines, self.boot, self.pattern) != (None, None, None, None, "")


def _rfc3339(name: str, value: str, errors: list[str]) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        errors.append(f'{name}: Invalid value: "{value}": invalid time format')
        return None
    if parsed.tzinfo is None:
        errors.append(f'{name}: Invalid value: "{value}": invalid time format')
        return None
    return parsed.astimezone(UTC)


def _integer(name: str, value: str, errors: list[str]) -> int | None:
    try:
        return int(value)
    except ValueError:
        errors.append(f'{name}: Invalid value: "{value}": not an integer')
        return None


def parse_node_log_query(query: Mapping[str, Sequence[str]]) -> NodeLogQuery | None:
    """The query of a /logs/ request; None when it has none of the query's parameters (then files are served).
    BadRequest lists every problem, as the kubelet's field errors do."""
    if not any(name in query for name in _QUERY_PARAMETERS):
        return None
    errors: list[str] = []
    services, files = [], []
    for value in query.get("query", ()):
        if "/" in value or "\\" in value:
            files.append(value)
        elif value.strip():
            services.append(value)
    if "query" in query and not services and not files:
        errors.append("query: Invalid value: query cannot be empty")

    def last(name: str) -> str:
        values = query.get(name) or [""]
        return values[0]

    since = _rfc3339("sinceTime", last("sinceTime"), errors) if last("sinceTime") else None
    until = _rfc3339("untilTime", last("untilTime"), errors) if last("untilTime") else None
    boot = _integer("boot", last("boot"), errors) if last("boot") else None
    tail = _integer("tailLines", last("tailLines"), errors) if last("tailLines") else None
    result = NodeLogQuery(tuple(services), tuple(files), since, until, tail, boot, last("pattern"))
    if not errors:
        errors += validation_errors(result)
    if errors:
        raise BadRequest(", ".join(errors) if len(errors) > 1 else errors[0])
    return result


def validation_errors(q: NodeLogQuery) -> list[str]:
    errors = []
    for service in q.services:
        if len(service) > MAX_SERVICE_LENGTH:
            errors.append(f'query: Invalid value: "{service}": length must be at most {MAX_SERVICE_LENGTH}')
        elif _UNSAFE_SERVICE.search(service):
            errors.append(f'query: Invalid value: "{service}": input contains unsupported characters')
    if len(q.services) > MAX_SERVICES:
        errors.append(f"query: Too many: {len(q.services)}: must have at most {MAX_SERVICES} items")
    if not q.services and not q.files:
        errors.append("query: Required value: cannot be empty with options")
    elif q.services and q.files:
        errors.append("query: Invalid value: cannot specify a file and service")
    elif len(q.files) > 1:
        errors.append("query: Invalid value: cannot specify more than one file")
    elif q.files and q.has_options:
        errors.append("query: Invalid value: cannot specify file with options")
    if q.since is not None and q.until is not None and q.since > q.until:
        errors.append("untilTime: Invalid value: must be after `sinceTime`")
    if q.boot is not None and q.boot > 0:
        errors.append(f"boot: Invalid value: {q.boot}: must be less than 1")
    if q.tail_lines is not None and not 0 <= q.tail_lines <= MAX_TAIL_LINES:
        errors.append(f"tailLines: Invalid value: {q.tail_lines}: must be between 0 and {MAX_TAIL_LINES}, inclusive")
    if q.pattern:
        try:
            re.compile(q.pattern)
        except re.error as err:
            errors.append(f'pattern: Invalid value: "{q.pattern}": {err}')
    return errors


_JOURNAL_TIME = "%Y-%m-%d %H:%M:%S"


def journal_source(journal_dir: str) -> list[str]:
    """journalctl's arguments naming the journal it reads: a directory's, or ("") the system's."""
    return [f"--directory={journal_dir}"] if journal_dir else []


def journalctl_args(q: NodeLogQuery, services: Sequence[str], journal_dir: str = "") -> list[str]:
    """journalctl's arguments for the services of a query, as the kubelet builds them, reading the journal in
    `journal_dir` ("" = the system journal)."""
    args = [*journal_source(journal_dir), "--utc", "--no-pager"]
    if q.since is not None:
        args.append(f"--since={q.since.strftime(_JOURNAL_TIME)}")
    if q.until is not None:
        args.append(f"--until={q.until.strftime(_JOURNAL_TIME)}")
    if q.tail_lines is not None:
        args += ["--pager-end", f"--lines={q.tail_lines}"]
    args += [f"--unit={service}" for service in services if service]
    if q.pattern:
        args += [f"--grep={q.pattern}", "--case-sensitive=false"]
    if q.boot is not None:
        args += ["--boot", str(q.boot)]
    args.append("--output=short-precise")
    return args


def logs_to_journal(service: str, units: str) -> bool:
    """Whether journald has the service's unit among those it has logs of (`journalctl --field _SYSTEMD_UNIT`)."""
    return f"{service}.service" in units.split()


def service_files(service: str) -> list[str]:
    """Where a service that does not log to the journal may log, in the kubelet's order."""
    return [service, f"{service}.log", f"{service}/{service}.log"]


def inside(root: str, name: str) -> str | None:
    """`name` under `root`, symlinks resolved; None when it leads outside `root`."""
    root = os.path.realpath(root)
    path = os.path.realpath(os.path.join(root, name.lstrip("/")))
    return path if path == root or path.startswith(root + os.sep) else None


def listing(entries: Sequence[tuple[str, bool]]) -> bytes:
    """A directory as Go's http.FileServer lists it (what the kubelet's /logs/ answers): (name, is a directory)."""
    lines = ['<!doctype html>\n<meta name="viewport" content="width=device-width">\n<pre>\n']
    for name, is_dir in sorted(entries):
        shown = name + "/" if is_dir else name
        lines.append(f'<a href="{urllib.parse.quote(shown)}">{html.escape(shown)}</a>\n')
    lines.append("</pre>\n")
    return "".join(lines).encode()


# -- reading (I/O) ---------------------------------------------------------------------------------

class NotFound(Exception):
    """The path under the node log directory does not exist (404)."""


def read_path(log_dir: str, path: str) -> tuple[bytes | None, str | None]:
    """/logs/<path> without a query: (a listing, None) for a directory, (None, file) for a file."""
    target = inside(log_dir, urllib.parse.unquote(path))
    if target is None or not os.path.exists(target):
        raise NotFound(f"{path or '/'}: not found")
    if os.path.isdir(target):
        with os.scandir(target) as entries:
            return listing([(entry.name, entry.is_dir()) for entry in entries]), None
    return None, target


async def file_chunks(path: str, deadline: float | None = None) -> AsyncIterator[bytes]:
    """A file's bytes in chunks; with a deadline (the loop's time), only until then."""
    loop = asyncio.get_running_loop()
    handle = await asyncio.to_thread(open, path, "rb")
    try:
        while deadline is None or loop.time() < deadline:
            chunk = await asyncio.to_thread(handle.read, _CHUNK)
            if not chunk:
                return
            yield chunk
    finally:
        handle.close()


# journalctl is started with subprocess (vfork in CPython), not the event loop's create_subprocess_exec: uvloop
# fork()s, which runs gRPC's fork handlers in the child, and a child forked while CRI calls are in flight dies of
# SIGSEGV before it execs (one in a few in a running agent). vfork runs no fork handlers.

def _spawn(args: Sequence[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _reap(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()
    if process.stdout is not None:
        process.stdout.close()


def resolve_file(q: NodeLogQuery, log_dir: str) -> str:
    """The file a query names, under the log directory; BadRequest when there is none."""
    target = inside(log_dir, q.files[0])
    if target is None or not os.path.isfile(target):
        raise BadRequest(f'query: Invalid value: "{q.files[0]}": no such file under {log_dir}')
    return target


async def query_chunks(q: NodeLogQuery, log_dir: str, journal_dir: str = "") -> AsyncIterator[bytes]:
    """The answer to a query, in chunks; output stops at QUERY_DEADLINE, as the kubelet's does. Services are
    looked up in the journal in `journal_dir` ("" = the system journal)."""
    deadline = asyncio.get_running_loop().time() + QUERY_DEADLINE
    if q.files:
        async for chunk in file_chunks(resolve_file(q, log_dir), deadline):
            yield chunk
        return
    native, from_files = await _split_services(q.services, journal_dir)
    if native:
        async for chunk in _journal(q, native, journal_dir, deadline):
            yield chunk
    if from_files and q.has_options:
        yield (f"\noptions present and query resolved to log files for {list(from_files)}\n"
               "try without specifying options\n").encode()
        return
    for service in from_files:
        async for chunk in _service_file(log_dir, service, deadline):
            yield chunk


async def _split_services(services: Sequence[str], journal_dir: str) -> tuple[list[str], list[str]]:
    try:
        done = await asyncio.to_thread(subprocess.run, ["journalctl", *journal_source(journal_dir), "--field",
                                                        "_SYSTEMD_UNIT"], stdin=subprocess.DEVNULL,
                                       capture_output=True, timeout=QUERY_DEADLINE)
        units = done.stdout
    except (OSError, subprocess.TimeoutExpired):
        units = b""
    text = units.decode(errors="replace")
    native = [s for s in services if logs_to_journal(s, text)]
    return native, [s for s in services if s not in native]


async def _journal(q: NodeLogQuery, services: Sequence[str], journal_dir: str,
                   deadline: float) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    try:
        process = await asyncio.to_thread(_spawn, ["journalctl", *journalctl_args(q, services, journal_dir)])
    except OSError:
        yield b"\nerror: journal output not available\n"
        return
    stdout = cast("io.BufferedReader | None", process.stdout)  # a pipe: _spawn asks for one
    if stdout is None:
        yield b"\nerror: journal output not available\n"
        return
    try:
        while (remaining := deadline - loop.time()) > 0:
            try:
                chunk = await asyncio.wait_for(asyncio.to_thread(stdout.read1, _CHUNK), remaining)
            except TimeoutError:
                return
            if not chunk:
                return
            yield chunk
    finally:
        await asyncio.to_thread(_reap, process)  # killing it ends a read still waiting in its thread


async def _service_file(log_dir: str, service: str, deadline: float) -> AsyncIterator[bytes]:
    for name in service_files(service):
        target = inside(log_dir, name)
        if target is not None and os.path.isfile(target):
            async for chunk in file_chunks(target, deadline):
                yield chunk
            return
    yield f"\nlog not found for {service}\n".encode()
