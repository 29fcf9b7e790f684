"""The `edgelet` command as scripts use it: exit codes and one clear line on bad input."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.integration.agent_harness import REPO


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
