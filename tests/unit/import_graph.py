"""edgelet's import graph read from its source (no module is imported): for the import-graph test and the parser
version test."""

from __future__ import annotations

import ast
import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "edgelet"


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


_PYTHON_IMPORT = re.compile(r"(?:from [\w.]+ )?import [\w., ]+$")


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The edgelet modules an import statement loads."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        origin = ".".join(base + ([node.module] if node.module else []))
    else:
        origin = node.module or ""
    # `from . import metrics` and `from .prober import hooks` load submodules.
    submodules = {f"{origin}.{alias.name}" for alias in node.names if f"{origin}.{alias.name}" in known}
    # Taking a submodule of one's own package does not depend on that package's __init__ (Python has it
    # half-loaded by then); taking a name from it, or from any other package, does.
    own_package = module.startswith(origin + ".")
    if origin in known and (not own_package or len(submodules) < len(node.names)):
        submodules.add(origin)
    return submodules


def import_graph(*, top_level_only: bool) -> dict[str, set[str]]:
    """module -> the edgelet modules it imports. Top level only: leaves out the imports inside functions
    (the lazy ones), keeps those under `if TYPE_CHECKING:`."""
    files = {module_name(path): path for path in [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.pyx")]}
    known = set(files)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        source = path.read_text()
        if path.suffix == ".pyx":  # Cython: its Python imports, each on a line of its own (cimports are C's)
            source = "\n".join(line for line in source.splitlines() if _PYTHON_IMPORT.match(line))
        tree = ast.parse(source, str(path))
        is_package = path.name == "__init__.py"
        statements = []
        if top_level_only:
            pending = list(tree.body)
            while pending:
                node = pending.pop()
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    statements.append(node)
                elif isinstance(node, ast.If):
                    pending.extend(node.body + node.orelse)
                elif isinstance(node, ast.Try):
                    pending.extend(node.body + node.orelse + node.finalbody
                                   + [n for h in node.handlers for n in h.body])
        else:
            statements = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        # A submodule's implicit load of its own package is left out: a package that imports its submodules
        # is not a circle (Python has the package half-loaded by then, and it works).
        graph[module] = set().union(*(_targets(n, module, is_package, known) for n in statements)) - {module}
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    pending = [start]
    while pending:
        module = pending.pop()
        if module not in seen:
            seen.add(module)
            pending.extend(graph.get(module, ()))
    return seen
