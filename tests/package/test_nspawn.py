"""The deb on a booted Debian 12: installed with dpkg, run by systemd, upgraded under the running agent,
stopped, removed and purged, inside a systemd-nspawn machine that has its own network namespace.

One boot runs the whole story (tests/package/machine-check.sh records each step); the tests below
judge one step each. The machine boots an overlay over the cached root, so the cache stays clean.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import Packages, run

pytestmark = pytest.mark.package

SHARED = "/var/tmp/edgelet-test"  # nspawn mounts a fresh /tmp; /var/tmp is ours
WATCHDOG_SEC = 3
CONFIG_EDIT = "# edited on this device: must survive upgrades\n"

TEST_UNIT = f"""\
[Unit]
Description=edgelet package test
After=containerd.service
SuccessAction=poweroff-force
FailureAction=poweroff-force

[Service]
Type=oneshot
ExecStart=/bin/sh {SHARED}/machine-check.sh
TimeoutStartSec=240
"""

# Shorter than the shipped 30 s, so that outliving it twice over stays cheap.
WATCHDOG_DROP_IN = f"[Service]\nWatchdogSec={WATCHDOG_SEC}s\n"


@dataclass
class Machine:
    packages: Packages
    upgrade: Packages
    out: Path
    enabled_after_install: bool
    edited_config: str
    journal: str

    @property
    def agent_log(self) -> str:
        """The journal lines about the agent and its unit: what to show when an assertion fails."""
        lines = [line for line in self.journal.splitlines() if "edgelet" in line and "edgelet-test" not in line]
        return "\n".join(lines[-80:])

    def read(self, name: str) -> str:
        path = self.out / name
        assert path.exists(), f"the machine recorded no {name}; journal:\n{self.journal[-6000:]}"
        return path.read_text()

    def props(self, name: str) -> dict[str, str]:
        return dict(line.split("=", 1) for line in self.read(name).splitlines() if "=" in line)


@pytest.fixture(scope="module")
def machine(nspawn_root, packages, upgrade_packages, tmp_path_factory) -> Machine:
    base = tmp_path_factory.mktemp("machine")
    upper, work, root, shared, containerd = (base / d for d in ("upper", "work", "root", "shared", "containerd"))
    for d in (upper, work, root, shared, containerd):
        d.mkdir()
    shutil.copy(packages.deb, shared / "edgelet.deb")
    shutil.copy(upgrade_packages.deb, shared / "upgrade.deb")
    shutil.copy(Path(__file__).with_name("machine-check.sh"), shared / "machine-check.sh")
    (shared / "watchdog-wait").write_text(str(WATCHDOG_SEC * 2 + 1))

    run("mount", "-t", "overlay", "overlay", "-o", f"lowerdir={nspawn_root},upperdir={upper},workdir={work}", root)
    try:
        nspawn = [
            "systemd-nspawn", "--quiet", "--directory", root, "--register=no", "--keep-unit",
            "--private-network", "--machine=edgelet-test", f"--bind={shared}:{SHARED}",
            # containerd's overlayfs snapshotter cannot stack on the overlay root.
            f"--bind={containerd}:/var/lib/containerd",
        ]
        run(*nspawn, "--pipe", "--", "dpkg", "--install", f"{SHARED}/edgelet.deb", timeout=120)
        enabled = (root / "etc/systemd/system/multi-user.target.wants/edgelet.service").is_symlink()

        config = root / "etc/edgelet/edgelet.toml"
        edited = config.read_text().replace('log_level = "info"', 'log_level = "debug"') + CONFIG_EDIT
        config.write_text(edited)

        units = root / "etc/systemd/system"
        (units / "edgelet-test.service").write_text(TEST_UNIT)
        (units / "multi-user.target.wants/edgelet-test.service").symlink_to("/etc/systemd/system/edgelet-test.service")
        (units / "edgelet.service.d").mkdir()
        (units / "edgelet.service.d/test-watchdog.conf").write_text(WATCHDOG_DROP_IN)

        run(*nspawn, "--boot", "--console=pipe", timeout=300)
        journal = "\n".join(
            run("journalctl", "--directory", d, "--no-pager", "-o", "short-monotonic", check=False).stdout
            for d in (root / "var/log/journal").iterdir()
        )
        return Machine(packages, upgrade_packages, shared / "out", enabled, edited, journal)
    finally:
        run("umount", root, check=False)


def test_install_enables_the_service(machine):
    assert machine.enabled_after_install


def test_the_service_runs_with_the_watchdog_armed(machine):
    assert machine.read("started.rc").strip() == "0", machine.agent_log
    first = machine.props("first.env")
    assert (first["ActiveState"], first["SubState"]) == ("active", "running")
    assert first["WatchdogUSec"] == f"{WATCHDOG_SEC}s"
    assert first["StatusText"].startswith("running "), first["StatusText"]
    assert first["NRestarts"] == "0"
    # Alive after twice the watchdog timeout in the same invocation: the pings arrive.
    later = machine.props("after-watchdog.env")
    assert (later["ActiveState"], later["InvocationID"], later["NRestarts"]) == ("active", first["InvocationID"], "0")
    assert "watchdog timeout" not in machine.journal


def test_the_agent_needs_no_python_on_the_device(machine):
    assert machine.read("pythons").strip() == ""
    assert machine.read("version-first").startswith(f"edgelet {machine.packages.version} (core: compiled,")


def test_the_unit_verifies_cleanly_on_the_device(machine):
    assert machine.read("verify") == ""


def test_the_agent_mounts_where_containerd_sees_it(machine):
    """Volume mounts made by the agent must land in the host's mount namespace."""
    assert machine.read("agent-mntns") == machine.read("init-mntns")


def test_the_agent_is_alone_in_its_cgroup(machine):
    """So stopping the unit (KillMode=mixed) can signal nothing but the agent: never a container."""
    first = machine.props("first.env")
    assert machine.read("unit-processes").split() == [first["MainPID"], "edgelet"]


def test_the_ops_endpoint_answers_on_loopback(machine):
    response = machine.read("healthz")
    assert response.startswith("HTTP/1.1 200 "), f"{response}\n{machine.agent_log}"


def test_upgrade_restarts_the_agent_and_keeps_the_edited_config(machine):
    assert machine.read("upgrade.rc").strip() == "0", machine.read("upgrade.log")
    assert machine.read("restarted.rc").strip() == "0", machine.agent_log
    first, upgraded = machine.props("first.env"), machine.props("upgraded.env")
    assert (upgraded["ActiveState"], upgraded["SubState"]) == ("active", "running")
    assert upgraded["InvocationID"] != first["InvocationID"]
    assert upgraded["NRestarts"] == "0", "the upgrade restart must not look like a crash"
    assert machine.read("version-upgraded").startswith(f"edgelet {machine.upgrade.version} ")
    assert machine.read("config-upgraded") == machine.edited_config
    assert machine.read("etc-edgelet-upgraded").split() == ["edgelet.toml", "manifests"]
    assert "Traceback" not in machine.journal, machine.agent_log


def test_stopping_the_agent_leaves_the_runtime_running(machine):
    stopped = machine.props("stopped.env")
    assert (stopped["ActiveState"], stopped["Result"]) == ("inactive", "success")
    assert machine.props("containerd-after-stop.env")["ActiveState"] == "active"


def test_remove_keeps_config_and_state_and_purge_forgets(machine):
    assert machine.read("remove.rc").strip() == "0", machine.read("remove.log")
    removed = machine.props("removed.env")
    assert (removed["ActiveState"], removed["LoadState"]) == ("inactive", "not-found")
    assert machine.read("left-after-remove").split() == ["/etc/edgelet/edgelet.toml", "/var/lib/edgelet"]
    assert machine.read("purge.rc").strip() == "0", machine.read("purge.log")
    assert machine.read("left-after-purge").split() == []
