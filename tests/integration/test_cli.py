"""The `edgelet` command as scripts use it: exit codes and one clear line on bad input."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from tests.integration.agent_harness import REPO, AgentProcess


def edgelet(*args: str, cwd=REPO) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "edgelet", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


def test_version_reports_the_compiled_core():
    result = edgelet("version")
    assert result.returncode == 0
    assert result.stdout.startswith("edgelet ") and "core: compiled" in result.stdout


def test_check_config_prints_effective_settings_and_exit_zero(tmp_path):
    config = tmp_path / "edgelet.toml"
    config.write_text('node_name = "box1"\n[pleg]\nrelist_period = "2s"\n')
    result = edgelet("check-config", str(config))
    assert result.returncode == 0, result.stderr
    assert 'node_name = "box1"' in result.stdout
    assert 'relist_period = "2s"' in result.stdout
    assert edgelet("check-config", "-q", str(config)).stdout == ""


def test_bad_config_is_refused_by_check_config_and_run_naming_the_key(tmp_path):
    config = tmp_path / "edgelet.toml"
    config.write_text('[pleg]\nrelist_period = "soon"\n')
    for args in (("check-config", str(config)), ("run", "--config", str(config))):
        result = edgelet(*args)
        assert result.returncode == 2, args
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        assert str(config) in lines[0] and "pleg.relist_period" in lines[0]


def test_unknown_key_and_missing_file(tmp_path):
    config = tmp_path / "edgelet.toml"
    config.write_text('[runtime]\nendpiont = "unix:///x.sock"\n')
    result = edgelet("check-config", str(config))
    assert result.returncode == 2 and "runtime.endpiont" in result.stderr
    missing = edgelet("check-config", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2 and "nope.toml" in missing.stderr


def test_bad_kubeconfig_is_a_config_error_not_a_traceback(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    config = tmp_path / "edgelet.toml"
    config.write_text(f'root_dir = "{tmp_path / "root"}"\n[cluster]\nkubeconfig = "{kubeconfig}"\n')
    result = edgelet("run", "--config", str(config))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "kubeconfig" in result.stderr


def test_version_flag_and_help_for_every_command():
    assert edgelet("--version").stdout == edgelet("version").stdout
    for command in ("run", "pods", "logs", "check-config", "version"):
        result = edgelet(command, "--help")
        assert result.returncode == 0 and "--help" in result.stdout, command


def test_config_path_comes_from_edgelet_config_when_not_given(tmp_path):
    config = tmp_path / "edgelet.toml"
    config.write_text('node_name = "from-env"\n')
    env = dict(os.environ, PYTHONPATH=str(REPO), EDGELET_CONFIG=str(config))
    result = subprocess.run([sys.executable, "-m", "edgelet", "check-config"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert 'node_name = "from-env"' in result.stdout
    env.pop("EDGELET_CONFIG")
    default = subprocess.run([sys.executable, "-m", "edgelet", "pods"], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=60)
    if not os.path.exists("/etc/edgelet/edgelet.toml"):
        assert default.returncode == 2 and "/etc/edgelet/edgelet.toml" in default.stderr


def _cluster_config(tmp_path, kubeconfig) -> str:
    config = tmp_path / "edgelet.toml"
    config.write_text(f'root_dir = "{tmp_path / "root"}"\n[cluster]\nkubeconfig = "{kubeconfig}"\n')
    return str(config)


def test_check_config_runs_the_validation_run_runs(tmp_path):
    """A kubeconfig that cannot be read (missing, or naming a missing certificate) fails both, naming the file."""
    missing = tmp_path / "absent-kubeconfig"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(f"""\
apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:6443", certificate-authority: "{tmp_path}/no-ca.crt"}}}}]
users: [{{name: u, user: {{token: abc}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    bad_ca = f"{kubeconfig}: clusters[name=c].cluster.certificate-authority"
    for path, named in ((missing, str(missing)), (kubeconfig, bad_ca)):
        config = _cluster_config(tmp_path, path)
        for args in (("check-config", config), ("run", "--config", config)):
            result = edgelet(*args)
            assert result.returncode == 2, (args, result.stderr)
            assert "Traceback" not in result.stderr
            (line,) = result.stderr.strip().splitlines()
            assert named in line, line


def test_a_port_in_use_stops_run_at_once_with_one_line_naming_it(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    address = f"127.0.0.1:{taken.getsockname()[1]}"
    try:
        agent = AgentProcess(tmp_path, f"unix://{tmp_path}/no-runtime.sock", server_address=address)
        result = subprocess.run([sys.executable, "-m", "edgelet", "run", "--config", str(agent.config_path)],
                                cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                                capture_output=True, text=True, timeout=60)
    finally:
        taken.close()
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if address in line]
    assert line.endswith(f"cannot run: cannot listen on {address}: Address already in use")
    assert "edgelet starting" not in result.stderr, "nothing may start before every listener is bound"
    assert not (agent.root_dir / "state" / "pods" / "agent.json").exists()


def test_run_without_a_readable_meminfo_ends_with_one_line_naming_it(tmp_path):
    """As in a bare chroot: the agent cannot size the node, so it does not start, and says why in one line."""
    agent = AgentProcess(tmp_path, f"unix://{tmp_path}/no-runtime.sock")
    empty = tmp_path / "meminfo"
    empty.write_text("MemFree: 1 kB\n")
    script = (f"mount --bind {empty} /proc/meminfo && exec {sys.executable} -m edgelet run "
              f"--config {agent.config_path}")
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                            cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line == "edgelet: cannot run: cannot read the node's memory size: /proc/meminfo: no MemTotal line"
