"""A loss that couples the samples of a batch (compares them with each other, divides totals
over the whole batch): gathered, or refused (DDP153).

See :mod:`dp2ddp.model.batch_coupling`: under DDP such a loss sees each process's share of
the batch, not the batch, so the migration would train with another loss. Where the loss
is called from the training step with values the step makes (``loss = criterion(features,
labels)``: names bound in the step's function, constants), each of them is gathered from
every rank first (``GatherBatch``, written once into the script: ``all_gather`` forward,
the summed gradient of this rank's share backward, as SimCLR's ``GatherLayer``): every
rank computes the original's loss over the global batch, and the step is the original's
(DDP154). Anything else (an argument that is state, such as a queue of negatives, or a
script with its own distributed path) is refused with the line of the comparison (DDP153).
"""

from __future__ import annotations

import ast
from typing import List

from dp2ddp.codemods.context import Context
from dp2ddp.codemods.facts import GatherHelper
from dp2ddp.engine import Edit, Finding, Replace
from dp2ddp.model.batch_coupling import in_batch_losses, loss_calls, ungatherable


PROVIDES = (GatherHelper,)


def propose(ctx: Context) -> List[Finding]:
    out: List[Finding] = _handed(ctx)
    ctx.provide(GatherHelper())
    for loss in in_batch_losses(ctx.m):
        node, name, how = loss.node, loss.name, loss.how
        where = f"{loss.rel}:{loss.line}" if loss.rel else f"line {loss.line}"
        calls = loss_calls(ctx.m, node) if ctx.mode == "plain" else None
        apart = next((why for why in (ungatherable(loss, c) for c in calls or []) if why), None)
        if apart is not None:
            out.append(ctx.block(node, "DDP153", f"{name} {how} ({where}): under DDP each process would compute it on its "
                                 f"own share of the batch (another loss), and dp2ddp cannot gather its inputs: {apart}; "
                                 "gather every rank's share inside the loss (or all-reduce its totals), then migrate"))
            continue
        if not calls:
            out.append(ctx.block(node, "DDP153", f"{name} {how} ({where}): under "
                                 "DDP each process would compute it on its own share of the batch (another loss: fewer negatives, "
                                 "other totals), and dp2ddp cannot gather what it is given (an argument that is not a value of the "
                                 "training step); gather every rank's features before it (dist.all_gather with gradients), "
                                 "then migrate"))
            continue
        gather = gather_name(ctx)
        for call in calls:
            edits = gathered(ctx, [a for a in list(call.args) + [k.value for k in call.keywords]
                                   if not isinstance(a, ast.Constant)])
            out.append(ctx.note(call, "DDP154", (
                f"{name} {how} ({where}): its inputs are gathered from every "
                f"rank first ({gather}), so every rank computes the original's loss over the global batch"), edits))
    return out


def _handed(ctx: Context) -> List[Finding]:
    """DDP153 for a loss the script hands to a project module's training code
    (:mod:`dp2ddp.model.handed_losses`): that code computes it on each rank's share."""
    from dp2ddp.model.handed_losses import handed_in_batch_losses

    m = ctx.m
    out: List[Finding] = []
    for h in handed_in_batch_losses(m):
        callee = m.source(h.call.func)
        out.append(ctx.block(h.arg, "DDP153", (
            f"`{m.source(h.arg)}`, handed to {callee}() as `{h.param}` and called where it trains ({h.rel}:{h.line}), "
            f"runs {h.name}, which {h.how} ({h.where}): under DDP each process would compute it on its own share of the "
            "batch (another loss: fewer negatives, other totals); gather every rank's features inside the loss "
            "(dist.all_gather with gradients), then migrate")))
    return out


def gather_name(ctx: Context) -> str:
    """The name of ``GatherBatch`` in this script, written once on first use."""
    helper = ctx.need(GatherHelper)
    if not helper.name:
        helper.name = ctx.fresh_name("GatherBatch")
        _define(ctx, helper.name)
    return helper.name


def gathered(ctx: Context, inputs: List[ast.AST]) -> List[Edit]:
    """Each of ``inputs`` through ``GatherBatch.apply(...)`` (written into the script on first use)."""
    gather = gather_name(ctx)
    return [Replace(ctx.cst(a), lambda u, g=gather: ctx.expr("{g}.apply({x})", g=g, x=u)) for a in inputs]


def _define(ctx: Context, name: str) -> None:
    ctx.define_after_imports("gather_batch.py.tmpl", gather=name, torch=ctx.name("torch"), dist=ctx.name("dist"))
