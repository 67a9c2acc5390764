"""Losses whose scale depends on how the batch is split.

A ``reduction="sum"`` loss (a ``torch.nn`` loss class or functional) adds up over the
samples a process sees. DataParallel computes it over the whole batch; under DDP each
process sums its share and the gradients are *averaged* across processes, so every step
is 1/world_size of DataParallel's. A summed loss divided by the size of its batch where it
is computed (``F.mse_loss(out, y, reduction="sum") / (x.size(0) * 2)``, the DnCNN shape) is a
mean: each rank's share is as large as every other's, so the average of the ranks' means
is the original's mean, and nothing is reported.
"""

from __future__ import annotations

import ast
from typing import List, NamedTuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.syntax import first_dim_of, kwarg


def sum_reductions(m: SemanticModel) -> List[ast.keyword]:
    """The ``reduction="sum"`` arguments of ``torch.nn`` losses that may train: a loss
    class (made once, used anywhere), or a functional loss outside ``torch.no_grad()``
    that is not in code apart from the module's ``backward`` calls (an evaluation's summed
    loss changes no gradient)."""
    got = m.cache.get("losses:sum")
    if got is None:
        got = []
        for call in m.nodes(ast.Call):
            arg = kwarg(call, "reduction")
            if arg is not None and isinstance(arg.value, ast.Constant) and arg.value.value == "sum":
                names = m.qualified_names(call.func)
                if not any(q.startswith("torch.nn.") for q in names):
                    continue
                functional = any(q.startswith("torch.nn.functional.") for q in names)
                if functional and (_no_grad(m, call) or not _trains_here(m, call)):
                    continue
                if _per_batch_mean(m, call, functional):
                    continue
                got.append(arg)
        m.cache["losses:sum"] = got
    return got  # type: ignore[return-value]


def _no_grad(m: SemanticModel, node: ast.AST) -> bool:
    from dp2ddp.model.training import under_no_grad

    return under_no_grad(m, node)


def _trains_here(m: SemanticModel, node: ast.AST) -> bool:
    """The function around ``node`` (or module-level code) reaches a ``.backward()`` — itself,
    through what it calls, or in a caller (a loss helper called from the training step).
    A module that calls ``backward`` nowhere (a module of losses, a snippet) may train
    anywhere: it counts as training."""
    if not any(isinstance(c.func, ast.Attribute) for c in m.calls_spelled("backward")):
        return True
    func = m.enclosing_function(node)
    scopes = [func] if func is not None else [m.tree]
    if func is not None:
        scopes += [m.enclosing_function(c) or m.tree for c in m.call_sites(func)]
    for scope in scopes:
        calls = m.calls_in(scope) if scope is m.tree else m.reached_calls(scope)
        if any(isinstance(c.func, ast.Attribute) and c.func.attr == "backward" for c in calls):
            return True
    return False


def _per_batch_mean(m: SemanticModel, call: ast.Call, functional: bool) -> bool:
    """Every use of the summed loss is divided by the size of a batch: the functional call
    itself, or each call of the name a loss class is bound to (``criterion = nn.MSELoss(
    reduction="sum")`` ... ``criterion(out, y) / (img.size()[0] * 2)``)."""
    if functional:
        return _divided_by_batch(m, call)
    stmt = m.parent(call)
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
        return False
    uses = _class_uses(m, call)
    return bool(uses) and all(_divided_by_batch(m, c) for c in uses)


def _divided_by_batch(m: SemanticModel, node: ast.AST) -> bool:
    parent = m.parent(node)
    if not (isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Div) and parent.left is node):
        return False
    todo = [parent.right]
    while todo:
        e = todo.pop()
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult):
            todo += [e.left, e.right]
        elif first_dim_of(e) is not None:
            return True
    return False


# torch.nn losses whose mean is over the targets that are not ``ignore_index``
_IGNORING = frozenset({"CrossEntropyLoss", "NLLLoss", "cross_entropy", "nll_loss"})


class ValidMean(NamedTuple):
    """A loss averaged over the valid targets of the batch it sees (``ignore_index``): a
    count that differs from share to share. DataParallel gathered the outputs and averaged
    over the whole batch's valid targets; under DDP each rank averages over its own, and the
    gradients are averaged over the ranks: a mean of means, the shares weighted alike."""

    call: ast.Call  # the loss computed in the training step (a use of the class, or the functional call)
    target: ast.AST  # its target argument
    ignore: ast.AST  # the ignore_index expression
    made: ast.Call  # where the loss is made (the class's construction, or the functional call)


def valid_count_means(m: SemanticModel) -> List[ValidMean]:
    """Losses with an explicit ``ignore_index`` and the default mean reduction, computed in
    the training step of this module on what the model returned: not inside a module's
    ``forward`` (under DataParallel each replica computed those on its own share already),
    not under ``torch.no_grad()``, and without class ``weight=`` (a weighted mean divides by
    the targets' weights: not handled, nothing found). A loss class is followed to the calls
    of the name or attribute it is bound to."""
    got = m.cache.get("losses:valid")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[ValidMean] = []
    for made in m.nodes(ast.Call):
        names = m.qualified_names(made.func)
        if not any(q.startswith("torch.nn.") and q.rsplit(".", 1)[-1] in _IGNORING for q in names):
            continue
        ignore = kwarg(made, "ignore_index")
        reduction = kwarg(made, "reduction")
        if ignore is None or kwarg(made, "weight") is not None or kwarg(made, "size_average") is not None:
            continue
        if reduction is not None and not (isinstance(reduction.value, ast.Constant) and reduction.value.value == "mean"):
            continue
        functional = any(q.startswith("torch.nn.functional.") for q in names)
        uses = [made] if functional else _class_uses(m, made)
        for use in uses:
            if _in_forward(m, use) or _no_grad(m, use) or not _trains_here(m, use):
                continue
            target = kwarg(use, "target")
            value = target.value if target is not None else use.args[1] if len(use.args) > 1 else None
            if value is None or isinstance(value, ast.Starred) or any(isinstance(a, ast.Starred) for a in use.args):
                continue
            if not (_constant(ignore.value) or m.enclosing_function(use) is m.enclosing_function(made)
                    or _same_binding(m, ignore.value, made, use)):
                continue  # ``ignore_index=self.ignore`` read where the loss is made, not where it is used
            out.append(ValidMean(use, value, ignore.value, made))
    m.cache["losses:valid"] = out
    return out


def _class_uses(m: SemanticModel, made: ast.Call) -> List[ast.Call]:
    """The calls of a loss object: ``criterion(out, y)`` after ``criterion = nn.X(...)`` (a
    name or ``self.attr`` bound once), or ``nn.X(...)(out, y)``."""
    parent = m.parent(made)
    if isinstance(parent, ast.Call) and parent.func is made:
        return [parent]
    if not (isinstance(parent, ast.Assign) and parent.value is made and len(parent.targets) == 1):
        return []
    target = parent.targets[0]
    if not isinstance(target, (ast.Name, ast.Attribute)):
        return []
    text = m.source(target)
    return [c for c in m.nodes(ast.Call) if isinstance(c.func, (ast.Name, ast.Attribute)) and m.source(c.func) == text]


def _in_forward(m: SemanticModel, node: ast.AST) -> bool:
    from dp2ddp.model.kinds import is_module_class

    func = m.enclosing_function(node)
    return func is not None and getattr(func, "name", "") == "forward" and is_module_class(m, m.enclosing_class(func))


def _constant(e: ast.AST) -> bool:
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
        e = e.operand
    return isinstance(e, ast.Constant) and isinstance(e.value, int)


def _same_binding(m: SemanticModel, e: ast.AST, made: ast.AST, use: ast.AST) -> bool:
    """``ignore_index=PAD``: a name that means the same binding where the loss is used (a
    module-level constant) as where it is made."""
    if not isinstance(e, ast.Name):
        return False
    _, here = m.lookup(e.id, m.scope_of(made))
    _, there = m.lookup(e.id, m.scope_of(use))
    return bool(here) and [id(b) for b in here] == [id(b) for b in there]
