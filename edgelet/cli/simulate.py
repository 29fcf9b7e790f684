"""`edgelet simulate`: its flags, and the process around the fleet (limits, event loop, signals).

Registering the subcommand imports nothing heavy; the fleet's modules load when the command runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from edgelet.cli.base import RawDescriptionHelpFormatter, setup_logging

EXIT_OK = 0
EXIT_BAD_INPUT = 2
# Every hollow node holds a watch connection and a keep-alive one, plus the fds of the loop itself.
_FDS_PER_NODE = 4

DESCRIPTION = """\
Run N hollow edgelet nodes in one process against a real control plane, to size it for a fleet.
Each node runs edgelet's own registration, NodeStatus, Lease, API pod source (watch and backoff) and
pod status sync; pods bound to a node "start" at once in an in-memory runtime.

For simulation only: the kubeconfig may be an admin one (e.g. system:masters), with which the hollow
nodes act as their own nodes by name. Never point it at a production cluster: the nodes it registers
are fake and accept pods they never run."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("simulate", help="run N hollow nodes against a control plane (load testing)",
                                   description=DESCRIPTION, formatter_class=RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, required=True, help="how many hollow nodes to run")
    parser.add_argument("--kubeconfig", required=True,
                        help="credentials for every hollow node (simulation only: an admin kubeconfig works)")
    parser.add_argument("--pods-per-node", type=int, default=0,
                        help="pods the simulator binds to each node once it registered (default 0)")
    parser.add_argument("--name-prefix", default="hollow-", help="node names are PREFIX0000, PREFIX0001, ...")
    parser.add_argument("--namespace", default="default", help="namespace of the --pods-per-node pods")
    parser.add_argument("--start-rate", type=float, default=25.0, help="nodes started per second (default 25)")
    parser.add_argument("--report-interval", type=float, default=30.0,
                        help="seconds between the fleet summary lines on stdout (default 30)")
    parser.add_argument("--lease-duration", type=float, default=40.0, help="seconds (default 40, as the kubelet)")
    parser.add_argument("--lease-renew-interval", type=float, default=10.0, help="seconds (default 10)")
    parser.add_argument("--node-status-update-frequency", type=float, default=10.0, help="seconds (default 10)")
    parser.add_argument("--node-status-report-frequency", type=float, default=300.0, help="seconds (default 300)")
    parser.add_argument("--status-resync", type=float, default=10.0, help="pod status resync, seconds (default 10)")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="warning",
                        help="log level of the nodes' own messages on stderr (default warning)")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from edgelet.kubeapi.kubeconfig import load_kubeconfig
    from edgelet.simulate.fleet import FleetOptions, options_problem
    from edgelet.simulate.node import Timings
    from edgelet.util.errors import ConfigError

    setup_logging(args.log_level)
    try:
        timings = Timings(args.lease_duration, args.lease_renew_interval, args.node_status_update_frequency,
                          args.node_status_report_frequency, args.status_resync)
        if min(dataclasses.astuple(timings)) <= 0:
            raise ValueError("every interval and duration must be positive")
    except ValueError as e:
        print(f"edgelet simulate: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    options = FleetOptions(nodes=args.nodes, pods_per_node=args.pods_per_node, name_prefix=args.name_prefix,
                           namespace=args.namespace, start_rate=args.start_rate,
                           report_interval=args.report_interval, timings=timings)
    problem = options_problem(options)
    if problem is not None:
        print(f"edgelet simulate: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        kubeconfig = load_kubeconfig(args.kubeconfig)
    except ConfigError as e:
        print(f"edgelet simulate: invalid kubeconfig: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    problem = _raise_fd_limit(options.nodes * _FDS_PER_NODE + 64)
    if problem is not None:
        print(f"edgelet simulate: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return _run(options, kubeconfig)


def _raise_fd_limit(wanted: int) -> str | None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= wanted:
        return None
    if hard != resource.RLIM_INFINITY and hard < wanted:
        return f"--nodes needs about {wanted} open files; the hard limit is {hard} (raise it with ulimit -Hn)"
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return None


def _run(options, kubeconfig) -> int:
    import asyncio
    import signal
    import tempfile

    import uvloop

    from edgelet.simulate.fleet import Fleet
    from edgelet.util.errors import ConfigError

    async def simulate(state_dir: str) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        fleet = Fleet(options, kubeconfig, state_dir=state_dir)
        print(f"edgelet simulate: {options.nodes} hollow nodes against {kubeconfig.server}", file=sys.stderr,
              flush=True)
        await fleet.run(stop)

    with tempfile.TemporaryDirectory(prefix="edgelet-simulate-") as state_dir:
        try:
            uvloop.run(simulate(state_dir))
        except ConfigError as e:  # the kubeconfig's TLS material
            print(f"edgelet simulate: invalid kubeconfig: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
    return EXIT_OK
