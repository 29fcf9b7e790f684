"""YAML as PyYAML's safe loader reads it, on libyaml's events: manifests, kubeconfigs and cluster-info.

The agent used `yaml.load_all(text, Loader=yaml.CSafeLoader)` and `yaml.safe_load`. Importing PyYAML costs a
node about 1.4 MiB that never leaves (its pure-Python scanner, parser, emitter and representer come with the C
loader); this module builds the same Python values from the events of `edgelet._yaml`, a small binding of
libyaml, so the agent does not import PyYAML at all (the `edgelet` CLI still does, to print YAML).

What it keeps of PyYAML's safe loader, rule for rule (tests/unit/test_yamlload.py holds it to PyYAML itself,
with tables and Hypothesis): YAML 1.1's implicit types (bools yes/no/on/off, ints in bases 2, 8, 10 and 16 and
base 60, floats with a signed exponent, .inf and .nan, null, timestamps), the standard tags (!!binary, !!set,
!!omap, !!pairs and the rest), merge keys, anchors and aliases (the same object, recursion included), and the
order in which it builds a document: breadth first, so that its first error is the one PyYAML meets first,
with the same problem and position, and libyaml 0.2.6's limit of 1000 nested levels (edgelet._yaml). Where PyYAML
lets a Python exception out (`!!int abc`, a 30th of February), this raises YAMLError too, naming the value.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import os
import re
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

from edgelet.util.errors import YAMLError

# EDGELET_NO_EXTENSIONS=1 runs every compiled module's twin, as edgelet.core reads it (not imported from there:
# the parsed-manifest record's key covers every module a parse imports, and the hot path is not one of them).
if os.environ.get("EDGELET_NO_EXTENSIONS") == "1":
    from edgelet import _yaml_py as _impl
else:
    try:
        from edgelet import _yaml as _impl  # type: ignore[no-redef, attr-defined]  # compiled: typed by its twin
    except ImportError as exc:
        raise ImportError(
            "edgelet._yaml (the compiled libyaml binding) is not built: run "
            "`python setup.py build_ext --inplace` or install the package, "
            "or set EDGELET_NO_EXTENSIONS=1 to read YAML through PyYAML"
        ) from exc

LIBRARY: str = _impl.LIBRARY
parse = _impl.parse  # (the events of a text up to its first error, that error or None)

Events = Callable[[str], "tuple[list[tuple], YAMLError | None]"]

# libyaml's event types (yaml_event_type_t)
STREAM_START, STREAM_END, DOCUMENT_START, DOCUMENT_END, ALIAS, SCALAR = 1, 2, 3, 4, 5, 6
SEQUENCE_START, SEQUENCE_END, MAPPING_START, MAPPING_END = 7, 8, 9, 10

_TAG = "tag:yaml.org,2002:"
STR, SEQ, MAP = _TAG + "str", _TAG + "seq", _TAG + "map"
_MERGE, _VALUE = _TAG + "merge", _TAG + "value"


# -- resolving a plain scalar's type (YAML 1.1, as PyYAML's resolver) ---------------------------------------------

_IMPLICIT: list[tuple[str, re.Pattern[str], str]] = [  # (tag, pattern, the first characters it can match)
    (_TAG + "bool", re.compile(r"^(?:yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$"),
     "yYnNtTfFoO"),
    (_TAG + "float", re.compile(r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+][0-9]+)?
                                   |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
                                   |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
                                   |[-+]?\.(?:inf|Inf|INF)
                                   |\.(?:nan|NaN|NAN))$""", re.X), "-+0123456789."),
    (_TAG + "int", re.compile(r"""^(?:[-+]?0b[01_]+
                                 |[-+]?0[0-7_]+
                                 |[-+]?(?:0|[1-9][0-9_]*)
                                 |[-+]?0x[0-9a-fA-F_]+
                                 |[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+)$""", re.X), "-+0123456789"),
    (_MERGE, re.compile(r"^(?:<<)$"), "<"),
    (_TAG + "null", re.compile(r"^(?:~|null|Null|NULL|)$"), "~nN"),
    (_TAG + "timestamp", re.compile(r"""^(?:[0-9]{4}-[0-9]{2}-[0-9]{2}
                                       |[0-9]{4}-[0-9][0-9]?-[0-9][0-9]?(?:[Tt]|[ \t]+)[0-9][0-9]?:[0-9]{2}:[0-9]{2}
                                        (?:\.[0-9]*)?(?:[ \t]*(?:Z|[-+][0-9][0-9]?(?::[0-9]{2})?))?)$""", re.X),
     "0123456789"),
    (_VALUE, re.compile(r"^(?:=)$"), "="),
    (_TAG + "yaml", re.compile(r"^(?:!|&|\*)$"), "!&*"),  # never plain in practice: these start tags and aliases
]
_BY_FIRST: dict[str, list[tuple[str, re.Pattern[str]]]] = {}
for _tag, _pattern, _first in _IMPLICIT:
    for _char in _first:
        _BY_FIRST.setdefault(_char, []).append((_tag, _pattern))
_BY_FIRST[""] = [(_TAG + "null", _IMPLICIT[4][1])]
del _tag, _pattern, _first, _char


def resolve(value: str, plain: bool) -> str:
    """The tag of an untagged scalar: by its form when plain, a string when quoted."""
    if plain:
        for tag, pattern in _BY_FIRST.get(value[:1], ()):
            if pattern.match(value):
                return tag
    return STR


# -- composing: events -> nodes --------------------------------------------------------------------------------------


class Node:
    """A scalar (value: str), sequence (value: list of nodes) or mapping (value: list of (key, value) nodes)."""

    __slots__ = ("kind", "tag", "value", "line", "column")

    def __init__(self, kind: str, tag: str, value: Any, line: int, column: int):
        self.kind, self.tag, self.value, self.line, self.column = kind, tag, value, line, column


class _Stream:
    """The events of one parse, taken in order; the parse's error is raised where its events end."""

    def __init__(self, parsed: tuple[list[tuple], YAMLError | None]):
        self._events, self._error = parsed
        self._next = 0

    def peek(self) -> tuple:
        if self._next < len(self._events):
            return self._events[self._next]
        raise self._error or YAMLError("the YAML stream ended early")

    def take(self) -> tuple:
        event = self.peek()
        self._next += 1
        return event

    def document(self) -> Node:
        """The next document's root node (anchors are a document's own)."""
        self.take()  # DOCUMENT-START
        anchors: dict[str, Node] = {}
        open_: list[list] = []  # [collection node, its pending key node] from the root down
        root = None
        while True:
            kind, line, column, anchor, tag, value, plain = self.take()
            if kind == SEQUENCE_END or kind == MAPPING_END:
                node = open_.pop()[0]
                if not open_:
                    root = node
                    break
                continue
            if kind == ALIAS:
                node = anchors.get(anchor)
                if node is None:
                    raise YAMLError("found undefined alias", line, column)
            else:
                if anchor is not None and anchor in anchors:
                    first = anchors[anchor]
                    raise YAMLError("second occurrence", line, column,
                                    context="found duplicate anchor; first occurrence",
                                    context_line=first.line, context_column=first.column)
                if kind == SCALAR:
                    node = Node("scalar", resolve(value, plain) if tag is None or tag == "!" else tag, value,
                                line, column)
                elif kind == SEQUENCE_START:
                    node = Node("sequence", SEQ if tag is None or tag == "!" else tag, [], line, column)
                else:
                    node = Node("mapping", MAP if tag is None or tag == "!" else tag, [], line, column)
                if anchor is not None:
                    anchors[anchor] = node
            if open_:
                parent = open_[-1]
                if parent[0].kind == "sequence":
                    parent[0].value.append(node)
                elif parent[1] is None:
                    parent[1] = node
                else:
                    parent[0].value.append((parent[1], node))
                    parent[1] = None
            if kind == SEQUENCE_START or kind == MAPPING_START:
                open_.append([node, None])
            elif not open_:
                root = node
                break
        self.take()  # DOCUMENT-END
        return root


# -- constructing: nodes -> Python values (PyYAML's SafeConstructor) ------------------------------------------------


def _problem(problem: str, node: Node, context: str | None = None, context_node: Node | None = None) -> YAMLError:
    return YAMLError(problem, node.line, node.column, context=context,
                     context_line=context_node.line if context_node else None,
                     context_column=context_node.column if context_node else None)


def _scalar(node: Node) -> str:
    if node.kind == "mapping":  # YAML 1.1's value key: `!!int {=: 5}` is 5
        for key_node, value_node in node.value:
            if key_node.tag == _VALUE:
                return _scalar(value_node)
    if node.kind != "scalar":
        raise _problem(f"expected a scalar node, but found {node.kind}", node)
    return node.value


_BOOLS = {"yes": True, "no": False, "true": True, "false": False, "on": True, "off": False}
_INF = float("inf")
_NAN = -_INF / _INF  # as PyYAML makes it


def _int(node: Node) -> int:
    value = _scalar(node).replace("_", "")
    sign = -1 if value[0] == "-" else 1
    if value[0] in "+-":
        value = value[1:]
    if value == "0":
        return 0
    if value.startswith("0b"):
        return sign * int(value[2:], 2)
    if value.startswith("0x"):
        return sign * int(value[2:], 16)
    if value[0] == "0":
        return sign * int(value, 8)
    if ":" in value:
        number = 0
        for part in value.split(":"):
            number = number * 60 + int(part)
        return sign * number
    return sign * int(value)


def _float(node: Node) -> float:
    value = _scalar(node).replace("_", "").lower()
    sign = -1 if value[0] == "-" else 1
    if value[0] in "+-":
        value = value[1:]
    if value == ".inf":
        return sign * _INF
    if value == ".nan":
        return _NAN
    if ":" in value:
        number, base = 0.0, 1
        for part in reversed(value.split(":")):
            number += float(part) * base
            base *= 60
        return sign * number
    return sign * float(value)


_TIMESTAMP = re.compile(r"""^(?P<year>[0-9]{4})-(?P<month>[0-9][0-9]?)-(?P<day>[0-9][0-9]?)
                           (?:(?:[Tt]|[ \t]+)(?P<hour>[0-9][0-9]?):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})
                            (?:\.(?P<fraction>[0-9]*))?
                            (?:[ \t]*(?P<tz>Z|(?P<tz_sign>[-+])(?P<tz_hour>[0-9][0-9]?)
                                (?::(?P<tz_minute>[0-9]{2}))?))?)?$""",
                        re.X)


def _timestamp(node: Node) -> datetime.date:
    _scalar(node)
    match = _TIMESTAMP.match(node.value)
    if match is None:
        raise ValueError("not a timestamp")
    year, month, day = int(match["year"]), int(match["month"]), int(match["day"])
    if not match["hour"]:
        return datetime.date(year, month, day)
    microsecond = int(match["fraction"][:6].ljust(6, "0")) if match["fraction"] else 0
    tzinfo = None
    if match["tz_sign"]:
        offset = datetime.timedelta(hours=int(match["tz_hour"]), minutes=int(match["tz_minute"] or 0))
        tzinfo = datetime.timezone(-offset if match["tz_sign"] == "-" else offset)
    elif match["tz"]:
        tzinfo = datetime.UTC
    return datetime.datetime(year, month, day, int(match["hour"]), int(match["minute"]), int(match["second"]),
                             microsecond, tzinfo=tzinfo)


def _binary(node: Node) -> bytes:
    try:
        data = _scalar(node).encode("ascii")
    except UnicodeEncodeError as exc:
        raise _problem(f"failed to convert base64 data into ascii: {exc}", node) from None
    try:
        return base64.decodebytes(data)
    except binascii.Error as exc:
        raise _problem(f"failed to decode base64 data: {exc}", node) from None


def _null(node: Node) -> None:
    _scalar(node)


_SCALARS: dict[str, Callable[[Node], Any]] = {
    _TAG + "null": _null,
    _TAG + "bool": lambda node: _BOOLS[_scalar(node).lower()],
    _TAG + "int": _int,
    _TAG + "float": _float,
    _TAG + "binary": _binary,
    _TAG + "timestamp": _timestamp,
    STR: _scalar,
}
_COLLECTIONS: dict[str, Callable[[], Any]] = {
    SEQ: list, MAP: dict, _TAG + "set": set, _TAG + "omap": list, _TAG + "pairs": list,
}


class _Constructor:
    """One document's values: each node built once (an alias is the same object), collections filled breadth
    first, as PyYAML does."""

    def __init__(self) -> None:
        self._built: dict[int, Any] = {}  # id(node) -> value (the nodes live as long as this)
        self._to_fill: deque[tuple[Any, Node]] = deque()

    def document(self, root: Node) -> Any:
        try:
            data = self.value(root)
            while self._to_fill:
                self._fill(*self._to_fill.popleft())
        except RecursionError:  # merge keys or value keys nested near the limit: the only recursive steps
            raise _problem("merge or value keys nested too deep to build", root) from None
        return data

    def value(self, node: Node) -> Any:
        try:
            return self._built[id(node)]
        except KeyError:
            pass
        make = _COLLECTIONS.get(node.tag)
        if make is not None:
            data = make()
            self._to_fill.append((data, node))
        else:
            construct = _SCALARS.get(node.tag)
            if construct is None:
                raise _problem(f"could not determine a constructor for the tag {node.tag!r}", node)
            try:
                data = construct(node)
            except YAMLError:
                raise
            except (ValueError, KeyError, IndexError, TypeError, OverflowError) as exc:
                what = repr(node.value) if node.kind == "scalar" else f"a {node.kind}"
                raise _problem(f"cannot read {what} as {node.tag.removeprefix(_TAG)} ({exc})", node) from None
        self._built[id(node)] = data
        return data

    def _fill(self, data: Any, node: Node) -> None:
        tag = node.tag
        if tag == SEQ:
            if node.kind != "sequence":
                raise _problem(f"expected a sequence node, but found {node.kind}", node)
            data.extend([self.value(child) for child in node.value])
        elif tag == MAP or tag == _TAG + "set":
            data.update(self._mapping(node))
        else:
            self._pairs(data, node, "an ordered map" if tag == _TAG + "omap" else "pairs")

    def _mapping(self, node: Node) -> dict:
        if node.kind == "mapping":
            _flatten(node)
        else:
            raise _problem(f"expected a mapping node, but found {node.kind}", node)
        mapping = {}
        for key_node, value_node in node.value:
            key = self.value(key_node)
            if not isinstance(key, Hashable):
                raise _problem("found unhashable key", key_node, "while constructing a mapping", node)
            mapping[key] = self.value(value_node)
        return mapping

    def _pairs(self, data: list, node: Node, what: str) -> None:
        context = f"while constructing {what}"
        if node.kind != "sequence":
            raise _problem(f"expected a sequence, but found {node.kind}", node, context, node)
        for entry in node.value:
            if entry.kind != "mapping":
                raise _problem(f"expected a mapping of length 1, but found {entry.kind}", entry, context, node)
            if len(entry.value) != 1:
                raise _problem(f"expected a single mapping item, but found {len(entry.value)} items", entry,
                               context, node)
            key_node, value_node = entry.value[0]
            data.append((self.value(key_node), self.value(value_node)))


def _flatten(node: Node) -> None:
    """Merge keys (<<) replaced by the pairs they bring, ahead of the mapping's own (which win, being later). A
    `=` key becomes a string. Changes the node, as PyYAML does.

    Of the merged pairs PyYAML 6.0.4 keeps the first with each key *object* (by identity): one key node reached
    through two aliases counts once, and so does a one-character key (CPython makes one string of each), while
    two equal keys of more characters both stay and the later wins. This keeps that rule, so that a file loads
    here as it did through PyYAML."""
    merged: list[tuple[Node, Node]] = []
    seen: set[int] = set()

    def merge(source: Node) -> None:
        _flatten(source)
        for pair in source.value:
            if id(pair[0].value) not in seen:
                seen.add(id(pair[0].value))
                merged.append(pair)

    index = 0
    while index < len(node.value):
        key_node, value_node = node.value[index]
        if key_node.tag == _MERGE:
            del node.value[index]
            if value_node.kind == "mapping":
                merge(value_node)
            elif value_node.kind == "sequence":
                for source in value_node.value:
                    if source.kind != "mapping":
                        raise _problem(f"expected a mapping for merging, but found {source.kind}", source,
                                       "while constructing a mapping", node)
                    merge(source)
            else:
                raise _problem(f"expected a mapping or list of mappings for merging, but found {value_node.kind}",
                               value_node, "while constructing a mapping", node)
        else:
            if key_node.tag == _VALUE:
                key_node.tag = STR
            index += 1
    if merged:
        node.value = merged + node.value


# -- the interface ----------------------------------------------------------------------------------------------------


def decode(data: bytes) -> str:
    """The text of a YAML file's bytes: UTF-16 when it starts with a UTF-16 byte order mark, else UTF-8 (a
    UTF-8 mark dropped), as YAML 1.1 and PyYAML read them."""
    try:
        if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
            return data.decode("utf-16")
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise YAMLError(f"not UTF-8 or UTF-16 text: {exc.reason} at byte {exc.start}") from None


def load_all(text: str, *, events: Events | None = None) -> list[Any]:
    """Every document of `text`, as `list(yaml.load_all(text, Loader=yaml.CSafeLoader))` gives them."""
    return load_parsed((events or parse)(text))


def load_parsed(parsed: tuple[list[tuple], YAMLError | None]) -> list[Any]:
    """Every document of a text `parse` has read already (a caller that looked at its events first)."""
    stream = _Stream(parsed)
    stream.take()  # STREAM-START
    documents = []
    while stream.peek()[0] != STREAM_END:
        documents.append(_Constructor().document(stream.document()))
    return documents


def load(text: str, *, events: Events | None = None) -> Any:
    """The one document of `text` (None when there is none), as `yaml.safe_load(text)` gives it."""
    stream = _Stream((events or parse)(text))
    stream.take()  # STREAM-START
    root = None
    if stream.peek()[0] != STREAM_END:
        root = stream.document()
    kind, line, column, *_ = stream.peek()
    if kind != STREAM_END:
        raise YAMLError("but found another document", line, column,
                        context="expected a single document in the stream",
                        context_line=root.line if root else None, context_column=root.column if root else None)
    return None if root is None else _Constructor().document(root)
