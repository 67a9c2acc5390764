"""DDP010: DataParallel's `if n_gpu > 1: loss = loss.mean()` left in DDP code."""

from __future__ import annotations

from dp2ddp.findings import Fix
from dp2ddp.model.collectives import is_ddp_code
from dp2ddp.model.dp_idioms import dp_loss_means, is_elif
from dp2ddp.rules.base import DDP_CODE, Hit, Invalid, Rule, Text, Valid


def _remove(node):
    def build(bridge):
        from dp2ddp.engine import Remove

        return [Remove(bridge.statement(node))]

    return build


def check(m):
    if not is_ddp_code(m):
        return
    for node in dp_loss_means(m):
        fix = None
        if not node.orelse and not is_elif(m, node):
            fix = Fix(build=_remove(node), description="remove the DataParallel loss averaging")
        yield Hit(node, fix=fix)


_HEAD = "import torch.distributed as dist\n\nloss = criterion(model(x), y)\n"

RULE = Rule(
    code="DDP010",
    name="data-parallel-loss-mean",
    message="leftover DataParallel idiom: `if n_gpu > 1: loss = loss.mean()` does nothing under DDP",
    what=(
        "In DDP code, checks for an `if` on the GPU count (`n_gpu`, `args.n_gpu`, `torch.cuda.device_count()`) "
        "whose body only averages a value over itself (`loss = loss.mean()`)."
    ),
    why=(
        "DataParallel gathers one loss per GPU, so scripts average them when `n_gpu > 1`. Under DDP each process "
        "computes one scalar loss for its own batch and the gradient averaging happens in the backward pass; "
        "the idiom is dead code that suggests the script still thinks it is DataParallel, and it hides the "
        "real question of how the loss should be reduced across ranks."
    ),
    fix="Delete the `if` (the fix does this when it has no `else` and is not an `elif`).",
    fix_safety="Safe: under DDP the loss is a scalar, and the mean of a scalar is the scalar.",
    fixable=True,
    gate=(DDP_CODE, ("mean",), tuple(Text(w, ignore_case=True) for w in ("gpu", "device_count", "world_size"))),
    check=check,
    examples=(
        Invalid(
            _HEAD + "if args.n_gpu > 1:\n    loss = loss.mean()  # mean() to average on multi-gpu.\nloss.backward()\n",
            4, 1, end=(5, 23),
            fixed=_HEAD + "loss.backward()\n",
        ),
        Invalid(_HEAD + "if n_gpu > 1: loss = loss.mean()\nloss.backward()\n", 4, 1, end=(4, 33), fixed=_HEAD + "loss.backward()\n"),
        Valid(_HEAD + "loss.backward()\n"),
        Valid("loss = criterion(model(x), y)\nif n_gpu > 1:\n    loss = loss.mean()  # not DDP code\n"),
    ),
)
