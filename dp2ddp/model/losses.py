"""Losses whose scale depends on how the batch is split.

A ``reduction="sum"`` loss (a ``torch.nn`` loss class or functional) adds up over the
samples a process sees. DataParallel computes it over the whole batch; under DDP each
process sums its share and the gradients are *averaged* across processes, so every step
is 1/world_size of DataParallel's. A summed loss divided by the size of its batch where it
is computed (``F.mse_loss(out, y, reduction="sum") / (x.size(0) * 2)``, the DnCNN shape) is a
mean: each rank's share is as large as every other's, so the average of the ranks' means
is the original's mean, and nothing is reported.

Where a summing loss is made: :mod:`dp2ddp.model.loss_totals`; the terms a loss expression
adds up: :mod:`dp2ddp.model.loss_terms`.
"""

from __future__ import annotations

import ast
from typing import Dict, List, NamedTuple, Optional, Set, Tuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.loss_calls import class_uses, shared_binding, trains_here
from dp2ddp.model.loss_terms import batch_size_of, loss_terms
from dp2ddp.model.loss_totals import made_sums, not_a_total
from dp2ddp.model.training import under_no_grad


class SumLoss(NamedTuple):
    """A use of a summed ``torch.nn`` loss in training. ``scalable``: every backward it
    reaches differentiates a sum of summed losses (times factors the same on every rank),
    so multiplying each by the world size gives DataParallel's step exactly (DDP averages
    the ranks' gradients of their shares' sums); else ``reason`` says what stands in the
    way: another term of the loss, or no backward dp2ddp can follow it to."""

    arg: ast.AST  # reduction="sum" / size_average=False, or the project's loss class that returns a total
    made: ast.Call  # the loss class's construction, or the functional call
    use: ast.Call  # the call that computes it
    scalable: bool
    reason: str


def what_sums(m: SemanticModel, arg: ast.AST) -> str:
    """How a :class:`SumLoss` sums, for a message: its argument, or its class's total."""
    if isinstance(arg, ast.ClassDef):
        forward = m.methods(arg).get("forward")
        where = m.cache.get("losses:class-files", {}).get(id(arg))
        some = " on one path" if not_a_total(m, arg) is not None else ""
        return (f"{arg.name}.forward returns a total{some}, {where[1] + ' ' if where else ''}"
                f"line {getattr(forward, 'lineno', arg.lineno)}")
    return m.source(arg)


def _fed_by_the_model(m: SemanticModel, use: ast.Call) -> bool:
    """An argument of the loss call is the wrapped model's output (the call itself, or a
    name bound to it in the same function): a total over the batch's samples."""
    from dp2ddp.model.collectives import is_wrapped_forward

    for a in use.args:
        if isinstance(a, ast.Call) and is_wrapped_forward(m, a, dp=True):
            return True
        if isinstance(a, ast.Name):
            _, bindings = m.lookup(a.id, m.scope_of(a))
            if bindings and all(isinstance(v, ast.Call) and is_wrapped_forward(m, v, dp=True)
                                for v in map(lambda b: _bound_value(m, b), bindings)):
                return True
    return False


def _bound_value(m: SemanticModel, binding) -> Optional[ast.AST]:
    """What a binding assigns: its value, or for one name of an unpacked tuple
    (``recon, mu, logvar = model(x)``) the whole value unpacked."""
    if binding.kind == "assign":
        return binding.value
    if binding.kind == "unpack":
        parent = m.parent(binding.node)
        if isinstance(parent, ast.Assign) and binding.node in parent.targets:
            return parent.value
    return None


def summed_losses(m: SemanticModel) -> List[SumLoss]:
    """Every use in training of a ``torch.nn`` loss that sums over the samples it sees: a
    loss class (followed to the calls of the name it is bound to) or a functional loss;
    not the ones divided by their batch's size (means), computed under ``torch.no_grad()``
    or in code that reaches no backward, read only as a number (``.item()``), passed
    through a function of this module that multiplies by the world size (already scaled),
    or reaching only a backward whose loop steps no optimizer of model parameters (an
    attack's input gradient: each sample's gradient is the same whoever sums it)."""
    got = m.cache.get("losses:summed")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[SumLoss] = []
    reached = _backward_terms(m)
    for made, arg, functional in made_sums(m):
        every = [made] if functional else class_uses(m, made)
        if isinstance(arg, ast.ClassDef):
            every = [u for u in every if _fed_by_the_model(m, u)]
            if not every:
                continue  # a total of something else than the model's output: not followed
        uses = [u for u in every if not _divided_by_batch(m, u)]
        if every and not uses:
            continue  # every use a mean
        if not uses:  # a loss made and not seen used: it may train anywhere
            out.append(SumLoss(arg, made, made, False, "dp2ddp sees no call of it to follow to a backward"))
            continue
        other = None if functional else shared_binding(m, made)
        mean = not_a_total(m, arg) if isinstance(arg, ast.ClassDef) else None
        for use in uses:
            if under_no_grad(m, use) or not trains_here(m, use) or _read_as_number(m, use) or _scaled(m, use):
                continue
            if mean is not None:
                where = m.cache.get("losses:class-files", {}).get(id(arg))
                out.append(SumLoss(arg, made, use, False, f"on another path it returns "
                                   f"`{' '.join((where[0] if where else m).source(mean).split())[:60]}` "
                                   f"({where[1] + ' ' if where else ''}line {mean.lineno}), which is no total"))
                continue
            if other is not None:
                out.append(SumLoss(arg, made, use, False, f"the same call also computes the loss bound at line "
                                   f"{other.lineno} (`{' '.join(m.source(other).split())[:60]}`), which may not be a sum"))
                continue
            verdict = reached.get(id(use))
            if verdict is None:
                if _input_gradient_only(m, use):
                    continue
                out.append(SumLoss(arg, made, use, False, "dp2ddp cannot follow it to a backward"))
            elif verdict[0] in ("frozen", "mean"):
                continue
            else:
                out.append(SumLoss(arg, made, use, verdict[0] == "sum", verdict[1]))
    m.cache["losses:summed"] = out
    return out


def _backward_terms(m: SemanticModel) -> Dict[int, Tuple[str, str]]:
    """id(summed loss call) -> ("sum", "") where every backward reaching it differentiates
    only summed losses, ("mixed", the other term) where one adds something else, or
    ("frozen", "") where it reaches only backward passes that train no model parameter."""
    from dp2ddp.model.steps import backward_calls, differentiated

    summed = set()
    for made, _, functional in made_sums(m):
        summed.update(id(u) for u in ([made] if functional else class_uses(m, made)))
    out: Dict[int, Tuple[str, str]] = {}
    for call in backward_calls(m):
        operand = differentiated(m, call)
        if operand is None:
            continue
        leaves: List[ast.AST] = []
        means: Set[int] = set()
        loss_terms(m, operand, leaves, set(), 0, means)
        for x in means & summed:
            out.setdefault(x, ("mean", ""))
        ours = [x for x in leaves if id(x) in summed]
        if not ours:
            continue
        if not trains_parameters(m, call):
            for x in ours:
                out.setdefault(id(x), ("frozen", ""))
            continue
        others = [x for x in leaves if id(x) not in summed]
        verdict = ("sum", "") if not others else (
            "mixed", f"the loss differentiated at line {call.lineno} also adds `{' '.join(m.source(others[0]).split())[:60]}` "
            f"(line {others[0].lineno}), which dp2ddp cannot show is a sum over the samples")
        for x in ours:
            if out.get(id(x), ("sum", ""))[0] in ("sum", "frozen"):
                out[id(x)] = verdict
    return out


def trains_parameters(m: SemanticModel, call: ast.Call) -> bool:
    """A backward whose loop steps an optimizer of model parameters (not only optimizers
    over a list of plain tensors: an attack's perturbation)."""
    from dp2ddp.model.steps import binding_values, innermost_loop, optimizer_steps

    loop = innermost_loop(m, call)
    steps = optimizer_steps(m, loop) if loop is not None else []
    if not steps:
        return True
    for step in steps:
        receiver = step.args[0] if step.args else step.func.value
        values = binding_values(m, receiver) or []
        if not values or not all(_over_plain_tensors(v) for v in values):
            return True
    return False


def _over_plain_tensors(value: ast.AST) -> bool:
    if not (isinstance(value, ast.Call) and value.args and isinstance(value.args[0], (ast.List, ast.Tuple))):
        return False
    return all(isinstance(x, ast.Name) for x in value.args[0].elts)


def _read_as_number(m: SemanticModel, use: ast.Call) -> bool:
    parent = m.parent(use)
    return isinstance(parent, ast.Attribute) and parent.attr in ("item", "detach", "data", "tolist")


def _scaled(m: SemanticModel, use: ast.Call) -> bool:
    """Passed straight to a function of this module that multiplies by the world size
    (the migration's ``whole_sum``)."""
    from dp2ddp.model.names import GET_WORLD_SIZE

    parent = m.parent(use)
    if not (isinstance(parent, ast.Call) and use in parent.args):
        return False
    func = m.resolve_call(parent)
    return func is not None and any(m.call_is(n, GET_WORLD_SIZE) for n in ast.walk(func))


def _input_gradient_only(m: SemanticModel, use: ast.Call) -> bool:
    """A summed loss bound to a name that is read only by ``torch.autograd.grad``: the
    gradient of an input (an attack's), each sample's its own whoever sums it."""
    node, parent = use, m.parent(use)
    while isinstance(parent, (ast.BinOp, ast.UnaryOp)):
        node, parent = parent, m.parent(parent)
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name):
        name = parent.targets[0].id
    elif isinstance(parent, ast.AugAssign) and isinstance(parent.target, ast.Name):
        name = parent.target.id
    else:
        return False
    func = m.enclosing_function(use) or m.tree
    reads = [n for n in ast.walk(func) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]
    for n in reads:
        node = m.parent(n)
        while node is not None and not isinstance(node, ast.stmt) and not (
                isinstance(node, ast.Call) and m.is_name(node.func, {"torch.autograd.grad"})):
            node = m.parent(node)
        if not isinstance(node, ast.Call):
            return False
    return bool(reads)


def _divided_by_batch(m: SemanticModel, node: ast.AST) -> bool:
    """``node / x.size(0)``, ``node * T ** 2 / len(x)``, ``(1.0 / batch_size) * node`` with
    ``batch_size = len(x)``: a sum made a mean over its batch."""
    while True:
        parent = m.parent(node)
        if not isinstance(parent, ast.BinOp):
            return False
        if isinstance(parent.op, ast.Div) and parent.left is node:
            if batch_size_of(m, parent.right):
                return True
        elif isinstance(parent.op, ast.Mult):
            other = parent.right if parent.left is node else parent.left
            if isinstance(other, ast.BinOp) and isinstance(other.op, ast.Div) and batch_size_of(m, other.right):
                return True
        else:
            return False
        node = parent
