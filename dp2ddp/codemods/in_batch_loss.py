"""Refuse a loss that compares the samples of a batch with each other (DDP153).

See :mod:`dp2ddp.model.batch_coupling`: under DDP such a loss sees each process's share of
the batch, not the batch, so the migration would train with another loss. The fix is the
user's (gather every rank's features before the loss, as SimCLR's ``GatherLayer`` does);
dp2ddp refuses with the line of the comparison.
"""

from __future__ import annotations

from typing import List

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding
from dp2ddp.model.batch_coupling import in_batch_losses


def propose(ctx: Context) -> List[Finding]:
    out: List[Finding] = []
    for node, rel, line, name in in_batch_losses(ctx.m):
        where = f"{rel}:{line}" if rel else f"line {line}"
        out.append(ctx.block(node, "DDP153", f"{name} compares the samples of a batch with each other ({where}): under DDP "
                             "each process would compute it on its own share of the batch (fewer negatives, another loss); "
                             "gather every rank's features before it (dist.all_gather with gradients), then migrate"))
    return out
