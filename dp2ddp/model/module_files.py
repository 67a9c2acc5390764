"""The project's module files beside a script: where the file of an imported module is,
and the names a star import of it binds to imports (read from that file, once)."""

from __future__ import annotations

import ast
import os
from typing import Dict, Optional

from dp2ddp.model.positions import decode

_EXPORTS: Dict[str, Optional[Dict[str, str]]] = {}


def _module_exports(base: str, module: str, level: int) -> Optional[Dict[str, str]]:
    """The names a star import of ``module`` binds to imports, read from its file found
    beside the importing script (or up to three folders above it for absolute names)."""
    cand = module_file(base, module, level)
    if cand is None:
        return None
    key = os.path.realpath(cand)
    if key not in _EXPORTS:
        _EXPORTS[key] = _read_exports(cand)
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


def _read_exports(path: str) -> Optional[Dict[str, str]]:
    try:
        with open(path, "rb") as fh:
            tree = ast.parse(decode(fh.read()))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError, LookupError):
        return None
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
        elif isinstance(stmt, ast.ImportFrom) and not stmt.level and stmt.module:
            for a in stmt.names:
                if a.name != "*":
                    out[a.asname or a.name] = f"{stmt.module}.{a.name}"
        elif isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets):
            if isinstance(stmt.value, (ast.List, ast.Tuple)):
                names_all = {e.value for e in stmt.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    public = {k: v for k, v in out.items() if not k.startswith("_")}
    if names_all is not None:
        public = {k: v for k, v in public.items() if k in names_all}
    return public
