"""Whether every rank runs a statement the same number of times.

A barrier or a broadcast the migration puts at a statement pairs up across the ranks only
where each rank passes the statement alike: each loop around it iterates a value that is
the same on every rank and each ``if`` around it tests one (:func:`same_passes`).
"""

from __future__ import annotations

import ast
from typing import Set

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.writers_setup import setup_calls

_ALIKE_CALLS = frozenset({"sorted", "list", "tuple", "enumerate", "len", "reversed", "range", "zip"})
_ALIKE_METHODS = frozenset({"items", "keys", "values", "get"})


def same_passes(m: SemanticModel, stmt: ast.stmt, training: bool = False) -> bool:
    """Every rank runs ``stmt`` the same number of times: each loop around it (in its
    function) iterates a value that is the same on every rank, and each ``if`` around it
    tests one (``for phase, o in sorted(opt["datasets"].items()): if phase == "train":``,
    ``opt`` from a set-up call every rank gets from rank 0). A barrier before and after it
    then pairs up across the ranks on every pass. With ``training``, a loop whose every pass
    trains counts as alike too: DDP's collectives in it already need every rank to take its
    passes together (an epoch loop that breaks on an early stop), and a barrier there pairs
    up as surely as they do."""
    from dp2ddp.model.training import trains

    func = m.enclosing_function(stmt)
    targets: Set[str] = set()
    around = []
    for a in m.ancestors(stmt):
        if a is func:
            break
        around.append(a)
    for a in reversed(around):  # outermost first: a loop's targets are alike inside it
        if training and isinstance(a, (ast.For, ast.While)) and not a.orelse and any(trains(m, s) for s in a.body):
            if isinstance(a, ast.For):
                targets |= {n.id for n in ast.walk(a.target) if isinstance(n, ast.Name)}
            continue
        if isinstance(a, (ast.While, ast.AsyncFor)):
            return False
        if isinstance(a, ast.For):
            if a.orelse or not _alike(m, a.iter, targets):
                return False
            targets |= {n.id for n in ast.walk(a.target) if isinstance(n, ast.Name)}
        elif isinstance(a, ast.If) and not _alike(m, a.test, targets):
            return False
        elif isinstance(a, (ast.Try, ast.With)):
            return False
    return True


def _alike(m: SemanticModel, e: ast.AST, targets: Set[str]) -> bool:
    from dp2ddp.model.rank_alike import same_on_every_rank

    go = lambda x: _alike(m, x, targets)  # noqa: E731
    if isinstance(e, ast.Constant):
        return True
    if isinstance(e, ast.Name):
        return e.id in targets or _from_setup(m, e) or same_on_every_rank(m, e)
    if isinstance(e, ast.Attribute):
        return go(e.value)
    if isinstance(e, ast.Subscript):
        return go(e.value) and go(e.slice)
    if isinstance(e, (ast.Tuple, ast.List, ast.Set)):
        return all(go(x) for x in e.elts)
    if isinstance(e, ast.Dict):
        return all(k is not None and go(k) for k in e.keys) and all(go(v) for v in e.values)
    if isinstance(e, ast.Compare):
        return go(e.left) and all(go(c) for c in e.comparators)
    if isinstance(e, ast.BoolOp):
        return all(go(v) for v in e.values)
    if isinstance(e, ast.UnaryOp):
        return go(e.operand)
    if isinstance(e, ast.Call) and not e.keywords:
        f = e.func
        if isinstance(f, ast.Name) and f.id in _ALIKE_CALLS and m.is_name(f, {f"builtins.{f.id}"}):
            return all(go(a) for a in e.args)
        if isinstance(f, ast.Attribute) and f.attr in _ALIKE_METHODS:
            return go(f.value) and all(go(a) for a in e.args)
    return False


def _from_setup(m: SemanticModel, name: ast.Name) -> bool:
    """Every binding of ``name`` is the result of a set-up call that rank 0 runs for every
    rank (:mod:`rank_zero_setup`): the same object on every rank."""
    ok = {id(s.call) for s in setup_calls(m) if s.refusal is None}
    bindings = m.bindings_of(name)
    return bool(bindings) and all(b.kind == "assign" and isinstance(b.value, ast.Call) and id(b.value) in ok for b in bindings)
