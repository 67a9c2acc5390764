"""DDP014 (off by default): `DataLoader` with 0/1 workers in DDP code."""

from __future__ import annotations

import ast

from dp2ddp.model.collectives import is_ddp_code
from dp2ddp.model.loaders import loaders
from dp2ddp.model.names import DATALOADER
from dp2ddp.rules.base import DDP_CODE, Hit, Invalid, Rule, Valid, has_double_star, tails

MESSAGE = "`DataLoader` with {n} in a DDP script: data loading runs in the training process"


def check(m):
    if not is_ddp_code(m):
        return
    for ld in loaders(m):
        arg = ld.num_workers
        if arg is None:
            if has_double_star(ld.call) or len(ld.call.args) >= 11:
                continue
            yield Hit(ld.call, MESSAGE.format(n="the default `num_workers=0`"))
        elif isinstance(arg.value, ast.Constant) and type(arg.value.value) is int and arg.value.value in (0, 1):
            yield Hit(arg, MESSAGE.format(n=f"`num_workers={m.source(arg.value)}`"))


_HEAD = "import torch.distributed as dist\nfrom torch.utils.data import DataLoader\n\n"

RULE = Rule(
    code="DDP014",
    name="dataloader-without-workers",
    message=MESSAGE,
    what=(
        "In DDP code, checks for a `DataLoader` with `num_workers=0` or `1`, or without `num_workers` (the "
        "default is 0). Off by default: select it with `--select DDP014`."
    ),
    why=(
        "With 0 workers every rank decodes and augments its batches in the training loop, so the GPU waits "
        "for the CPU; with DDP there are N such processes competing. It is the most common reason a DDP job "
        "is not faster than expected."
    ),
    fix="Pass `num_workers=` a few per process (e.g. `os.cpu_count() // local_world_size`) and `pin_memory=True`.",
    fix_safety="",
    default=False,
    gate=(DDP_CODE, tails(DATALOADER)),
    check=check,
    examples=(
        Invalid(_HEAD + "loader = DataLoader(ds, batch_size=32)\n", 4, 10, end=(4, 39)),
        Invalid(_HEAD + "loader = DataLoader(ds, batch_size=32, num_workers=1)\n", 4, 40, end=(4, 53)),
        Valid(_HEAD + "loader = DataLoader(ds, batch_size=32, num_workers=4, pin_memory=True)\n"),
        Valid("from torch.utils.data import DataLoader\n\nloader = DataLoader(ds, batch_size=32)  # not DDP code\n"),
    ),
)
