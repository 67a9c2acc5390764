"""Losses averaged over a data-dependent count: under DDP a mean of the ranks' means, the
shares weighted alike. The count of valid targets of a loss with ``ignore_index``
(:class:`ValidMean`), and a loss divided by a count the script computes from its batch
(``(loss * mask).sum() / mask.sum()``, ``loss / num_pos``: :class:`CountMean`)."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Dict, List, NamedTuple, Optional

from dp2ddp.model.batch_counts import data_count
from dp2ddp.model.batch_coupling import bodies_when_called, in_batch_losses, project_callables
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.loss_calls import class_uses, in_forward, shared_binding, trains_here
from dp2ddp.model.project_defs import path_of
from dp2ddp.model.syntax import FUNCTIONS, kwarg, summing_keyword
from dp2ddp.model.training import under_no_grad

if TYPE_CHECKING:
    from dp2ddp.model.loss_terms import Division


# torch.nn losses whose mean is over the targets that are not ``ignore_index``
_IGNORING = frozenset({"CrossEntropyLoss", "NLLLoss", "cross_entropy", "nll_loss"})


class CountMean(NamedTuple):
    """A loss the training step divides by a count it sums from the batch (the valid tokens
    of a padded batch, ``mask.sum()``; the matched anchors, ``(iou > t).sum()``; the sum of
    the samples' weights): DataParallel divided the whole batch's sum by the whole batch's
    count; under DDP each rank divides its share's sum by its share's count, and the ranks'
    gradients are averaged, a mean of means. Dividing by the count summed over the ranks
    (divided by the world size) gives the original's gradient."""

    division: ast.BinOp  # ``sum / count`` in the loss a backward differentiates
    count: ast.AST  # the count: a ``.sum()`` of a mask, weights or a comparison of the batch, or a name bound to one


def count_means(m: SemanticModel) -> List[CountMean]:
    """Terms of a loss a training backward differentiates (:func:`_divisions`) that are a
    division by a count summed from the data (a division inside a term, such as logits
    divided by a count, is not the loss's normaliser, and the count of every rank's share
    over the world size would not give its value): a ``.sum()`` (``torch.sum``, ``count_nonzero``), under
    ``max(1, ...)``/``.clamp(min=...)``/``float()``/``.float()`` if it is, of a comparison
    (``tgt != pad``) or of a name bound to one, or of a field of the batch the loop iterates
    (``batch["attention_mask"]``). Nothing that may carry a gradient: a sum of the model's
    output divides its gradient too, and is not a count."""
    got = m.cache.get("losses:counts")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[CountMean] = []
    for d in _divisions(m):
        count = data_count(m, d.divisor)
        if count is not None:
            out.append(CountMean(d.node, count))
    m.cache["losses:counts"] = out
    return out


def _divisions(m: SemanticModel) -> List["Division"]:
    """The divisions of the losses training backward passes differentiate by their batch's
    size or a count of it (:func:`dp2ddp.model.loss_terms.loss_divisions`: a division inside a
    term, such as logits divided by a count, is not the loss's normaliser), outside a
    module's ``forward`` and ``torch.no_grad()``; each once."""
    got = m.cache.get("losses:divisions")
    if got is not None:
        return got  # type: ignore[return-value]
    from dp2ddp.model.loss_terms import loss_divisions
    from dp2ddp.model.losses import trains_parameters
    from dp2ddp.model.steps import backward_calls, differentiated

    out = []
    seen = set()
    for call in backward_calls(m):
        operand = differentiated(m, call)
        if operand is None or not trains_parameters(m, call) or in_forward(m, call):
            continue
        for d in loss_divisions(m, operand):
            if id(d.node) in seen or in_forward(m, d.node) or under_no_grad(m, d.node):
                continue
            seen.add(id(d.node))
            out.append(d)
    m.cache["losses:divisions"] = out
    return out


class BatchMean(NamedTuple):
    """A loss that is a mean over its batch divided by the batch's size again (DeepLab's
    ``batch_average``: ``loss = criterion(out, y); loss /= n``). DataParallel divided the
    whole batch's mean by the whole batch's size; under DDP each rank divides its share's
    mean by its share's size, world_size times smaller, and the gradients are averaged: each
    step world_size times the original's. Dividing by the whole batch's size (every rank's
    share is as large: the migration's loaders pad to equal shares) gives the original's."""

    division: ast.AST  # ``loss / n``, or the ``loss /= n`` statement
    size: ast.AST  # the batch size it divides by
    mixed: Optional[ast.AST] = None  # a term divided with the mean that is no mean dp2ddp can name (a sum, or unknown)


def batch_means(m: SemanticModel) -> List[BatchMean]:
    """Divisions of a training loss by its batch's size (:func:`_divisions`) where a term
    divided is a mean over the batch: a ``torch.nn`` loss with the mean reduction (a class
    followed to its calls, or a functional), ``.mean()`` or ``torch.mean(x)``. A sum divided
    by its batch's size is a mean, right as it is: left alone. Where the mean is divided
    together with another term, ``mixed`` names it."""
    got = m.cache.get("losses:batch-means")
    if got is not None:
        return got  # type: ignore[return-value]
    from dp2ddp.model.loss_terms import batch_size_of

    kinds = _mean_or_sum_uses(m)
    out: List[BatchMean] = []
    for d in _divisions(m):
        if not batch_size_of(m, d.divisor):
            continue
        verdicts = [kinds.get(id(t)) or _reduced(m, t) for t in d.inner]
        if "mean" not in verdicts:
            continue
        other = next((t for t, v in zip(d.inner, verdicts) if v != "mean"), None)
        out.append(BatchMean(d.node, d.divisor, other))
    m.cache["losses:batch-means"] = out
    return out


_LOSS_SUFFIXES = ("Loss", "_loss", "cross_entropy", "kl_div", "binary_cross_entropy")


def _mean_or_sum_uses(m: SemanticModel) -> Dict[int, str]:
    """id(call of a ``torch.nn`` loss) -> "mean" or "sum", by the reduction where it is made."""
    out = {}
    for made in m.nodes(ast.Call):
        names = [q for q in m.qualified_names(made.func) if q.startswith("torch.nn.")]
        if not names or not names[0].endswith(_LOSS_SUFFIXES):
            continue
        kind = _reduction(made)
        if kind is None:
            continue
        functional = names[0].startswith("torch.nn.functional.")
        for use in [made] if functional else class_uses(m, made):
            out[id(use)] = kind
    return out


def _reduction(made: ast.Call) -> Optional[str]:
    if summing_keyword(made) is not None:
        return "sum"
    reduction = kwarg(made, "reduction")
    if kwarg(made, "size_average") is not None or kwarg(made, "reduce") is not None:
        return None
    if reduction is None or (isinstance(reduction.value, ast.Constant) and reduction.value.value == "mean"):
        return "mean"
    return None


def _reduced(m: SemanticModel, t: ast.AST) -> Optional[str]:
    """``x.mean()``/``torch.mean(x)``: "mean"; ``x.sum()``/``torch.sum(x)``: "sum"."""
    if not isinstance(t, ast.Call) or t.keywords:
        return None
    if isinstance(t.func, ast.Attribute) and t.func.attr in ("mean", "sum") and not t.args:
        return t.func.attr
    for what in ("mean", "sum"):
        if m.is_name(t.func, {f"torch.{what}"}) and len(t.args) == 1:
            return what
    return None


class ValidMean(NamedTuple):
    """A loss averaged over the valid targets of the batch it sees (``ignore_index``): a
    count that differs from share to share. DataParallel gathered the outputs and averaged
    over the whole batch's valid targets; under DDP each rank averages over its own, and the
    gradients are averaged over the ranks: a mean of means, the shares weighted alike."""

    call: ast.Call  # the loss computed in the training step (a use of the class, or the functional call)
    target: ast.AST  # its target argument
    ignore: ast.AST  # the ignore_index expression
    made: ast.Call  # where the loss is made (the class's construction, or the functional call)
    shared: Optional[ast.AST] = None  # another loss bound to the same name (``criterion = CTCLoss()`` on another branch)


def _ignoring_class(names) -> bool:
    """One of ``names`` (qualified) is a ``torch.nn`` loss that averages over the targets that
    are not ``ignore_index``."""
    return any(q.startswith("torch.nn.") and q.rsplit(".", 1)[-1] in _IGNORING for q in names)


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
        if not _ignoring_class(names):
            continue
        ignore = kwarg(made, "ignore_index")
        reduction = kwarg(made, "reduction")
        if ignore is None or kwarg(made, "weight") is not None or kwarg(made, "size_average") is not None:
            continue
        if reduction is not None and not (isinstance(reduction.value, ast.Constant) and reduction.value.value == "mean"):
            continue
        functional = any(q.startswith("torch.nn.functional.") for q in names)
        uses = [made] if functional else class_uses(m, made)
        shared = None if functional else shared_binding(m, made)
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
            out.append(ValidMean(use, value, ignore.value, made, shared))
    m.cache["losses:valid"] = out
    return out


def count_mean_when_called(pm: SemanticModel, node: ast.AST, rel: str, depth: int = 0,
                           seen: Optional[set] = None) -> Optional[str]:
    """``path:line`` of a loss term that calling ``node`` (a function or a loss class of
    module ``pm``, at ``rel`` from the script's folder) averages over a count of its batch: a
    division by a count summed from the data (:func:`data_count`), or a ``torch.nn`` loss
    with ``ignore_index`` (a mean over the valid targets) — in its body, in the functions of
    its module it calls (a closure's sibling ``get_rpn_loss``), or in the project's (three
    calls deep). Not what is only read (under ``.item()``/``.detach()``, or
    ``torch.no_grad()``): a metric divides too. Code in another module that trains calls it
    on its own share under DDP, and the rewrite of the script cannot put the count of every
    rank's share inside it."""
    seen = set() if seen is None else seen
    if depth > 3 or id(node) in seen:
        return None
    seen.add(id(node))
    for body in bodies_when_called(pm, node):
        for n in ast.walk(body):
            divisor = (n.right if isinstance(n, ast.BinOp) else n.value) if isinstance(n, (ast.BinOp, ast.AugAssign)) and isinstance(n.op, ast.Div) else None
            ignoring = (isinstance(n, ast.Call) and kwarg(n, "ignore_index") is not None
                        and _ignoring_class(pm.qualified_names(n.func)))
            if (ignoring or (divisor is not None and data_count(pm, divisor) is not None)) and not _only_read(pm, n):
                return f"{rel}:{n.lineno}" if rel else f"line {n.lineno}"
        for call in (n for n in ast.walk(body) if isinstance(n, ast.Call)):
            target = pm.resolve_call(call)
            if isinstance(target, FUNCTIONS) and target is not node:
                got = count_mean_when_called(pm, target, rel, depth + 1, seen)
            else:  # every class or function the call may run (a factory's picks too)
                got = next((g for found in project_callables(pm, call) if found[1] is not node
                            for g in [count_mean_when_called(found[0], found[1], path_of(found, pm, rel), depth + 1, seen)]
                            if g is not None), None)
            if got is not None:
                return got
    return None


class ProjectCountMean(NamedTuple):
    """A loss of the project's code, called in this script's training step, that averages
    over a count of its batch (:func:`count_mean_when_called`)."""

    call: ast.Call  # ``self.criterion(output, target)``
    name: str  # what it runs (``CrossEntropyLoss``)
    where: str  # the count: ``utils/loss.py:23``
    own: bool = False  # a loss class of this script (its forward not followed by the count rewrite)


def project_count_means(m: SemanticModel) -> List[ProjectCountMean]:
    """Calls in this script's training loops (outside ``torch.no_grad()``) of project code
    that averages the loss over a count of its batch: a project loss class or function, or
    a method a project factory returns (DeepLab's ``build_loss(mode)``: every method it may
    return counts). Not the wrapped model's forward: DataParallel already ran that on each
    share. The script's rewrite cannot put the count of every rank's share inside them."""
    from dp2ddp.model.collectives import var_key
    from dp2ddp.model.training import training_loops
    from dp2ddp.model.uses import dp_wrapper_keys

    got = m.cache.get("losses:project_counts")
    if got is not None:
        return got  # type: ignore[return-value]
    keys = dp_wrapper_keys(m)
    feeds = _feeding_backward(m)
    out: List[ProjectCountMean] = []
    seen: set = {id(b.node) for b in in_batch_losses(m)}  # refused as coupling the batch already (DDP153)
    for loop in training_loops(m):
        for call in m.reached_calls(loop):
            if id(call) in seen or id(call) not in feeds or under_no_grad(m, call) or in_forward(m, call):
                continue
            seen.add(id(call))
            if isinstance(call.func, (ast.Name, ast.Attribute)) and var_key(m, call.func) in keys:
                continue  # the wrapped model's forward
            for pm, node, rel in project_callables(m, call):
                if id(node) in seen:
                    break  # that loss named once, where the step first calls it
                where = count_mean_when_called(pm, node, rel)
                if where is not None:
                    seen.add(id(node))
                    out.append(ProjectCountMean(call, getattr(node, "name", "?"), where, pm is m))
                    break
    m.cache["losses:project_counts"] = out
    return out


def _feeding_backward(m: SemanticModel) -> set:
    """The calls whose values a training backward differentiates: the loss it is called on,
    followed through the names it is made of to what binds them (``loss = self.criterion(out,
    y)``, ``loss = a + b``), not a metric the step only logs."""
    from dp2ddp.model.flow import origins
    from dp2ddp.model.steps import backward_calls, differentiated

    out: set = set()
    todo = [differentiated(m, b) for b in backward_calls(m)]
    seen: set = set()
    while todo and len(seen) < 2000:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        for n in ast.walk(e):
            if isinstance(n, ast.Call):
                out.add(id(n))
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                todo.extend(o for o, _ in origins(m, n))
    return out


def _only_read(m: SemanticModel, node: ast.AST) -> bool:
    """``node`` is computed to be read, not differentiated: under ``torch.no_grad()``, or
    inside ``.item()``/``.detach()``/``.cpu()`` or ``float(...)`` of its statement."""
    if under_no_grad(m, node):
        return True
    for a in m.ancestors(node):
        if isinstance(a, ast.stmt):
            return False
        if isinstance(a, ast.Call) and ((isinstance(a.func, ast.Attribute) and a.func.attr in ("item", "detach", "cpu", "tolist"))
                                        or m.is_name(a.func, {"builtins.float"})):
            return True
    return False


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

