"""The edgelet command line: the entry point (main.py), its subcommands and their shared parsing."""
