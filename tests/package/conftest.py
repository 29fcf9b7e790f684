"""Fixtures for the package tests: the deb and rpm built from this tree, and a cached bookworm root
that boots systemd under systemd-nspawn."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache"
PACKAGE_SH = REPO / "hack" / "package.sh"
NSPAWN_ROOT_SH = Path(__file__).with_name("nspawn-root.sh")


def run(*argv: str | os.PathLike, timeout: float = 900, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """Runs a command, capturing text output; a failure shows the command and everything it said."""
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        pytest.fail(
            f"{' '.join(map(str, argv))} exited {result.returncode}\n"
            f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"
        )
    return result


def unavailable(reason: str) -> None:
    """Skips locally, fails under CI=true: CI must never pass by skipping the package tests."""
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def require_tools(*tools: str) -> None:
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        unavailable(f"package tests need {', '.join(missing)} on PATH")


def require_root() -> None:
    if os.geteuid() != 0:
        unavailable("package tests that install and boot packages must run as root")


def source_version() -> str:
    text = (REPO / "edgelet" / "__init__.py").read_text()
    match = re.search(r'^__version__ = "([^"]+)"$', text, re.MULTILINE)
    assert match, "edgelet/__init__.py has no __version__"
    return match.group(1)


def native_arch() -> str:
    return run("dpkg", "--print-architecture").stdout.strip()


def build_glibc_version() -> str:
    return run("getconf", "GNU_LIBC_VERSION").stdout.split()[1]


@dataclass(frozen=True)
class Packages:
    version: str
    arch: str
    deb: Path
    rpm: Path


def build_packages(out: Path, version: str) -> Packages:
    require_tools("dpkg-deb", "tar")
    run(PACKAGE_SH, "--out", out, "--version", version)
    arch = native_arch()
    rpm_arch = {"amd64": "x86_64", "arm64": "aarch64"}[arch]
    deb, rpm = out / f"edgelet_{version}_{arch}.deb", out / f"edgelet-{version}-1.{rpm_arch}.rpm"
    packages = Packages(version, arch, deb, rpm)
    assert packages.deb.is_file() and packages.rpm.is_file(), f"hack/package.sh did not write {packages}"
    return packages


@pytest.fixture(scope="session")
def packages(tmp_path_factory) -> Packages:
    """The deb and rpm of this tree's version, built fresh for the session."""
    return build_packages(tmp_path_factory.mktemp("dist"), source_version())


@pytest.fixture(scope="session")
def upgrade_packages(tmp_path_factory, packages) -> Packages:
    """The same tree packaged under a newer version, to upgrade to."""
    return build_packages(tmp_path_factory.mktemp("dist-upgrade"), f"{packages.version}+upgrade1")


@pytest.fixture(scope="session")
def nspawn_root() -> Path:
    """A bookworm root with systemd and containerd, cached under .cache/ (built once: a few minutes)."""
    require_root()
    require_tools("debootstrap", "systemd-nspawn", "journalctl")
    root = CACHE / "nspawn-bookworm"
    run(NSPAWN_ROOT_SH, root, timeout=1800)
    return root
