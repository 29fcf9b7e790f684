"""The parsed-manifest record's key follows the parser: PARSER_DIGEST is the digest of the parsing modules'
source, and the list of those modules is every edgelet module a manifest's parse imports."""

from __future__ import annotations

import pathlib

from edgelet.podconfig.parserversion import PARSER_DIGEST, PARSER_MODULES, source_digest
from tests.unit.import_graph import import_graph, reachable

PACKAGE_PARENT = pathlib.Path(__file__).resolve().parents[2]


def module_source(name: str) -> bytes:
    path = PACKAGE_PARENT.joinpath(*name.split("."))
    if path.is_dir():
        return (path / "__init__.py").read_bytes()
    source = path.with_suffix(".py")
    return (source if source.exists() else path.with_suffix(".pyx")).read_bytes()


def test_the_digest_is_that_of_the_parsing_modules_source():
    actual = source_digest((name, module_source(name)) for name in PARSER_MODULES)
    assert PARSER_DIGEST == actual, (
        "a module that parses manifests changed: set PARSER_DIGEST in edgelet/podconfig/parserversion.py to "
        f"{actual!r}, so records of the old parser's output are parsed anew")


def test_every_module_a_parse_imports_is_in_the_digest():
    graph = import_graph(top_level_only=False)
    assert sorted(reachable(graph, "edgelet.podconfig.manifest")) == sorted(PARSER_MODULES)


def test_the_digest_changes_with_any_module_and_with_names():
    sources = [("a", b"x = 1\n"), ("b", b"y = 2\n")]
    assert source_digest(sources) == source_digest(reversed(sources))
    assert source_digest(sources) != source_digest([("a", b"x = 2\n"), ("b", b"y = 2\n")])
    assert source_digest([("a", b"b")]) != source_digest([("ab", b"")])
