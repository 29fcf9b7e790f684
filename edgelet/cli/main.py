"""The `edgelet` command: run the agent, list its pods, read container logs, exec in a container, check a config.

Every subcommand's flags are defined here; its implementation is imported only when it runs, so that
`edgelet run` does not carry the readers' code for as long as the agent lives. Options may stand anywhere on the
line, as kubectl takes them (edgelet.cli.base).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from edgelet import __version__
from edgelet.cli.base import ArgumentParser, parse_command_line, setup_logging

if TYPE_CHECKING:
    from edgelet.kubelet.agent import Agent

DEFAULT_CONFIG = "/etc/edgelet/edgelet.toml"
CONFIG_ENV = "EDGELET_CONFIG"

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_CONFIG = 2


def default_config_path() -> str:
    return os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG


def load_checked_config(path: str, *, referenced_files: bool = True):
    """The config as `run` needs it, or None after one line on stderr: the file, then the files it points at.

    `run` and `check-config` both call this, so a config one accepts the other never refuses. The
    commands that only read the agent's files (`pods`, `logs`) leave the referenced files alone.
    """
    from edgelet.config import load_config
    from edgelet.util.errors import ConfigError

    try:
        config = load_config(path)
        if referenced_files:
            check_referenced_files(config)
    except ConfigError as exc:
        print(f"edgelet: invalid config: {exc}", file=sys.stderr)
        return None
    return config


def check_referenced_files(config) -> None:
    """Files named by the config that `run` reads before anything starts (the kubeconfig and its certificates,
    or the CA file of a bootstrap token join; the tunnel's CA file; the credential provider config)."""
    if config.images.credential_provider_config:
        from edgelet.images.credentialprovider import load_provider_config

        load_provider_config(config.images.credential_provider_config, config.images.credential_provider_bin_dir)
    if config.cluster is not None and config.cluster.kubeconfig:
        from edgelet.kubeapi.kubeconfig import load_kubeconfig, ssl_context

        ssl_context(load_kubeconfig(config.cluster.kubeconfig))
    elif config.cluster is not None and config.cluster.ca_file:
        from edgelet.bootstrap.manager import read_ca_file

        read_ca_file(config.cluster.ca_file)
    if config.cluster is not None and config.cluster.tunnel is not None and config.cluster.tunnel.ca_file:
        from edgelet.tunnel.wiring import read_pem_file

        read_pem_file(config.cluster.tunnel.ca_file, "the konnectivity-server CA (cluster.tunnel.ca_file)")


def cmd_run(args: argparse.Namespace) -> int:
    # Loading the config, importing the agent and building it make objects that live as long as the process:
    # collecting while that runs is wasted start-up time, and later collections need not walk them (gc.freeze).
    gc.disable()
    try:
        agent = _build_agent(args)
        gc.freeze()
    finally:
        gc.enable()
    if isinstance(agent, int):
        return agent
    import uvloop

    from edgelet.util.errors import EdgeletError

    try:
        uvloop.run(agent.run())
    except EdgeletError as exc:  # cannot start as configured: a port taken, a CPU state that does not fit
        logging.getLogger("edgelet").error("cannot run: %s", exc)
        return EXIT_FAILURE
    return EXIT_OK


def _build_agent(args: argparse.Namespace) -> Agent | int:
    """The agent `edgelet run` runs, or the exit code that says why there is none."""
    config = load_checked_config(args.config)
    if config is None:
        return EXIT_BAD_CONFIG
    setup_logging(args.log_level or config.log_level)
    # gRPC's C core prints ERROR lines of its own for each failed connect or TLS alert (three per retry of a tunnel
    # stream konnectivity-server refuses); edgelet says what a failure means once per streak. Read when grpc loads;
    # GRPC_VERBOSITY set in the environment wins.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    from edgelet.kubelet.agent import Agent
    from edgelet.util.errors import ConfigError, EdgeletError

    try:
        return Agent(config, config_path=args.config)
    except ConfigError as exc:  # a file the config points at changed between the check and now
        print(f"edgelet: invalid config: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    except EdgeletError as exc:  # say, another agent holds root_dir
        print(f"edgelet: cannot run: {exc}", file=sys.stderr)
        return EXIT_FAILURE


def cmd_check_config(args: argparse.Namespace) -> int:
    from edgelet.config import format_effective

    config = load_checked_config(args.file or args.config)
    if config is None:
        return EXIT_BAD_CONFIG
    if not args.quiet:
        print(format_effective(config), end="")
    return EXIT_OK


def cmd_keygen(args: argparse.Namespace) -> int:
    from edgelet.bootstrap.keygen import main as keygen_main

    return keygen_main()


def version_text() -> str:
    from edgelet import core

    kind = "compiled" if core.IS_COMPILED else "pure-python"
    return f"edgelet {__version__} (core: {kind}, python {sys.version.split()[0]})"


def cmd_version(args: argparse.Namespace) -> int:
    print(version_text())
    return EXIT_OK


def cmd_pods(args: argparse.Namespace) -> int:
    config = load_checked_config(args.config, referenced_files=False)
    if config is None:
        return EXIT_BAD_CONFIG
    from edgelet.cli import pods as cli_pods

    return cli_pods.run(config, args)


def cmd_describe(args: argparse.Namespace) -> int:
    config = load_checked_config(args.config, referenced_files=False)
    if config is None:
        return EXIT_BAD_CONFIG
    from edgelet.cli.describe import describe_command

    return describe_command(config, args)


def cmd_get(args: argparse.Namespace) -> int:
    config = load_checked_config(args.config, referenced_files=False)
    if config is None:
        return EXIT_BAD_CONFIG
    from edgelet.cli.describe import get_events_command

    return get_events_command(config, args)


def cmd_exec(args: argparse.Namespace) -> int:
    config = load_checked_config(args.config, referenced_files=False)
    if config is None:
        return EXIT_BAD_CONFIG
    from edgelet.cli.exec import exec_command

    return exec_command(config, args)


def cmd_logs(args: argparse.Namespace) -> int:
    config = load_checked_config(args.config, referenced_files=False)
    if config is None:
        return EXIT_BAD_CONFIG
    from edgelet.logs.reader import LogOptions, LogsError, print_logs

    try:
        since = _since(args.since, args.since_time)
        options = LogOptions(follow=args.follow, previous=args.previous, tail=args.tail, since_ns=since,
                             timestamps=args.timestamps)
        return print_logs(config, namespace=args.namespace, pod_name=args.pod, container=args.container,
                          all_containers=args.all_containers, options=options, out=sys.stdout, err=sys.stderr)
    except LogsError as exc:
        print(f"edgelet: {exc}", file=sys.stderr)
        return EXIT_FAILURE


def _since(since: str | None, since_time: str | None) -> int | None:
    """--since or --since-time as nanoseconds since the epoch, the time stamps' own unit."""
    from edgelet.api.kubetime import parse_rfc3339_ns
    from edgelet.config import parse_duration
    from edgelet.logs.reader import LogsError

    if since is not None and since_time is not None:
        raise LogsError("at most one of --since and --since-time may be given")
    try:
        if since is not None:
            seconds = parse_duration(since)
            if seconds <= 0:
                raise ValueError(f"--since must be a positive duration, got {since!r}")
            return time.time_ns() - int(seconds * 1_000_000_000)
        return parse_rfc3339_ns(since_time) if since_time is not None else None
    except ValueError as exc:
        raise LogsError(str(exc)) from None


class _VersionAction(argparse.Action):
    """--version without importing the core unless asked."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="edgelet", description="A compact node agent for edge devices.")
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = ArgumentParser(add_help=False)
    common.add_argument("--config", default=default_config_path(), metavar="FILE",
                        help=f"the config file (default: ${CONFIG_ENV}, else {DEFAULT_CONFIG})")

    run = sub.add_parser("run", parents=[common], help="run the agent in the foreground",
                         description="Run the agent in the foreground; SIGTERM or SIGINT stop it, containers keep "
                                     "running.")
    run.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                     help="override the config's log_level")
    run.set_defaults(func=cmd_run)

    pods = sub.add_parser("pods", parents=[common], help="list the pods of this node with their status",
                          description="List the pods of this node as the agent last recorded them (this works "
                                      "while the agent is down, and says so).")
    pods.add_argument("name", nargs="?", help="only this pod (a static pod also by its name without the node suffix)")
    pods.add_argument("-n", "--namespace", default="default", help="the namespace to list (default: %(default)s)")
    pods.add_argument("-A", "--all-namespaces", action="store_true",
                      help="list the pods of every namespace, with a NAMESPACE column")
    pods.add_argument("-l", "--selector", metavar="SELECTOR",
                      help="label selector, as kubectl takes it: 'app=web,tier!=db', 'env in (a,b)', '!canary'")
    pods.add_argument("-w", "--watch", action="store_true",
                      help="after the list, print a pod again whenever it changes (until interrupted)")
    pods.add_argument("-o", "--output", choices=["table", "wide", "json", "yaml", "name"], default="table",
                      help="table (default), wide (adds IP and NODE), json or yaml (a Pod, or a PodList), "
                           "name (pod/NAME)")
    pods.set_defaults(func=cmd_pods)

    logs = sub.add_parser("logs", parents=[common], help="print the logs of a container",
                          description="Print a container's logs from the CRI log files, as kubectl logs does.")
    logs.add_argument("pod", help="the pod (a static pod also by its name without the node suffix)")
    logs.add_argument("-n", "--namespace", default=None, help="the pod's namespace (default: any)")
    logs.add_argument("-c", "--container", default=None,
                      help="the container (default: the kubectl.kubernetes.io/default-container annotation, "
                           "else the first container)")
    logs.add_argument("--all-containers", action="store_true", help="the logs of every container of the pod")
    logs.add_argument("-f", "--follow", action="store_true",
                      help="keep printing new lines until the container ends or the pod is gone")
    logs.add_argument("-p", "--previous", action="store_true",
                      help="the logs of the previous instance of the container (before its last restart)")
    logs.add_argument("--tail", type=int, default=-1, metavar="N",
                      help="only the last N lines (default: -1, all)")
    logs.add_argument("--since", metavar="DURATION",
                      help="only lines newer than a relative duration like 5s, 2m or 3h")
    logs.add_argument("--since-time", metavar="TIME",
                      help="only lines at or after an RFC 3339 time like 2026-01-02T15:04:05Z")
    logs.add_argument("--timestamps", action="store_true",
                      help="start each line with the time the runtime recorded it (RFC 3339)")
    logs.set_defaults(func=cmd_logs)

    check = sub.add_parser("check-config", parents=[common],
                           help="validate a config file, print the effective settings",
                           description="Run the validation `edgelet run` runs, then print the effective settings.")
    check.add_argument("file", nargs="?", default=None, help="the config file (default: the --config file)")
    check.add_argument("-q", "--quiet", action="store_true", help="print nothing; only the exit code tells")
    check.set_defaults(func=cmd_check_config)

    describe = sub.add_parser("describe", parents=[common],
                              help="show a pod or the node in detail with recent events, as kubectl describe")
    describe.add_argument("kind", choices=["pod", "pods", "po", "node", "nodes", "no"], help="what to describe")
    describe.add_argument("name", nargs="?", default="",
                          help="the pod's name (a static pod also without its -NODE suffix); for node, optional")
    describe.add_argument("-n", "--namespace", default="default", help="the pod's namespace (default: default)")
    describe.set_defaults(func=cmd_describe)

    get = sub.add_parser("get", parents=[common], help="list this node's events, as kubectl get events")
    get.add_argument("kind", choices=["events", "event", "ev"], help="what to list (events only)")
    get.add_argument("-n", "--namespace", default="default", help="only events in this namespace (default: default)")
    get.add_argument("-A", "--all-namespaces", action="store_true", help="events of every namespace")
    get.add_argument("--for", dest="for_object", metavar="KIND/NAME",
                     help="only events about this object, e.g. pod/web")
    get.set_defaults(func=cmd_get)

    exec_ = sub.add_parser("exec", parents=[common], rest_dest="cmd",
                           usage="%(prog)s POD [-c CONTAINER] [-i] [-t] [-n NS] -- COMMAND [ARGS...]",
                           help="run a command in a container of a pod, as kubectl exec",
                           description="Run a command in a running container through the runtime (no cluster or "
                                       "network needed); edgelet exits with the command's exit code.")
    exec_.add_argument("pod", help="the pod (a static pod also by its name without the node suffix)")
    exec_.add_argument("cmd", nargs="*", metavar="COMMAND", help="the command and its arguments, after --")
    exec_.add_argument("-n", "--namespace", default=None,
                       help="the pod's namespace (default: any, as for logs; a name in several needs -n)")
    exec_.add_argument("-c", "--container", default=None,
                       help="the container (default: the kubectl.kubernetes.io/default-container annotation, "
                            "else the first container)")
    exec_.add_argument("-i", "--stdin", action="store_true", help="pass stdin to the command")
    exec_.add_argument("-t", "--tty", action="store_true",
                       help="a terminal for the command (with -i, when stdin is a terminal: raw mode, resizes sent)")
    exec_.set_defaults(func=cmd_exec)

    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=cmd_version)
    keygen = sub.add_parser("keygen", help="make a key with a CSR or a self-signed certificate (JSON in and out; "
                                           "the agent runs it as a child so cryptography never loads in it)")
    keygen.set_defaults(func=cmd_keygen)

    from edgelet.cli import simulate as simulate_cli

    simulate_cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_command_line(build_parser(), sys.argv[1:] if argv is None else argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:  # how -f and -w end
        return EXIT_OK
    except BrokenPipeError:
        # The reader went away (`edgelet logs -f | head`): end quietly. Point stdout at /dev/null so the
        # interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
