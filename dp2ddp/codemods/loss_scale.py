"""A summed loss keeps DataParallel's step: scaled by the world size, or refused.

A ``reduction="sum"`` loss (or ``size_average=False``) adds up over the samples a process
sees. DataParallel computed it over the whole batch; under DDP each rank sums its share and
the gradients are *averaged* across the ranks, so each step would be 1/world_size of the
original's. Where every backward the loss reaches differentiates a sum of summed losses
(times factors the same on every rank), each of them passes through ``whole_sum(loss)``
(written once into the script: the loss times the world size), which gives the original's
gradient exactly, and its loss when averaged over the ranks (DDP164). Where another term
is added, or dp2ddp cannot follow the loss to a backward, the file is left unchanged with
the reason (DDP118): scaling the whole loss would also scale a mean, and leaving it would
train at 1/world_size of the step. Sums divided by their batch's size (means), evaluation
sums and an attack's input gradients are left alone (:func:`dp2ddp.model.losses.summed_losses`).
A mixed script's own distributed path is left as it is.
"""

from __future__ import annotations

from typing import List

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding, Replace
from dp2ddp.model.losses import summed_losses, what_sums


def propose(ctx: Context) -> List[Finding]:
    if ctx.mode != "plain":
        return []
    found = summed_losses(ctx.m)
    if not found:
        return []
    m = ctx.m
    refused = [s for s in found if not s.scalable]
    if refused:
        out = []
        for s in refused:
            what = " ".join(m.source(s.use).split())[:60]
            out.append(ctx.block(s.use, "DDP118", f"`{what}` sums over the samples ({what_sums(m, s.arg)}): under DDP each "
                                 f"rank sums its share and the gradients are averaged, so the step would be 1/world_size "
                                 f"of DataParallel's, and dp2ddp cannot scale it back: {s.reason}; scale it by "
                                 "dist.get_world_size() where it is computed (or make it a mean), then migrate"))
        return out
    name = ctx.fresh_name("whole_sum")
    ctx.define_after_imports("whole_sum.py.tmpl", whole_sum=name, dist=ctx.name("dist"))
    out = []
    for s in found:
        edit = Replace(ctx.cst(s.use), lambda u: ctx.expr(f"{name}({{loss}})", loss=u))
        out.append(ctx.note(s.use, "DDP164", f"the loss sums over the samples ({what_sums(m, s.arg)}): under DDP each rank "
                            f"sums its share and the gradients are averaged; {name} multiplies it by the world size, so "
                            "the step is DataParallel's", [edit]))
    return out
