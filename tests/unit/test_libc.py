"""The C library calls behind `edgelet.libc`, every test run against both the compiled `_libc` and its ctypes
twin `_libc_py` through the `libc` fixture: the same results and the same errors."""

from __future__ import annotations

import ctypes
import errno
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgelet import _libc_py
from edgelet.podconfig.inotify import IN_CLOEXEC, IN_CREATE, IN_NONBLOCK, parse_events

REPO_ROOT = Path(__file__).resolve().parents[2]
NO_EXTENSIONS = os.environ.get("EDGELET_NO_EXTENSIONS") == "1"
compiled_only = pytest.mark.skipif(NO_EXTENSIONS, reason="EDGELET_NO_EXTENSIONS=1: pure-Python run")
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="mount(2) needs root")


@pytest.fixture(params=[pytest.param("compiled", marks=compiled_only), "ctypes"])
def libc(request):
    if request.param == "compiled":
        return importlib.import_module("edgelet._libc")
    return _libc_py


def test_both_export_the_same_names(libc):
    assert sorted(libc.__all__) == sorted(_libc_py.__all__)
    assert libc.HAVE_MALLOC_TRIM is True  # the agent's platforms are glibc


def test_inotify_reports_a_created_file(libc, tmp_path):
    fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    try:
        assert os.get_blocking(fd) is False and os.get_inheritable(fd) is False
        wd = libc.inotify_add_watch(fd, os.fsencode(tmp_path), IN_CREATE)
        (tmp_path / "pod.yaml").write_text("")
        [event] = parse_events(os.read(fd, 4096))
        assert (event.wd, event.name) == (wd, "pod.yaml") and event.mask & IN_CREATE
        libc.inotify_rm_watch(fd, wd)
        with pytest.raises(OSError) as removed_twice:
            libc.inotify_rm_watch(fd, wd)
        assert removed_twice.value.errno == errno.EINVAL
    finally:
        os.close(fd)


@pytest.mark.parametrize(("call", "code"), [
    (lambda libc, fd, path: libc.inotify_add_watch(fd, os.fsencode(path / "missing"), IN_CREATE), errno.ENOENT),
    (lambda libc, fd, path: libc.inotify_add_watch(-1, os.fsencode(path), IN_CREATE), errno.EBADF),
    (lambda libc, fd, path: libc.inotify_add_watch(fd, os.fsencode(path), 0), errno.EINVAL),  # an empty mask
    (lambda libc, fd, path: libc.inotify_init1(-1), errno.EINVAL),
    (lambda libc, fd, path: libc.umount2(os.fsencode(path), 0), errno.EINVAL if os.geteuid() == 0 else errno.EPERM),
    (lambda libc, fd, path: libc.mount(b"none", os.fsencode(path / "missing"), b"tmpfs", 0, None), errno.ENOENT
     if os.geteuid() == 0 else errno.EPERM),
])
def test_failures_raise_oserror_with_the_errno(libc, tmp_path, call, code):
    inotify = libc.inotify_init1(IN_CLOEXEC)
    try:
        with pytest.raises(OSError) as raised:
            call(libc, inotify, tmp_path)
        assert raised.value.errno == code
    finally:
        os.close(inotify)


def test_wrong_argument_types_are_refused(libc):
    with pytest.raises((TypeError, ctypes.ArgumentError)):
        libc.umount2("/a/str", 0)
    with pytest.raises((TypeError, ctypes.ArgumentError)):
        libc.inotify_add_watch(0, "/a/str", IN_CREATE)


@root_only
def test_mount_and_umount2(libc, tmp_path):
    """A tmpfs with options, seen in the mount table, then gone; both implementations (as root, in a private
    mount namespace of a child, so a failure leaves nothing mounted here)."""
    code = f"""
import os, sys
sys.path.insert(0, {str(REPO_ROOT)!r})
from edgelet import {libc.__name__.split('.')[-1]} as libc
target = {str(tmp_path)!r}.encode()
libc.mount(b"edgelet-test", target, b"tmpfs", 0, b"size=1m,mode=0750")
line = [l for l in open("/proc/self/mountinfo") if l.split()[4] == target.decode()][0]
assert "tmpfs edgelet-test" in line and "size=1024k" in line and "mode=750" in line, line
libc.umount2(target, 0)
assert not [l for l in open("/proc/self/mountinfo") if l.split()[4] == target.decode()]
print("ok")
"""
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr


def test_malloc_trim_answers_a_bool(libc):
    assert libc.malloc_trim() in (True, False)


@compiled_only
def test_the_agent_takes_the_compiled_calls_and_ctypes_stays_unloaded():
    done = subprocess.run([sys.executable, "-c", "import sys, edgelet.libc, edgelet.kubelet.agent, edgelet.cli.main; "
                           "print(edgelet.libc._impl.__name__, 'ctypes' in sys.modules)"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "EDGELET_NO_EXTENSIONS": "0"})
    assert done.stdout.split() == ["edgelet._libc", "False"], done.stderr


def test_without_extensions_the_ctypes_twin_is_used():
    done = subprocess.run([sys.executable, "-c", "import edgelet.libc; print(edgelet.libc._impl.__name__)"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "EDGELET_NO_EXTENSIONS": "1"})
    assert done.stdout.split() == ["edgelet._libc_py"], done.stderr
