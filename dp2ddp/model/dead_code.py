"""Code that never runs: the body of an ``if`` whose test is false whatever the run.

A test is false when it is a false constant (``if False:``, ``if 0:``), a name of the same
function that every binding sets to a false constant (``create_subset = False``, or by
position in ``a, b = False, False``, as yolov5's datasets switch off their debugging
branches), ``not`` of a true one, or an ``and`` with such an operand. What lies under such a
test makes no effect a rule has to answer for: a folder it deletes is never deleted.
"""

from __future__ import annotations

import ast
from typing import Any, Optional

SemanticModel = Any  # the model (dp2ddp.model.core) asks this module from its call graph: no import back


def never_runs(m: SemanticModel, node: ast.AST) -> bool:
    """``node`` lies in the body of an ``if`` whose test is always false (or the ``else`` of
    one that is always true)."""
    child = node
    for a in m.ancestors(node):
        if isinstance(a, ast.If) and child is not a.test:
            value = constant_truth(m, a.test)
            if value is False and any(s is child for s in a.body):
                return True
            if value is True and any(s is child for s in a.orelse):
                return True
        if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            return False
        child = a
    return False


def constant_truth(m: SemanticModel, test: ast.AST) -> Optional[bool]:
    """The truth of ``test`` when it is the same on every run, else ``None``."""
    if isinstance(test, ast.Constant):
        return bool(test.value)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = constant_truth(m, test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        values = [constant_truth(m, v) for v in test.values]
        if isinstance(test.op, ast.And):
            return False if False in values else (True if all(v is True for v in values) else None)
        return True if True in values else (False if all(v is False for v in values) else None)
    if isinstance(test, ast.Name):
        return _name_truth(m, test)
    return None


def _name_truth(m: SemanticModel, name: ast.Name) -> Optional[bool]:
    """Every binding of the local ``name`` assigns one constant, and all agree."""
    scope = m.scope_of(name)
    if scope.kind != "function":
        return None  # a module global may be set from elsewhere
    where, bindings = m.lookup(name.id, scope)
    if where is not scope or not bindings:
        return None
    truths = set()
    for b in bindings:
        stmt = b.node if b.kind == "assign" else m.parent(b.node) if b.kind == "unpack" else None  # ``a, b = False, False``
        if not isinstance(stmt, ast.Assign):
            return None
        value = _bound_value(stmt, b.target)
        if not isinstance(value, ast.Constant):
            return None
        truths.add(bool(value.value))
    return truths.pop() if len(truths) == 1 else None


def _bound_value(stmt: ast.Assign, target: Optional[ast.AST]) -> Optional[ast.AST]:
    if len(stmt.targets) != 1 or target is None:
        return None
    t = stmt.targets[0]
    if t is target:
        return stmt.value
    if isinstance(t, (ast.Tuple, ast.List)) and isinstance(stmt.value, (ast.Tuple, ast.List)) and len(t.elts) == len(stmt.value.elts):
        for e, v in zip(t.elts, stmt.value.elts):
            if e is target:
                return v
    return None
