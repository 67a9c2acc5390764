"""The project's module files beside a script: where the file of an imported module is,
and the names a star import of it binds to imports (read from that file, once)."""

from __future__ import annotations

import ast
import os
from typing import Dict, Optional

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


def module_file(base: str, module: str, level: int = 0) -> Optional[str]:
    """The file of a project module imported by a script in folder ``base``: beside it
    (or up to three folders above it for absolute names); ``None`` when not found."""
    parts = module.split(".") if module else []
    roots = []
    if level:
        d = base
        for _ in range(level - 1):
            d = os.path.dirname(d)
        roots = [d]
    else:
        d = base
        for _ in range(4):
            roots.append(d)
            d = os.path.dirname(d)
    for root in roots:
        for cand in (os.path.join(root, *parts) + ".py", os.path.join(root, *parts, "__init__.py")):
            if os.path.isfile(cand):
                return cand
    return None


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
