"""A forward of the wrapped model that only some ranks run calls the bare module.

A DDP forward is a collective (it broadcasts buffers after a training step and prepares
the gradient all-reduce): evaluating the wrapped model under ``if rank == 0:`` (HF's
``if args.local_rank in [-1, 0]: evaluate(...)``) hangs the other ranks. Under the guard
the forward goes to the module itself, as lint rule DDP009 advises: ``model.module(x)``,
or ``getattr(model, "module", model)(x)`` in a script whose own path may run unwrapped, handed
through ``fed_like_the_wrapper`` (its inputs moved onto its GPU, as the wrapper moved them).
"""

from __future__ import annotations

from typing import List

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding, Replace
from dp2ddp.model.collectives import collective_sites
from dp2ddp.model.ranks import rank_conditionals


def propose(ctx: Context) -> List[Finding]:
    m = ctx.m
    edits = []
    first = None
    for call, what in collective_sites(m, dp=True):
        if what != "DDP forward":
            continue
        if next(rank_conditionals(m, call), None) is None:
            continue
        f = call.func
        text = m.source(f)
        new = f"{ctx.fed_like_the_wrapper()}({ctx.module_of(text)})"
        edits.append(Replace(ctx.cst(f), ctx.expr(new)))
        first = first or call
    if not edits:
        return []
    return [ctx.note(first, "DDP124", "a forward only some ranks run calls the bare module (a DDP forward is a collective)", edits)]
