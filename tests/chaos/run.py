"""`make chaos`: runs the chaos suite and prints its figures as the very last line (CHAOS ...).

    python -m tests.chaos.run [pytest arguments]    # CHAOS_SCALE=small for the fast slice

The exit status is pytest's: an experiment that misses its goal fails its test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.chaos.harness import FIGURES_ENV, Figures

REPO = Path(__file__).resolve().parents[2]


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="edgelet-chaos-") as scratch:
        figures_path = os.path.join(scratch, "figures.json")
        env = dict(os.environ, **{FIGURES_ENV: figures_path})
        env.setdefault("PYTHONPATH", str(REPO))
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "chaos", "-rfE",
                   "tests/chaos", *argv]
        code = subprocess.run(command, cwd=REPO, env=env).returncode
        figures = Figures.load(figures_path) if os.path.exists(figures_path) else Figures()
    print("\n".join(figures.notes + [figures.line()]), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
