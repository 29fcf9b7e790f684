"""What every `edgelet` subcommand shares: argparse's classes with the help width and kubectl's option placement
(options anywhere on the line, before or after the subcommand and its arguments; `--` ends them), and logging.

edgelet.cli.main and edgelet.cli.simulate both import this; neither imports the other at import time.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass


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


def terminal_width() -> int:
    """The columns shutil.get_terminal_size() answers ($COLUMNS if a positive number, else stdout's terminal,
    else 80), for argparse's help: its formatter asks shutil itself, and shutil brings bz2 and lzma, 0.4 MiB
    that `edgelet run` has no other use for (tests/unit/test_cli_units.py holds the two side by side)."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0 and sys.__stdout__ is not None:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns if columns > 0 else 80


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, given the width it would have asked shutil for."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None,
                 **kwargs):
        super().__init__(prog, indent_increment, max_help_position,
                         terminal_width() - 2 if width is None else width, **kwargs)


class RawDescriptionHelpFormatter(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """argparse's RawDescriptionHelpFormatter, as HelpFormatter."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with HelpFormatter by default and no abbreviated long options (kubectl takes none, and
    the line is split before argparse sees it); its subcommands' parsers are of this class too.

    `rest_dest`: the attribute that receives everything after `--` as is (`edgelet exec POD -- CMD ARGS...`);
    without it, what follows `--` are more positional arguments.
    """

    def __init__(self, *, formatter_class: type[argparse.HelpFormatter] = HelpFormatter,
                 allow_abbrev: bool = False, rest_dest: str | None = None, **kwargs):
        super().__init__(formatter_class=formatter_class, allow_abbrev=allow_abbrev, **kwargs)
        self.rest_dest = rest_dest


# -- kubectl's option placement -------------------------------------------------------------------
#
# argparse alone cannot: a subcommand's options before its name are the top parser's business, and
# parse_intermixed_args (Python 3.11) loses positionals that follow `--` or takes them for options. So the
# line is first split into options (with their values) and positionals, with the options' own table; argparse
# then parses `OPTIONS -- POSITIONALS`, the one order it handles in every case, and does all the rest.

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse's: a positional, as no option looks like one


@dataclass(frozen=True, slots=True)
class CommandLine:
    options: list[str]  # every option with its value, in the order given
    positionals: list[str]  # the arguments before `--`, in order
    after_dash: list[str] | None  # everything after the first `--`; None when there is none


def split_line(argv: Sequence[str], takes_value: Callable[[str], bool]) -> CommandLine:
    """Options apart from positionals, as kubectl (pflag) tells them: `--name=value`, `--name value`, `-nvalue`,
    `-n value`, flags grouped as `-it`; a lone `-` and negative numbers are positionals; `--` ends options.

    `takes_value(option)` says whether an option string (`-n`, `--namespace`) takes a value; an unknown one is
    taken for a flag and left to argparse to refuse."""
    options: list[str] = []
    positionals: list[str] = []
    index = 0
    while index < len(argv):
        token = argv[index]
        index += 1
        if token == "--":
            return CommandLine(options, positionals, list(argv[index:]))
        if not token.startswith("-") or token == "-" or _NEGATIVE_NUMBER.match(token):
            positionals.append(token)
            continue
        options.append(token)
        if token.startswith("--"):
            wants_next = "=" not in token and takes_value(token)
        else:
            wants_next = _short_group_wants_next(token, takes_value)
        if wants_next and index < len(argv):
            options.append(argv[index])
            index += 1
    return CommandLine(options, positionals, None)


def _short_group_wants_next(token: str, takes_value: Callable[[str], bool]) -> bool:
    """`-itc`: flags, until one that takes a value: the rest of the token is its value, or the next token."""
    for position in range(1, len(token)):
        if takes_value("-" + token[position]):
            return position == len(token) - 1
    return False


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's subcommands by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def value_options(parsers: Iterable[argparse.ArgumentParser]) -> dict[str, bool]:
    """Every option string of the parsers -> whether it takes a value. An option string must mean the same in
    every subcommand (a value everywhere or nowhere): options before the subcommand's name are split with it."""
    table: dict[str, bool] = {}
    for parser in parsers:
        for option, action in parser._option_string_actions.items():
            table.setdefault(option, action.nargs != 0)
    return table


def parse_command_line(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """argv parsed as kubectl would: the subcommand is the first positional, wherever its options stand.

    Without a known subcommand the top parser answers with its own options (--version, --help) and the first
    positional: a missing or misspelt command."""
    commands = subcommands(parser)
    table = value_options(commands.values())
    line = split_line(argv, lambda option: table.get(option, False))
    if not line.positionals or line.positionals[0] not in commands:
        own = [option for option in line.options if option in parser._option_string_actions]
        return parser.parse_args(own + line.positionals[:1])
    name, positionals = line.positionals[0], line.positionals[1:]
    command = commands[name]
    rest_dest = getattr(command, "rest_dest", None)
    if rest_dest is None and line.after_dash:
        positionals = positionals + line.after_dash
    args = command.parse_args(line.options + (["--", *positionals] if positionals else []))
    if rest_dest is not None and line.after_dash is not None:
        if getattr(args, rest_dest, None):
            command.error(f"{' '.join(getattr(args, rest_dest))!r} before --: the command goes after --")
        setattr(args, rest_dest, line.after_dash)
    return args
