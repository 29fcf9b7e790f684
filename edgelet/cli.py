"""The `edgelet` command: run the agent, list its pods, read container logs, check a config file."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any, Sequence

import orjson

from . import __version__

DEFAULT_CONFIG = "/etc/edgelet/edgelet.toml"

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_CONFIG = 2


def setup_logging(level: str) -> None:
    """One line per event; under systemd the journal adds the timestamp, so we leave it out."""
    if os.environ.get("JOURNAL_STREAM") or os.environ.get("INVOCATION_ID"):
        fmt = "%(levelname)s %(name)s: %(message)s"
    else:
        fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), format=fmt, stream=sys.stderr)
    # gRPC and httpx log every request or loop detail; they are noise on a device.
    for noisy in ("httpx", "httpcore", "grpc"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _load_config(path: str):
    from .config import load_config
    from .errors import ConfigError

    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"edgelet: invalid config: {exc}", file=sys.stderr)
        return None


def cmd_run(args: argparse.Namespace) -> int:
    config = _load_config(args.config)
    if config is None:
        return EXIT_BAD_CONFIG
    setup_logging(args.log_level or config.log_level)
    import uvloop

    from .agent import Agent

    from .errors import ConfigError, EdgeletError

    uvloop.install()
    import asyncio

    try:
        agent = Agent(config)
    except ConfigError as exc:  # a file the config points at, such as the kubeconfig
        print(f"edgelet: invalid config: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    except EdgeletError as exc:  # say, another agent holds root_dir
        print(f"edgelet: cannot run: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    try:
        asyncio.run(agent.run())
    except EdgeletError as exc:  # the agent cannot start on this machine as configured (say, CPU state)
        logging.getLogger("edgelet").error("cannot run: %s", exc)
        return EXIT_FAILURE
    return EXIT_OK


def cmd_check_config(args: argparse.Namespace) -> int:
    from .config import format_effective

    config = _load_config(args.file)
    if config is None:
        return EXIT_BAD_CONFIG
    if not args.quiet:
        print(format_effective(config), end="")
    return EXIT_OK


def cmd_version(args: argparse.Namespace) -> int:
    from . import core

    kind = "compiled" if core.IS_COMPILED else "pure-python"
    print(f"edgelet {__version__} (core: {kind}, python {sys.version.split()[0]})")
    return EXIT_OK


def cmd_pods(args: argparse.Namespace) -> int:
    config = _load_config(args.config)
    if config is None:
        return EXIT_BAD_CONFIG
    from .status.manager import read_pod_list, status_dir

    pod_list = read_pod_list(status_dir(config))
    if args.output == "json":
        sys.stdout.write(orjson.dumps(pod_list, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(format_pod_table(pod_list["items"], wide=args.output == "wide", now=time.time()))
    return EXIT_OK


def format_pod_table(pods: list[dict[str, Any]], *, wide: bool, now: float) -> str:
    """kubectl-like columns: NAMESPACE NAME READY STATUS RESTARTS AGE (+ IP NODE)."""
    header = ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    if wide:
        header += ["IP", "NODE"]
    rows = [header]
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        statuses = status.get("containerStatuses") or []
        ready = sum(1 for s in statuses if s.get("ready"))
        total = len((pod.get("spec") or {}).get("containers") or statuses)
        restarts = sum(int(s.get("restartCount") or 0) for s in statuses)
        row = [
            meta.get("namespace", "default"),
            meta.get("name", ""),
            f"{ready}/{total}",
            display_status(status),
            str(restarts),
            _age(status.get("startTime"), now),
        ]
        if wide:
            row += [status.get("podIP") or "<none>", (pod.get("spec") or {}).get("nodeName") or "<none>"]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "".join("   ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n" for r in rows)


def display_status(status: dict[str, Any]) -> str:
    """What kubectl shows: a container's waiting/terminated reason wins over the phase."""
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
    from .kubetime import parse_time

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


def cmd_logs(args: argparse.Namespace) -> int:
    config = _load_config(args.config)
    if config is None:
        return EXIT_BAD_CONFIG
    from .containerlogs import LogsError, print_logs

    try:
        return print_logs(config, namespace=args.namespace, pod_name=args.pod, container=args.container,
                          follow=args.follow, previous=args.previous, out=sys.stdout)
    except LogsError as exc:
        print(f"edgelet: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edgelet", description="A compact node agent for edge devices.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the agent in the foreground")
    run.add_argument("--config", default=DEFAULT_CONFIG)
    run.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    run.set_defaults(func=cmd_run)

    pods = sub.add_parser("pods", help="list the pods of this node with their status")
    pods.add_argument("--config", default=DEFAULT_CONFIG)
    pods.add_argument("-o", "--output", choices=["table", "wide", "json"], default="table")
    pods.set_defaults(func=cmd_pods)

    logs = sub.add_parser("logs", help="print the logs of a container")
    logs.add_argument("pod")
    logs.add_argument("-n", "--namespace", default=None)
    logs.add_argument("-c", "--container", default=None)
    logs.add_argument("-f", "--follow", action="store_true")
    logs.add_argument("-p", "--previous", action="store_true")
    logs.add_argument("--config", default=DEFAULT_CONFIG)
    logs.set_defaults(func=cmd_logs)

    check = sub.add_parser("check-config", help="validate a config file and print the effective settings")
    check.add_argument("file", nargs="?", default=DEFAULT_CONFIG)
    check.add_argument("-q", "--quiet", action="store_true")
    check.set_defaults(func=cmd_check_config)

    from .cli_describe import add_commands  # describe pod, get events
    add_commands(sub, default_config=DEFAULT_CONFIG, load_config=_load_config)

    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=cmd_version)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
