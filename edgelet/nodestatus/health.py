"""The node's health as its Ready condition reports it: each check by name, and whether it is known yet.

The agent builds one `NodeHealth` (the runtime, the PLEG, a node shutdown under way) and the node status manager
reads it; it imports nothing, so a standalone node carries it without the cluster side.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

Check = Callable[[], tuple[bool, str]]  # (healthy, message)


def _always() -> bool:
    return True


class NodeHealth:
    """The checks the node's Ready condition is made of, by name, and `settled()`: whether they tell the
    runtime's verdict yet (its first Status call answered), which the node's first status waits for."""

    __slots__ = ("_checks", "_settled")

    def __init__(self, checks: Mapping[str, Check], *, settled: Callable[[], bool] = _always):
        self._checks = dict(checks)
        self._settled = settled

    def add(self, name: str, check: Check) -> None:
        """One more check (node shutdown's, when it is configured)."""
        self._checks[name] = check

    def report(self) -> dict[str, tuple[bool, str]]:
        """Each check's (healthy, message) now."""
        return {name: check() for name, check in self._checks.items()}

    def settled(self) -> bool:
        return self._settled()
