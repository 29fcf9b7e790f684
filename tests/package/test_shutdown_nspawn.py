"""Graceful node shutdown under real systemd: the packaged agent on a booted Debian 12 in systemd-nspawn takes
systemd-logind's delay inhibitor and, on an ordinary `systemctl poweroff`, runs its shutdown and releases the
inhibitor before systemd stops the unit.

No pods run here: containerd cannot start containers inside this nspawn machine (its cgroup mounts are
read-only), so the pods' order and budgets are shown by tests/e2e/test_node_shutdown.py against real
containerd and a logind stand-in; this test shows the part only real logind and systemd can.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .conftest import run

pytestmark = pytest.mark.package

SHARED = "/var/tmp/edgelet-test"
GRACE = 6
CHECK_UNIT = f"""\
[Unit]
Description=edgelet graceful shutdown test
After=edgelet.service
FailureAction=poweroff-force

[Service]
Type=oneshot
ExecStart=/bin/sh {SHARED}/shutdown-check.sh
TimeoutStartSec=120
"""
SHIPPED_DEFAULTS = 'grace_period = "0s"\ncritical_pods_grace_period = "0s"\n'
ENABLED = f'grace_period = "{GRACE}s"\ncritical_pods_grace_period = "2s"\n'
# logind waits at most InhibitDelayMaxSec (default 5 s) for delay inhibitors: the README tells users to set this.
LOGIND_DROP_IN = f"[Login]\nInhibitDelayMaxSec={GRACE + 4}\n"


@pytest.fixture(scope="module")
def powered_off(nspawn_root, packages, tmp_path_factory):
    base = tmp_path_factory.mktemp("shutdown-machine")
    upper, work, root, shared, containerd = (base / d for d in ("upper", "work", "root", "shared", "containerd"))
    for d in (upper, work, root, shared, containerd):
        d.mkdir()
    shutil.copy(packages.deb, shared / "edgelet.deb")
    shutil.copy(Path(__file__).with_name("shutdown-check.sh"), shared / "shutdown-check.sh")
    run("mount", "-t", "overlay", "overlay", "-o", f"lowerdir={nspawn_root},upperdir={upper},workdir={work}", root)
    try:
        nspawn = ["systemd-nspawn", "--quiet", "--directory", root, "--register=no", "--keep-unit",
                  "--private-network", "--machine=edgelet-shutdown", f"--bind={shared}:{SHARED}",
                  f"--bind={containerd}:/var/lib/containerd"]
        run(*nspawn, "--pipe", "--", "dpkg", "--install", f"{SHARED}/edgelet.deb", timeout=120)
        config = root / "etc/edgelet/edgelet.toml"
        shipped = config.read_text()
        config.write_text(shipped.replace(SHIPPED_DEFAULTS, ENABLED))
        (root / "etc/systemd/logind.conf.d").mkdir(parents=True, exist_ok=True)
        (root / "etc/systemd/logind.conf.d/edgelet.conf").write_text(LOGIND_DROP_IN)
        units = root / "etc/systemd/system"
        (units / "edgelet-test.service").write_text(CHECK_UNIT)
        (units / "multi-user.target.wants/edgelet-test.service").symlink_to("/etc/systemd/system/edgelet-test.service")
        run(*nspawn, "--boot", "--console=pipe", timeout=300)
        journal = "\n".join(
            run("journalctl", "--directory", d, "--no-pager", "-o", "short-unix", check=False).stdout
            for d in (root / "var/log/journal").iterdir())
        return shared / "out", journal, config.read_text()
    finally:
        run("umount", root, check=False)


def _at(journal: str, text: str) -> float:
    for line in journal.splitlines():
        if text in line:
            return float(line.split()[0])
    raise AssertionError(f"the journal has no line with {text!r}:\n" + "\n".join(
        line for line in journal.splitlines() if "edgelet" in line)[-5000:])


def test_the_agent_holds_a_delay_inhibitor(powered_off):
    out, journal, config = powered_off
    assert ENABLED in config, config
    inhibitors = (out / "inhibitors").read_text()
    assert any("edgelet" in line and "shutdown" in line and "delay" in line for line in inhibitors.splitlines()), \
        inhibitors
    assert (out / "inhibit-delay-max").read_text().split() == ["t", str((GRACE + 4) * 1_000_000)]


def test_poweroff_waits_for_the_agent_to_finish(powered_off):
    out, journal, _ = powered_off
    requested = float((out / "poweroff-requested").read_text())
    shutting_down = _at(journal, "node is shutting down: stopping pods")
    released = _at(journal, "released the logind shutdown inhibitor")
    stopping = _at(journal, "stop requested: shutting down")  # the agent's SIGTERM from systemd
    # PrepareForShutdown reached the agent, which finished and released before systemd stopped its unit.
    assert requested <= shutting_down + 1 <= released + 1 <= stopping + 1, (requested, shutting_down, released,
                                                                            stopping)
    assert released - requested < GRACE + 4
    assert "Traceback" not in journal
