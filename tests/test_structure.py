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


def private_imports(name: str, path: Path, known: Dict[str, Path]) -> List[str]:
    """``from dp2ddp.x import _name`` in module ``name``, ``x`` another module of dp2ddp: a
    private name used outside its module (what two modules share is public, in one home)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "") in known and node.module != name:
            out += [f"{path.name}:{node.lineno}: {a.name} from {node.module}" for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def test_no_module_imports_another_modules_private_name():
    known = modules()
    found = [line for name, path in known.items() for line in private_imports(name, path, known)]
    assert not found, "private names imported from another module (make them public where they live):\n" + "\n".join(found)


def test_the_private_import_check_sees_one(tmp_path):
    path = tmp_path / "b.py"
    path.write_text("def f():\n    from dp2ddp.model.core import _hidden, public, __version__\n")
    assert private_imports("b", path, {"dp2ddp.model.core": path}) == ["b.py:2: _hidden from dp2ddp.model.core"]
    assert private_imports("dp2ddp.model.core", path, {"dp2ddp.model.core": path}) == []  # its own name


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


# --------------------------------------------------------------------------- dead code

# Where a definition may be used from: the package, its tests (a helper that proves a
# property, such as Rule.passes_gate, is used) and the benchmarks.
USERS = ("dp2ddp", "tests", "benchmarks")

# Dead definitions in packages another change is rewriting (issue 21: model/ and
# codemods/); each entry must go once its definition is removed — the test fails on an
# entry that is no longer dead, so the list can only shrink.
KNOWN_DEAD: set = set()


def definitions(root: Path = ROOT) -> List[str]:
    """Module-level functions, classes and aliases (``X = Y``) of dp2ddp, and the methods
    of its classes that derive from no other class (an override of a base class's method
    is called by that base: click's, LibCST's)."""
    out: List[str] = []
    package = root / "dp2ddp"
    for path in sorted(package.rglob("*.py")):
        if "templates" in path.relative_to(package).parts:
            continue
        rel = path.relative_to(root).as_posix()
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.append(f"{rel}: {node.name}")
                if isinstance(node, ast.ClassDef) and not node.bases:
                    out += [
                        f"{rel}: {node.name}.{n.name}"
                        for n in node.body
                        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and not n.name.startswith("__")
                    ]
            elif (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, (ast.Name, ast.Attribute))
            ):
                out.append(f"{rel}: {node.targets[0].id}")
    return out


def used_words(root: Path = ROOT) -> Set[str]:
    """Every name the code reads: names, attributes, imported names, keyword arguments,
    and the words of string constants (``"dp2ddp.cli.check"``, ``getattr(x, "name")``).
    A definition's own name, where it is defined, is not a use; nor is a docstring's word
    (a function a docstring names, ``:func:`x```, is not called by it)."""
    words: Set[str] = set()
    for folder in USERS:
        for path in sorted((root / folder).rglob("*.py")):
            if path.resolve() == Path(__file__).resolve():
                continue  # this file names dead code on purpose
            tree = ast.parse(path.read_text(errors="replace"), str(path))
            docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
                    and isinstance(n.value.value, str)}
            for n in ast.walk(tree):
                if id(n) in docs:
                    continue
                if isinstance(n, ast.Name):
                    words.add(n.id)
                elif isinstance(n, ast.Attribute):
                    words.add(n.attr)
                elif isinstance(n, ast.alias):
                    words.add(n.name.rsplit(".", 1)[-1])
                elif isinstance(n, ast.keyword) and n.arg:
                    words.add(n.arg)
                elif isinstance(n, ast.Constant) and isinstance(n.value, str):
                    words.update(n.value.replace(".", " ").replace(":", " ").split())
    return words


def dead(root: Path = ROOT) -> Set[str]:
    words = used_words(root)
    return {d for d in definitions(root) if d.rsplit(".", 1)[-1].split(": ")[-1] not in words}


def test_no_dead_code():
    """vulture's question, asked of the whole tree at once: a function, class, method or
    alias that no code reads by name is gone, not kept."""
    found = dead()
    assert not sorted(found - KNOWN_DEAD), "nothing uses these; remove them"
    assert not sorted(KNOWN_DEAD - found), "no longer dead (or gone): remove them from KNOWN_DEAD"


def test_the_dead_code_check_sees_a_dead_function(tmp_path):
    """The check can fail: a function nothing reads is found; once read, it is not."""
    (tmp_path / "dp2ddp").mkdir()
    module = tmp_path / "dp2ddp" / "probe.py"
    module.write_text("def nobody_calls_this(): return 1\n\n\nclass Tool:\n    def unused_method(self): pass\n")
    assert dead(tmp_path) == {"dp2ddp/probe.py: nobody_calls_this", "dp2ddp/probe.py: Tool", "dp2ddp/probe.py: Tool.unused_method"}
    (tmp_path / "dp2ddp" / "other.py").write_text('"""Calls :func:`nobody_calls_this`? No: a docstring names it."""\n')
    assert "dp2ddp/probe.py: nobody_calls_this" in dead(tmp_path)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_probe.py").write_text("from dp2ddp.probe import Tool\nTool().unused_method()\n")
    assert dead(tmp_path) == {"dp2ddp/probe.py: nobody_calls_this"}


# --------------------------------------------------------------------------- lower bounds


def test_the_lowest_versions_are_the_bounds():
    """`make test-lowest` installs constraints-lowest.txt: each pin there is the lower bound
    pyproject.toml gives (dependencies and the verify extra), so the suite runs on exactly
    what we promise users works."""
    import re

    try:
        import tomllib
    except ImportError:  # pragma: no cover - Python < 3.11
        import tomli as tomllib  # type: ignore[no-redef]

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bounds = {}
    for spec in project["dependencies"] + project["optional-dependencies"]["verify"]:
        m = re.match(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9.]*)", spec.split(";")[0])
        if m and ";" not in spec:
            bounds[m.group(1).lower()] = m.group(2)
    pins = {}
    for line in (ROOT / "constraints-lowest.txt").read_text().splitlines():
        m = re.match(r"([A-Za-z0-9_.-]+)==([0-9][0-9.]*)", line.strip())
        if m:
            pins[m.group(1).lower()] = m.group(2)
    assert bounds and set(bounds) == set(pins), (bounds, pins)
    for name, low in bounds.items():
        assert [int(x) for x in pins[name].split(".")][: len(low.split("."))] == [int(x) for x in low.split(".")], name


# Call arguments read by position (``call.args[i]``) instead of by the callee's signature
# (dp2ddp/model/call_args.py ``argument``, ``SemanticModel.argument_for``): issue 21 counted
# 47 and a later review 117. The count may only fall; lower the bound as reads move over.
POSITIONAL_READS_AT_MOST = 112


def test_positional_argument_reads_do_not_grow():
    reads = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "dp2ddp").rglob("*.py")) if "probe" not in p.parts
             for i, line in enumerate(p.read_text().splitlines(), 1) if ".args[" in line]
    assert len(reads) <= POSITIONAL_READS_AT_MOST, (
        f"{len(reads)} reads of call arguments by position (at most {POSITIONAL_READS_AT_MOST}): read a parameter by "
        "name through dp2ddp.model.call_args.argument (a library's call) or SemanticModel.argument_for (the script's "
        "own function)")


def test_the_architecture_page_lists_the_transforms_in_their_order():
    """docs/architecture.md names the transforms in the order codemods.TRANSFORMS runs them."""
    import re

    from dp2ddp.codemods import TRANSFORMS

    text = (ROOT / "docs" / "architecture.md").read_text()
    para = text[text.index("then one transform per module"):]
    para = para[: para.index("\n\n")]
    named = [n for n in re.findall(r"`([a-z_]+)`", para) if n != "TRANSFORMS"]
    assert named == [t.__module__.rsplit(".", 1)[-1] for t in TRANSFORMS]


def test_every_fact_a_transform_reads_is_declared():
    """A transform that reads a fact (``ctx.need(X)``, ``ctx.has(X)``) declares it in ``NEEDS``
    (or provides it itself): the engine orders transforms by the declarations only."""
    from dp2ddp import codemods

    for mod in codemods._MODULES:
        tree = ast.parse(Path(mod.__file__).read_text())
        read = {n.args[0].id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and n.func.attr in ("need", "has") and n.args and isinstance(n.args[0], ast.Name)}
        declared = {c.__name__ for c in getattr(mod, "NEEDS", ()) + getattr(mod, "PROVIDES", ())}
        assert read <= declared, (mod.__name__, read - declared)
