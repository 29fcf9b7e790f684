"""Benchmarks: `python -m bench.run` (or `make bench`) measures edgelet beside the raw CRI floor in one run."""
