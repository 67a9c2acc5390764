"""A forward on a training batch between the wrap and training sees the global batch.

Layers that initialise themselves from the first batch they see (ActNorm in flow models,
data-dependent initialisation, LSUV) do it in a forward before training. DataParallel ran
that forward on the whole batch; under DDP each rank would run it on its own share, after
the wrapper broadcast rank 0's parameters: the replicas would start apart and stay apart.
dp2ddp cannot tell such a forward from a harmless one, so it makes every such forward see
the global batch: each input made from the batch is gathered from every rank first
(``GatherBatch.apply(x)``, see :mod:`in_batch_loss`), so every rank initialises from the
same data as the original did, and the replicas start alike (DDP155). That covers a
forward of the wrapped model on data from a loader, after the wrap and before the first
training loop of the same function, and the same forward in the training loop through
``model.module`` under a first-pass test (``if i == 0:``, glow's ActNorm initialisation).
Where an input cannot be gathered (not a tensor expression: ``model(**batch)``, ``*args``),
the forward runs through the wrapper with gradients on (no backward would follow it), or
the script has its own distributed path, the migration stops (DDP139) with the line.
"""

from __future__ import annotations

import ast
from typing import List

from dp2ddp.codemods.context import Context
from dp2ddp.codemods.facts import GatherHelper, Wrappers
from dp2ddp.codemods.in_batch_loss import gather_name, gathered
from dp2ddp.engine import Finding
from dp2ddp.model.collectives import var_key
from dp2ddp.model.training import training_loops, under_no_grad

NEEDS = (Wrappers, GatherHelper)


def _batch(m, expr: ast.AST) -> bool:
    """``expr`` is (made from) a batch of a loader: ``next(iter(loader))``, a loop variable."""
    from dp2ddp.model.flow import origins

    for n in ast.walk(expr):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "next":
            return True
        if not isinstance(n, ast.Name):
            continue
        for node, path in origins(m, n):
            if "*" in path:
                return True
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "next":
                return True
    return False


def _first_pass(m, call: ast.AST):
    """The test of an ``if`` inside the loop around ``call`` that holds on the first pass
    only (``if i == 0:``, ``if step == 0 and epoch == 0:``): ``call`` is a one-off there."""
    for a in m.ancestors(call):
        if isinstance(a, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        if isinstance(a, ast.If) and any(
            isinstance(c, ast.Compare) and len(c.ops) == 1 and isinstance(c.ops[0], ast.Eq)
            and any(isinstance(x, ast.Constant) and x.value == 0 and not isinstance(x.value, bool) for x in (c.left, *c.comparators))
            for c in ast.walk(a.test)
        ) and any(m.contains(s, call) or s is call for s in a.body):
            return a.test
    return None


def _gatherable(m, a: ast.AST) -> bool:
    """An input that is a tensor expression made from a batch: arithmetic on it, an item
    of it, a method of it (``x.to(device)``), or a name unpacked from a batch."""
    from dp2ddp.model.flow import origins

    if isinstance(a, (ast.BinOp, ast.Subscript)):
        return True
    if isinstance(a, ast.Call):
        return isinstance(a.func, ast.Attribute)
    if isinstance(a, ast.Name):
        made = origins(m, a)
        return bool(made) and all(path or isinstance(node, (ast.BinOp, ast.Subscript)) or (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)) for node, path in made)
    return False


def _gather(ctx: Context, call: ast.Call, what: str):
    """Every input of ``call`` made from a batch goes through ``GatherBatch``; ``None``
    where one cannot (or in a script with its own distributed path)."""
    m = ctx.m
    if ctx.mode != "plain" or any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    inputs = [a for a in list(call.args) + [k.value for k in call.keywords] if _batch(m, a)]
    if not all(_gatherable(m, a) for a in inputs):
        return None
    edits = gathered(ctx, inputs)
    name = gather_name(ctx)
    return ctx.note(call, "DDP155", (
        f"`{' '.join(m.source(call).split())[:60]}`: a {what} sees the global batch ({name}): a layer that initialises "
        "from its first batch (ActNorm, data-dependent init) starts every rank from the data the original used, and "
        "the replicas start alike"), edits)


def propose(ctx: Context) -> List[Finding]:
    m = ctx.m
    wrappers = ctx.need(Wrappers)
    if not wrappers.keys:
        return []
    loops = training_loops(m)
    out: List[Finding] = []
    for call in m.nodes(ast.Call):
        f = call.func
        subject = f.value if isinstance(f, ast.Attribute) and f.attr == "module" else f
        if var_key(m, subject) not in wrappers.keys:
            continue
        if any(isinstance(a, (ast.For, ast.AsyncFor, ast.While)) for a in m.ancestors(call)):
            first = _first_pass(m, call) if f is not subject else None
            if first is not None and any(_batch(m, a) for a in list(call.args) + [k.value for k in call.keywords]):
                gathered = _gather(ctx, call, f"first-batch forward under `if {m.source(first)[:40]}`")
                if gathered is not None:
                    out.append(gathered)
                    continue
                out.append(ctx.block(call, "DDP139", f"`{' '.join(m.source(call).split())[:60]}` runs the bare model on the first training "
                                     f"batch only (`if {m.source(first)[:40]}` at line {first.lineno}), past the "
                                     "DistributedDataParallel wrapper: a layer that initialises from its first batch (ActNorm, "
                                     "data-dependent init) would start each rank from its own share and the replicas apart; run it "
                                     "before the wrap, then migrate"))
                break
            continue  # in a loop: training or evaluation, not a one-off before training
        func = m.enclosing_function(call)
        later = [lp for lp in loops if m.enclosing_function(lp) is func and (lp.lineno, lp.col_offset) > (call.lineno, call.col_offset)]
        if not later:
            continue
        if not any(_batch(m, a) for a in list(call.args) + [k.value for k in call.keywords]):
            continue
        # through the wrapper with gradients on, a forward with no backward leaves DDP's reduction pending
        gathered = _gather(ctx, call, f"forward on a training batch before training (line {later[0].lineno})") if (
            f is not subject or under_no_grad(m, call)) else None
        if gathered is not None:
            out.append(gathered)
            continue
        out.append(ctx.block(call, "DDP139", f"`{' '.join(m.source(call).split())[:60]}` runs the wrapped model on a training batch before training "
                             f"(line {later[0].lineno}): a layer that initialises from its first batch (ActNorm, data-dependent "
                             "init) would start each rank from its own share and the replicas apart; run it before the wrap, "
                             "then migrate" + (" (it runs under no_grad, the usual shape of such an initialisation)" if under_no_grad(m, call) else "")))
        break
    return out


__all__ = ["propose"]
