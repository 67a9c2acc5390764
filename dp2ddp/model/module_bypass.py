"""Training forwards that go around the wrapper, through ``.module``.

Under DataParallel, ``model.module(x)`` or ``model.module.compute_loss(x, y)`` runs the bare
model on one GPU: slower than through the wrapper, but the gradients are the model's and
the optimizer steps them. Under DDP the gradients are averaged over the ranks only after a
forward through the wrapper itself (``DistributedDataParallel.forward`` readies its reducer
for the backward pass that follows); a forward through ``.module`` leaves each rank with the
gradients of its own share, and the replicas drift apart with no error.

:func:`bypassing_forwards`: such calls whose result a backward pass differentiates (the loss
is computed from them, through the names bound in the function of the backward call and the
returns of the script's functions it calls), not under ``torch.no_grad()``.
"""

from __future__ import annotations

import ast
from typing import List, NamedTuple, Set

from dp2ddp.model.collectives import var_key
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.steps import backward_calls, differentiated
from dp2ddp.model.syntax import FUNCTIONS
from dp2ddp.model.training import under_no_grad
from dp2ddp.model.uses import MODULE_API


class Bypass(NamedTuple):
    call: ast.Call  # ``model.module(x)`` or ``model.module.compute_loss(x, y)``
    backward: ast.Call  # the backward pass that differentiates its result


def _bypass(m: SemanticModel, node: ast.AST, keys) -> bool:
    """``node`` is ``W.module(...)`` or ``W.module.<method>(...)`` of a wrapper ``W`` (one of
    ``keys``), a method of the model's own (not the ``nn.Module`` API: ``.parameters()``)."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute) and f.attr not in MODULE_API and isinstance(f.value, ast.Attribute) \
            and f.value.attr == "module":
        return var_key(m, f.value.value) in keys
    if isinstance(f, ast.Attribute) and f.attr == "module":
        return var_key(m, f.value) in keys
    return False


def _feeding(m: SemanticModel, expr: ast.AST, func, seen: Set[int], depth: int = 0):
    """The nodes ``expr`` is computed from: its own, and those of the values bound to the
    names it reads in the same function (``loss = criterion(out, y)`` after ``out =
    model.module(x)``)."""
    if id(expr) in seen or depth > 8:
        return
    seen.add(id(expr))
    for n in ast.walk(expr):
        yield n
        target = m.resolve_call(n) if isinstance(n, ast.Call) else None
        if isinstance(target, FUNCTIONS):  # ``step_loss(model, x, y)``: what its returns compute
            for r in ast.walk(target):
                if isinstance(r, ast.Return) and r.value is not None and m.enclosing_function(r) is target:
                    yield from _feeding(m, r.value, target, seen, depth + 1)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            for b in m.bindings_of(n):
                if b.kind not in ("assign", "augassign") or m.enclosing_function(b.node) is not func:
                    continue
                value = b.value if b.value is not None else getattr(b.node, "value", None)
                if value is not None:
                    yield from _feeding(m, value, func, seen, depth + 1)


def bypassing_forwards(m: SemanticModel, keys) -> List[Bypass]:
    """Forwards through ``.module`` of a wrapper in ``keys`` that a backward pass
    differentiates (see the module docstring)."""
    out: List[Bypass] = []
    if not keys:
        return out
    for b in backward_calls(m):
        loss = differentiated(m, b)
        if loss is None or under_no_grad(m, b):
            continue
        func = m.enclosing_function(b)
        for n in _feeding(m, loss, func, set()):
            if _bypass(m, n, keys) and not under_no_grad(m, n):
                out.append(Bypass(n, b))  # type: ignore[arg-type]
                break
    return out
