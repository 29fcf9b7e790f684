"""The twin of `edgelet._yaml`: the same events, through PyYAML's C parser (as EDGELET_NO_EXTENSIONS=1 runs).

See `edgelet._yaml` for the shape of an event; tests/unit/test_yamlload.py holds the two together.
"""

from __future__ import annotations

from typing import Any

import yaml

from edgelet.util.errors import YAMLError

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

LIBRARY = f"PyYAML {yaml.__version__}"

_KINDS = {
    yaml.StreamStartEvent: 1,
    yaml.StreamEndEvent: 2,
    yaml.DocumentStartEvent: 3,
    yaml.DocumentEndEvent: 4,
    yaml.AliasEvent: 5,
    yaml.ScalarEvent: 6,
    yaml.SequenceStartEvent: 7,
    yaml.SequenceEndEvent: 8,
    yaml.MappingStartEvent: 9,
    yaml.MappingEndEvent: 10,
}


def _event(event: Any) -> tuple:  # a yaml.Event subclass, each with its own fields (the stubs know only Event)
    kind = _KINDS[type(event)]
    mark = event.start_mark
    if kind == 6:
        return kind, mark.line, mark.column, event.anchor, event.tag, event.value, bool(event.implicit[0])
    if kind in (7, 9):
        return kind, mark.line, mark.column, event.anchor, event.tag, None, bool(event.flow_style)
    if kind == 5:
        return kind, mark.line, mark.column, event.anchor, None, None, False
    return kind, mark.line, mark.column, None, None, None, False


def _error(exc: yaml.YAMLError) -> YAMLError:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark, context_mark = exc.problem_mark, exc.context_mark
        return YAMLError(exc.problem or "", mark.line if mark else None, mark.column if mark else None,
                         context=exc.context, context_line=context_mark.line if context_mark else None,
                         context_column=context_mark.column if context_mark else None)
    if isinstance(exc, yaml.reader.ReaderError):
        return YAMLError(f"unacceptable character #x{exc.character:04x}: {exc.reason}, position {exc.position}")
    return YAMLError(str(exc))


def parse(text: str) -> tuple[list[tuple], YAMLError | None]:
    """(the events of `text` up to the first error, that error or None)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return [], YAMLError(f"not UTF-8 text: {exc.reason} at character {exc.start}")
    events: list[tuple] = []
    try:
        for event in yaml.parse(text, Loader=_Loader):
            events.append(_event(event))
    except yaml.YAMLError as exc:
        return events, _error(exc)
    return events, None
