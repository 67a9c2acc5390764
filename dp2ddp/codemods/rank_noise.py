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
samples ``shard_loader`` gives this rank (its contiguous slice of each global batch).

A draw shaped like a batch tensor has no count to multiply (``torch.randn_like(img)``,
``torch.randn(img.size())``, ``torch.FloatTensor(img.size()).normal_(0, s)``, the noise of
denoising and diffusion trainers): every rank makes it world-size times, one after the
other from the same stream, and keeps draw number ``rank``::

    [torch.randn_like(img) for _ in range(dist.get_world_size())][dist.get_rank()]

the ranks' noise differs and their streams stay alike (the numbers are not the
original's, which drew them in one call). A NumPy draw of one number per item
(``np.random.uniform(0, 55, size=n)``) takes the same form, which gives each rank the
original's numbers (NumPy draws them one after the other). Draws in a loop over the
items of the batch are refused (DDP179): no edit of the call gives each rank its own.
Scripts with their own distributed path are left as they are (their path decides what
each rank draws).
"""

from __future__ import annotations

import ast
from typing import List

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding, Replace
from dp2ddp.model.noise import batch_permutations, draws_per_item, kept_stream_draws, per_sample_draws, worker_id_seeds

_COMMENT = "# dp2ddp: every rank draws the same noise for the global batch and keeps its own share (DataParallel drew one per item)"


def propose(ctx: Context) -> List[Finding]:
    if ctx.mode != "plain":
        return []
    m = ctx.m
    out: List[Finding] = []
    commented = set()
    for d in per_sample_draws(m):
        dist = ctx.name("dist")
        world = f"{dist}.get_world_size()"
        if d.count is not None and d.tensor:
            simple = isinstance(d.count, (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant))
            edits = [
                Replace(ctx.cst(d.count), lambda node, w=world, s=simple: ctx.expr(
                    "{c} * {w}" if s else "({c}) * {w}", c=node, w=w)),
                Replace(ctx.cst(d.call), lambda node, w=world: ctx.expr(
                    "{call}.chunk({w})[{dist}.get_rank()]", call=node, dist=dist, w=w)),
            ]
        else:  # shaped like a batch tensor, or a NumPy array: one draw per rank, each rank keeps its own
            edits = [Replace(ctx.cst(d.call), lambda node, w=world: ctx.expr(
                "[{call} for _ in range({w})][{dist}.get_rank()]", call=node, dist=dist, w=w))]
        stmt = m.statement_of(d.call)
        if stmt is not None and id(stmt) not in commented:
            commented.add(id(stmt))
            edits += ctx.comment_above(d.call, _COMMENT)
        what = ("draws one row per item of the batch: every rank now draws the global batch's rows from the same "
                "stream and keeps its own, as DataParallel's scatter gave them" if d.count is not None and d.tensor else
                "draws one number per item of the batch: every rank now draws it world-size times from the same stream "
                "and keeps draw number `rank`, the original's numbers for its items" if d.count is not None else
                "draws noise shaped like the batch: every rank now draws it world-size times from the same stream and "
                "keeps draw number `rank`")
        out.append(ctx.note(d.call, "DDP162", (
            f"`{m.source(d.call)}` {what} (otherwise every rank would draw the same noise)"
        ), edits))
    for item_loop, draw in draws_per_item(m):
        out.append(ctx.block(draw, "DDP179", (
            f"`{' '.join(m.source(draw).split())[:60]}` draws random numbers in a loop over the items of the batch "
            f"(`for {m.source(item_loop.target)} in {m.source(item_loop.iter)}`, line {item_loop.lineno}): under DDP the "
            "loop runs over each rank's share and the ranks' streams are alike, so every rank would draw the same "
            "numbers for its items; draw them for the whole batch in one call (`torch.randn(n, ...)`), or take the "
            "risk with --accept DDP179")))
    for call, where in kept_stream_draws(m):
        out.append(ctx.block(call, "DDP179", (
            f"`{' '.join(m.source(call).split())[:60]}` draws random numbers for the items of the batch from a generator "
            f"its object keeps ({where}), seeded alike on every rank: under DDP every rank would draw the same numbers for "
            "its share's items; draw them from the global random stream for the whole batch (or seed the object's "
            "generator by the rank), or take the risk with --accept DDP179")))
    for node, where in worker_id_seeds(m):
        out.append(ctx.block(node, "DDP184", (
            f"a dataset seeds its random streams from the DataLoader worker's id alone ({where}): under DDP worker k "
            "of every rank seeds alike, so every rank would draw the same augmentations for its share; seed from "
            "`torch.initial_seed()` (which differs per rank and worker once migrated), or take the risk with "
            "--accept DDP184")))
    warned = set()
    for call in batch_permutations(m):
        func = m.enclosing_function(call)
        if id(func) in warned:
            continue  # one line per function (``randperm(n).cuda()`` on one branch, ``randperm(n)`` on the other)
        warned.add(id(func))
        out.append(ctx.note(call, "DDP178", (
            f"`{m.source(call)}` pairs each sample with another of the same batch (mixup, CutMix): under DDP the "
            "batch is this rank's share, so the pairs come from that share, not from the whole batch as under "
            "DataParallel; the same training in law (as distributed mixup does), with losses that agree with the "
            "original's only statistically (verify judges them as a moving average)")))
    return out
