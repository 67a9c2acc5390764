"""Whether a name is bound on every path that reaches a statement: what moving code past
an ``if`` needs to know (``if cfg.eval_head: head = Head(model)`` binds ``head`` on one
path only; a wrap of ``head`` moved out of a later ``if`` would read an unbound name on
the other)."""

from __future__ import annotations

import ast
from typing import List, Optional

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.syntax import FUNCTIONS


def _binds(stmts: List[ast.stmt], name: str) -> bool:
    """Some statement of ``stmts`` binds ``name`` on every path through it (one that
    ends the block, ``return``/``raise``/``continue``/``break``, counts: no path goes on)."""
    for s in stmts:
        if _stmt_binds(s, name):
            return True
        if isinstance(s, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
            return True
    return False


def _target_binds(t: ast.AST, name: str) -> bool:
    if isinstance(t, ast.Name):
        return t.id == name
    if isinstance(t, (ast.Tuple, ast.List)):
        return any(_target_binds(e, name) for e in t.elts)
    if isinstance(t, ast.Starred):
        return _target_binds(t.value, name)
    return False


def _stmt_binds(s: ast.stmt, name: str) -> bool:
    if isinstance(s, ast.Assign):
        return any(_target_binds(t, name) for t in s.targets)
    if isinstance(s, ast.AnnAssign):
        return s.value is not None and _target_binds(s.target, name)
    if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return s.name == name
    if isinstance(s, (ast.Import, ast.ImportFrom)):
        return any((a.asname or a.name.split(".")[0]) == name for a in s.names)
    if isinstance(s, (ast.With, ast.AsyncWith)):
        return any(i.optional_vars is not None and _target_binds(i.optional_vars, name) for i in s.items) or _binds(s.body, name)
    if isinstance(s, ast.If):
        return _binds(s.body, name) and _binds(s.orelse, name)
    if isinstance(s, ast.Try):
        return (_binds(s.body, name) and all(_binds(h.body, name) for h in s.handlers)) or _binds(s.finalbody, name)
    if isinstance(s, ast.Expr) and isinstance(s.value, ast.NamedExpr):
        return _target_binds(s.value.target, name)
    return False


def maybe_unbound(m: SemanticModel, name: str, stmt: ast.stmt) -> bool:
    """``name`` is a local of the function around ``stmt`` (assigned in it, not a
    parameter, ``global`` or ``nonlocal``) and some path reaches ``stmt`` without binding it
    (module-level code and names bound elsewhere: False, not claimed)."""
    func = m.enclosing_function(stmt)
    if func is None or not isinstance(func, FUNCTIONS):
        return False
    params = set(m.params(func)) | {a.arg for a in (func.args.vararg, func.args.kwarg) if a is not None}
    if name in params:
        return False
    inside = [n for n in ast.walk(func) if m.enclosing_function(n) is func]
    if any(isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names for n in inside):
        return False
    if not any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in inside):
        return False  # not a local: a global or a closure's
    node: ast.AST = stmt
    while node is not func:
        parent = m.parent(node)
        if parent is None:
            return False
        block = m.block_of(node) if isinstance(node, ast.stmt) else None
        if block is not None:
            stmts = block[2]
            before = stmts[: next(i for i, s in enumerate(stmts) if s is node)]
            if _binds(before, name):
                return False
            if isinstance(parent, ast.For) and block[1] == "body" and _target_binds(parent.target, name):
                return False
            if isinstance(parent, (ast.With, ast.AsyncWith)) and block[1] == "body" and any(
                    i.optional_vars is not None and _target_binds(i.optional_vars, name) for i in parent.items):
                return False
        node = parent
    return True


def binding_conditions(m: SemanticModel, name: str, stmt: ast.stmt) -> List[ast.If]:
    """The ``if`` statements (outermost first) that hold every earlier binding of ``name``
    in the function around ``stmt``: one whose test holds binds it."""
    func = m.enclosing_function(stmt)
    stores = [n for n in ast.walk(func or m.tree) if isinstance(n, ast.Name) and n.id == name
              and isinstance(n.ctx, ast.Store) and n.lineno < stmt.lineno]
    common: Optional[List[ast.If]] = None
    for n in stores:
        ifs = [a for a in m.ancestors(n) if isinstance(a, ast.If) and not m.contains(a, stmt)
               and (func is None or m.contains(func, a)) and any(m.contains(b, n) or b is n for b in a.body)]
        ifs.reverse()
        common = ifs if common is None else [i for i in common if i in ifs]
    return common or []
