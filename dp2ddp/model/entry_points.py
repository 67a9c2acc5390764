"""Whether a module runs something when executed (a script) or only defines things (a
library module whose callers set up the process group and the device)."""

from __future__ import annotations

import ast
import os
from typing import Optional

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.syntax import FUNCTIONS, is_docstring


# DDP116's words for a module that does not run, wherever a migration is refused for it
LIBRARY_MODULE = "library module (no `if __name__ == \"__main__\":` and no module-level code that runs)"


def has_entry_point(m: SemanticModel) -> bool:
    """The module runs something when executed: a main guard, or module-level statements
    other than imports, definitions, assignments of plain values and docstrings."""
    if m.main_guard is not None:
        return True
    if os.path.basename(m.path) == "__init__.py":
        return False  # a package's __init__ runs on import, never as a script
    for stmt in m.tree.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.ClassDef) + FUNCTIONS) or is_docstring(stmt):
            continue
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and not any(isinstance(n, ast.Call) for n in ast.walk(stmt)):
            continue
        if isinstance(stmt, (ast.If, ast.Try)) and all(
            isinstance(n, (ast.Import, ast.ImportFrom, ast.Pass, ast.Assign, ast.Expr, ast.Raise)) or not isinstance(n, ast.stmt)
            for s in ([stmt] if False else stmt.body) for n in ast.walk(s)
        ) and not any(isinstance(n, ast.Call) and not _harmless(n) for n in ast.walk(stmt)):
            continue
        if isinstance(stmt, ast.Assign) and all(_harmless(c, m) for c in ast.walk(stmt.value) if isinstance(c, ast.Call)):
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and m.qualified_names(stmt.value.func) & _SETTINGS:
            continue
        return True
    return False


_HARMLESS = {"logging.getLogger", "os.path.join", "os.path.dirname", "os.path.abspath", "os.environ.get", "os.getenv",
             "collections.namedtuple", "typing.TypeVar", "re.compile", "sys.path.append", "sys.path.insert",
             "warnings.filterwarnings", "torch.device", "torch.cuda.is_available"}


# module-level calls that only settle the environment the module's code will run in
_SETTINGS = frozenset({
    "matplotlib.use", "matplotlib.pyplot.switch_backend", "warnings.filterwarnings", "warnings.simplefilter",
    "sys.path.append", "sys.path.insert", "cv2.setNumThreads", "cv2.ocl.setUseOpenCL", "numpy.set_printoptions",
    "torch.set_printoptions", "torch.multiprocessing.set_sharing_strategy", "os.environ.setdefault",
    "logging.captureWarnings"})


# calls that only build a value (a lookup table at module level: ``lookup = torch.tensor(mapping)``)
_VALUE_BUILDERS = frozenset(
    [f"torch.{n}" for n in ("tensor", "as_tensor", "zeros", "ones", "arange", "linspace", "full", "eye", "empty", "Tensor",
                            "LongTensor", "FloatTensor")]
    + [f"numpy.{n}" for n in ("array", "asarray", "zeros", "ones", "arange", "linspace", "full", "eye", "empty")]
    + [f"builtins.{n}" for n in ("range", "len", "list", "dict", "set", "frozenset", "tuple", "zip", "enumerate", "sorted",
                                 "int", "float", "str", "min", "max", "sum", "abs", "round")])


def _harmless(call: ast.Call, m: Optional[SemanticModel] = None) -> bool:
    if m is not None and m.qualified_names(call.func) & _VALUE_BUILDERS:
        return True
    name = _dotted(call.func)
    return name in _HARMLESS or name.endswith(("getLogger", "namedtuple", "compile", "path.join", "path.dirname", "path.abspath"))


def _dotted(f: ast.AST) -> str:
    """``a.b.c`` for an attribute chain on a name, as spelled."""
    parts = []
    while isinstance(f, ast.Attribute):
        parts.append(f.attr)
        f = f.value
    if isinstance(f, ast.Name):
        parts.append(f.id)
    return ".".join(reversed(parts))
