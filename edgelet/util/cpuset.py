"""CPU lists in the Linux cpuset syntax ("0-3,8,10-11"), parsed into sets of CPU ids and written back."""

from __future__ import annotations

from collections.abc import Iterable

MAX_CPU_ID = 65535  # far beyond any machine; bounds what a typo like "0-99999999" could allocate


def parse_cpuset(text: str) -> frozenset[int]:
    """The CPU ids of a list like "0-3,8"; "" is the empty set. ValueError says what is wrong."""
    if not isinstance(text, str):
        raise ValueError(f'expected a CPU list like "0-3,8", got {text!r}')
    cpus: set[int] = set()
    stripped = text.strip()
    if not stripped:
        return frozenset()
    for part in stripped.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError:
            raise ValueError(f'{text!r} is not a CPU list (write it like "0-3,8")') from None
        if low < 0 or high > MAX_CPU_ID or high < low:
            raise ValueError(f"{text!r}: range {part.strip()!r} is not an ascending range of CPU ids")
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


def format_cpuset(cpus: Iterable[int]) -> str:
    """The shortest list for a set of CPU ids, ranges ascending: {0, 1, 2, 5} -> "0-2,5"."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    index = 0
    while index < len(ordered):
        end = index
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        parts.append(str(ordered[index]) if end == index else f"{ordered[index]}-{ordered[end]}")
        index = end + 1
    return ",".join(parts)
