"""Entry point of the packaged `edgelet` binary: the same command as the `edgelet` console script."""

import os
import sys


def restore_library_path(environ) -> None:
    """Gives programs the agent starts (zstd, for one) the system's libraries, not the bundle's.

    The PyInstaller bootloader puts the bundle's library directory first on LD_LIBRARY_PATH and
    keeps the original in LD_LIBRARY_PATH_ORIG. This process read the variable when it started,
    so changing it now only affects child processes.
    """
    original = environ.pop("LD_LIBRARY_PATH_ORIG", None)
    if original is None:
        environ.pop("LD_LIBRARY_PATH", None)
    else:
        environ["LD_LIBRARY_PATH"] = original


if __name__ == "__main__":
    if getattr(sys, "frozen", False):
        restore_library_path(os.environ)

    from edgelet.cli.main import main

    sys.exit(main())
