"""Loops over a training loader that only compute a statistic of its batches.

:func:`statistic_loops`: class weights or a mean over the training set, summed over the
loader before training (not a training loop, not an evaluation, nothing but arithmetic on
the batch).
"""

from __future__ import annotations

import ast
from typing import List, Tuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.training import trains, training_loops, under_no_grad
from dp2ddp.model.training_feeds import iterated


def statistic_loops(m: SemanticModel, loaders: List[ast.Call]) -> List[Tuple[ast.For, ast.Call]]:
    """Loops over one of ``loaders`` (the DataLoader calls the migration shards; the loader
    itself, not a value of its batches: ``for ref in ref_imgs``) that only compute a statistic
    of its batches (class weights or a mean over the training set before training:
    deep-person-reid's attribute recognition sums its labels over ``trainloader``), with the
    loader each reads. Not one: a training loop or one inside it (its steps may be a model
    class's methods), a loop that ``break``s (a peek at the first batch), one that runs the
    model or runs under ``no_grad`` (an evaluation over the training set, whose metric each
    rank reports over its share: a number printed, not a value training uses), or one that
    calls anything but arithmetic on its batch (:func:`_only_batch_arithmetic`)."""
    from dp2ddp.model.flow import origins
    from dp2ddp.model.uses import dp_wrapper_uses

    calls = {id(c): c for c in loaders}
    training = {id(lp) for lp in training_loops(m)}
    out: List[Tuple[ast.For, ast.Call]] = []
    for loop in m.nodes(ast.For):
        hit = next((calls[id(n)] for v in iterated(loop.iter) for n, path in origins(m, v) if id(n) in calls and not path), None)  # type: ignore[attr-defined]
        if hit is None or id(loop) in training or trains(m, loop) or under_no_grad(m, loop):
            continue
        if any(isinstance(a, ast.For) and (id(a) in training or trains(m, a)) for a in m.ancestors(loop)):
            continue
        if any(isinstance(s, ast.Break) for s in loop.body):  # type: ignore[attr-defined]
            continue
        if any(u.kind == "forward" and m.contains(loop, u.node) for u in dp_wrapper_uses(m)):
            continue
        if _only_batch_arithmetic(m, loop):  # type: ignore[arg-type]
            out.append((loop, hit))  # type: ignore[arg-type]
    return out


def _only_batch_arithmetic(m: SemanticModel, loop: ast.For) -> bool:
    """Every call in ``loop`` is arithmetic on its batch: a method of a value the loop binds
    (``attrs.sum(0)``), or a function of torch, numpy, math or the builtins."""
    local = {n.id for n in ast.walk(loop) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for c in ast.walk(loop):
        if not isinstance(c, ast.Call):
            continue
        f = c.func
        if isinstance(f, ast.Attribute):
            root = f.value
            while isinstance(root, (ast.Attribute, ast.Subscript, ast.Call)):
                root = root.func if isinstance(root, ast.Call) else root.value
            if isinstance(root, ast.Name) and root.id in local:
                continue
        q = m.qualified_names(f)
        if q and all(x.split(".", 1)[0] in ("torch", "numpy", "math", "builtins") for x in q):
            continue
        return False
    return True
