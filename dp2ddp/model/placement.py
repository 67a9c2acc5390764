"""Device placement of a module around its wrap.

``DistributedDataParallel(module, device_ids=[d])`` needs the module's parameters on ``d``
when it is built (it checks, and it broadcasts rank 0's values from there). A script whose
placement comes after the wrap (``net = DDP(net)`` ... ``net.cuda()``, or a DataParallel
wrap moved out of ``if args.ngpu > 1:`` above a separate ``if args.ngpu > 0:
net.cuda()``) works on CPU and fails on the first GPU run.

* :func:`placement_of`: ``x.cuda()``, ``x.to(...)``, ``x = x.cuda()`` — the expression placed;
* :func:`placed_before` / :func:`placements_after`: placements of a module's names before and
  after a statement, in the statements of the same function (nested blocks included,
  nested functions not).
"""

from __future__ import annotations

import ast
from typing import Iterable, List, Optional

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.syntax import FUNCTIONS

PLACEMENT = frozenset({"cuda", "to"})


def placement_of(m: SemanticModel, stmt: ast.AST) -> Optional[ast.AST]:
    """The expression a statement places on a device: ``x.cuda()`` / ``x.to(d)`` as a
    statement, or ``x = x.cuda()``; ``None`` otherwise."""
    value = None
    if isinstance(stmt, ast.Expr):
        value = stmt.value
    elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        value = stmt.value
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in PLACEMENT):
        return None
    if value.func.attr == "to" and value.args and isinstance(value.args[0], ast.Constant) and value.args[0].value == "cpu":
        return None
    placed = value.func.value
    if isinstance(stmt, ast.Assign) and m.source(stmt.targets[0]) != m.source(placed):
        return None
    return placed


def _statements(m: SemanticModel, stmt: ast.stmt) -> List[ast.stmt]:
    """Every statement of the function (or module) of ``stmt``, in source order, nested
    blocks included, nested functions and classes not."""
    func = m.enclosing_function(stmt)
    root = func if func is not None else m.tree
    out: List[ast.stmt] = []
    todo = list(reversed(root.body))  # type: ignore[attr-defined]
    while todo:
        s = todo.pop()
        out.append(s)
        if isinstance(s, FUNCTIONS + (ast.ClassDef,)):
            continue
        for field in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(s, field, None)
            if isinstance(block, list):
                todo.extend(reversed(block))
    return out


def _branch(m: SemanticModel, node: ast.AST) -> dict:
    """For each ``if`` above ``node``: which of its blocks holds it."""
    out = {}
    child = node
    for a in m.ancestors(node):
        if isinstance(a, ast.If):
            for field in ("body", "orelse"):
                if any(c is child for c in getattr(a, field, ()) or ()):
                    out[id(a)] = field
        child = a
    return out


def exclusive(m: SemanticModel, a: ast.AST, b: ast.AST) -> bool:
    """``a`` and ``b`` sit in different branches of one ``if`` (``if``/``else``, an ``elif``
    chain): one run never executes both."""
    ba, bb = _branch(m, a), _branch(m, b)
    for key, field in ba.items():
        other = bb.get(key)
        if other is not None and other != field:
            return True
    return False


def placements_after(m: SemanticModel, stmt: ast.stmt, names: Iterable[str]) -> List[ast.stmt]:
    """Statements after ``stmt`` (same function) that place one of ``names`` (source texts)."""
    wanted = set(names)
    pos = (stmt.end_lineno or stmt.lineno, stmt.end_col_offset or 0)
    out = []
    for s in _statements(m, stmt):
        if (s.lineno, s.col_offset) <= pos or exclusive(m, s, stmt):
            continue
        placed = placement_of(m, s)
        if placed is not None and m.source(placed) in wanted:
            out.append(s)
    return out


def placed_before(m: SemanticModel, stmt: ast.stmt, names: Iterable[str]) -> bool:
    """A statement before ``stmt`` (same function) places one of ``names``."""
    wanted = set(names)
    for s in _statements(m, stmt):
        if (s.lineno, s.col_offset) >= (stmt.lineno, stmt.col_offset):
            break
        if exclusive(m, s, stmt):
            continue
        placed = placement_of(m, s)
        if placed is not None and m.source(placed) in wanted:
            return True
        # net = Net().cuda(): made on its device
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and m.source(s.targets[0]) in wanted:
            v = s.value
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr in PLACEMENT:
                return True
    return False


def placed_in(m: SemanticModel, expr: Optional[ast.AST]) -> bool:
    """``expr`` (a wrap's module argument) places the module as it is wrapped:
    ``model.cuda()``, ``model.to(device)``, or what the migration writes for a model the
    script places later, ``model.cuda() if torch.cuda.is_available() else model`` (on CPU
    there is no device to place it on)."""
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in ("cuda", "to"):
        return True
    return (isinstance(expr, ast.IfExp) and isinstance(expr.test, ast.Call)
            and m.is_name(expr.test.func, {"torch.cuda.is_available"}) and placed_in(m, expr.body))
