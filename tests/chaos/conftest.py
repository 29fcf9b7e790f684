"""Fixtures of the chaos suite (`make chaos`): its scale, the figures every experiment adds to, and the runtime.

Every test here is marked `chaos`; `make test` never collects this directory. The figures are printed as the
CHAOS line at the end of the session and written to $CHAOS_FIGURES for `python -m tests.chaos.run`.
"""

from __future__ import annotations

import os

import pytest

from tests.chaos.harness import FIGURES_ENV, Figures, Runtime, Scale

_figures = Figures()


def pytest_collection_modifyitems(items):
    for item in items:
        if "/tests/chaos/" in str(item.path):
            item.add_marker(pytest.mark.chaos)


@pytest.fixture(scope="session")
def scale() -> Scale:
    return Scale.from_env()


@pytest.fixture(scope="session")
def figures() -> Figures:
    return _figures


@pytest.fixture
def runtime(containerd):
    """A blocking CRI client on an empty runtime, emptied again afterwards."""
    view = Runtime(containerd.endpoint)
    view.remove_everything()
    yield view
    try:
        view.remove_everything()
    finally:
        view.close()


def pytest_sessionfinish(session):
    if path := os.environ.get(FIGURES_ENV):
        _figures.dump(path)


def pytest_terminal_summary(terminalreporter):
    for note in _figures.notes:
        terminalreporter.write_line(note)
    if _figures.measured:
        terminalreporter.write_line(_figures.line())
