"""Reads one sample out of a registry's exposition, as a scraper sees it (tests only)."""

from __future__ import annotations

import re
from collections.abc import Mapping

_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$')
_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')


def sample_value(registry, name: str, labels: Mapping[str, str] | None = None) -> float | None:
    """The value of the sample `name` with exactly these labels (`..._total`, `..._bucket` with `le`), or None."""
    wanted = dict(labels or {})
    for line in registry.exposition().decode().splitlines():
        match = _SAMPLE.match(line)
        if match is None or match["name"] != name:
            continue
        found = {m["key"]: m["value"].replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
                 for m in _LABEL.finditer(match["labels"] or "")}
        if found == wanted:
            return float(match["value"])
    return None
