"""`edgelet exec` against a real agent on the private containerd: output and exit code of the remote command,
stdin with -i (ended, so `cat` ends), -c, kubectl's default-container note and errors, without any cluster."""

from __future__ import annotations

import fcntl
import os
import select
import struct
import subprocess
import sys
import termios

import pytest

from tests.helpers import wait_for
from tests.integration.agent_harness import REPO, TWO_CONTAINERS, AgentProcess

pytestmark = [pytest.mark.containerd, pytest.mark.usefixtures("clean_runtime")]


def _exec(agent: AgentProcess, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """`edgelet --config FILE exec ARGS...`: the global option before the subcommand, as kubectl takes them."""
    return subprocess.run([sys.executable, "-m", "edgelet", "--config", str(agent.config_path), "exec", *args],
                          cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True,
                          input=stdin, stdin=subprocess.DEVNULL if stdin is None else None, timeout=60)


@pytest.fixture
def duo(tmp_path, containerd):
    agent = AgentProcess(tmp_path, containerd.endpoint)
    agent.start()
    agent.write_manifest("duo.yaml", TWO_CONTAINERS.replace("{ANNOTATIONS}", "{}"))
    wait_for(lambda: (agent.pod("duo") or {}).get("status", {}).get("phase") == "Running"
             and _exec(agent, "duo", "-c", "second", "--", "true").returncode == 0, 60, what="duo running")
    yield agent
    agent.close()


def test_exec_prints_the_output_and_exits_with_the_commands_code(duo):
    echoed = _exec(duo, "duo", "--", "echo", "hello", "-n", "--", "x")
    assert echoed.returncode == 0
    assert echoed.stdout == "hello -n -- x\n"
    assert echoed.stderr == 'Defaulted container "first" out of: first, second\n'

    both = _exec(duo, "-c", "first", "duo", "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    assert (both.returncode, both.stdout) == (3, "out\n")
    assert both.stderr == "err\ncommand terminated with exit code 3\n"

    many = _exec(duo, "duo", "-c", "first", "--", "seq", "1", "200000")  # more than any flow-control window
    assert many.returncode == 0 and many.stdout == "".join(f"{i}\n" for i in range(1, 200001))


def test_exec_passes_stdin_with_i_and_ends_it(duo):
    piped = _exec(duo, "-i", "duo", "-c", "second", "--", "sh", "-c", "tr a-z A-Z; echo done", stdin="abc\ndef\n")
    assert (piped.returncode, piped.stdout, piped.stderr) == (0, "ABC\nDEF\ndone\n", "")
    without = _exec(duo, "duo", "-c", "second", "--", "cat")  # no -i: the command's stdin is closed at once
    assert (without.returncode, without.stdout) == (0, "")
    no_tty = _exec(duo, "duo", "-i", "-t", "-c", "second", "--", "cat", stdin="x\n")
    assert no_tty.stdout == "x\n"
    assert no_tty.stderr == "Unable to use a TTY - input is not a terminal or the right kind of file\n"


def test_exec_chooses_the_container_with_c_and_by_annotation(duo):
    assert _exec(duo, "duo", "-c", "first", "--", "touch", "/tmp/in-first").returncode == 0
    assert _exec(duo, "duo", "-c", "first", "--", "test", "-e", "/tmp/in-first").returncode == 0
    assert _exec(duo, "duo", "-c", "second", "--", "test", "-e", "/tmp/in-first").returncode == 1
    assert _exec(duo, "duo", "--", "test", "-e", "/tmp/in-first").returncode == 0  # the first by default
    duo.write_manifest("duo.yaml", TWO_CONTAINERS.replace(
        "{ANNOTATIONS}", "{kubectl.kubernetes.io/default-container: second}"))
    # kubectl says nothing when the annotation chose: the note goes once the agent has the annotated pod.
    wait_for(lambda: _exec(duo, "duo", "--", "true").stderr == "", 60, what="the annotated pod")
    assert _exec(duo, "duo", "-c", "second", "--", "touch", "/tmp/in-second").returncode == 0
    assert _exec(duo, "duo", "--", "test", "-e", "/tmp/in-second").returncode == 0
    assert _exec(duo, "duo", "-c", "first", "--", "test", "-e", "/tmp/in-second").returncode == 1


def test_exec_it_gives_a_terminal_of_the_local_size_and_follows_resizes(duo):
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 101, 0, 0))

    def controlling_terminal():  # a terminal's resize signals its session's foreground process
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    process = subprocess.Popen(
        [sys.executable, "-m", "edgelet", "exec", "duo", "-c", "first", "-it", "--config", str(duo.config_path), "--",
         "sh"], cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), stdin=slave, stdout=slave, stderr=slave,
        preexec_fn=controlling_terminal)
    os.close(slave)
    seen = bytearray()

    def read_until(text: bytes, start: int = 0) -> bytes:
        while text not in seen[start:]:
            ready, _, _ = select.select([master], [], [], 30)
            assert ready, f"no {text!r} in {bytes(seen)!r}"
            try:
                seen.extend(os.read(master, 4096))
            except OSError:  # the terminal closed: edgelet ended
                raise AssertionError(f"no {text!r} in {bytes(seen)!r}") from None
        return bytes(seen[start:])

    def ask_size() -> bytes:
        start = len(seen)
        os.write(master, b"stty size; echo E''ND\r")  # the echoed line shows E''ND, the output END
        return read_until(b"END\r\n", start)

    try:
        read_until(b"# ")  # the remote shell's prompt: edgelet's terminal is in raw mode by now
        assert b"33 101" in ask_size()
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        wait_for(lambda: b"40 120" in ask_size(), 20, interval=0.3, what="the new size in the container")
        os.write(master, b"exit 7\r")
        assert process.wait(timeout=30) == 7
    finally:
        process.kill()
        os.close(master)


def test_exec_errors_name_the_pod_or_the_container(duo):
    missing = _exec(duo, "nosuch", "--", "true")
    assert (missing.returncode, missing.stderr) == (1, 'Error from server (NotFound): pods "nosuch" not found\n')
    wrong_ns = _exec(duo, "duo", "-n", "kube-system", "--", "true")
    assert wrong_ns.stderr == 'Error from server (NotFound): pods "duo" not found\n'
    container = _exec(duo, "duo", "-c", "third", "--", "true")
    assert container.returncode == 1
    assert container.stderr == 'error: unable to upgrade connection: container not found ("third")\n'
    nothing = _exec(duo, "duo")
    assert nothing.stderr == "error: you must specify at least one command for the container\n"
    absent = _exec(duo, "duo", "-c", "first", "--", "/no/such/binary")
    assert absent.returncode != 0 and "/no/such/binary" in absent.stderr
