"""The project's module files beside a script: where the file of an imported module is,
and the names a star import of it binds to imports (read from that file, once)."""

from __future__ import annotations

import ast
import os
from typing import Dict, List, Optional, Tuple

from dp2ddp.model.positions import decode

_EXPORTS: Dict[str, Optional[Dict[str, str]]] = {}
# top-level packages that are never the project's own
NOT_PROJECT = frozenset({"torch", "os", "sys", "numpy", "torchvision", "logging", "pathlib", "shutil", "json", "builtins"})


def module_exports(base: str, module: str, level: int) -> Optional[Dict[str, str]]:
    """The names a star import of ``module`` binds, with their qualified names, read from
    its file found beside the importing script (or up to three folders above it for
    absolute names): its imports, its own top-level definitions (``utils.Batches``) and what
    its own star imports bind in turn (a package's ``from .vgg import *``)."""
    cand = module_file(base, module, level)
    if cand is None:
        return None
    return _file_exports(cand, module if not level else None)


def _file_exports(path: str, qual: Optional[str]) -> Optional[Dict[str, str]]:
    key = os.path.realpath(path)
    if key not in _EXPORTS:
        _EXPORTS[key] = {}  # a star-import cycle reads as nothing more
        _EXPORTS[key] = _read_exports(path, qual)
    return _EXPORTS[key]


# how far above its folder a script's absolute imports are looked for, and the files that
# mark a repository's root (the search stops there)
_UP = 7
_ROOT_MARKS = (".git", "pyproject.toml", "setup.py", "setup.cfg", "requirements.txt", "LICENSE", "LICENSE.txt", "LICENSE.md")


def _root(d: str) -> bool:
    """A repository's root: a folder with a :data:`_ROOT_MARKS` file that is no package of
    its own (a package's folder holds modules of the root above it)."""
    return not os.path.exists(os.path.join(d, "__init__.py")) and any(
        os.path.exists(os.path.join(d, mark)) for mark in _ROOT_MARKS)


def _ancestors(base: str) -> List[str]:
    """``base`` and the folders above it that may hold a script's absolute imports: up to
    the repository's root (the first with a :data:`_ROOT_MARKS` file, at most six folders
    up: a script run as a module of it, ``python -m code.scripts.x``), or, where no such
    root is found, the three folders above ``base``."""
    chain, d = [base], base
    for _ in range(_UP - 1):
        if _root(d):
            return chain
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
        chain.append(d)
    if _root(d):
        return chain
    return chain[:4]


def module_file(base: str, module: str, level: int = 0) -> Optional[str]:
    """The file of a project module imported by a script in folder ``base``: beside it
    (or in a folder above it for absolute names: :func:`_ancestors`; then in the folders
    the modules beside it put on ``sys.path``: :func:`path_roots`); ``None`` when not found."""
    parts = module.split(".") if module else []
    roots = []
    if level:
        d = base
        for _ in range(level - 1):
            d = os.path.dirname(d)
        roots = [d]
    else:
        roots = _ancestors(base)
        roots += [r for r in path_roots(base) if r not in roots]
    for root in roots:
        for cand in (os.path.join(root, *parts) + ".py", os.path.join(root, *parts, "__init__.py")):
            if os.path.isfile(cand):
                return cand
    return None


_ROOTS: Dict[str, Tuple[Dict[str, List[str]], Dict[str, frozenset]]] = {}
_PATH_FUNCS = frozenset({"join", "dirname", "abspath", "realpath", "normpath"})


def path_roots(folder: str, importer: Optional[str] = None) -> Tuple[str, ...]:
    """The folders that modules in ``folder`` put on ``sys.path`` when a script beside them
    imports them: ``sys.path.insert(0, path)`` / ``sys.path.append(path)`` run by such a
    module's own top-level code, directly or through a function of that module (the
    ``_init_paths.py`` a script imports first, which adds ``../lib``), or by a script of the
    folder itself. Only the modules that ``importer`` imports count (a file in ``folder``),
    and ``importer``'s own edits; without one, those any file of the folder imports or makes. Only paths that can be read without running anything count: string
    constants, ``__file__``, the module's own top-level names, and ``os.path``'s
    ``join``/``dirname``/``abspath``/``realpath``/``normpath``; a relative path (the working
    directory's: ``sys.path.append('core')``) is read from ``folder``, where a script beside
    these modules is usually run from. Existing folders only; each folder read once (again when
    a file is added to it or removed)."""
    try:
        key = f"{os.path.realpath(folder)}:{os.stat(folder).st_mtime_ns}"  # a file added since: read again
    except OSError:
        return ()
    if key not in _ROOTS:
        edits: Dict[str, List[str]] = {}
        imports: Dict[str, frozenset] = {}
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            names = []
        for name in names:
            if name.endswith(".py"):
                edits[name[:-3]], imports[name[:-3]] = _module_path_edits(os.path.join(folder, name), cwd=folder)
        _ROOTS[key] = (edits, imports)
    edits, imports = _ROOTS[key]
    # and what a script of the folder adds itself (``sys.path.insert(1, os.path.join(sys.path[0],
    # '../utils'))`` before ``from utilities import create_logging``, audioset_tagging_cnn)
    if importer is not None:
        stem = os.path.splitext(os.path.basename(importer))[0]
        wanted = imports.get(stem, frozenset()) | {stem}
    else:
        wanted = (frozenset().union(*imports.values()) if imports else frozenset()) | frozenset(edits)
    found: List[str] = []
    for stem in sorted(wanted):
        for root in edits.get(stem, []):
            if root not in found and os.path.isdir(root):
                found.append(root)
    return tuple(found)


def _module_path_edits(path: str, cwd: Optional[str] = None) -> Tuple[List[str], frozenset]:
    """The absolute folders the module at ``path`` adds to ``sys.path`` at import (see
    :func:`path_roots`), and the top-level names of the modules it imports. A path relative
    to the working directory (``os.path.abspath("..")``) counts only where ``cwd`` says
    which folder that is."""
    try:
        with open(path, "rb") as fh:
            tree = ast.parse(decode(fh.read()))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError, LookupError):
        return [], frozenset()
    imported = frozenset(
        [a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        + [n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level])
    if "sys" not in imported:
        return [], imported
    env: Dict[str, Optional[str]] = {"__file__": os.path.abspath(path)}
    path_mods = {"os.path"}  # names that are os.path: `os.path`, `osp`, `path`
    path_funcs: Dict[str, str] = {}  # `from os.path import join` -> join
    adders: Dict[str, int] = {}  # top-level function -> index of the parameter it adds
    out: List[str] = []

    def value(e: ast.AST) -> Optional[str]:
        if isinstance(e, ast.Constant) and isinstance(e.value, str):
            return e.value
        if isinstance(e, ast.Name):
            return env.get(e.id)
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Add):
            a, b = value(e.left), value(e.right)
            return a + b if a is not None and b is not None else None
        if isinstance(e, ast.Call) and not e.keywords:
            f = e.func
            fname = None
            if isinstance(f, ast.Attribute) and ast.unparse(f.value) in path_mods and f.attr in _PATH_FUNCS:
                fname = f.attr
            elif isinstance(f, ast.Name) and f.id in path_funcs:
                fname = path_funcs[f.id]
            args = [value(a) for a in e.args]
            if fname is None or not args or any(a is None for a in args):
                return None
            if fname == "join":
                return os.path.join(*args)  # type: ignore[arg-type]
            if len(args) != 1:
                return None
            if fname in ("abspath", "realpath") and not os.path.isabs(args[0]):  # type: ignore[arg-type]
                # the working directory's: the run's, not this process's
                return os.path.normpath(os.path.join(cwd, args[0])) if cwd is not None else None  # type: ignore[arg-type]
            return getattr(os.path, fname)(args[0])
        if (isinstance(e, ast.Call) and not e.args and not e.keywords and isinstance(e.func, ast.Attribute)
                and e.func.attr == "getcwd" and ast.unparse(e.func.value) == "os"):
            return cwd
        if isinstance(e, ast.Subscript) and ast.unparse(e) == "sys.path[0]":
            return os.path.dirname(os.path.abspath(path))  # the script's folder (audioset_tagging_cnn's `../utils`)
        return None

    def added(call: ast.Call) -> Optional[ast.AST]:
        f = call.func
        if isinstance(f, ast.Attribute) and ast.unparse(f.value) == "sys.path":
            if f.attr == "insert" and len(call.args) == 2:
                return call.args[1]
            if f.attr == "append" and len(call.args) == 1:
                return call.args[0]
        return None

    def run(stmts: List[ast.stmt]) -> None:
        for st in stmts:
            if isinstance(st, ast.Import):
                for a in st.names:
                    if a.name == "os.path" and a.asname:
                        path_mods.add(a.asname)
            elif isinstance(st, ast.ImportFrom) and st.module == "os" and not st.level:
                path_mods.update(a.asname or a.name for a in st.names if a.name == "path")
            elif isinstance(st, ast.ImportFrom) and st.module == "os.path" and not st.level:
                path_funcs.update({a.asname or a.name: a.name for a in st.names if a.name in _PATH_FUNCS})
            elif isinstance(st, ast.FunctionDef):
                params = [a.arg for a in st.args.args]
                for call in (n for n in ast.walk(st) if isinstance(n, ast.Call)):
                    arg = added(call)
                    if isinstance(arg, ast.Name) and arg.id in params:
                        adders[st.name] = params.index(arg.id)
            elif isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
                env[st.targets[0].id] = value(st.value)
            elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
                call = st.value
                arg = added(call)
                if arg is None and isinstance(call.func, ast.Name) and call.func.id in adders:
                    i = adders[call.func.id]
                    arg = call.args[i] if i < len(call.args) else None
                got = value(arg) if arg is not None else None
                if got is not None and not os.path.isabs(got) and cwd is not None:
                    got = os.path.join(cwd, got)  # ``sys.path.insert(0, "..")``: from where the run starts
                if got is not None and os.path.isabs(got):
                    out.append(os.path.normpath(got))
            elif isinstance(st, (ast.If, ast.Try)):
                run(st.body)  # an `if __package__ is None:` or a `try:` around the edit
                run(getattr(st, "orelse", []))

    run(tree.body)
    return out, imported


def _read_exports(path: str, qual: Optional[str]) -> Optional[Dict[str, str]]:
    """What ``from <the module at path> import *`` binds: ``qual`` is the module's dotted
    name (``None`` when it cannot be told: its own definitions are then not exported)."""
    try:
        with open(path, "rb") as fh:
            tree = ast.parse(decode(fh.read()))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError, LookupError):
        return None
    package = None
    if qual is not None:
        package = qual if os.path.basename(path) == "__init__.py" else qual.rpartition(".")[0]
    out: Dict[str, str] = {}
    names_all = None
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            for a in stmt.names:
                if a.asname:
                    out[a.asname] = a.name
                else:
                    top = a.name.split(".", 1)[0]
                    out[top] = top
        elif isinstance(stmt, ast.ImportFrom) and any(a.name == "*" for a in stmt.names):
            inner = _nested_star(path, package, stmt)
            if inner is not None:
                out.update(inner)
        elif isinstance(stmt, ast.ImportFrom) and not stmt.level and stmt.module:
            for a in stmt.names:
                out[a.asname or a.name] = f"{stmt.module}.{a.name}"
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and qual is not None:
            out[stmt.name] = f"{qual}.{stmt.name}"
        elif isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets):
            if isinstance(stmt.value, (ast.List, ast.Tuple)):
                names_all = {e.value for e in stmt.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    public = {k: v for k, v in out.items() if not k.startswith("_")}
    if names_all is not None:
        public = {k: v for k, v in public.items() if k in names_all}
    return public


def _nested_star(path: str, package: Optional[str], stmt: ast.ImportFrom) -> Optional[Dict[str, str]]:
    """What a project module's own ``from x import *`` binds (relative to its package, or
    absolute beside it)."""
    if stmt.level:
        if package is None:
            return None
        parts = package.split(".") if package else []
        if stmt.level - 1 > len(parts):
            return None
        base_parts = parts[: len(parts) - (stmt.level - 1)]
        target = ".".join(base_parts + ([stmt.module] if stmt.module else []))
        cand = module_file(os.path.dirname(path), stmt.module or "", stmt.level)
        return _file_exports(cand, target or None) if cand is not None else None
    if not stmt.module or stmt.module.split(".")[0] in NOT_PROJECT:
        return None
    cand = module_file(os.path.dirname(path), stmt.module)
    return _file_exports(cand, stmt.module) if cand is not None else None


def script_path_edits(script: str, cwd: str) -> List[str]:
    """The folders the script itself adds to ``sys.path`` at its top level, read as from
    working directory ``cwd`` (``sys.path.append(os.path.dirname(os.path.abspath(
    os.path.dirname("optimizers"))))``: the folder above ``cwd``)."""
    return [r for r in _module_path_edits(script, cwd)[0] if os.path.isdir(r)]

