"""`edgelet.yamlload` against PyYAML, the oracle: every test runs through the `parse` fixture, once over the compiled
`edgelet._yaml` (libyaml called directly) and once over its twin `edgelet._yaml_py` (PyYAML's CParser).

The rule the loader is held to, for any text: where `yaml.load_all(text, Loader=yaml.CSafeLoader)` returns, ours
returns an equal result, equal with types (True, 1 and 1.0 differ; bytes and str differ; NaN equals NaN; datetimes
carry the same UTC offset) and with the same sharing of mutable objects (an alias is the very same object, a
recursive structure the same cycle). Where PyYAML raises a `MarkedYAMLError`, ours raises `YAMLError` with the same
problem text, problem mark and context. Where PyYAML raises anything else (a ReaderError, or the raw ValueError,
KeyError, AttributeError, IndexError, TypeError or RecursionError some constructors let out), ours raises YAMLError.

Sections: the comparison helpers (and tests of them), table tests of every scalar form, tag, merge, alias and error
case, realistic manifests, Hypothesis differential tests over a small YAML grammar and over arbitrary text, and the
two `parse` backends held to the same events and errors.
"""

from __future__ import annotations

import datetime
import importlib
import math
import os
import reprlib
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgelet import _yaml_py, yamlload
from edgelet.util.errors import YAMLError

NO_EXTENSIONS = os.environ.get("EDGELET_NO_EXTENSIONS") == "1"
compiled_only = pytest.mark.skipif(NO_EXTENSIONS, reason="EDGELET_NO_EXTENSIONS=1: pure-Python run")

DIFFERENTIAL = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ARBITRARY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module", params=[pytest.param("compiled", marks=compiled_only), "pure"])
def parse(request):
    """The event parser under test: `edgelet._yaml.parse` (compiled) or `edgelet._yaml_py.parse` (its twin)."""
    if request.param == "compiled":
        return importlib.import_module("edgelet._yaml").parse
    return _yaml_py.parse


# ---------------------------------------------------------------------------------------------
# Comparison helpers
# ---------------------------------------------------------------------------------------------

_MUTABLE = (list, dict, set)


def _scalar_key(value):
    """A hashable key that tells apart what `==` confuses: the type, and the repr (NaN and -0.0 included)."""
    if isinstance(value, datetime.datetime):
        return (type(value), value.isoformat(), value.utcoffset())
    if isinstance(value, tuple):
        return (tuple, tuple(_scalar_key(item) for item in value))
    return (type(value), repr(value))


def assert_same(expected, actual, path="$"):
    """`actual` equals `expected` with types and with the same sharing of mutable objects: a list, dict or set
    seen twice on one side is seen twice, at the same places, on the other. Handles cycles."""
    _same(expected, actual, path, {}, {})


def _same(expected, actual, path, left, right):
    assert type(actual) is type(expected), f"{path}: {type(expected).__name__} {expected!r:.200} expected, " \
                                            f"got {type(actual).__name__} {actual!r:.200}"
    if isinstance(expected, _MUTABLE):
        seen_left, seen_right = left.get(id(expected)), right.get(id(actual))
        if seen_left is not None or seen_right is not None:
            assert seen_left is not None and seen_left[0] is actual and seen_right is not None \
                and seen_right[0] is expected, \
                f"{path}: the sharing differs (expected first seen at {seen_left and seen_left[1]}, " \
                f"actual first seen at {seen_right and seen_right[1]})"
            return
        left[id(expected)] = (actual, path)
        right[id(actual)] = (expected, path)
    if isinstance(expected, list):
        assert len(actual) == len(expected), \
            f"{path}: {len(expected)} items expected, got {len(actual)}: {actual!r:.300}"
        for index, (one, other) in enumerate(zip(expected, actual)):
            _same(one, other, f"{path}[{index}]", left, right)
    elif isinstance(expected, tuple):
        assert len(actual) == len(expected), f"{path}: {expected!r:.200} expected, got {actual!r:.200}"
        for index, (one, other) in enumerate(zip(expected, actual)):
            _same(one, other, f"{path}({index})", left, right)
    elif isinstance(expected, dict):
        assert len(actual) == len(expected), f"{path}: keys {list(expected)!r:.300} expected, got {list(actual)!r:.300}"
        for index, ((key, value), (other_key, other_value)) in enumerate(zip(expected.items(), actual.items())):
            assert _scalar_key(key) == _scalar_key(other_key), \
                f"{path}: key #{index} {key!r} ({type(key).__name__}) expected, got {other_key!r} " \
                f"({type(other_key).__name__}); keys {list(expected)!r:.200} vs {list(actual)!r:.200}"
            _same(value, other_value, f"{path}[{key!r:.40}]", left, right)
    elif isinstance(expected, set):
        assert {_scalar_key(item) for item in actual} == {_scalar_key(item) for item in expected}, \
            f"{path}: {expected!r:.200} expected, got {actual!r:.200}"
    elif isinstance(expected, float):
        if math.isnan(expected):
            assert math.isnan(actual), f"{path}: nan expected, got {actual!r}"
        else:
            assert actual == expected and math.copysign(1, actual) == math.copysign(1, expected), \
                f"{path}: {expected!r} expected, got {actual!r}"
    elif isinstance(expected, datetime.datetime):
        assert actual == expected and actual.utcoffset() == expected.utcoffset() \
            and (actual.tzinfo is None) == (expected.tzinfo is None), f"{path}: {expected!r} expected, got {actual!r}"
    else:  # str, bytes, int, bool, None, date
        assert actual == expected, f"{path}: {expected!r:.300} expected, got {actual!r:.300}"


def pyyaml(text, *, single=False):
    """What PyYAML makes of `text`: ("ok", value) or ("error", the exception)."""
    try:
        if single:
            return "ok", yaml.load(text, Loader=yaml.CSafeLoader)
        return "ok", list(yaml.load_all(text, Loader=yaml.CSafeLoader))
    except (Exception, RecursionError) as exc:  # noqa: BLE001 -- every failure of the oracle is an outcome
        return "error", exc


def ours(text, parse, *, single=False):
    """What edgelet.yamlload makes of `text`: ("ok", value) or ("error", the exception)."""
    try:
        if single:
            return "ok", yamlload.load(text, events=parse)
        return "ok", yamlload.load_all(text, events=parse)
    except (Exception, RecursionError) as exc:  # noqa: BLE001 -- compared below
        return "error", exc


def _describe(outcome):
    kind, value = outcome
    if kind == "ok":
        return f"returned {reprlib.repr(value)}"  # reprlib: bounded for deep and recursive values
    return f"raised {type(value).__name__}: {value!s:.300}"


def assert_agrees(text, parse, *, single=False):
    """Ours behaves as PyYAML on `text` (see the module docstring); returns PyYAML's outcome."""
    expected, actual = pyyaml(text, single=single), ours(text, parse, single=single)
    where = f"text {text!r:.400}: PyYAML {_describe(expected)}; ours {_describe(actual)}"
    if expected[0] == "ok":
        assert actual[0] == "ok", where
        try:
            assert_same(expected[1], actual[1])
        except AssertionError as mismatch:
            raise AssertionError(f"{where}\n{mismatch}") from None
        return expected
    assert actual[0] == "error" and type(actual[1]) is not RecursionError, where
    error = actual[1]
    assert isinstance(error, YAMLError), where
    assert isinstance(error, ValueError) and isinstance(error.problem, str), where
    if isinstance(expected[1], yaml.MarkedYAMLError):
        want = expected[1]
        assert error.problem == want.problem, where
        assert (error.line, error.column) == (want.problem_mark.line, want.problem_mark.column), where
        if want.context is not None:
            assert error.context == want.context, where
    return expected


# ---------------------------------------------------------------------------------------------
# The helpers themselves
# ---------------------------------------------------------------------------------------------

def _recursive_list():
    value = []
    value.append(value)
    return value


def _recursive_dict():
    value = {}
    value["x"] = value
    return value


def _shared():
    inner = [1]
    return [inner, inner]


@pytest.mark.parametrize(("left", "right"), [
    (True, 1), (1, 1.0), (0, False), (None, ""), ("1", 1), (b"a", "a"), (1.0, -1.0), (0.0, -0.0),
    (datetime.date(2001, 12, 14), datetime.datetime(2001, 12, 14)),
    (datetime.datetime(2001, 12, 14, tzinfo=datetime.UTC),
     datetime.datetime(2001, 12, 14, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=1)))),
    (datetime.datetime(2001, 12, 14), datetime.datetime(2001, 12, 14, tzinfo=datetime.UTC)),
    ({"a": 1, "b": 2}, {"b": 2, "a": 1}), ({1: "a"}, {True: "a"}), ([("a", 1)], [["a", 1]]), ({1}, {True}),
    ({1, 2}, [1, 2]), (_shared(), [[1], [1]]), ([[1], [1]], _shared()), (_recursive_list(), [[]]),
    (_recursive_list(), [_recursive_list()]), (float("nan"), 0.0),
])
def test_the_strict_comparison_tells_these_apart(left, right):
    with pytest.raises(AssertionError):
        assert_same(left, right)


@pytest.mark.parametrize(("left", "right"), [
    (float("nan"), float("nan")), ({float("nan"), 1}, {1, float("nan")}), (_shared(), _shared()),
    (_recursive_list(), _recursive_list()), (_recursive_dict(), _recursive_dict()),
    ({"a": [("x", 1)]}, {"a": [("x", 1)]}),
    (datetime.datetime(2001, 12, 14, tzinfo=datetime.timezone(datetime.timedelta(hours=-5))),
     datetime.datetime(2001, 12, 14, tzinfo=datetime.timezone(datetime.timedelta(hours=-5)))),
])
def test_the_strict_comparison_accepts_these(left, right):
    assert_same(left, right)


# ---------------------------------------------------------------------------------------------
# Plain scalars: YAML 1.1 implicit types, each with its value written out
# ---------------------------------------------------------------------------------------------

UTC = datetime.UTC
MINUS_5 = datetime.timezone(datetime.timedelta(hours=-5))
NAN = float("nan")
INF = float("inf")

SCALARS = [
    # null
    ("~", None), ("null", None), ("Null", None), ("NULL", None), ("", None), ("nUll", "nUll"), ("none", "none"),
    # bool: yes/no/on/off/true/false in three casings; y/n are strings
    ("yes", True), ("Yes", True), ("YES", True), ("no", False), ("No", False), ("NO", False),
    ("true", True), ("True", True), ("TRUE", True), ("false", False), ("False", False), ("FALSE", False),
    ("on", True), ("On", True), ("ON", True), ("off", False), ("Off", False), ("OFF", False),
    ("y", "y"), ("Y", "Y"), ("n", "n"), ("N", "N"), ("yEs", "yEs"), ("tRUE", "tRUE"), ("oN", "oN"),
    # int: decimal, signs, underscores, binary, hex, leading-0 octal, sexagesimal
    ("0", 0), ("+0", 0), ("-0", 0), ("12", 12), ("-12", -12), ("+12", 12), ("1_000", 1000), ("1__0", 10),
    ("0_", 0), ("0b101", 5), ("-0b101", -5), ("0b1_0", 2), ("0x1F", 31), ("0x1f", 31), ("-0x1F", -31),
    ("0x_1F", 31), ("017", 15), ("-017", -15), ("0_17", 15), ("08", "08"), ("09", "09"), ("0o17", "0o17"),
    ("0x", "0x"), ("0b", "0b"), ("0b2", "0b2"), ("0xG", "0xG"), ("190:20:30", 685230), ("1:20", 80),
    ("-1:20", -80), ("1:60", "1:60"), ("12345678901234567890", 12345678901234567890), ("_1", "_1"),
    # float: dots, exponents with a sign only, inf/nan, sexagesimal
    ("1.5", 1.5), ("-1.5", -1.5), ("+1.5", 1.5), ("1.", 1.0), (".5", 0.5), ("-.5", "-.5"), ("+.5", "+.5"),
    ("1_0.5", 10.5), ("1.0e+3", 1000.0), ("1.0E-3", 0.001), ("1.e+3", 1000.0), ("6.8523015e+5", 685230.15),
    ("1e3", "1e3"), ("1e+3", "1e+3"), ("1.0e3", "1.0e3"), ("0.1e3", "0.1e3"), (".5e+1", 5.0),
    ("190:20:30.15", 685230.15), ("-1:20.5", -80.5), ("0.0", 0.0), ("-0.0", -0.0), ("-0.", -0.0),
    (".inf", INF), (".Inf", INF), (".INF", INF), ("+.inf", INF), ("-.inf", -INF), ("-.Inf", -INF),
    (".iNf", ".iNf"), ("inf", "inf"), (".nan", NAN), (".NaN", NAN), (".NAN", NAN), ("-.nan", "-.nan"),
    ("nan", "nan"), (".", "."),
    # timestamps: dates, date-times with t/T/space, fractions, time zones; out-of-form ones stay strings
    ("2001-12-14", datetime.date(2001, 12, 14)), ("2002-1-1", "2002-1-1"),
    ("2001-12-14t21:59:43.10-05:00", datetime.datetime(2001, 12, 14, 21, 59, 43, 100000, tzinfo=MINUS_5)),
    ("2001-12-14 21:59:43.10 -5", datetime.datetime(2001, 12, 14, 21, 59, 43, 100000, tzinfo=MINUS_5)),
    ("2001-12-14T21:59:43Z", datetime.datetime(2001, 12, 14, 21, 59, 43, tzinfo=UTC)),
    ("2001-12-15T02:59:43.1Z", datetime.datetime(2001, 12, 15, 2, 59, 43, 100000, tzinfo=UTC)),
    ("2001-12-14 21:59:43.10", datetime.datetime(2001, 12, 14, 21, 59, 43, 100000)),
    ("2001-12-14 21:59:43.1234567", datetime.datetime(2001, 12, 14, 21, 59, 43, 123456)),
    ("2002-12-14 1:02:03", datetime.datetime(2002, 12, 14, 1, 2, 3)), ("2002-12-14 1:2:3", "2002-12-14 1:2:3"),
    ("2001-12-14T21:59:43+05:30",
     datetime.datetime(2001, 12, 14, 21, 59, 43, tzinfo=datetime.timezone(datetime.timedelta(hours=5, minutes=30)))),
    ("2001-12-14 21:59", "2001-12-14 21:59"),
    # strings that look like something else
    ("<<x", "<<x"), ("=x", "=x"), ("hello world", "hello world"), ("a:b", "a:b"), ("a#b", "a#b"),
    ("1.2.3", "1.2.3"), ("0.0.0.0", "0.0.0.0"), ("10.0.0.1:8080", "10.0.0.1:8080"), ("1Gi", "1Gi"),
    ("100m", "100m"), ("v1", "v1"), ("é", "é"),
]


@pytest.mark.parametrize(("scalar", "value"), SCALARS, ids=[repr(row[0]) for row in SCALARS])
def test_plain_scalars_as_values(parse, scalar, value):
    text = f"v: {scalar}\n"
    assert_agrees(text, parse)
    assert_same({"v": value}, yamlload.load(text, events=parse))


@pytest.mark.parametrize(("scalar", "value"), [row for row in SCALARS if row[0]],
                         ids=[repr(row[0]) for row in SCALARS if row[0]])
def test_plain_scalars_as_keys_and_in_flow_sequences(parse, scalar, value):
    assert_agrees(f"{scalar}: 1\n", parse)
    assert_agrees(f"[{scalar}, {scalar}]\n", parse)
    assert_same([{value: 1}], yamlload.load_all(f"{scalar}: 1\n", events=parse))


@pytest.mark.parametrize("scalar", [row[0] for row in SCALARS if row[0]] + ["<<", "="])
@pytest.mark.parametrize("quote", ["'", '"'])
def test_quoted_scalars_stay_strings(parse, scalar, quote):
    text = f"v: {quote}{scalar}{quote}\n"
    assert_agrees(text, parse)
    assert_same({"v": scalar}, yamlload.load(text, events=parse))


@pytest.mark.parametrize(("text", "value"), [
    ("'it''s'", "it's"), ("''", ""), ('""', ""), ('"a\\nb\\tc"', "a\nb\tc"), ('"\\x41\\u00e9\\U0001F600"', "Aé😀"),
    ('"\\"q\\" \\\\"', '"q" \\'),
    ('"\\0\\a\\b\\e\\f\\r\\v\\/\\ \\N\\_\\L\\P"', "\0\a\b\x1b\f\r\v/ \x85\xa0\u2028\u2029"),
    ("'a\n  b\n\n  c'", "a b\nc"), ('"a\\\n  b"', "ab"), ("'# not a comment'", "# not a comment"),
    ("|\n  line 1\n  line 2\n", "line 1\nline 2\n"), ("|-\n  x\n\n", "x"), ("|+\n  x\n\n", "x\n\n"),
    (">\n  folded\n  text\n\n  para\n", "folded text\npara\n"), ("|2\n    indented\n", "  indented\n"),
    ("plain\n  continued\n  lines", "plain continued lines"),
])
def test_quoted_and_block_scalars(parse, text, value):
    assert_agrees(text, parse)
    assert_same(value, yamlload.load(text, events=parse))


# ---------------------------------------------------------------------------------------------
# Explicit tags
# ---------------------------------------------------------------------------------------------

TAGGED = [
    ("!!str 1", "1"), ("!!str yes", "yes"), ("!!str", ""), ("!!str ~", "~"), ("!<tag:yaml.org,2002:str> 1", "1"),
    ("!!int 12", 12), ("!!int '12'", 12), ("!!int 0x1F", 31), ("!!int 017", 15), ("!!int 1_000", 1000),
    ("!!int 190:20:30", 685230), ("!!int '-0b11'", -3),
    ("!!float 1", 1.0), ("!!float '1.5'", 1.5), ("!!float 1e3", 1000.0), ("!!float .inf", INF),
    ("!!float 1:30", 90.0), ("!!float -1_0", -10.0),
    ("!!bool yes", True), ("!!bool 'Off'", False), ("!!bool TRUE", True),
    ("!!null ''", None), ("!!null null", None), ("!!null anything", None),
    ("!!binary aGVsbG8=", b"hello"), ("!!binary |\n  aGVs\n  bG8=", b"hello"), ("!!binary ''", b""),
    ("!!timestamp 2001-12-14", datetime.date(2001, 12, 14)),
    ("!!timestamp '2001-12-14 21:59:43.10 -5'", datetime.datetime(2001, 12, 14, 21, 59, 43, 100000, tzinfo=MINUS_5)),
    ("!!set {a, b, 1}", {"a", "b", 1}), ("!!set {}", set()), ("!!set\n? a\n? b\n", {"a", "b"}),
    ("!!omap [a: 1, b: 2]", [("a", 1), ("b", 2)]), ("!!omap [a: 1, a: 2]", [("a", 1), ("a", 2)]),
    ("!!omap []", []), ("!!omap\n- a: 1\n- b: [x]\n", [("a", 1), ("b", ["x"])]),
    ("!!pairs [a: 1, a: 2]", [("a", 1), ("a", 2)]), ("!!pairs\n- 1: yes\n", [(1, True)]),
    ("!!seq [a, 1]", ["a", 1]), ("!!seq\n- x\n", ["x"]), ("!!map {a: 1}", {"a": 1}), ("!!map\na: 1\n", {"a": 1}),
    ("- !!str\n- !!str 0x1F\n", ["", "0x1F"]), ("{!!str 1: !!int '2'}", {"1": 2}),
]


@pytest.mark.parametrize(("text", "value"), TAGGED, ids=[repr(row[0]) for row in TAGGED])
def test_explicit_tags(parse, text, value):
    assert_agrees(text, parse)
    assert_same(value, yamlload.load(text, events=parse))


@pytest.mark.parametrize("text", [
    # PyYAML lets a raw ValueError, KeyError, AttributeError, IndexError or TypeError out of these
    "!!int abc", "!!int 1.5", "!!int ''", "!!int", "!!float abc", "!!float ''", "!!bool maybe", "!!bool 1",
    "!!bool ''", "!!timestamp x", "!!timestamp ''", "2001-02-30", "2001-13-01", "2001-12-14 25:00:00",
    "!!timestamp 2001-02-29", "v: 2000-00-10", "{!!set {a}: 1}",
    # and MarkedYAMLErrors from the constructor
    "!foo x", "!foo [x]", "!!python/object:os.system x", "!!python/name:os.system ''", "!<tag:example.com,2000:x> 1",
    "!!binary é", "!!set [a]", "!!set a", "!!omap {a: 1}", "!!omap [a, b]", "!!omap [{a: 1, b: 2}]", "!!pairs a",
    "!!pairs [[a]]", "!!seq {a: 1}", "!!seq a", "!!map [1]", "!!map a", "!!str [a]", "!!int [1]", "!!null {}",
    "!!binary [a]", "!!timestamp {}", "!!value x", "!!merge x", "v: =", "- =", "[=]", "!!float [1]",
])
def test_tag_errors(parse, text):
    kind, _ = assert_agrees(text, parse)
    assert kind == "error"


def test_unknown_tag_message(parse):
    with pytest.raises(YAMLError) as raised:
        yamlload.load("a: !foo x\n", events=parse)
    assert raised.value.problem == "could not determine a constructor for the tag '!foo'"
    assert (raised.value.line, raised.value.column) == (0, 3)


def test_equals_sign_is_a_key_but_not_a_value(parse):
    assert_same({"=": 1}, yamlload.load("=: 1\n", events=parse))
    assert_same({"=": 1}, yamlload.load("= : 1\n", events=parse))
    with pytest.raises(YAMLError) as raised:
        yamlload.load("a: =\n", events=parse)
    assert raised.value.problem == "could not determine a constructor for the tag 'tag:yaml.org,2002:value'"
    assert (raised.value.line, raised.value.column) == (0, 3)


# ---------------------------------------------------------------------------------------------
# Collections: styles, keys, duplicates
# ---------------------------------------------------------------------------------------------

COLLECTIONS = [
    ("a: 1\nb: 2\n", {"a": 1, "b": 2}), ("{a: 1, b: 2}", {"a": 1, "b": 2}), ("- a\n- b\n", ["a", "b"]),
    ("[a, b]", ["a", "b"]), ("[a, b, ]", ["a", "b"]), ("{a, b: }", {"a": None, "b": None}), ("[]", []), ("{}", {}),
    ("- - - x", [[["x"]]]), ("- a: 1\n  b: 2\n- c\n", [{"a": 1, "b": 2}, "c"]),
    ("a:\n- 1\n- 2\nb:\n  - 3\n", {"a": [1, 2], "b": [3]}), ("a:\n  b:\n    c: d\n", {"a": {"b": {"c": "d"}}}),
    ("? a\n", {"a": None}), ("? a\n: b\n", {"a": "b"}), ("[a: 1, b]", [{"a": 1}, "b"]),
    ("{a: [1, {b: c}], d: {e: [f]}}", {"a": [1, {"b": "c"}], "d": {"e": ["f"]}}),
    ("[\n  1,\n  2\n]", [1, 2]), ("a: 1\nb:\nc: 3\n", {"a": 1, "b": None, "c": 3}),
    ("? !!binary aGk=\n: 1\n", {b"hi": 1}), ("2001-12-14: x\n", {datetime.date(2001, 12, 14): "x"}),
    ("{1: a, 1.0: b}", {1: "b"}), ("1: a\ntrue: b\n", {1: "b"}), ("true: b\n1: a\n", {True: "a"}),
    ("0: a\nfalse: b\nno: c\n", {0: "c"}), ("a: 1\na: 2\n", {"a": 2}), ("a: 1\nb: 2\na: 3\n", {"a": 3, "b": 2}),
    ("{.nan: 1, .nan: 2}", {NAN: 2}), ("null: 1\n~: 2\n", {None: 2}), ("'1': a\n1: b\n", {"1": "a", 1: "b"}),
    ("a: 1 # comment\n# full line\nb: [2, # inside\n  3]\n", {"a": 1, "b": [2, 3]}),
    ("# only\n# comments\n", None), ("a: 'b' # c\n", {"a": "b"}), ("a: b#c\n", {"a": "b#c"}),
    ("a:\tb\n", {"a": "b"}), ("\ufeffa: 1\n", {"a": 1}), ("%YAML 1.1\n--- a\n", "a"),
    ("%TAG !e! tag:yaml.org,2002:\n--- !e!int '5'\n", 5), ("--- !!map\na: 1\n", {"a": 1}),
]


@pytest.mark.parametrize(("text", "value"), COLLECTIONS, ids=[repr(row[0]) for row in COLLECTIONS])
def test_collections(parse, text, value):
    assert_agrees(text, parse)
    assert_same(value, yamlload.load(text, events=parse))


@pytest.mark.parametrize("text", [
    "[a, b]: 1\n", "{a: 1}: 2\n", "? [1]\n: 2\n", "? - 1\n: 2\n", "? {a: 1}\n", "{[a]: 1}", "[{[a]: 1}]",
    "!!set {[a]}", "&a [x]: *a\n",
])
def test_unhashable_keys(parse, text):
    with pytest.raises(YAMLError) as raised:
        yamlload.load_all(text, events=parse)
    assert raised.value.problem == "found unhashable key"
    assert raised.value.context == "while constructing a mapping"
    assert_agrees(text, parse)


# ---------------------------------------------------------------------------------------------
# Documents
# ---------------------------------------------------------------------------------------------

DOCUMENTS = [
    ("", []), ("\n\n", []), ("# c\n", []), ("---", [None]), ("---\n", [None]), ("--- \n...\n", [None]),
    ("a\n---\nb\n", ["a", "b"]), ("---\na: 1\n---\nb: 2\n", [{"a": 1}, {"b": 2}]), ("---\n---\n", [None, None]),
    ("a: 1\n...\n---\nb\n...\n", [{"a": 1}, "b"]), ("--- 1\n--- [2]\n--- {c: 3}\n", [1, [2], {"c": 3}]),
    ("--- &a [1]\n--- &a [2]\n", [[1], [2]]), ("--- |\n  x\n--- >\n  y\n", ["x\n", "y\n"]),
    ("%YAML 1.1\n---\na\n...\n%YAML 1.1\n---\nb\n", ["a", "b"]),
]


@pytest.mark.parametrize(("text", "value"), DOCUMENTS, ids=[repr(row[0]) for row in DOCUMENTS])
def test_documents(parse, text, value):
    assert_agrees(text, parse)
    assert_same(value, yamlload.load_all(text, events=parse))


def test_load_of_an_empty_stream_is_none(parse):
    assert yamlload.load("", events=parse) is None
    assert yamlload.load("# nothing\n", events=parse) is None
    assert yamlload.load("---\n", events=parse) is None


@pytest.mark.parametrize("text", ["a\n---\nb\n", "---\n---\n", "a: 1\n--- b\n", "--- 1\n...\n--- 2\n"])
def test_load_refuses_two_documents(parse, text):
    with pytest.raises(YAMLError) as raised:
        yamlload.load(text, events=parse)
    assert raised.value.problem == "but found another document"
    assert raised.value.context == "expected a single document in the stream"
    assert_agrees(text, parse, single=True)


def test_an_error_in_a_later_document_fails_the_whole_stream(parse):
    with pytest.raises(YAMLError):
        yamlload.load_all("a: 1\n---\nb: [\n", events=parse)
    assert_agrees("a: 1\n---\nb: [\n", parse)
    assert_agrees("a: 1\n---\n!!int x\n", parse)


# ---------------------------------------------------------------------------------------------
# Anchors, aliases, merge keys
# ---------------------------------------------------------------------------------------------

def test_an_alias_is_the_same_object(parse):
    data = yamlload.load("a: &x [1, {b: 2}]\nc: *x\nd: &y {e: f}\ng: [*y, *y]\n", events=parse)
    assert data["a"] is data["c"] and data["a"][1] is data["c"][1]
    assert data["d"] is data["g"][0] is data["g"][1]


def test_unaliased_equal_collections_are_distinct_objects(parse):
    data = yamlload.load("a: []\nb: []\nc: {}\nd: {}\n", events=parse)
    assert data["a"] is not data["b"] and data["c"] is not data["d"]


def test_recursive_structures(parse):
    outer = yamlload.load("&a [*a, 1]", events=parse)
    assert outer[0] is outer and outer[1] == 1
    mapping = yamlload.load("&a {x: *a}", events=parse)
    assert mapping["x"] is mapping
    nested = yamlload.load("&a {x: [*a, &b {y: *b}]}", events=parse)
    assert nested["x"][0] is nested and nested["x"][1]["y"] is nested["x"][1]


ALIASES = [
    ("a: &x 1\nb: *x\n", {"a": 1, "b": 1}), ("- &x yes\n- *x\n", [True, True]), ("- &x !!str 1\n- *x\n", ["1", "1"]),
    ("a: &x [1]\nb: *x\n", None), ("&a [*a]", None), ("&a {x: *a}", None), ("&a [&b [*a, *b], *b]", None),
    ("a: &a [*a]\n", None), ("&a !!omap [x: *a]", None), ("&a !!pairs [x: *a, y: *a]", None),
    ("- &a [x]\n- {k: *a, l: *a}\n", None), ("&k key: &v value\n*v : *k\n", {"key": "value", "value": "key"}),
    ("[&a a, *a, &b b, *b]", ["a", "a", "b", "b"]), ("[&a a, *a, &a b, *a]", "error"), ("- &a\n- *a\n", [None, None]),
    ("a: &a !!set {x}\nb: *a\n", None), ("--- &a x\n--- *a\n", "error"), ("a: *x\n", "error"),
    ("a: &x 1\nb: &x 2\n", "error"), ("<<: [*a]\n", "error"), ("- *a\n- &a 1\n", "error"),
    ("{&a [x]: 1}", "error"), ("- &a [x]\n- {*a : 1}\n", "error"),
]


def agrees_with_row(parse, text, value):
    """PyYAML and ours agree on `text`, and its one document is `value` (types and key order included); "error":
    both fail; None: only the agreement is checked (sharing and cycles, which a literal cannot spell)."""
    kind, expected = assert_agrees(text, parse)
    if value == "error":
        assert kind == "error"
    elif value is not None:
        assert kind == "ok"
        assert_same([value], expected)


@pytest.mark.parametrize(("text", "value"), ALIASES, ids=[repr(row[0]) for row in ALIASES])
def test_anchors_and_aliases(parse, text, value):
    agrees_with_row(parse, text, value)


def test_alias_errors_have_pyyaml_messages(parse):
    with pytest.raises(YAMLError) as undefined:
        yamlload.load("a: *x\n", events=parse)
    assert (undefined.value.problem, undefined.value.line, undefined.value.column) == ("found undefined alias", 0, 3)
    with pytest.raises(YAMLError) as duplicate:
        yamlload.load("a: &x 1\nb: &x 2\n", events=parse)
    assert (duplicate.value.problem, duplicate.value.line, duplicate.value.column) == ("second occurrence", 1, 3)
    assert duplicate.value.context == "found duplicate anchor; first occurrence"
    assert (duplicate.value.context_line, duplicate.value.context_column) == (0, 3)


MERGES = [
    ("a: &a {x: 1, y: 2}\nb:\n  <<: *a\n  z: 3\n", {"a": {"x": 1, "y": 2}, "b": {"x": 1, "y": 2, "z": 3}}),
    ("a: &a {x: 1, y: 2}\nb:\n  <<: *a\n  x: 9\n", {"a": {"x": 1, "y": 2}, "b": {"x": 9, "y": 2}}),
    ("a: &a {x: 1, y: 2}\nb:\n  x: 9\n  <<: *a\n", {"a": {"x": 1, "y": 2}, "b": {"x": 9, "y": 2}}),
    ("- &a {x: 1, y: 2}\n- &b {x: 3, z: 4}\n- <<: [*a, *b]\n  w: 0\n",
     [{"x": 1, "y": 2}, {"x": 3, "z": 4}, {"x": 1, "y": 2, "z": 4, "w": 0}]),
    ("- &a {x: 1, y: 2}\n- &b {x: 3, z: 4}\n- <<: [*b, *a]\n  w: 0\n",
     [{"x": 1, "y": 2}, {"x": 3, "z": 4}, {"x": 3, "z": 4, "y": 2, "w": 0}]),
    ("- &a {x: 1, y: 2}\n- &b {x: 3, z: 4}\n- w: 0\n  <<: [*a, *b]\n  x: 9\n",
     [{"x": 1, "y": 2}, {"x": 3, "z": 4}, {"x": 9, "y": 2, "z": 4, "w": 0}]),
    ("<<: {a: 1, b: 2}\nb: 3\n", {"a": 1, "b": 3}), ("a: 1\n<<: {a: 2, b: 3}\n", {"a": 1, "b": 3}),
    ("<<: [{a: 1}, {a: 2, b: 2}]\n", {"a": 1, "b": 2}), ("{<<: {a: 1}, <<: {b: 2}}", {"a": 1, "b": 2}),
    ("- &a {x: 1}\n- &b {<<: *a, y: 2}\n- {<<: *b, z: 3}\n", [{"x": 1}, {"x": 1, "y": 2}, {"x": 1, "y": 2, "z": 3}]),
    ("- &a {<<: {p: 0}, x: 1}\n- {<<: *a}\n", [{"p": 0, "x": 1}, {"p": 0, "x": 1}]),
    ("<<: []\n", {}), ("<<: {}\n", {}), ("'<<': {a: 1}\n", {"<<": {"a": 1}}), ("!!str <<: {a: 1}\n", {"<<": {"a": 1}}),
    ("a: <<\n", "error"), ("- <<\n", "error"), ("&a {<<: *a}", {}), ("&a {x: 1, <<: *a}", {"x": 1}),
    ("a: &a [1]\nb: {<<: {k: *a}}\n", None), ("- &a {x: [1]}\n- <<: *a\n", None),
    ("&a {<<: [*a]}", None), ("&a [{<<: *a}]", None), ("- &a {x: 1}\n- !!map {<<: *a}\n", None),
    ("- &a {x: 1}\n- !!omap [<<: *a]\n", None), ("- &a {x: 1}\n- !!set {<<: *a}\n", None),
    ("<<: 1\n", "error"), ("<<: [1]\n", "error"), ("<<: [[{a: 1}]]\n", "error"), ("<<: [*a]\n", "error"),
    ("- &a [1]\n- <<: *a\n", "error"), ("- &a x\n- {<<: [*a]}\n", "error"), ("<<: !!set {a}\n", None),
    ("<<: !!omap [a: 1]\n", None), ("a: {<<: {[1]: 2}}\n", "error"), ("<<: {a: !!int x}\n", "error"),
]


@pytest.mark.parametrize(("text", "value"), MERGES, ids=[repr(row[0]) for row in MERGES])
def test_merge_keys(parse, text, value):
    agrees_with_row(parse, text, value)


def test_merged_values_are_the_merged_objects(parse):
    data = yamlload.load("- &a {x: [1], y: {z: 2}}\n- <<: *a\n", events=parse)
    assert data[1] is not data[0]
    assert data[1]["x"] is data[0]["x"] and data[1]["y"] is data[0]["y"]


# ---------------------------------------------------------------------------------------------
# Scanner, parser and reader errors: the same problem, mark and context
# ---------------------------------------------------------------------------------------------

# Mostly scanner, parser and reader errors; a few edge cases that libyaml accepts ("\ud7ff", "%FOO") ride along.
SYNTAX_ERRORS = [
    "a:\n\tb: 1\n", "\ta: 1\n", "- a\n\t- b\n", "a:\n  b: 1\n c: 2\n", "- a\nb: 1\n", "a: 1\n- b\n", "a: b: c\n",
    "a: 'x", 'a: "x', "'x\n", 'key: "\\q"', 'a: "\\x4"', "a: [1, 2", "a: {b: 1", "[a, b}", "{a: 1]", "]", "}",
    "a: b\nc", "--- |\n  x\n y", "%YAML 2.0\n--- a\n", "%YAML 1.1\n%YAML 1.1\n--- a\n", "%FOO\na\n", "%TAG !x!\n",
    "%YAML 1.1\na\n", "!x!y z\n", "&\n", "*\n", "& a", "a: &\n", "@a\n", "`a\n", "a: @b\n", "- !<>\n",
    "a: |\n  x\n y: 1\n", "a: >\n x\n  y\n z: 1\n", "? a\n? b\n:c\n:", ",a\n", "a: ,b\n", "[a, ,]", "{a: 1, ,}",
    "- [a\n- b]\n", "a:\n- b\n  - c\n", "a: 1\n  b: 2\n", "[a\n b]: 1\n", "{a: 1}\nb: 2\n", "'a'b\n",
    "a: 'b'c\n", "--- a\nb: c\n", "a: &x *y\n", "a: !!str &x *y\n", "- &a *b\n", "\x07\n", "a: \x1f\n",
    "\ud7ff\n", "\ufffe\n", "a: \x85b\n", "...x\n", "---x\n", "| x\n", "|0\n x\n", "|12\n", ">-+\n",
    "'\n", '"\n', "[", "{", "? ", ": ", "- -\n  - a\n - b\n", "...\n", "-", "v: -\n",
]


@pytest.mark.parametrize("text", SYNTAX_ERRORS, ids=[repr(text) for text in SYNTAX_ERRORS])
def test_syntax_errors_match_pyyaml(parse, text):
    assert_agrees(text, parse)
    assert_agrees(text, parse, single=True)


@pytest.mark.parametrize(("text", "problem", "line", "column", "context"), [
    ("a:\n\tb: 1\n", "found character that cannot start any token", 1, 0, "while scanning for the next token"),
    ("a:\n  b: 1\n c: 2\n", "did not find expected key", 2, 1, "while parsing a block mapping"),
    ("a: 'x", "found unexpected end of stream", 0, 5, "while scanning a quoted scalar"),
    ("a: b: c\n", "mapping values are not allowed in this context", 0, 4, None),
    ("a: [1, 2", "did not find expected ',' or ']'", 1, 0, "while parsing a flow sequence"),
    ('key: "\\q"', "found unknown escape character", 0, 6, "while parsing a quoted scalar"),
    ("a: b\nc", "could not find expected ':'", 2, 0, "while scanning a simple key"),
    ("- a\nb: 1\n", "did not find expected '-' indicator", 1, 0, "while parsing a block collection"),
])
def test_syntax_error_details(parse, text, problem, line, column, context):
    with pytest.raises(YAMLError) as raised:
        yamlload.load_all(text, events=parse)
    error = raised.value
    assert (error.problem, error.line, error.column) == (problem, line, column)
    if context is not None:
        assert error.context == context
    assert str(error)  # a readable message


@pytest.mark.parametrize("text", [
    "\ufeffa", "\ufeff", "\ufeff---\na\n", "\ufeff\ufeffa", "a\n\ufeff", "\ufeff'x", "\ufeffa: b: c", "\ufeff[a",
    "a: 1\r\nb: 2\r\n", "a: 1\rb: 2", "a: b\u2028c: d", "a: 'x\u2028y'", "a: \x85", "a: \t1", "- \t- a",
    "\ud800", "a: \ud800", "a: \x00", "\x00", "a: \x7f", "a: \x9f", "x" * 2000 + ": 1",
], ids=repr)
def test_byte_order_marks_line_breaks_and_odd_characters(parse, text):
    assert_agrees(text, parse)
    assert_agrees(text, parse, single=True)


def test_deep_nesting_is_a_yaml_error(parse):
    for text in ["[" * 5000 + "]" * 5000, "- " * 3000 + "x\n", "{a: " * 3000 + "}" * 3000]:
        assert_agrees(text, parse)


def test_a_block_mapping_too_deep_is_refused_at_its_first_key(parse):
    """libyaml 0.2.6 finds a block mapping one level too deep at the ':' after its first key; the events, which
    the limit is kept on when libyaml is older, have the key's position. The same problem, one key earlier."""
    text = "a:\n" + "".join(" " * depth + "a:\n" for depth in range(1, 1500))
    with pytest.raises(yaml.MarkedYAMLError) as expected:
        yaml.load(text, Loader=yaml.CSafeLoader)
    with pytest.raises(YAMLError) as actual:
        yamlload.load(text, events=parse)
    want, got = expected.value, actual.value
    assert (got.context, got.problem) == (want.context, want.problem) == (
        "while increasing block level", "exceeded maximum nesting depth")
    assert got.line == want.problem_mark.line and got.column in (want.problem_mark.column,
                                                                  want.problem_mark.column - 1)


def test_nesting_up_to_libyamls_limit_loads(parse):
    """libyaml refuses more than 1000 levels; up to that PyYAML loads, and so must ours (no RecursionError)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 5000))  # for the recursive comparison helper, not for the loader
    try:
        for text in ["[" * 1000 + "]" * 1000, "- " * 999 + "x\n", "{a: " * 1000 + "}" * 1000,
                     "".join(" " * depth + "a:\n" for depth in range(999)) + " " * 999 + "b\n"]:
            kind, _ = assert_agrees(text, parse)
            assert kind == "ok"
    finally:
        sys.setrecursionlimit(limit)


# ---------------------------------------------------------------------------------------------
# Realistic documents
# ---------------------------------------------------------------------------------------------

POD = """\
# A static pod, as the agent reads it from its manifest directory.
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: default
  labels: {app: web, tier: "frontend", version: "1.0"}
  annotations:
    edgelet.io/config-hash: 0x1F
    description: >
      a folded
      description
spec:
  hostNetwork: false
  restartPolicy: OnFailure
  terminationGracePeriodSeconds: 30
  containers:
  - name: nginx
    image: docker.io/library/nginx:1.25
    args: ["--port", "8080", --debug]
    command:
      - /bin/sh
      - -c
      - |
        echo start
        exec nginx -g 'daemon off;'
    env:
    - name: ENABLED
      value: "yes"
    - name: RAW_BOOL
      value: yes
    - name: OCTAL
      value: 0755
    ports:
    - {containerPort: 8080, protocol: TCP, name: http}
    resources:
      limits: {cpu: 500m, memory: 128Mi}
      requests:
        cpu: 0.25
        memory: 64Mi
    livenessProbe: &probe
      httpGet: {path: /healthz, port: 8080}
      initialDelaySeconds: 5
      periodSeconds: 10
    readinessProbe:
      <<: *probe
      periodSeconds: 3
    volumeMounts:
    - name: data
      mountPath: /data
      readOnly: true
  volumes:
  - name: data
    hostPath: {path: /var/lib/web, type: DirectoryOrCreate}
  - name: empty
    emptyDir: {}
  nodeSelector:
    kubernetes.io/os: linux
  tolerations:
  - key: node.kubernetes.io/not-ready
    operator: Exists
    effect: NoExecute
    tolerationSeconds: 300
status: {}
"""

KUBECONFIG = """\
apiVersion: v1
kind: Config
preferences: {}
current-context: edge@cluster
clusters:
- name: cluster
  cluster:
    server: https://10.0.0.1:6443
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJkVENDQVJ1Z0F3SUJBZ0lCQURBS0JnZ3Foa2pP==
    insecure-skip-tls-verify: false
contexts:
- name: edge@cluster
  context:
    cluster: cluster
    user: edge
    namespace: kube-system
users:
- name: edge
  user:
    client-certificate: /var/lib/edgelet/pki/edgelet-client-current.pem
    client-key: /var/lib/edgelet/pki/edgelet-client-current.pem
    token: 'abc.def'
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: /usr/local/bin/token
      args: [get, --cluster=cluster]
      env: null
      interactiveMode: Never
      provideClusterInfo: off
"""

MULTI = """\
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: default}
data:
  settings.ini: |
    mode=edge
  enabled: "true"
  port: "8080"
...
---
apiVersion: v1
kind: Secret
metadata: {name: token}
type: Opaque
data:
  token: dG9rZW4=
stringData: {}
---
# an empty document follows
---
"""


def test_pod_manifest(parse):
    assert_agrees(POD, parse)
    pod = yamlload.load(POD, events=parse)
    container = pod["spec"]["containers"][0]
    assert pod["metadata"]["annotations"]["edgelet.io/config-hash"] == 31
    assert pod["metadata"]["annotations"]["description"] == "a folded description\n"
    assert container["command"][2] == "echo start\nexec nginx -g 'daemon off;'\n"
    assert [env["value"] for env in container["env"]] == ["yes", True, 493]
    assert_same({"cpu": 0.25, "memory": "64Mi"}, container["resources"]["requests"])
    assert_same({"httpGet": {"path": "/healthz", "port": 8080}, "initialDelaySeconds": 5, "periodSeconds": 3},
                container["readinessProbe"])
    assert container["readinessProbe"]["httpGet"] is container["livenessProbe"]["httpGet"]
    assert pod["spec"]["hostNetwork"] is False and pod["status"] == {}


def test_kubeconfig(parse):
    assert_agrees(KUBECONFIG, parse)
    config = yamlload.load(KUBECONFIG, events=parse)
    assert config["current-context"] == "edge@cluster"
    assert config["users"][0]["user"]["exec"]["provideClusterInfo"] is False
    assert config["users"][0]["user"]["exec"]["env"] is None
    assert config["clusters"][0]["cluster"]["certificate-authority-data"].startswith("LS0t")


def test_multi_document_manifest(parse):
    assert_agrees(MULTI, parse)
    documents = yamlload.load_all(MULTI, events=parse)
    assert [doc and doc["kind"] for doc in documents] == ["ConfigMap", "Secret", None, None]


def test_repository_yaml_files(parse):
    """Every YAML file shipped in the repository's examples and packaging loads as PyYAML loads it."""
    root = Path(__file__).resolve().parents[2]
    files = sorted(path for folder in ("examples", "packaging", "docs", "hack") if (root / folder).is_dir()
                   for pattern in ("*.yaml", "*.yml") for path in (root / folder).rglob(pattern))
    for path in files:
        assert_agrees(path.read_text(encoding="utf-8", errors="replace"), parse)


# ---------------------------------------------------------------------------------------------
# Hypothesis: a small YAML grammar, differential against PyYAML
# ---------------------------------------------------------------------------------------------

TRICKY = ["yes", "No", "ON", "off", "y", "n", "0x1F", "0b101", "017", "08", "1_000", "190:20:30", "1.5", "1.", ".5",
          "-.inf", ".NaN", "1e3", "1.0e+3", "6.8523015e+5", "2001-12-14", "2001-12-14t21:59:43.10-05:00",
          "2001-12-14 21:59:43.10 -5", "~", "null", "NULL", "", "0", "+0", "-0", "0_", "0o17", "True", "FALSE",
          "-12", "+.5", "-1:20.5", "a b", "hello", "x", "1", "2", "2002-1-1", ".", "-", "-0.0", "0x_1F"]
TRICKY_KEYS = [*TRICKY, "<<", "="]
FAILING_VALUES = ["=", "<<", "2001-02-30", "!!int x", "!!bool maybe", "!!timestamp x", "!foo x", "!!value x",
                  "!!merge x", "!!binary é", "!!float ''"]
# (tag, a value it takes) -- and now and then a tag on a value it does not take
TAGGED_SCALARS = [("!!str", st.sampled_from(TRICKY)), ("!!int", st.sampled_from(["0x1F", "'017'", "-1_0", "1:20"])),
                  ("!!float", st.sampled_from(["1", ".inf", "'1e3'", "-1.5", "1:30.5"])),
                  ("!!bool", st.sampled_from(["yes", "'Off'", "TRUE", "no"])),
                  ("!!null", st.sampled_from(["''", "x", "~"])),
                  ("!!binary", st.sampled_from(["aGVsbG8=", "''", "'aGk='"])),
                  ("!!timestamp", st.sampled_from(["2001-12-14", "'2001-12-14T21:59:43Z'", "2001-12-14 1:02:03"]))]
SEQUENCE_TAGS = ["!!seq", "!!seq", "!!seq", "!!omap", "!!pairs", "!!map"]
MAPPING_TAGS = ["!!map", "!!map", "!!map", "!!set", "!!seq", "!!str"]

_words = st.text(alphabet="abcxyzAZ019 _-.:/@%", min_size=1, max_size=8).map(str.strip).filter(
    lambda word: word and word[0] not in "-:%@" and ": " not in word and not word.endswith(":"))
_plain_text = st.one_of(st.sampled_from(TRICKY), st.sampled_from(TRICKY), _words)
_quoted_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)


def _rarely(draw, one_in: int) -> bool:
    """True about once in `one_in` draws. The middle value: Hypothesis draws the ends of a range far more often."""
    return draw(st.integers(0, one_in - 1)) == one_in // 2


class _Doc:
    """The state of one generated document: the anchors defined so far, by the kind of node they name (aliases
    may point at them; merge keys mostly at mappings)."""

    def __init__(self):
        self.anchors: dict[str, str] = {}

    def new_anchor(self, draw, kind: str) -> str:
        if self.anchors and _rarely(draw, 150):  # a duplicate anchor, now and then
            return draw(st.sampled_from(sorted(self.anchors)))
        name = f"a{len(self.anchors)}"
        self.anchors[name] = kind
        return name

    def alias(self, draw, kind: str | None = None) -> str | None:
        """An alias to an anchor defined so far (of `kind`, if given), or None when there is none."""
        names = sorted(name for name, its in self.anchors.items() if kind is None or its == kind)
        if _rarely(draw, 150):
            return "*undefined"
        return "*" + draw(st.sampled_from(names)) if names else None


def _double_quoted(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return '"' + "".join(ch if ch.isprintable() or ch == " " else f"\\u{ord(ch):04x}" if ord(ch) < 0x10000
                         else f"\\U{ord(ch):08x}" for ch in escaped) + '"'


def _single_quoted(text: str) -> str:
    return "'" + "".join(ch for ch in text if ch.isprintable()).replace("'", "''") + "'"


def _scalar(draw, doc: _Doc, key: bool = False) -> str:
    """A scalar node in one line: plain, quoted, tagged or an alias, maybe with an anchor."""
    if not key and _rarely(draw, 8):
        alias = doc.alias(draw)
        if alias:
            return alias
    if not key and _rarely(draw, 80):
        return draw(st.sampled_from(FAILING_VALUES))
    props = []
    style = draw(st.sampled_from(["plain"] * 5 + ["single", "single", "double", "double", "tagged", "tagged"]))
    if style == "plain":
        text = draw(st.sampled_from(TRICKY_KEYS) if key else _plain_text)
        if text in ("", "-"):
            text = "~"
    elif style == "single":
        text = _single_quoted(draw(_quoted_text))
    elif style == "double":
        text = _double_quoted(draw(_quoted_text))
    else:
        tag, values = draw(st.sampled_from(TAGGED_SCALARS))
        props.append(tag)
        text = draw(values)
    if _rarely(draw, 6):
        props.append("&" + doc.new_anchor(draw, "scalar"))
    return " ".join([*props, text]).strip()


def _key(draw, doc: _Doc, flow: bool) -> str:
    """A mapping key: mostly scalars (merge keys and '=' included), sometimes an alias or a flow collection."""
    if _rarely(draw, 8):
        return "<<"
    if _rarely(draw, 30):
        alias = doc.alias(draw, "scalar")
        if alias:
            return alias + " "  # "*a :" needs the space
    if _rarely(draw, 150):  # an unhashable key, unless a scalar comes out; in a flow mapping it takes a "?"
        return ("? " if flow else "") + _flow(draw, doc, 2)
    return _scalar(draw, doc, key=True)


def _merge_value(draw, doc: _Doc) -> str:
    if _rarely(draw, 3) or not any(kind == "map" for kind in doc.anchors.values()):
        return _flow(draw, doc, 1, kind="map") if not _rarely(draw, 10) else _flow(draw, doc, 1)
    if draw(st.booleans()):
        return doc.alias(draw, "map")
    return "[" + ", ".join(doc.alias(draw, None if _rarely(draw, 15) else "map") or "{}"
                           for _ in range(draw(st.integers(0, 3)))) + "]"


def _flow(draw, doc: _Doc, depth: int, kind: str | None = None) -> str:
    """A flow collection, or at the bottom a scalar."""
    if kind is None and (depth > 2 or _rarely(draw, 4)):
        return _scalar(draw, doc)
    kind = kind or draw(st.sampled_from(["seq", "map"]))
    props = []
    anchor = None
    if _rarely(draw, 4):
        anchor = "&" + doc.new_anchor(draw, kind)  # defined before its content: the content may alias it (a cycle)
    if _rarely(draw, 16):
        props.append(draw(st.sampled_from(SEQUENCE_TAGS if kind == "seq" else MAPPING_TAGS)))
    if anchor:
        props.append(anchor)
    prefix = " ".join(props) + " " if props else ""
    size = draw(st.integers(0, 3))
    if kind == "seq":
        pair_first = size and _rarely(draw, 6)  # a single-pair mapping inside a sequence: [a: 1]
        items = [f"{_key(draw, doc, True)}: {_flow(draw, doc, depth + 1)}" if pair_first and not index
                 else _flow(draw, doc, depth + 1) for index in range(size)]
        return prefix + "[" + ", ".join(items) + "]"
    pairs = []
    for _ in range(size):
        key = _key(draw, doc, True)
        value = _merge_value(draw, doc) if key == "<<" else _flow(draw, doc, depth + 1)
        pairs.append(f"{key}: {value}")
    return prefix + "{" + ", ".join(pairs) + "}"


def _comment(draw) -> str:
    return " # " + draw(st.sampled_from(["c", "a: b", "- x", "#", ""])) if _rarely(draw, 8) else ""


def _block(draw, doc: _Doc, indent: int, depth: int, is_mapping: bool | None = None) -> list[str]:
    """A block mapping or sequence at `indent`, as lines."""
    pad = " " * indent
    lines: list[str] = []
    if is_mapping is None:
        is_mapping = draw(st.booleans())
    for _ in range(draw(st.integers(1, 4))):
        if is_mapping:
            key = _key(draw, doc, False)
            head = f"{pad}{key}:"
            if key == "<<":
                lines.append(f"{head} {_merge_value(draw, doc)}{_comment(draw)}")
                continue
        else:
            head = f"{pad}-"
        choice = draw(st.integers(0, 9))
        if depth < 3 and choice < 4:
            nested_mapping = draw(st.booleans())
            props = []
            if _rarely(draw, 4):
                props.append("&" + doc.new_anchor(draw, "map" if nested_mapping else "seq"))
            if _rarely(draw, 16):
                props.append(draw(st.sampled_from(MAPPING_TAGS if nested_mapping else SEQUENCE_TAGS)))
            # a mapping's sequence may sit at the mapping's own indentation
            same_indent = is_mapping and not nested_mapping and _rarely(draw, 4)
            nested = _block(draw, doc, indent + (0 if same_indent else 2), depth + 1, nested_mapping)
            if not is_mapping and not props and draw(st.booleans()):
                lines.append(head + " " + nested[0][indent + 2:])  # compact: "- a: 1" / "- - x"
                lines.extend(nested[1:])
            else:
                lines.append(f"{head} {' '.join(props)}".rstrip() + _comment(draw))
                lines.extend(nested)
        elif choice < 5:
            style = draw(st.sampled_from(["|", ">", "|-", ">+", "|2"]))
            lines.append(f"{head} {style}")
            lines.extend(" " * (indent + 2) + draw(_words) for _ in range(draw(st.integers(1, 3))))
        elif choice < 7:
            lines.append(f"{head} {_flow(draw, doc, 1)}{_comment(draw)}")
        else:
            lines.append(f"{head} {_scalar(draw, doc)}" + _comment(draw))
        if _rarely(draw, 12):
            lines.append(pad + "# a comment line")
    return lines


@st.composite
def yaml_documents(draw) -> str:
    """One YAML text of one or more documents."""
    documents = []
    for _ in range(draw(st.integers(1, 3))):
        doc = _Doc()
        choice = draw(st.integers(0, 9))
        if choice < 6:
            body = "\n".join(_block(draw, doc, 0, 0))
        elif choice < 9:
            body = _flow(draw, doc, 0)
        else:
            body = ""
        documents.append(body)
    if len(documents) == 1 and draw(st.booleans()):
        return documents[0] + "\n"
    separator = draw(st.sampled_from(["\n---\n", "\n...\n---\n"]))
    start = "---\n" if not documents[0] or draw(st.booleans()) else ""
    return start + separator.join(documents) + "\n"


@DIFFERENTIAL
@given(yaml_documents())
def test_generated_documents_load_as_pyyaml_loads_them(parse, text):
    assert_agrees(text, parse)


@DIFFERENTIAL
@given(yaml_documents())
def test_generated_documents_load_singly_as_pyyaml_loads_them(parse, text):
    assert_agrees(text, parse, single=True)


@DIFFERENTIAL
@given(st.lists(st.tuples(st.sampled_from(["<<", "x", "y", "z", "1", "true"]), st.sampled_from(["1", "2", "yes"])),
                max_size=3).map(lambda pairs: "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"),
       st.lists(st.integers(0, 3), max_size=4), st.booleans())
def test_generated_merges(parse, own, merged, merged_first):
    """Merge keys over anchored maps: which value wins, and in what order the keys come out."""
    bases = ["{x: 1, y: 2}", "{x: 3, z: 4}", "{<<: *m0, w: 5}", "{y: [1], <<: {q: 0}}"]
    lines = [f"- &m{index} {base}" for index, base in enumerate(bases)]
    merge = "[" + ", ".join(f"*m{index}" for index in merged) + "]"
    body = own[1:-1]
    entries = [f"<<: {merge}", body] if merged_first else [body, f"<<: {merge}"]
    lines.append("- {" + ", ".join(entry for entry in entries if entry) + "}")
    assert_agrees("\n".join(lines) + "\n", parse)


@ARBITRARY
@given(st.text(max_size=60))
def test_arbitrary_text(parse, text):
    assert_agrees(text, parse)


@ARBITRARY
@given(st.text(alphabet="-:[]{},#&*!|>'\"%@`? \n\t\r\ufeffab01.~<=\\", max_size=40))
def test_arbitrary_yaml_punctuation(parse, text):
    assert_agrees(text, parse)


# ---------------------------------------------------------------------------------------------
# The two `parse` backends: the same events, the same errors
# ---------------------------------------------------------------------------------------------

EVENT_KINDS = {yaml.StreamStartEvent: 1, yaml.StreamEndEvent: 2, yaml.DocumentStartEvent: 3,
               yaml.DocumentEndEvent: 4, yaml.AliasEvent: 5, yaml.ScalarEvent: 6, yaml.SequenceStartEvent: 7,
               yaml.SequenceEndEvent: 8, yaml.MappingStartEvent: 9, yaml.MappingEndEvent: 10}

EVENT_TEXTS = [
    "", "a", "---", "a: 1\nb: [x, 'y', \"z\"]\n", "&a [*a]", "- !!str 1\n- !foo {a: b}\n- ! x\n",
    "%TAG !e! tag:example.com,2000:\n--- !e!thing x\n", "a: |\n  x\n", "? a\n: b\n", "'a': \"b\"",
    "a: é\nb: 😀\n", "- &x1 v\n- *x1\n", POD, KUBECONFIG, MULTI, "\ufeffa", "a\n...\n", "[a: 1]",
    "a: \\x\nb: \"\\x41\"\n", "a: 'multi\n  line'\n",
    *SYNTAX_ERRORS,
]


def _pyyaml_events(text):
    events, error = [], None
    try:
        for event in yaml.parse(text, Loader=yaml.CSafeLoader):
            events.append(event)
    except yaml.YAMLError as exc:
        error = exc
    return events, error


def _compiled():
    if NO_EXTENSIONS:
        pytest.skip("EDGELET_NO_EXTENSIONS=1: pure-Python run, no twin to compare")
    return importlib.import_module("edgelet._yaml")


def _error_fields(error):
    if error is None:
        return None
    return (type(error).__name__, error.problem, error.line, error.column, error.context, error.context_line,
            error.context_column)


def assert_same_events(text):
    compiled_events, compiled_error = _compiled().parse(text)
    pure_events, pure_error = _yaml_py.parse(text)
    assert compiled_events == pure_events
    assert _error_fields(compiled_error) == _error_fields(pure_error)


@pytest.mark.parametrize("text", EVENT_TEXTS, ids=[repr(text[:40]) for text in EVENT_TEXTS])
def test_both_backends_give_the_same_events(text):
    assert_same_events(text)


@ARBITRARY
@given(st.one_of(yaml_documents(), st.text(alphabet="-:[]{},#&*!|>'\"%@`? \n\t\r\ufeffab01.~<=\\", max_size=40),
                 st.text(max_size=40)))
def test_both_backends_agree_on_generated_texts(text):
    assert_same_events(text)


def test_both_backends_name_their_library():
    compiled = _compiled()
    assert isinstance(compiled.LIBRARY, str) and compiled.LIBRARY
    assert isinstance(_yaml_py.LIBRARY, str) and _yaml_py.LIBRARY


@pytest.mark.parametrize("text", EVENT_TEXTS, ids=[repr(text[:40]) for text in EVENT_TEXTS])
def test_events_are_libyamls(parse, text):
    """The event tuples say what PyYAML's own C parser says: kinds, start marks, anchors, tags, scalar values."""
    events, error = parse(text)
    expected, expected_error = _pyyaml_events(text)
    assert all(isinstance(event, tuple) and len(event) == 7 for event in events)
    assert [event[:3] for event in events] == [(EVENT_KINDS[type(event)], event.start_mark.line,
                                                event.start_mark.column) for event in expected]
    for ours_event, theirs in zip(events, expected):
        kind, _, _, anchor, tag, value, plain_implicit = ours_event
        if isinstance(theirs, yaml.AliasEvent):
            assert anchor == theirs.anchor
        elif isinstance(theirs, yaml.ScalarEvent):
            assert (anchor, tag, value, bool(plain_implicit)) == (theirs.anchor, theirs.tag, theirs.value,
                                                                 theirs.implicit[0])
        elif isinstance(theirs, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            assert (anchor, tag) == (theirs.anchor, theirs.tag)
    if expected_error is None:
        assert error is None
    else:
        assert isinstance(error, YAMLError)
        if isinstance(expected_error, yaml.MarkedYAMLError):
            assert (error.problem, error.line, error.column) == (expected_error.problem,
                                                                 expected_error.problem_mark.line,
                                                                 expected_error.problem_mark.column)
