"""Building is quiet: the project metadata loads without a setuptools deprecation banner."""

from __future__ import annotations

import subprocess
import sys
import tomllib

from tests.integration.agent_harness import REPO


def test_metadata_loads_without_deprecation_warnings():
    result = subprocess.run([sys.executable, "-W", "always", "setup.py", "--name"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "edgelet"
    assert "Deprecat" not in result.stderr and "!!" not in result.stderr, result.stderr


def test_license_is_an_spdx_string_and_the_build_asks_for_a_setuptools_that_reads_it():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in pyproject["build-system"]["requires"]
