"""What the deb and the rpm carry: metadata, files, the conffile, dependencies, maintainer scripts,
and a bundled binary that runs with an empty environment."""

from __future__ import annotations

import inspect
import re
import stat
import types
from pathlib import Path

import pytest

from .conftest import REPO, build_glibc_version, require_tools, run

pytestmark = pytest.mark.package

CONFIG = "/etc/edgelet/edgelet.toml"
PAYLOAD = {
    "/opt/edgelet/edgelet",
    "/usr/bin/edgelet",
    CONFIG,
    "/etc/edgelet/manifests",
    "/usr/lib/systemd/system/edgelet.service",
    "/usr/share/doc/edgelet/README.md",
    "/usr/share/doc/edgelet/changelog",
    "/usr/share/doc/edgelet/copyright",
}
SCRIPTS = {"postinst": "postinstall.sh", "prerm": "preremove.sh", "postrm": "postremove.sh"}


def deb_field(deb: Path, field: str) -> str:
    return run("dpkg-deb", "--field", deb, field).stdout.strip()


def deb_listing(deb: Path) -> dict[str, str]:
    """Path -> `ls -l`-style mode string ('lrwxrwxrwx ... -> target' keeps the target)."""
    entries = {}
    for line in run("dpkg-deb", "--contents", deb).stdout.splitlines():
        mode, _owner, _size, _date, _time, name, *link = line.split()
        entries["/" + name.removeprefix("./").rstrip("/")] = mode + (f" -> {link[-1]}" if link else "")
    return entries


def rpm_query(rpm: Path, *args: str) -> str:
    require_tools("rpm")
    return run("rpm", "-qp", *args, rpm).stdout


@pytest.fixture(scope="module")
def extracted(packages, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("deb-root")
    run("dpkg-deb", "-x", packages.deb, root)
    return root


# --- deb ------------------------------------------------------------------------------------------


def test_deb_metadata(packages):
    assert deb_field(packages.deb, "Package") == "edgelet"
    assert deb_field(packages.deb, "Version") == f"{packages.version}-1"
    assert deb_field(packages.deb, "Architecture") == packages.arch
    depends = [d.strip() for d in deb_field(packages.deb, "Depends").split(",")]
    assert depends == [f"libc6 (>= {build_glibc_version()})", "zlib1g"]
    assert deb_field(packages.deb, "Recommends") == "containerd"
    assert deb_field(packages.deb, "Suggests") == "zstd"
    # containerd is recommended, never required: the agent can point at another CRI runtime.
    assert "containerd" not in deb_field(packages.deb, "Depends")


def test_deb_files(packages):
    listing = deb_listing(packages.deb)
    assert PAYLOAD <= listing.keys()
    assert listing["/usr/bin/edgelet"].endswith("-> /opt/edgelet/edgelet")
    assert listing["/opt/edgelet/edgelet"].startswith("-rwxr-xr-x")
    assert listing["/etc/edgelet/manifests"].startswith("drwxr-xr-x")
    assert listing[CONFIG].startswith("-rw-r-----")
    for extension in ("_core", "_libc", "_yaml"):
        compiled = [p for p in listing
                    if re.fullmatch(rf"/opt/edgelet/_internal/edgelet/{extension}\.cpython-[^/]+\.so", p)]
        assert compiled, f"the compiled edgelet.{extension} is not in the bundle"
    # edgelet._yaml links libyaml; the bundle carries it, since the packages do not depend on libyaml-0-2.
    assert [p for p in listing if re.fullmatch(r"/opt/edgelet/_internal/(.+/)?libyaml-0\.so\.2(\.[0-9.]+)?", p)], \
        "libyaml-0.so.2 (edgelet._yaml's shared library) is not in the bundle"
    # State is created by the unit (StateDirectory=), never shipped; nothing of the build leaks in.
    assert not [p for p in listing if p.startswith("/var/")]
    assert not [p for p in listing if "__pycache__" in p or p.endswith((".pyx", ".c"))]
    assert not [p for p in listing if "/grpc_tools" in p or "/pytest" in p or "/Cython" in p]


def test_deb_conffile_and_scripts(packages, tmp_path):
    run("dpkg-deb", "--control", packages.deb, tmp_path / "control")
    assert (tmp_path / "control" / "conffiles").read_text().split() == [CONFIG]
    for name, source in SCRIPTS.items():
        script = tmp_path / "control" / name
        assert script.read_text() == (REPO / "packaging" / "scripts" / source).read_text()
        assert stat.S_IMODE(script.stat().st_mode) & 0o111, f"{name} is not executable"


def test_shipped_files_are_the_sources(extracted):
    assert (extracted / "etc/edgelet/edgelet.toml").read_text() == (REPO / "examples/edgelet.toml").read_text()
    unit = extracted / "usr/lib/systemd/system/edgelet.service"
    assert unit.read_text() == (REPO / "packaging/edgelet.service").read_text()


# --- rpm ------------------------------------------------------------------------------------------


def test_rpm_metadata(packages):
    rpm_arch = {"amd64": "x86_64", "arm64": "aarch64"}[packages.arch]
    header = rpm_query(packages.rpm, "--queryformat", "%{NAME} %{VERSION} %{RELEASE} %{ARCH}")
    assert header == f"edgelet {packages.version} 1 {rpm_arch}"
    requires = set(rpm_query(packages.rpm, "--requires").splitlines())
    assert {f"glibc >= {build_glibc_version()}", "zlib"} <= requires
    assert not [r for r in requires if not r.startswith(("glibc", "zlib", "rpmlib(", "/bin/sh"))], requires
    assert rpm_query(packages.rpm, "--recommends").split() == ["containerd"]
    assert rpm_query(packages.rpm, "--suggests").split() == ["zstd"]


def test_rpm_files_match_the_deb(packages):
    rpm_files = set(rpm_query(packages.rpm, "--list").split())
    assert PAYLOAD <= rpm_files
    deb_files = set(deb_listing(packages.deb)) - {"/", "/etc", "/opt", "/usr", "/usr/bin", "/usr/lib",
                                                  "/usr/lib/systemd", "/usr/lib/systemd/system", "/usr/share",
                                                  "/usr/share/doc"}
    assert rpm_files == deb_files


def test_rpm_config_and_scripts(packages):
    assert rpm_query(packages.rpm, "--configfiles").split() == [CONFIG]
    # %config(noreplace): an edited file stays in place on upgrade, the new one lands as .rpmnew.
    flags = rpm_query(packages.rpm, "--queryformat", "[%{FILEFLAGS:fflags} %{FILENAMES}\n]")
    assert f"cn {CONFIG}" in flags.splitlines()
    scripts = rpm_query(packages.rpm, "--scripts")
    for section, source in (("postinstall", "postinstall.sh"), ("preuninstall", "preremove.sh"),
                            ("postuninstall", "postremove.sh")):
        body = (REPO / "packaging" / "scripts" / source).read_text()
        assert f"{section} scriptlet (using /bin/sh):\n{body}" in scripts, f"%{section} is not {source}"


# --- the bundled binary ---------------------------------------------------------------------------


def bundled(extracted: Path, *args: str, check: bool = True):
    # As systemd starts it: no PATH, no PYTHONPATH, no HOME.
    return run("env", "-i", extracted / "opt/edgelet/edgelet", *args, check=check, timeout=60)


def test_binary_runs_without_an_environment(packages, extracted):
    banner = bundled(extracted, "version").stdout
    assert banner.startswith(f"edgelet {packages.version} (core: compiled, python 3.")


def test_bundled_bytecode_is_made_as_the_benchmark_measures_it(extracted):
    """The agent's modules in the bundle carry no docstrings (-OO) and no column positions (-X no_debug_ranges):
    the bytecode bench/bench_agent.py runs the agent with, read back with PyInstaller's own archive reader."""
    from PyInstaller.archive.readers import CArchiveReader

    modules = CArchiveReader(str(extracted / "opt/edgelet/edgelet")).open_embedded_archive("PYZ.pyz")
    for name in ("edgelet.kubelet.agent", "edgelet.kuberuntime.manager", "asyncio.base_events", "grpc.aio._channel"):
        module = modules.extract(name)
        codes = [module]
        for code in codes:
            codes.extend(const for const in code.co_consts if isinstance(const, types.CodeType))
        assert len(codes) > 20, name
        assert all(column is None for code in codes for *_, column, _end in code.co_positions()), name
        # A function's first constant is its docstring, None without one; comprehensions and lambdas have none.
        functions = [code for code in codes if code.co_flags & inspect.CO_NEWLOCALS and code.co_name[0] != "<"]
        assert all(code.co_consts[0] is None for code in functions), name


def test_binary_accepts_the_shipped_config(extracted):
    result = bundled(extracted, "check-config", extracted / "etc/edgelet/edgelet.toml")
    assert 'root_dir = "/var/lib/edgelet"' in result.stdout


def test_binary_names_the_bad_key(extracted, tmp_path):
    shipped = (extracted / "etc/edgelet/edgelet.toml").read_text()
    assert 'relist_period = "1s"' in shipped
    broken = tmp_path / "edgelet.toml"
    broken.write_text(shipped.replace('relist_period = "1s"', 'relist_period = "soon"'))
    result = bundled(extracted, "check-config", broken, check=False)
    assert result.returncode != 0
    assert f"{broken}: pleg.relist_period:" in result.stderr
    assert "Traceback" not in result.stderr


def test_unit_file_is_clean(extracted, tmp_path):
    """systemd-analyze only warns about unknown keys and bad values, so any output is a failure."""
    require_tools("systemd-analyze")
    # The host has no /usr/bin/edgelet to check ExecStart against: point it at the extracted binary.
    unit = tmp_path / "edgelet.service"
    text = (extracted / "usr/lib/systemd/system/edgelet.service").read_text()
    unit.write_text(text.replace("ExecStart=/usr/bin/edgelet", f"ExecStart={extracted}/opt/edgelet/edgelet"))
    result = run("systemd-analyze", "verify", "--man=no", unit, check=False)
    assert (result.returncode, result.stderr) == (0, "")
