"""kubectl's option placement for every `edgelet` subcommand: options before the subcommand, between and after
its positionals, grouped short flags, `--opt=value`, and `--` ending options."""

from __future__ import annotations

import pytest

from edgelet.cli.base import CommandLine, parse_command_line, split_line, subcommands, value_options
from edgelet.cli.main import build_parser

_TAKES_VALUE = {"-n": True, "--namespace": True, "-c": True, "--config": True, "-i": False, "-t": False, "-A": False}


@pytest.mark.parametrize("argv, line", [
    ([], CommandLine([], [], None)),
    (["exec", "p", "--", "sh", "-c", "x"], CommandLine([], ["exec", "p"], ["sh", "-c", "x"])),
    (["-n", "exec", "pods"], CommandLine(["-n", "exec"], ["pods"], None)),  # a value, even one named like a command
    (["--namespace=x", "pods"], CommandLine(["--namespace=x"], ["pods"], None)),
    (["-nx", "pods"], CommandLine(["-nx"], ["pods"], None)),
    (["-it", "p"], CommandLine(["-it"], ["p"], None)),
    (["-itc", "main", "p"], CommandLine(["-itc", "main"], ["p"], None)),  # grouped flags, the last with a value
    (["-icmain", "p"], CommandLine(["-icmain"], ["p"], None)),
    (["-", "-1", "-2.5"], CommandLine([], ["-", "-1", "-2.5"], None)),
    (["--unknown", "p"], CommandLine(["--unknown"], ["p"], None)),  # a flag to the split; argparse refuses it
    (["p", "-n"], CommandLine(["-n"], ["p"], None)),  # no value left: argparse says so
    (["a", "--", "--", "-n", "x"], CommandLine([], ["a"], ["--", "-n", "x"])),  # only the first -- ends options
])
def test_split_line(argv, line):
    assert split_line(argv, lambda option: _TAKES_VALUE.get(option, False)) == line


def _parse(*argv: str) -> dict:
    args = vars(parse_command_line(build_parser(), list(argv)))
    args.pop("func")
    return args


CONFIG = "/etc/edgelet/edgelet.toml"


@pytest.mark.parametrize("argv, expected", [
    # describe: -n and --config before, between, after the kind and name
    (["describe", "pod", "-n", "ns", "web"], {"kind": "pod", "name": "web", "namespace": "ns", "config": CONFIG}),
    (["describe", "pod", "--config", "f", "web"],
     {"kind": "pod", "name": "web", "namespace": "default", "config": "f"}),
    (["-n", "ns", "--config", "f", "describe", "pod", "web"],
     {"kind": "pod", "name": "web", "namespace": "ns", "config": "f"}),
    (["describe", "--namespace=ns", "pod", "web", "--config=f"],
     {"kind": "pod", "name": "web", "namespace": "ns", "config": "f"}),
    (["describe", "-n", "ns", "--", "pod", "-web"],
     {"kind": "pod", "name": "-web", "namespace": "ns", "config": CONFIG}),
    (["describe", "node"], {"kind": "node", "name": "", "namespace": "default", "config": CONFIG}),
    # pods
    (["-o", "wide", "pods", "-A"], {"name": None, "namespace": "default", "all_namespaces": True, "selector": None,
                                    "watch": False, "output": "wide", "config": CONFIG}),
    (["pods", "-l", "app=web", "web", "-nkube-system", "-w", "-oyaml"],
     {"name": "web", "namespace": "kube-system", "all_namespaces": False, "selector": "app=web", "watch": True,
      "output": "yaml", "config": CONFIG}),
    # logs
    (["logs", "-c", "main", "web", "--tail", "-1", "-f", "--config", "f"],
     {"pod": "web", "namespace": None, "container": "main", "all_containers": False, "follow": True,
      "previous": False, "tail": -1, "since": None, "since_time": None, "timestamps": False, "config": "f"}),
    (["--tail", "5", "-n", "ns", "logs", "-p", "--", "-web"],
     {"pod": "-web", "namespace": "ns", "container": None, "all_containers": False, "follow": False,
      "previous": True, "tail": 5, "since": None, "since_time": None, "timestamps": False, "config": CONFIG}),
    # get events
    (["get", "-A", "events", "--for", "pod/web"], {"kind": "events", "namespace": "default", "all_namespaces": True,
                                                   "for_object": "pod/web", "config": CONFIG}),
    (["--for=pod/web", "get", "ev", "-n", "ns"], {"kind": "ev", "namespace": "ns", "all_namespaces": False,
                                                  "for_object": "pod/web", "config": CONFIG}),
    # exec: everything after -- is the command, options and -- included
    (["exec", "web", "-c", "main", "-it", "--", "sh", "-c", "echo -n hi", "--", "-x"],
     {"pod": "web", "cmd": ["sh", "-c", "echo -n hi", "--", "-x"], "namespace": None, "container": "main",
      "stdin": True, "tty": True, "config": CONFIG}),
    (["-i", "--config", "f", "exec", "-nns", "web", "--", "cat"],
     {"pod": "web", "cmd": ["cat"], "namespace": "ns", "container": None, "stdin": True, "tty": False, "config": "f"}),
    (["exec", "web", "ls", "/"], {"pod": "web", "cmd": ["ls", "/"], "namespace": None, "container": None,
                                  "stdin": False, "tty": False, "config": CONFIG}),  # kubectl's older form
    (["exec", "web", "--"], {"pod": "web", "cmd": [], "namespace": None, "container": None, "stdin": False,
                             "tty": False, "config": CONFIG}),
    # run, check-config, version, simulate
    (["--log-level", "debug", "run", "--config", "f"], {"log_level": "debug", "config": "f"}),
    (["check-config", "-q", "f.toml"], {"file": "f.toml", "quiet": True, "config": CONFIG}),
    (["-q", "check-config", "--config", "g", "--", "-f.toml"], {"file": "-f.toml", "quiet": True, "config": "g"}),
    (["version"], {}),
    (["--nodes", "3", "simulate", "--kubeconfig=k", "--namespace", "load"],
     {"nodes": 3, "kubeconfig": "k", "pods_per_node": 0, "name_prefix": "hollow-", "namespace": "load",
      "start_rate": 25.0, "report_interval": 30.0, "lease_duration": 40.0, "lease_renew_interval": 10.0,
      "node_status_update_frequency": 10.0, "node_status_report_frequency": 300.0, "status_resync": 10.0,
      "log_level": "warning"}),
])
def test_options_stand_anywhere(monkeypatch, argv, expected):
    monkeypatch.delenv("EDGELET_CONFIG", raising=False)
    assert _parse(*argv) == expected


@pytest.mark.parametrize("argv, error", [
    (["exec", "web", "extra", "--", "ls"], "'extra' before --: the command goes after --"),
    (["logs", "--", "web", "-n", "ns"], "unrecognized arguments: -n ns"),  # after --, no options
    (["pods", "--name", "x"], "unrecognized arguments: --name"),
    (["pods", "--all"], "unrecognized arguments: --all"),  # no abbreviations, as kubectl
    (["describe", "pods", "-n"], "argument -n/--namespace: expected one argument"),
    (["version", "--config", "f"], "unrecognized arguments: --config f"),
    (["nosuch"], "invalid choice: 'nosuch'"),
    ([], "the following arguments are required: COMMAND"),
    (["-n", "ns"], "the following arguments are required: COMMAND"),
])
def test_bad_lines_are_refused_by_argparse_naming_the_option(capsys, argv, error):
    with pytest.raises(SystemExit) as exited:
        parse_command_line(build_parser(), argv)
    assert exited.value.code == 2
    assert error in capsys.readouterr().err


def test_help_after_the_subcommand_or_before_it_is_the_subcommands(capsys):
    for argv in (["exec", "-h"], ["-h", "exec"], ["exec", "web", "--help"]):
        with pytest.raises(SystemExit):
            parse_command_line(build_parser(), argv)
        assert capsys.readouterr().out.startswith("usage: edgelet exec POD [-c CONTAINER]")


def test_an_option_means_the_same_in_every_subcommand():
    """Options before the subcommand are split before it is known: one option string, one arity everywhere."""
    parsers = list(subcommands(build_parser()).values())
    table = value_options(parsers)
    for parser in parsers:
        for option, action in parser._option_string_actions.items():
            assert (action.nargs != 0) == table[option], f"{parser.prog} {option}"
