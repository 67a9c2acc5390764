"""A ``reduction="sum"`` loss changes its gradient scale under DDP: warned, not rewritten.

DDP averages the gradients of the processes, each of which sums over its share of the
batch: a step is 1/world_size of DataParallel's (:mod:`dp2ddp.model.losses`). dp2ddp
cannot tell whether the script wants the sum (then the loss, or the learning rate, must
be scaled by the world size) or would be better off with the mean; it says so at each
such loss (DDP118), and lint rule DDP015 reports the same places in the migrated script.
"""

from __future__ import annotations

from typing import List

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding
from dp2ddp.model.losses import sum_reductions


def propose(ctx: Context) -> List[Finding]:
    return [
        ctx.warn(
            arg,
            "DDP118",
            "reduction=\"sum\" loss: DDP averages the gradients across processes, so each step is 1/world_size of "
            "DataParallel's; multiply the loss (or the learning rate) by dist.get_world_size(), or use the mean",
        )
        for arg in sum_reductions(ctx.m)
    ]
