"""The kinds of nodes and the small questions about one node that need no model: which
node types are functions, loops, comprehensions; a node's children and source order; a
call's keyword; a constant; the ``if __name__ == "__main__"`` test; a docstring; the name an
attribute chain starts from."""

from __future__ import annotations

import ast
import operator
from typing import List, Optional, Tuple

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
LOOPS = (ast.For, ast.AsyncFor, ast.While)
# statement fields that hold blocks of statements
BLOCK_FIELDS = ("body", "orelse", "finalbody", "handlers")

_POSITION = operator.attrgetter("lineno", "col_offset")
first_item = operator.itemgetter(0)


def sort_nodes(nodes: List[ast.AST]) -> None:
    """In source order (a stable sort: nodes that start at one place keep their order)."""
    try:
        nodes.sort(key=_POSITION)
    except AttributeError:  # nodes without a position (comprehension, arguments ...)
        nodes.sort(key=order_key)


def children(node: ast.AST) -> List[ast.AST]:
    """What ``ast.iter_child_nodes`` yields, in its order, as a list (several times faster)."""
    out = []
    for name in node._fields:
        v = getattr(node, name, None)
        if isinstance(v, ast.AST):
            out.append(v)
        elif isinstance(v, list):
            out.extend(x for x in v if isinstance(x, ast.AST))
    return out


def order_key(node: ast.AST) -> Tuple[int, int]:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


def is_main_test(test: ast.AST) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and any(
        isinstance(s, ast.Constant) and s.value == "__main__" for s in sides
    )


def is_docstring(stmt: ast.AST) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def only_imports(stmt: ast.AST) -> bool:
    found = False
    for n in ast.walk(stmt):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            found = True
        elif isinstance(n, ast.stmt) and not isinstance(n, (ast.If, ast.Try, ast.Pass, ast.Expr) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())):
            return False
    return found


def kwarg(call: ast.Call, name: str) -> Optional[ast.keyword]:
    for k in call.keywords:
        if k.arg == name:
            return k
    return None


def summing_keyword(call: ast.Call) -> Optional[ast.keyword]:
    """The keyword that makes a loss call sum over its samples: ``reduction="sum"``, or the
    deprecated ``size_average=False`` (without ``reduce``)."""
    arg = kwarg(call, "reduction")
    if arg is not None and isinstance(arg.value, ast.Constant) and arg.value.value == "sum":
        return arg
    legacy = kwarg(call, "size_average")  # deprecated spelling of the same sum
    if (legacy is not None and isinstance(legacy.value, ast.Constant) and legacy.value.value is False
            and kwarg(call, "reduce") is None):
        return legacy
    return None


def is_const(node: Optional[ast.AST], value) -> bool:
    return isinstance(node, ast.Constant) and node.value is value if value in (True, False, None) else (
        isinstance(node, ast.Constant) and node.value == value
    )


def terminal(node: ast.AST) -> Optional[str]:
    """The identifier an expression ends with: ``f`` of ``a.b.f``, of ``f(...)`` and of
    ``os.environ["RANK"]`` its key."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call):
        return terminal(node.func)
    if isinstance(node, ast.Subscript):
        s = node.slice
        if isinstance(s, ast.Constant) and isinstance(s.value, str):
            return s.value
        return terminal(node.value)
    return None


def first_dim_of(e: ast.AST) -> Optional[ast.AST]:
    """``x`` of ``x.size(0)``, ``x.size()[0]``, ``x.shape[0]`` or ``len(x)`` (spelled
    ``len``: a caller that must know it is the builtin checks the name); else ``None``."""
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "size":
        ok = len(e.args) == 1 and isinstance(e.args[0], ast.Constant) and e.args[0].value == 0 and not e.keywords
        return e.func.value if ok else None
    if isinstance(e, ast.Subscript) and isinstance(e.slice, ast.Constant) and e.slice.value == 0:
        v = e.value
        if isinstance(v, ast.Attribute) and v.attr == "shape":
            return v.value
        if isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "size" and not v.args:
            return v.func.value
        return None
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id == "len" and len(e.args) == 1:
        return e.args[0]
    return None


def root_name(expr: ast.AST) -> Optional[ast.Name]:
    """The name an attribute chain starts from: ``model`` of ``model.features.conv``
    (``None`` when the chain starts elsewhere: a call, a subscript)."""
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return expr if isinstance(expr, ast.Name) else None


def self_attribute_method(node: ast.AST) -> Optional[Tuple[str, str]]:
    """``self.attr.meth(...)``: ``(attr, meth)``; else ``None``."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    owner = node.func.value
    if isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name) and owner.value.id == "self":
        return owner.attr, node.func.attr
    return None


def unplaced(v: ast.AST) -> ast.AST:
    """The module a ``.to(device)``/``.cuda()``/``.float()`` chain starts from."""
    while isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr in ("to", "cuda", "cpu", "float", "double", "half"):
        v = v.func.value
    return v
