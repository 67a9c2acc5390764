"""DataParallel idioms that mean nothing under DDP.

``if n_gpu > 1: loss = loss.mean()`` averages the per-GPU losses DataParallel gathers;
under DDP each process has one scalar loss and the gradients are averaged in the
backward pass. The ``if`` goes — the same statements lint rule DDP010 reports
(:func:`dp2ddp.model.wraps.dp_loss_means`, one definition for both).
"""

from __future__ import annotations

from typing import List

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding, Remove
from dp2ddp.model.wraps import dp_loss_means, is_elif


def propose(ctx: Context) -> List[Finding]:
    out = []
    for node in dp_loss_means(ctx.m):
        if node.orelse or is_elif(ctx.m, node) or not ctx.bridge.alone_on_line(node):
            continue
        out.append(ctx.note(node, "DDP122", "`if <GPU count>: loss = loss.mean()` removed: under DDP each process has one loss",
                            [Remove(ctx.bridge.statement(node))]))
    return out
