"""`edgelet pods`: the node's pods from the status files, selected and printed the way `kubectl get pods` does.

The files answer whether or not the agent runs; when it does not, a line on stderr says since when, and
pods whose manifest is gone show Terminating (the agent removes them when it starts).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import IO, Any

import orjson

from edgelet.api import podutil
from edgelet.api.labelselector import Requirement, parse_selector
from edgelet.api.podutil import Pod

WATCH_INTERVAL = 1.0


def run(config, args: argparse.Namespace, out: IO[str] = sys.stdout, err: IO[str] = sys.stderr) -> int:
    try:
        selector = parse_selector(args.selector) if args.selector else None
    except ValueError as exc:
        print(f"edgelet: -l {args.selector!r}: {exc}", file=err)
        return 2
    namespace = None if args.all_namespaces else args.namespace

    def fetch() -> tuple[list[Pod], str]:
        pods, note = load_view(config)
        return select(pods, namespace=namespace, name=args.name, selector=selector, node_name=config.node_name), note

    selected, note = fetch()
    if note:
        print(f"edgelet: {note}; statuses are as it last wrote them", file=err)
    if args.name and not selected:
        where = "any namespace" if namespace is None else f"namespace {namespace!r}"
        print(f"edgelet: pod {args.name!r} not found in {where}", file=err)
        return 1
    if not selected and args.output in ("table", "wide"):
        where = "" if namespace is None else f" in {namespace} namespace"
        print(f"No resources found{where}.", file=err)
    printer = Printer(args.output, all_namespaces=namespace is None, single=bool(args.name))
    out.write(printer.render(selected, header=True))
    out.flush()
    if args.watch:
        _watch(fetch, printer, selected, note, out, err)
    return 0


def _watch(fetch: Callable[[], tuple[list[Pod], str]], printer: Printer, shown: list[Pod], note: str,
           out: IO[str], err: IO[str]) -> None:
    """kubectl's -w: a pod is printed again whenever its row (or document) changes; the agent coming and
    going is said on stderr."""
    last = {podutil.uid(pod): printer.render([pod], header=False) for pod in shown}
    header_printed = bool(shown) or printer.output not in ("table", "wide")
    while True:
        time.sleep(WATCH_INTERVAL)
        selected, new_note = fetch()
        if new_note != note:
            print(f"edgelet: {new_note or 'the agent is running again'}", file=err)
            note = new_note
        current = {podutil.uid(pod): printer.render([pod], header=False) for pod in selected}
        changed = [pod for pod in selected if last.get(podutil.uid(pod)) != current[podutil.uid(pod)]]
        if changed:
            out.write(printer.render(changed, header=not header_printed))
            out.flush()
            header_printed = True
        last = current


def load_view(config) -> tuple[list[Pod], str]:
    """The pods as `present_pods` shows them, and a note when the agent is not running (empty when it is)."""
    from edgelet.status.manager import read_pod_list, status_dir
    from edgelet.status.view import agent_state, ask_ops_endpoint, pid_alive, present_pods, read_agent_record

    directory = status_dir(config)
    pods = read_pod_list(directory)["items"]
    record = read_agent_record(directory)
    alive = record is not None and record.stopped_at is None and pid_alive(record.pid)
    # A hung agent still has its PID: whether it answers tells. Without an ops endpoint there is no asking.
    responding = ask_ops_endpoint(*config.server.host_port) if alive and config.server.host_port else ""
    state = agent_state(record, now=time.time(), alive=alive, responding=responding)
    if state.running and record is not None:  # running: the agent's record says so
        return present_pods(pods, runtime_ready=record.runtime_ready, runtime_message=record.runtime_message), ""
    uids, changed_at = _manifest_uids(config)
    return present_pods(pods, manifest_uids=uids, manifests_changed_at=changed_at), state.message


def _manifest_uids(config) -> tuple[set[str] | None, float | None]:
    """The uids the manifest directory defines now (None when it cannot be read), and when it last changed."""
    manifest_dir = config.pods.manifest_dir
    if not manifest_dir:
        return None, None
    from edgelet.podconfig.file import ManifestScanner

    scan = ManifestScanner(manifest_dir, config.node_name).scan()
    if scan.objects is None:
        return None, None
    try:
        changed_at = os.stat(manifest_dir).st_mtime
    except OSError:
        changed_at = None
    return {podutil.uid(pod) for pod in scan.objects.pods}, changed_at


def select(pods: list[Pod], *, namespace: str | None, name: str | None, selector: Requirement | None,
           node_name: str) -> list[Pod]:
    """Pods in the namespace (None: all), by name (a static pod also without its node suffix) and labels."""
    names = {name, f"{name}-{node_name.lower()}"} if name else None
    return [pod for pod in pods
            if (namespace is None or podutil.namespace(pod) == namespace)
            and (names is None or podutil.name(pod) in names)
            and (selector is None or selector(podutil.meta(pod).get("labels") or {}))]


class Printer:
    def __init__(self, output: str, *, all_namespaces: bool, single: bool, now=time.time):
        self.output = output
        self.all_namespaces = all_namespaces
        self.single = single
        self._now = now

    def render(self, pods: list[Pod], *, header: bool) -> str:
        if self.output == "name":
            return "".join(f"pod/{podutil.name(pod)}\n" for pod in pods)
        if self.output in ("json", "yaml"):
            from edgelet.status.manager import pod_list

            # The listing is one document (a Pod for a named pod, else a PodList); a watch prints each change.
            if not header:
                documents: list[Any] = list(pods)
            else:
                documents = [pods[0] if self.single and len(pods) == 1 else pod_list(pods)]
            if self.output == "json":
                return "".join(orjson.dumps(d, option=orjson.OPT_INDENT_2).decode() + "\n" for d in documents)
            import yaml

            return "".join(("" if header else "---\n") + yaml.safe_dump(d, sort_keys=False) for d in documents)
        return format_pod_table(pods, wide=self.output == "wide", now=self._now(),
                                namespaces=self.all_namespaces, header=header)


def format_pod_table(pods: list[Pod], *, wide: bool, now: float, namespaces: bool = True,
                     header: bool = True) -> str:
    """kubectl's columns: [NAMESPACE] NAME READY STATUS RESTARTS AGE [IP NODE]."""
    columns = (["NAMESPACE"] if namespaces else []) + ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    if wide:
        columns += ["IP", "NODE"]
    rows = [columns] if header else []
    for pod in pods:
        status, spec = pod.get("status") or {}, pod.get("spec") or {}
        statuses = status.get("containerStatuses") or []
        # As kubectl counts them: sidecars are among the containers that should be ready; every restart counts.
        sidecars = {c.get("name") for c in spec.get("initContainers") or [] if podutil.is_sidecar(c)}
        init_statuses = status.get("initContainerStatuses") or []
        ready = sum(1 for s in statuses if s.get("ready")) + sum(
            1 for s in init_statuses if s.get("name") in sidecars and s.get("ready"))
        total = len(spec.get("containers") or statuses) + len(sidecars)
        restarts = sum(int(s.get("restartCount") or 0) for s in [*statuses, *init_statuses])
        row = ([podutil.namespace(pod)] if namespaces else []) + [
            podutil.name(pod), f"{ready}/{total}", display_status(pod), str(restarts),
            _age(status.get("startTime"), now),
        ]
        if wide:
            row += [status.get("podIP") or "<none>", spec.get("nodeName") or "<none>"]
        rows.append(row)
    if not rows:
        return ""
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    # A watch prints rows one at a time: pad them to the header's widths at least.
    widths = [max(w, len(c)) for w, c in zip(widths, columns)]
    return "".join("   ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n" for r in rows)


def display_status(pod: Pod) -> str:
    """What kubectl shows: Terminating while deleted, Unknown when nobody can vouch, else a container's
    waiting or failure reason over the phase."""
    status = pod.get("status") or {}
    if podutil.deletion_requested(pod):
        return "Terminating"
    if status.get("phase") == "Unknown":
        return "Unknown"
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or []:
            state = cs.get("state") or {}
            waiting = state.get("waiting") or {}
            if waiting.get("reason") and waiting["reason"] not in ("ContainerCreating", "PodInitializing"):
                return waiting["reason"]
            terminated = state.get("terminated") or {}
            if terminated.get("reason") and status.get("phase") not in ("Succeeded",):
                if key == "initContainerStatuses" and terminated.get("exitCode") == 0:
                    continue
                if terminated.get("exitCode") != 0:
                    return terminated["reason"]
    return status.get("reason") or status.get("phase") or "Unknown"


def _age(start: str | None, now: float) -> str:
    from edgelet.api.kubetime import parse_time

    if not start:
        return "<unknown>"
    try:
        started = parse_time(start)
    except ValueError:
        return "<unknown>"
    seconds = max(int(now - started), 0)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"
