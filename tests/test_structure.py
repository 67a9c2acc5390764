"""The package's shape: no import circle between dp2ddp's modules.

Every import statement counts, wherever it stands (module level, inside a function, under
``if TYPE_CHECKING:``): a lazy import is still a dependency, and two modules that import
each other — however late — are one module in two files.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dp2ddp"


def modules() -> Dict[str, Path]:
    """Every module of dp2ddp by its dotted name (a package by its ``__init__.py``)."""
    out: Dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "templates" in path.relative_to(PACKAGE).parts:
            continue  # code the migration inserts, not modules of dp2ddp
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imported(name: str, path: Path, known: Dict[str, Path]) -> Set[str]:
    """The modules of dp2ddp that module ``name`` imports (``from a.b import c`` imports
    ``a.b``, and ``a.b.c`` when that is a module)."""
    is_package = path.name == "__init__.py"
    out: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in out if m in known and m != name}


def import_graph() -> Dict[str, Set[str]]:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_imports_at_any_depth():
    graph = import_graph()
    # a module-level import, and one inside a function (check.engine imports check.fix lazily)
    assert "dp2ddp.check.results" in graph["dp2ddp.check.engine"]
    assert "dp2ddp.check.fix" in graph["dp2ddp.check.engine"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle():
    found = circles(import_graph())
    assert not found, "modules that import each other (directly or around a circle): " + "; ".join(
        " <-> ".join(c) for c in found
    )
