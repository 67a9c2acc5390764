"""Which statements place a module on a device, before and after a given statement.

``DistributedDataParallel(module, device_ids=[d])`` needs the module's parameters on ``d``
when it is built (it checks, and it broadcasts rank 0's values from there). A script whose
placement comes after the wrap (``net = DDP(net)`` ... ``net.cuda()``, or a DataParallel
wrap moved out of ``if args.ngpu > 1:`` above a separate ``if args.ngpu > 0:
net.cuda()``) works on CPU and fails on the first GPU run.

* :func:`placement_of`: ``x.cuda()``, ``x.to(...)``, ``x = x.cuda()`` — the expression placed;
* :func:`placed_before` / :func:`placements_after`: placements of a module's names before and
  after a statement, in the statements of the same function (nested blocks included,
  nested functions not); a placement after the name is bound to another value on every path
  to it places that value, not the module (:func:`rebound_between`, from the model's bindings);
* :func:`placed_in`: a wrap's module argument placed as it is wrapped.

Where a DDP wrap goes among them is :mod:`dp2ddp.model.wrap_placement`'s; placements away
from the wrap (a maker, a caller), :mod:`dp2ddp.model.placed_elsewhere`'s.
"""

from __future__ import annotations

import ast
from typing import Iterable, List, Optional

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.syntax import FUNCTIONS, root_name


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
    """Statements after ``stmt`` (same function) that place one of ``names`` (source texts)
    while the name still holds the value it held at ``stmt``: a placement after the name is
    bound anew on every path to it (``net = WideResNet(...)`` ... ``net.cuda()``) places
    another value (:func:`rebound_between`)."""
    wanted = set(names)
    pos = (stmt.end_lineno or stmt.lineno, stmt.end_col_offset or 0)
    out = []
    for s in _statements(m, stmt):
        if (s.lineno, s.col_offset) <= pos or exclusive(m, s, stmt):
            continue
        placed = placement_of(m, s)
        if placed is not None and m.source(placed) in wanted and rebound_between(m, stmt, s, placed) is None:
            out.append(s)
    return out


_REBINDS = frozenset({"assign", "unpack"})


def _rebinding_statements(m: SemanticModel, expr: ast.AST) -> List[ast.stmt]:
    """The statements that may give ``expr`` (a name, or an attribute chain of one) a new
    value: the assignments of its root name in the scope it is read in, as the model records
    them, and for an attribute chain the assignments to that same chain."""
    root = expr if isinstance(expr, ast.Name) else root_name(expr)
    out: List[ast.stmt] = []
    if root is not None and not (root is not expr and root.id == "self"):
        for b in m.bindings_of(root):
            if b.kind not in _REBINDS:
                continue  # a for/with target may hold the module itself; an except or a walrus may not run
            s = b.node if isinstance(b.node, ast.stmt) else m.statement_of(b.node)
            if s is not None:
                out.append(s)
    if isinstance(expr, ast.Attribute):
        text = m.source(expr)
        for s in _statements(m, expr):
            targets = s.targets if isinstance(s, ast.Assign) else [s.target] if isinstance(s, (ast.AnnAssign, ast.AugAssign)) else []
            if any(m.source(t) == text for t in targets):
                out.append(s)
    return out


def _runs_before(m: SemanticModel, first: ast.stmt, later: ast.stmt) -> bool:
    """Whenever ``later`` runs, ``first`` has run before it in the same pass: ``first``'s
    block holds ``later`` (or a statement around it) after ``first``."""
    around = {id(later)} | {id(a) for a in m.ancestors(later)}
    return any(id(s) in around for s in m.siblings_after(first))


def rebound_between(m: SemanticModel, start: ast.stmt, placement: ast.stmt, placed: ast.AST) -> Optional[ast.stmt]:
    """A statement after ``start`` that binds ``placed`` (the placed name) anew on every
    path to ``placement``, in the same function: from there on the name holds another
    value, and ``placement`` does not place the one ``start`` saw. Only a value made anew
    counts (:func:`_fresh`: ``x = x.cuda()``, ``x = f(x)`` or an alias may hold the same
    module); a binding in one branch, or in a loop that may not run, does not count."""
    end = (start.end_lineno or start.lineno, start.end_col_offset or 0)
    func = m.enclosing_function(placement)
    for r in _rebinding_statements(m, placed):
        if r is placement or (r.lineno, r.col_offset) <= end or m.enclosing_function(r) is not func:
            continue
        if m.contains(r, start):
            continue
        if not _fresh(m, r, placed):
            continue
        if (r.lineno, r.col_offset) < (placement.lineno, placement.col_offset) and _runs_before(m, r, placement):
            return r
    return None


def _fresh(m: SemanticModel, stmt: ast.stmt, placed: ast.AST) -> bool:
    """``stmt`` binds a value made anew, not the one the name held: an assignment of a call
    that reads neither the name nor anything of it (``net = WideResNet(...)``). ``x =
    x.cuda()``, ``net = convert(net)``, ``net = base`` (an alias may be the wrapped module),
    a ``for``/``with`` target may all hold the same module: they do not count."""
    value = stmt.value if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else None
    if not isinstance(value, ast.Call):
        return False
    root = placed if isinstance(placed, ast.Name) else root_name(placed)
    if root is None:
        return False
    return not any(isinstance(n, ast.Name) and n.id == root.id for n in ast.walk(value))


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
