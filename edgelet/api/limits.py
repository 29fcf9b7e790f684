"""The bounds every document from outside keeps before any other layer sees it: nesting depth and number ranges.

Manifests, API objects and checkpoints all pass `document_problem` where they enter, so no later layer (a JSON
encoder, a protobuf field, a time computation) ever meets a number the API server would not have stored (its
integers are int64 at most) or a document nested deeper than a pod can be.
"""

from __future__ import annotations

import math
from typing import Any

INT32_MAX = 2**31 - 1
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
# A pod is about 12 levels deep; the JSON encoders the agent uses stop at 254 and Python's stack near 1000.
MAX_DEPTH = 100


def document_problem(value: Any, *, max_depth: int = MAX_DEPTH) -> tuple[str, str] | None:
    """The first (field path, message) that puts `value` out of bounds, or None. Iterative: any depth is safe."""
    if _within_bounds(value, max_depth):  # the common case, without spelling out a path for every field
        return None
    return _first_problem(value, max_depth)


def _within_bounds(value: Any, max_depth: int) -> bool:
    if not isinstance(value, (dict, list)):
        return _scalar_within_bounds(value)
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            return False
        for child in item.values() if isinstance(item, dict) else item:
            if type(child) is str:
                continue
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
            elif not _scalar_within_bounds(child):
                return False
    return True


def _scalar_within_bounds(value: Any) -> bool:
    if isinstance(value, int):  # bool too: 0 and 1 fit
        return INT64_MIN <= value <= INT64_MAX
    return not isinstance(value, float) or math.isfinite(value)


def _first_problem(value: Any, max_depth: int) -> tuple[str, str] | None:
    stack: list[tuple[Any, str, int]] = [(value, "", 1)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > max_depth:
                return path, f"is nested more than {max_depth} levels deep"
            if isinstance(item, dict):
                children = [(child, f"{path}.{key}" if path else str(key)) for key, child in item.items()]
            else:
                children = [(child, f"{path}[{index}]") for index, child in enumerate(item)]
            stack.extend((child, child_path, depth + 1) for child, child_path in reversed(children))
        elif not _scalar_within_bounds(item):
            if isinstance(item, int):
                return path, f"integer out of range: {describe_int(item)} does not fit in 64 bits"
            return path, f"number out of range: {item}"
    return None


def describe_int(value: int) -> str:
    """A short spelling of any integer (str() refuses more than 4300 digits and a million digits is no message)."""
    if abs(value) < 10**30:
        return str(value)
    return f"{'-' if value < 0 else ''}2^{abs(value).bit_length() - 1} or more"
