"""A ``--local_rank`` flag the migration keeps reads torchrun's ``LOCAL_RANK`` by default.

``torch.distributed.launch`` passed ``--local_rank=N`` to every process; ``torchrun`` sets
the ``LOCAL_RANK`` environment variable instead. A flag left at ``default=-1`` under
torchrun makes every process believe it runs alone (``if args.local_rank in [-1, 0]:``
logs and saves on every rank; ``get_world_size() if args.local_rank != -1 else 1`` says 1):
its default becomes ``int(os.environ.get("LOCAL_RANK", <default>))``, so a launcher that
passes the flag still wins and plain ``python`` keeps the old default (DDP121). In every
mode: a mixed script's own distributed path reads it (:mod:`dp2ddp.codemods.mixed`), and a
DataParallel script that kept the flag from a template reads it too (lint rule DDP011).
"""

from __future__ import annotations

from typing import List

from dp2ddp.codemods.context import Context, add_kwarg
from dp2ddp.engine import Finding, Replace
from dp2ddp.model.ranks import local_rank_arguments
from dp2ddp.model.syntax import kwarg

_NOTE = "--local_rank defaults to torchrun's LOCAL_RANK"


def propose(ctx: Context) -> List[Finding]:
    out: List[Finding] = []
    for call, _flag, from_torchrun in local_rank_arguments(ctx.m):
        if from_torchrun:
            continue  # already torchrun's LOCAL_RANK
        os_ = ctx.name("os")
        default = kwarg(call, "default")
        if default is not None:
            new = ctx.expr('int({os}.environ.get("LOCAL_RANK", {d}))', os=os_, d=default.value)
            out.append(ctx.note(call, "DDP121", _NOTE, [Replace(ctx.cst(default.value), new)]))
        else:
            out.append(ctx.note(call, "DDP121", _NOTE, [Replace(ctx.cst(call), lambda u: add_kwarg(
                u, "default", f'int({os_}.environ.get("LOCAL_RANK", -1))'))]))
    return out
