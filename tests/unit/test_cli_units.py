"""The CLI's pure parts: the parser documents every option, pod selection, kubectl's STATUS column, label selectors."""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import struct
import sys
import termios

import pytest

from edgelet.api.labelselector import parse_selector
from edgelet.cli import base as cli_base
from edgelet.cli.main import build_parser, default_config_path
from edgelet.cli.pods import Printer, display_status, format_pod_table, select


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_every_option_of_every_command_has_help_text():
    parser = build_parser()
    commands = _subparsers(parser)
    assert {"run", "pods", "logs", "check-config", "version"} <= set(commands)
    for name, command in [("edgelet", parser), *commands.items()]:
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help and action.help != argparse.SUPPRESS, f"{name} {action.option_strings or action.dest}"


class _Terminal:
    """A pseudo-terminal of a given width as stdout (sys.__stdout__, which shutil asks), or None for no terminal."""

    def __init__(self, columns: int | None):
        self.columns = columns

    def __enter__(self):
        self.fds = ()
        if self.columns is None:
            return open(os.devnull, "w")
        self.fds = os.openpty()
        fcntl.ioctl(self.fds[1], termios.TIOCSWINSZ, struct.pack("HHHH", 24, self.columns, 0, 0))
        return os.fdopen(os.dup(self.fds[1]), "w")

    def __exit__(self, *exc):
        for fd in self.fds:
            os.close(fd)


@pytest.mark.parametrize("columns_env", [None, "120", "0", "-4", "wide", ""])
@pytest.mark.parametrize("terminal", [None, 100, 0])
def test_the_help_width_is_shutils(monkeypatch, columns_env, terminal):
    """terminal_width() stands in for shutil.get_terminal_size().columns (shutil stays out of `edgelet run`):
    the same answer in every case, and so the same help, byte for byte, as argparse's own formatter gives."""
    if columns_env is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns_env)
    with _Terminal(terminal) as stdout:
        monkeypatch.setattr(sys, "__stdout__", stdout)
        assert cli_base.terminal_width() == shutil.get_terminal_size().columns
        logs = _subparsers(build_parser())["logs"]
        assert logs.formatter_class is cli_base.HelpFormatter
        ours = logs.format_help()
        logs.formatter_class = argparse.HelpFormatter
        assert logs.format_help() == ours
        stdout.close()


def test_no_stdout_at_all_is_80_columns(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(sys, "__stdout__", None)
    assert cli_base.terminal_width() == shutil.get_terminal_size().columns == 80


def test_config_defaults_to_etc_and_the_environment_overrides_it(monkeypatch):
    monkeypatch.delenv("EDGELET_CONFIG", raising=False)
    assert default_config_path() == "/etc/edgelet/edgelet.toml"
    assert build_parser().parse_args(["pods"]).config == "/etc/edgelet/edgelet.toml"
    monkeypatch.setenv("EDGELET_CONFIG", "/srv/edge.toml")
    assert build_parser().parse_args(["logs", "web"]).config == "/srv/edge.toml"
    assert build_parser().parse_args(["logs", "web", "--config", "/x.toml"]).config == "/x.toml"


def _pod(name, namespace="default", labels=None, phase="Running", **extra):
    meta = {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}", "labels": labels or {}}
    return {"metadata": {**meta, **extra}, "spec": {"containers": [{"name": "main"}], "nodeName": "n1"},
            "status": {"phase": phase, "containerStatuses": [
                {"name": "main", "ready": phase == "Running", "restartCount": 2, "state": {"running": {}}}]}}


PODS = [_pod("web-n1", labels={"app": "web", "tier": "front"}), _pod("db-n1", labels={"app": "db"}),
        _pod("agent", "kube-system", labels={"app": "agent"})]


@pytest.mark.parametrize(
    ("namespace", "name", "selector", "expected"),
    [
        ("default", None, None, ["web-n1", "db-n1"]),
        (None, None, None, ["web-n1", "db-n1", "agent"]),
        ("kube-system", None, None, ["agent"]),
        ("default", "web", None, ["web-n1"]),  # a static pod by its name without the node suffix
        ("default", "web-n1", None, ["web-n1"]),
        ("default", "agent", None, []),
        (None, None, "app=web", ["web-n1"]),
        (None, None, "app!=web", ["db-n1", "agent"]),
        (None, None, "app in (web, agent)", ["web-n1", "agent"]),
        (None, None, "app notin (web,agent),!tier", ["db-n1"]),
        (None, None, "tier", ["web-n1"]),
        (None, None, "app==db,tier", []),
    ],
)
def test_select(namespace, name, selector, expected):
    chosen = select(PODS, namespace=namespace, name=name,
                    selector=parse_selector(selector) if selector else None, node_name="n1")
    assert [p["metadata"]["name"] for p in chosen] == expected


@pytest.mark.parametrize("selector", ["a=b=c", "app in web", "=x"])
def test_a_bad_selector_names_the_term(selector):
    with pytest.raises(ValueError, match="unable to parse requirement"):
        parse_selector(selector)


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (_pod("a"), "Running"),
        (_pod("a", deletionTimestamp="2026-01-01T00:00:00Z"), "Terminating"),
        (_pod("a", phase="Unknown"), "Unknown"),
        ({"metadata": {}, "status": {"phase": "Pending", "containerStatuses": [
            {"state": {"waiting": {"reason": "ImagePullBackOff"}}}]}}, "ImagePullBackOff"),
        ({"metadata": {}, "status": {"phase": "Running", "containerStatuses": [
            {"state": {"terminated": {"reason": "Error", "exitCode": 1}}}]}}, "Error"),
        ({"metadata": {}, "status": {"phase": "Failed", "reason": "Evicted"}}, "Evicted"),
    ],
)
def test_display_status_follows_kubectl(pod, expected):
    assert display_status(pod) == expected


def test_table_has_a_namespace_column_only_for_all_namespaces():
    narrow = format_pod_table(PODS[:1], wide=False, now=0, namespaces=False)
    assert narrow.splitlines()[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert narrow.splitlines()[1].split() == ["web-n1", "1/1", "Running", "2", "<unknown>"]
    wide = format_pod_table(PODS, wide=True, now=0, namespaces=True)
    assert wide.splitlines()[0].split() == ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"]
    assert wide.splitlines()[3].split()[:2] == ["kube-system", "agent"]


def test_table_counts_sidecars_and_init_restarts_as_kubectl():
    pod = _pod("job-n1")
    pod["spec"]["initContainers"] = [{"name": "setup"}, {"name": "proxy", "restartPolicy": "Always"}]
    pod["status"]["initContainerStatuses"] = [
        {"name": "setup", "ready": True, "restartCount": 1, "state": {"terminated": {"exitCode": 0}}},
        {"name": "proxy", "ready": True, "restartCount": 4, "state": {"running": {}}}]
    row = format_pod_table([pod], wide=False, now=0, namespaces=False).splitlines()[1].split()
    assert row[:4] == ["job-n1", "2/2", "Running", "7"]


def test_printer_name_json_and_yaml():
    assert Printer("name", all_namespaces=False, single=False).render(PODS[:2], header=True) == \
        "pod/web-n1\npod/db-n1\n"
    import json

    import yaml

    single = json.loads(Printer("json", all_namespaces=False, single=True).render(PODS[:1], header=True))
    assert single["metadata"]["name"] == "web-n1"
    listing = yaml.safe_load(Printer("yaml", all_namespaces=False, single=False).render(PODS, header=True))
    assert listing["kind"] == "PodList" and len(listing["items"]) == 3
    watched = Printer("yaml", all_namespaces=False, single=False).render(PODS[:2], header=False)
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(watched) if d] == ["web-n1", "db-n1"]
