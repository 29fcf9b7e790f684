"""The test suites' own layout: the folders one pytest run collects together (`make test` runs tests/unit and
tests/integration in one session) hold no two test modules of the same name, which pytest's rootdir-based
import cannot tell apart (the whole run stops at collection)."""

from __future__ import annotations

import collections
import pathlib

TESTS = pathlib.Path(__file__).resolve().parents[1]
# Suites collected in one pytest session (see the Makefile's test target).
COLLECTED_TOGETHER = ("unit", "integration")


def test_no_two_test_modules_of_one_run_share_a_name():
    where = collections.defaultdict(list)
    for suite in COLLECTED_TOGETHER:
        for path in sorted((TESTS / suite).rglob("test_*.py")):
            where[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not clashes, f"test modules of one pytest run share a name (rename one): {clashes}"
