"""Label selectors as kubectl's `-l` takes them: `a=b`, `a==b`, `a!=b`, `a`, `!a`, `a in (x,y)`, `a notin (x,y)`."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

Requirement = Callable[[Mapping[str, str]], bool]

_KEY = r"([A-Za-z0-9][-A-Za-z0-9_./]*)"
_VALUE = r"([-A-Za-z0-9_.]*)"
_SET = re.compile(rf"^\s*{_KEY}\s+(in|notin)\s+\(([^)]*)\)\s*$")
_COMPARE = re.compile(rf"^\s*{_KEY}\s*(==|!=|=)\s*{_VALUE}\s*$")
_EXISTS = re.compile(rf"^\s*(!?)\s*{_KEY}\s*$")


def _terms(selector: str) -> list[str]:
    """Splits on the commas that are not inside a set's parentheses."""
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [term for term in terms if term.strip()]


def _requirement(term: str) -> Requirement:
    if match := _SET.match(term):
        key, operator, values = match.group(1), match.group(2), {v.strip() for v in match.group(3).split(",")}
        if operator == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if match := _COMPARE.match(term):
        key, operator, value = match.groups()
        if operator == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if match := _EXISTS.match(term):
        negated, key = match.groups()
        if negated:
            return lambda labels: key not in labels
        return lambda labels: key in labels
    raise ValueError(f"unable to parse requirement {term.strip()!r}")


def parse_selector(selector: str) -> Requirement:
    """A predicate over a label mapping; ValueError names the term that does not parse."""
    requirements = [_requirement(term) for term in _terms(selector)]
    return lambda labels: all(requirement(labels) for requirement in requirements)
