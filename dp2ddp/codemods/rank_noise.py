"""Noise a training step draws per sample: each rank keeps its rows of the global batch's.

``noise = torch.randn(b_size, nz, 1, 1, device=device)`` in a GAN's training loop drew
one row per item of the global batch under DataParallel. Under DDP each rank's
``b_size`` is its share, and the ranks' random streams are seeded alike: every rank
would draw the same rows (the global batch holds world-size copies of them). Each such
draw (found by :func:`dp2ddp.model.noise.per_sample_draws`) becomes::

    torch.randn(b_size * dist.get_world_size(), nz, 1, 1, device=device).chunk(dist.get_world_size())[dist.get_rank()]

every rank draws the global batch's rows from the same stream (so the streams stay
alike on every rank, and random choices that steer control flow still agree) and keeps
part ``rank`` of ``world`` equal parts: the rows of the original's draw that go with the
samples ``shard_loader`` gives this rank (its contiguous slice of each global batch). Scripts with their own distributed path
are left as they are (their path decides what each rank draws).
"""

from __future__ import annotations

import ast
from typing import List

import libcst as cst

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding, Replace
from dp2ddp.model.noise import per_sample_draws

_COMMENT = "# dp2ddp: every rank draws the global batch's rows alike and keeps its own (DataParallel drew one per item)"


def propose(ctx: Context) -> List[Finding]:
    if ctx.mode != "plain":
        return []
    m = ctx.m
    out: List[Finding] = []
    commented = set()
    for d in per_sample_draws(m):
        dist = ctx.name("dist")
        world = f"{dist}.get_world_size()"
        simple = isinstance(d.count, (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant))
        edits = [
            Replace(ctx.cst(d.count), lambda node, w=world, s=simple: ctx.expr(
                "{c} * {w}" if s else "({c}) * {w}", c=node, w=w)),
            Replace(ctx.cst(d.call), lambda node, w=world: ctx.expr(
                "{call}.chunk({w})[{dist}.get_rank()]", call=node, dist=dist, w=w)),
        ]
        stmt = m.statement_of(d.call)
        if stmt is not None and id(stmt) not in commented:
            commented.add(id(stmt))
            line = ctx.bridge.statement(stmt)
            if hasattr(line, "leading_lines"):
                comment = cst.EmptyLine(comment=cst.Comment(_COMMENT))
                edits.append(Replace(line, lambda u, c=comment: u.with_changes(leading_lines=[*u.leading_lines, c])))
        out.append(ctx.note(d.call, "DDP162", (
            f"`{m.source(d.call)}` draws one row per item of the batch: every rank now draws the global batch's rows "
            "from the same stream and keeps its own, as DataParallel's scatter gave them (otherwise every rank would "
            "draw the same rows)"
        ), edits))
    return out
