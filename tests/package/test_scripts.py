"""The maintainer scripts under every dpkg and rpm calling convention: which systemctl commands each
one issues, with and without a running systemd.

Each script runs in a private mount namespace where /run and /etc/systemd/system are fresh tmpfs
(so "systemd is running" is just a directory) and systemctl is a recorder on PATH. The booted
machine in test_nspawn.py covers the real systemctl for the deb; this covers the rpm's numbers too.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from .conftest import REPO, require_root, require_tools

pytestmark = pytest.mark.package

WANTS = "/etc/systemd/system/multi-user.target.wants/edgelet.service"
ENABLE = "enable edgelet.service"
RESTART = "--no-block try-restart edgelet.service"
RELOAD = "daemon-reload"
STOP = "stop edgelet.service"
DISABLE = "--no-reload disable edgelet.service"

CASES = [
    # script, arguments, systemd running, systemctl calls expected
    ("postinstall.sh", ["configure", ""], True, [RELOAD, ENABLE]),
    ("postinstall.sh", ["configure"], False, [ENABLE]),
    ("postinstall.sh", ["configure", "0.1.0-1"], True, [RELOAD, RESTART]),
    ("postinstall.sh", ["configure", "0.1.0-1"], False, []),
    ("postinstall.sh", ["abort-upgrade", "0.2.0-1"], True, [RELOAD, RESTART]),
    ("postinstall.sh", ["triggered", "/usr/lib/systemd"], True, []),
    ("postinstall.sh", ["1"], True, [RELOAD, ENABLE]),
    ("postinstall.sh", ["2"], True, [RELOAD, RESTART]),
    ("preremove.sh", ["remove"], True, [STOP]),
    ("preremove.sh", ["remove"], False, []),
    ("preremove.sh", ["upgrade", "0.2.0-1"], True, []),
    ("preremove.sh", ["failed-upgrade", "0.1.0-1"], True, []),
    ("preremove.sh", ["deconfigure", "in-favour", "other", "1.0"], True, []),
    ("preremove.sh", ["0"], True, [STOP, DISABLE]),
    ("preremove.sh", ["0"], False, [DISABLE]),
    ("preremove.sh", ["1"], True, []),
    ("postremove.sh", ["remove"], True, [RELOAD]),
    ("postremove.sh", ["remove"], False, []),
    ("postremove.sh", ["purge"], True, [RELOAD]),
    ("postremove.sh", ["upgrade", "0.2.0-1"], True, []),
    ("postremove.sh", ["0"], True, [RELOAD]),
    ("postremove.sh", ["1"], True, []),
]

SANDBOX = r"""
set -e
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /etc/systemd/system
if [ "$SYSTEMD_RUNNING" = yes ]; then mkdir -p /run/systemd/system; fi
mkdir -p /etc/systemd/system/multi-user.target.wants
ln -s /usr/lib/systemd/system/edgelet.service "$WANTS"
status=0
PATH="$STUBS:/usr/sbin:/usr/bin:/sbin:/bin" sh "$@" || status=$?
if [ -L "$WANTS" ]; then echo enabled >"$STATE"; else echo not-enabled >"$STATE"; fi
exit $status
"""


@pytest.fixture(scope="module")
def sandbox_ready():
    require_root()
    require_tools("unshare")
    if not os.path.isdir("/etc/systemd/system"):
        pytest.skip("the host has no /etc/systemd/system to cover with a tmpfs")


@pytest.mark.parametrize(("script", "args", "running", "expected"), CASES)
def test_systemctl_calls(sandbox_ready, tmp_path, script, args, running, expected):
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    calls = tmp_path / "calls"
    systemctl = stubs / "systemctl"
    systemctl.write_text(f'#!/bin/sh\necho "$*" >>{calls}\n')
    systemctl.chmod(0o755)
    env = {
        "SYSTEMD_RUNNING": "yes" if running else "no",
        "STUBS": str(stubs),
        "WANTS": WANTS,
        "STATE": str(tmp_path / "state"),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", SANDBOX, "sandbox",
         str(REPO / "packaging" / "scripts" / script), *args],
        env=env, capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 0, result.stderr
    recorded = calls.read_text().splitlines() if calls.exists() else []
    assert recorded == expected
    purged = script == "postremove.sh" and args[0] == "purge"
    assert (tmp_path / "state").read_text().strip() == ("not-enabled" if purged else "enabled")


def test_scripts_need_no_bash():
    """Maintainer scripts run under /bin/sh, which is dash on Debian."""
    shell = shutil.which("dash") or shutil.which("sh")
    for script in sorted((REPO / "packaging" / "scripts").glob("*.sh")):
        assert script.read_text().startswith("#!/bin/sh\n"), script.name
        subprocess.run([shell, "-n", str(script)], check=True)
