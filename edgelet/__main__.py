"""`python -m edgelet` runs the CLI."""

import sys

from edgelet.cli.main import main

sys.exit(main())
