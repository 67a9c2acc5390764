"""Losses averaged over a data-dependent count of valid targets (``ignore_index``): under
DDP a mean of the ranks' means, the shares weighted alike (:class:`ValidMean`)."""

from __future__ import annotations

import ast
from typing import List, NamedTuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.loss_calls import class_uses, in_forward, trains_here
from dp2ddp.model.syntax import kwarg
from dp2ddp.model.training import under_no_grad


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
        uses = [made] if functional else class_uses(m, made)
        for use in uses:
            if in_forward(m, use) or under_no_grad(m, use) or not trains_here(m, use):
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

