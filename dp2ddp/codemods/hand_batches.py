"""Batches the script cuts itself, and DataParallel's ``dim``: each process takes its share.

A training loop that cuts its batches by index (``for i in range(0, len(x), bs):
xb = x[i:i + bs]``, or ``data, target = get_batch(source, i)``) would feed every process
the whole batch under DDP: each rank would repeat the others' work. Each cut becomes this
process's share of it, as DataParallel scattered it (``rank_share``, defined once in the
migrated script): the global batch and the number of steps stay the original's; a batch
that does not divide by the world size is padded by repeating its own first items, so that
every process computes on the same number (DDP averages the processes' gradients).

``DataParallel(model, dim=d)`` with ``d != 0`` (sequence-first models: ``(seq_len,
batch)`` tensors) scatters along ``d``. DDP splits nothing, so the batches must be shared
on ``d`` where they are made: the tensor a loop cuts its steps from is shared once before
the loop (``train_data = rank_share(train_data, dim=1)``: the columns of this process),
and state the model returns and the next step feeds back (an RNN's hidden state) starts
from this process's share. Where an input of the forward comes from anywhere else, the
file is refused (DDP101) naming it: DataParallel split it along ``d`` and dp2ddp cannot
tell which part is this process's.
"""

from __future__ import annotations

import ast
from typing import Dict, List


from dp2ddp.codemods.context import Context
from dp2ddp.engine import Edit, Finding, InsertBefore, Replace
from dp2ddp.model.batches import HandLoop, dim_problems, hand_loops


def problems(ctx: Context) -> List[Finding]:
    """A DataParallel with ``dim != 0`` whose batches dp2ddp cannot split on that dimension
    (checked with the other wraps that cannot be migrated, before any transform)."""
    out: List[Finding] = []
    for w, why, where in dim_problems(ctx.m):
        d = ast.unparse(w.args["dim"]) if w.args.get("dim") is not None else "0"
        at = "" if where is w.call else f" (line {where.lineno})"
        out.append(ctx.block(w.call, "DDP101", (
            f"DataParallel(dim={d}) scatters every input along dimension {d} and DistributedDataParallel splits "
            f"nothing: {why}{at}; left unchanged"
        )))
    return out


def propose(ctx: Context) -> List[Finding]:
    m = ctx.m
    out: List[Finding] = []
    share = None
    for hl in hand_loops(m):
        if hl.problem is not None:
            out.append(ctx.warn(hl.problem_node or hl.loop, "DDP145", (
                f"this loop cuts its own batches, but {hl.problem}: every process still computes on the whole batch "
                "(the same work on every rank); cut the batches from a tensor that stays the same through the loop"
            )))
            continue
        if ctx.mode != "plain":
            out.append(ctx.warn(hl.loop, "DDP145", (
                "this loop cuts its own batches in a script with its own distributed path, which dp2ddp does not "
                "change: each process computes on what that path gives it"
            )))
            continue
        if share is None:
            share = ctx.fresh_name("rank_share")
            _define(ctx, share)
        out.append(_split(ctx, hl, share))
    return out


def _define(ctx: Context, name: str) -> None:
    ctx.define_after_imports("rank_share.py.tmpl", rank_share=name, torch=ctx.name("torch"), dist=ctx.name("dist"))


def _shared(ctx: Context, name: str, dim: int):
    suffix = f", dim={dim}" if dim else ""
    return lambda node: ctx.expr("{f}({x}{suffix})", f=name, x=node, suffix=suffix)


def _split(ctx: Context, hl: HandLoop, share: str) -> Finding:
    m = ctx.m
    edits: List[Edit] = []
    if hl.dim == 0:
        for c in hl.cuts:
            if c.kind == "iterable":  # each batch it yields
                edits.append(Replace(ctx.cst(c.node), lambda node: ctx.expr("map({f}, {x})", f=share, x=node)))
            else:
                edits.append(Replace(ctx.cst(c.node), _shared(ctx, share, 0)))
        cuts = ", ".join(f"`{m.source(c.node)}`" for c in hl.cuts)
        message = (
            f"{cuts}: each process takes its share of every batch the loop cuts ({share}); the global batch and the "
            "number of steps are the original's (a batch that does not divide by the world size is padded by "
            "repeating its own first items)"
        )
        return ctx.note(hl.loop, "DDP143", message, edits)
    hoisted: Dict[str, str] = {}
    for c in hl.cuts:
        text = m.source(c.source)
        if text not in hoisted:
            base = c.source.attr if isinstance(c.source, ast.Attribute) else c.source.id  # type: ignore[attr-defined]
            hoisted[text] = ctx.fresh_name(f"{base}_share")
            edits.append(InsertBefore(ctx.bridge.statement(hl.loop), (
                ctx.stmt("{name} = {f}({src}, dim={dim})  # dp2ddp: this process's columns of the batch dimension\n",
                         name=hoisted[text], f=share, src=c.source, dim=str(hl.dim)),
            )))
        edits.append(Replace(ctx.cst(c.source), ctx.expr(hoisted[text])))
    for init in hl.carried:
        edits.append(Replace(ctx.cst(init), _shared(ctx, share, hl.dim)))
    sources = ", ".join(f"`{t}`" for t in hoisted)
    carried = "; the state the forward feeds back starts from this process's share" if hl.carried else ""
    message = (
        f"DataParallel(dim={hl.dim}): each process trains on its share of dimension {hl.dim} of {sources}, taken "
        f"once before the loop ({share}){carried}; the steps and the global batch are the original's"
    )
    return ctx.note(hl.wrap.call, "DDP144", message, edits)
